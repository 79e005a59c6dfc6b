"""bench/bench_where.py runs end to end on a small memory: both paths give the same results and the JSON says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("numba")


def test_bench_where_smoke(tmp_path):
    out = tmp_path / "where.json"
    cmd = [sys.executable, str(REPO / "bench" / "bench_where.py"), "--records", "3000", "--queries", "25",
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["identical"] is True
    assert res["questions"] == 25 and res["tenants"] >= 2
    assert set(res["cpu"]) == {"compiled", "per-segment"}
    assert res["cpu"]["compiled"]["p50_ms"] > 0
