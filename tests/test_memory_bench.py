"""bench/bench_memory.py runs end to end on a small memory and writes JSON, markdown and a plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest.importorskip("psutil")
pytest.importorskip("matplotlib")


def test_small_run_writes_json_docs_and_plot(tmp_path):
    out, md, png = tmp_path / "m.json", tmp_path / "benchmarks.md", tmp_path / "img" / "m.png"
    md.write_text("# Benchmarks\n\nintro\n\n<!-- BEGIN bench_cpu -->\ncpu\n<!-- END bench_cpu -->\n")
    cmd = [sys.executable, str(REPO / "bench" / "bench_memory.py"), "--records", "6000", "--batch", "500",
           "--queries", "120", "--checkpoints", "2000,6000", "--compare-at", "6000", "--budgets", "2",
           "--check-queries", "40", "--compare-queries", "60", "--no-progress",
           "--out", str(out), "--md", str(md), "--png", str(png)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["machine"]["cpu_model"] and res["growth"]["records"] == 6000 and not res["reader_errors"]
    assert [c["records"] for c in res["checks"]] == [2000, 6000]
    assert all(c["identical_exhaustive"] and c["identical_newest"] for c in res["checks"])
    modes = res["compare"][0]["modes"]
    assert set(modes) == {"exhaustive", "newest", "budgeted K=2", "budgeted eps=0.1"}
    assert modes["newest"]["identical_to_exhaustive"] is True
    assert 0.0 <= modes["budgeted K=2"]["recall@10_vs_exhaustive"] <= 1.0
    assert res["growth"]["adds_per_s"] > 0 and res["growth"]["searches"] > 0
    text = md.read_text()
    assert "<!-- BEGIN bench_cpu -->\ncpu\n<!-- END bench_cpu -->" in text, "other sections are kept"
    assert "## Memory: growth" in text and "| newest |" in text and png.stat().st_size > 1000
