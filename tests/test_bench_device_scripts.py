"""bench/bench_memory_device.py and bench/gpu_profile.py run end to end without a GPU, on the kernel model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_memory_device_bench_on_the_kernel_model(tmp_path):
    pytest.importorskip("numba")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_memory_device.py"), "--model", "--records", "3000",
                        "--queries", "16", "--one", "5", "--repeats", "1", "--partition-days", "0", "--sweep", "4,32",
                        "--out", str(out)],
                       check=False, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["model"] is True and res["build"]["partitions"] == 1 and res["build"]["records"] == 3000
    assert {n: v["backend"] for n, v in res["batch"].items()} == {
        "memory_cupy": "cupy", "memory_numba": "numba", "static_cupy": "cupy", "static_numba": "numba",
        "memory_cupy_per_query": "cupy"}
    assert len(res["identical"]) == 4 and all(
        v["rows"] == 16 and v["rows_with_other_ids"] == 0 and v["scores_bit_equal"] for v in res["identical"].values())
    assert set(res["one_at_a_time"]) == set(res["batch"]) - {"memory_cupy_per_query"} and all(
        v["queries"] == 5 and v["one_p50_ms"] > 0 for v in res["one_at_a_time"].values())
    assert list(res["sweep"]) == ["4", "32"] and all(
        set(row) == set(res["batch"]) and all(v["qps"] > 0 for v in row.values()) for row in res["sweep"].values())


def test_gpu_profile_script_on_the_kernel_model():
    code = ("import sys; sys.path.insert(0, 'bench'); from gpuir.backends import model_device_plugin; "
            "import gpu_profile; raise SystemExit(gpu_profile.main(['--n-docs', '700', '--batch', '4']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["n_docs"] == 700 and line["batch"] == 4 and line["tiles_scored"] > 0 and line["postings"] > 0
