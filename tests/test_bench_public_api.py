"""bench/bench_public_api.py runs end to end on a slice of LongMemEval-S: every entry point answers, the real
service's top 10 equal Memory.search's, and the JSON says so."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuir.datapath import longmemeval_path

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("numba")


@pytest.mark.skipif(not longmemeval_path("s").exists(), reason="LongMemEval-S is not in GPUIR_DATA")
def test_bench_public_api_runs_end_to_end(tmp_path):
    out = tmp_path / "public_api.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "bench_public_api.py"), "--records", "3000",
                        "--questions", "12", "--passes", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["records"] == 3000 and res["questions"] == 12
    assert res["service_top10_equals_memory_first_100"] is True
    want = {"Memory.search", "Memory.search, tenant where", "Retriever (default)", "BM25Index.search", "HTTP service"}
    assert want <= set(res["search"])
    for name, row in res["search"].items():
        assert row["one_p50_ms"] > 0 and row["batch_qps"] > 0, name
