"""The tiered start (gpuir.memory.warmup): a fresh process's first "auto" searches run on the NumPy reference
while the compiled engine loads in the background, with the same results; explicit requests wait for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")
REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json, sys, time
    from gpuir import Memory
    from gpuir.memory import warmup
    from gpuir.memory.store import warm_compiled_engine
    m = Memory.open(sys.argv[2], writer=False)
    qs = ["garden party topic 3", "note 5", "party 2 topic 11"]
    out = {"numba_imported_before": "numba" in sys.modules}
    first = m.search(qs, k=10, backend=sys.argv[1], where={"session": "s1"})
    out["first"] = [first.meta["backend"], first.meta["backend_reason"]]
    out["numba_imported_by_first"] = "numba" in sys.modules
    out["ready_after_first"] = warmup.wait(warm_compiled_engine, timeout=300)
    snap = m.snapshot()
    from gpuir.backends.numba_segments import SMALL_ROWS  # (small segments: scored as they are, no scorer)
    out["laid_out"] = all((("scorer", "numba", snap.params) if v.seg.n_docs > SMALL_ROWS else ("numba", "small"))
                          in v.seg.cache for v in snap.views)
    later = m.search(qs, k=10, backend=sys.argv[1], where={"session": "s1"})
    out["later"] = [later.meta["backend"], later.meta["backend_reason"]]
    ref = m.search(qs, k=10, backend="numpy", where={"session": "s1"})
    out["same"] = all(r.ids(i) == ref.ids(i) and r.scores[i].tobytes() == ref.scores[i].tobytes()
                      for r in (first, later) for i in range(len(qs)))
    out["hits"] = sum(len(ref.ids(i)) for i in range(len(qs)))
    m.close()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A saved memory of three segments (adds build segments with numba: a process that only opens and
    searches is the one the tiered start spares)."""
    from gpuir import Memory

    d = tmp_path_factory.mktemp("warm") / "mem"
    m = Memory(partition_days=None)
    for b in range(3):
        m.add([{"id": f"r{b}-{i}", "text": f"note {i % 7} about the garden party {b} and topic {i % 13}",
                "session": f"s{i % 3}"} for i in range(200)])
    m.save(d)
    m.close()
    return d


def _run(saved: Path, backend: str, **env) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("GPUIR_TIERED_START", "GPUIR_BACKEND")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", SCRIPT, backend, str(saved)], cwd=REPO, env=e, check=False,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_first_auto_search_runs_on_numpy_then_the_compiled_engine_takes_over(saved):
    out = _run(saved, "auto")
    assert out["hits"] > 10 and out["same"], out
    assert not out["numba_imported_before"] and not out["numba_imported_by_first"], "the first search spares numba"
    assert out["first"][0] == "numpy" and "starting in the background" in out["first"][1]
    assert out["ready_after_first"] and out["later"][0] == "numba"
    assert out["laid_out"], "the warm-up lays out the searched snapshot's segments for the compiled engine"


@pytest.mark.parametrize("backend,env", [("numba", {}), ("auto", {"GPUIR_BACKEND": "numba"}),
                                         ("auto", {"GPUIR_TIERED_START": "0"})])
def test_an_explicit_or_untiered_request_waits_for_the_compiled_engine(saved, backend, env):
    out = _run(saved, backend, **env)
    assert out["same"] and out["first"][0] == "numba" and out["later"][0] == "numba", out


def test_a_failing_warm_up_is_logged_and_leaves_the_choice_to_the_next_search(monkeypatch, caplog):
    from gpuir.memory import warmup

    monkeypatch.setattr(warmup, "_ready", warmup.threading.Event())
    monkeypatch.setattr(warmup, "_thread", None)
    monkeypatch.setenv("GPUIR_TIERED_START", "1")
    assert warmup.tiered("auto") and warmup.tiered(None) and not warmup.tiered("numba")

    def boom():
        raise RuntimeError("no compiler today")

    with caplog.at_level("WARNING", logger="gpuir.memory.warmup"):
        assert warmup.wait(boom, timeout=60)
    assert "failed" in caplog.text and "no compiler today" in caplog.text
    assert not warmup.tiered("auto"), "once tried, searches resolve the backend themselves"
