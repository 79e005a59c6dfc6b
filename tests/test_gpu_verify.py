"""bench/gpu_verify.py without a device: argument parsing, the checks it applies, a tiny dry run."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import BM25Params

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gv():
    spec = importlib.util.spec_from_file_location("gpu_verify", ROOT / "bench" / "gpu_verify.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_verify"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_arguments(gv, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    a = gv.parse_args([])
    assert a.steps == [s.name for s in gv.STEPS] and a.budget_s == 540
    assert a.batch == [1, 1024] and a.k == [10, 100] and a.sizes["n_small"] == 2_700_000
    assert a.sizes["n_scale"] == 8_800_000 and a.sizes["check_rows"] == 64
    assert Path(a.out) == ROOT / "bench" / "results"
    monkeypatch.setenv("OUT", "/some/out")
    assert gv.parse_args([]).out == "/some/out" and gv.parse_args(["--out", "x"]).out == "x"
    d = gv.parse_args(["--dry-run", "-k", "5", "--steps", "scale", "tests"])
    assert d.dry_run and d.k == [5] and d.steps == ["scale", "tests"] and d.sizes == gv.SIZES["dry"]
    for bad in (["--steps", "nope"], ["-k", "0"], ["--budget-s", "-1"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            gv.parse_args(bad)


def test_steps_run_in_the_order_of_value(gv):
    """Core tests, then the small grid (with bm25s on it), scale, racecheck and memcheck, then the rest."""
    names = [s.name for s in gv.STEPS]
    assert names[:7] == ["tests", "timings_small", "bm25s", "scale", "racecheck", "memcheck", "memory"]
    assert set(names[7:]) == {"filtered", "synccheck", "initcheck", "timings_rest", "tests_rest"}


def test_zipf_corpus_is_a_valid_index(gv):
    idx, tok_off, tok = gv.make_index(2000, seed=3, xp=np)
    idx.validate()
    assert idx.n_docs == 2000 and idx.n_postings > 2000
    assert np.array_equal(np.bincount(tok, minlength=idx.n_terms) > 0, np.diff(idx.offsets) > 0)
    qs = gv.make_queries(tok_off, tok, idx.n_terms, 50, seed=3)
    assert all(1 <= q.size <= 7 and q.max() < idx.n_terms for q in qs)


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_reference_scores_and_checks_can_fail(gv, method):
    idx = random_index(3000, 80, seed=5)
    p = BM25Params(method=method)
    ref = NumpyScorer(idx, p)
    qs = random_queries(80, 10, seed=6)
    res = ref.search(qs, 50)
    chk = gv.check_results(ref, qs, res)
    assert chk["ok"] and chk["pairs_checked"] > 100
    bad = ref.search(qs, 50)
    i = int(np.flatnonzero(bad.ids[:, 0] >= 0)[0])
    bad.scores[i, 0] = np.nextafter(bad.scores[i, 0], np.float32(np.inf))  # one ulp off
    assert gv.check_results(ref, qs, bad)["wrong_scores"] == 1
    bad.ids[i, [0, 1]] = bad.ids[i, [1, 0]]
    assert not gv.check_results(ref, qs, bad)["ok"]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dry_run_writes_each_step_as_it_finishes(gv, tmp_path, monkeypatch, capsys):
    """The whole dry run, in order, to $OUT: one jsonl line per step written before the next step starts."""
    monkeypatch.setenv("OUT", str(tmp_path))
    seen_before: dict[str, list[str]] = {}
    steps = []
    for st in gv.STEPS:
        def spy(run, _fn=st.fn, _name=st.name):
            seen_before[_name] = [e["step"] for e in _read_jsonl(run.report.jsonl) if e.get("done")]
            return _fn(run)
        steps.append(gv.Step(st.name, spy, st.need_s, st.what))
    monkeypatch.setattr(gv, "STEPS", steps)
    rc = gv.main(["--dry-run", "--repeats", "1", "--batch", "1", "16", "--steps", "timings_small", "scale",
                  "racecheck", "filtered", "timings_rest"])
    assert rc == 0
    files = sorted(tmp_path.iterdir())
    assert 1 <= len(files) <= 8 and all(f.name.startswith("gpu_verify_dryrun_") for f in files)
    (js,) = [f for f in files if f.suffix == ".jsonl"]
    events = _read_jsonl(js)
    done = [e["step"] for e in events if e.get("done")]
    assert done == ["timings_small", "scale", "racecheck", "filtered", "timings_rest"]
    assert seen_before["scale"] == ["timings_small"] and seen_before["timings_rest"][-1] == "filtered"
    res = {e["step"]: e["result"] for e in events if e.get("done")}
    assert res["scale"]["ok"] and res["filtered"]["ok"] and not res["racecheck"]["ran"]
    assert res["racecheck"]["ok"] and res["racecheck"]["workload"]["returncode"] == 0  # the workload itself ran
    assert {c["case"] for c in res["scale"]["cases"]} == {"k>4096", "many rows"}
    cells = [e["cell"] for e in events if "cell" in e and e["step"] == "timings_small"]
    assert {(c["batch"], c["k"]) for c in cells} == {(1, 10), (16, 10), (1, 100), (16, 100)}
    assert all(c["check"]["ok"] and c["check"]["rows_checked"] > 0 for c in cells if c["batch"] > 1)
    md = js.with_suffix(".md").read_text()
    assert "no figure below is a GPU figure" in md and "| scale | pass |" in md
    assert md in capsys.readouterr().out


def test_a_failing_step_is_recorded_and_the_rest_still_run(gv, tmp_path, monkeypatch):
    def boom(run):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(gv, "STEPS", [gv.Step("tests", boom, 0, "x"),
                                      gv.Step("racecheck", gv.step_racecheck, 0, "y")])
    assert gv.main(["--dry-run", "--out", str(tmp_path)]) == 1
    (js,) = tmp_path.glob("*.jsonl")
    res = {e["step"]: e["result"] for e in _read_jsonl(js) if e.get("done")}
    assert res["tests"]["ok"] is False and "kernel exploded" in res["tests"]["error"]
    assert "racecheck" in res
    assert "| tests | ERROR |" in js.with_suffix(".md").read_text()


def test_budget_skips_steps_and_bounds_subprocesses(gv, tmp_path):
    """A step needing more than is left is skipped (and recorded); a subprocess is killed at the budget."""
    args = gv.parse_args(["--dry-run", "--out", str(tmp_path), "--budget-s", "8"])
    rep = gv.Report(tmp_path, "x", True)
    run = gv.Run(args, rep)
    t = time.perf_counter()
    r = run.bounded([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], 60, "sleep")
    assert r["timed_out"] and r["returncode"] is None and time.perf_counter() - t < 8
    assert "started" in rep.log.read_text()
    deadline = run.deadline(100)
    assert deadline <= time.perf_counter() + 8
    monkeypatch_steps = [gv.Step("tests", lambda run: {"ok": True}, 1e6, "needs more than the budget")]
    gv.STEPS, old = monkeypatch_steps, gv.STEPS
    try:
        assert gv.main(["--dry-run", "--out", str(tmp_path / "b")]) == 0
    finally:
        gv.STEPS = old
    (js,) = (tmp_path / "b").glob("*.jsonl")
    assert [e.get("skipped", "")[:6] for e in _read_jsonl(js) if e["step"] == "tests"] == ["budget"]


def test_check_loop_stops_at_its_deadline(gv):
    idx = random_index(500, 40, seed=1)
    ref = NumpyScorer(idx, BM25Params())
    qs = random_queries(40, 30, seed=2)
    res = ref.search(qs, 5)
    assert gv.check_results(ref, qs, res, rows=10)["rows_checked"] == 10
    late = gv.check_results(ref, qs, res, deadline=time.perf_counter() - 1)
    assert late["rows_checked"] == 0 and not late["ok"]  # nothing checked is not a pass


def test_names_are_unique_per_run(gv, tmp_path):
    a, b = gv.Report(tmp_path, "NVIDIA H100 80GB HBM3", False), gv.Report(tmp_path, "NVIDIA H100 80GB HBM3", False)
    a.event("x")
    b.event("x")
    assert a.stem != b.stem and a.stem.startswith("gpu_verify_NVIDIA_H100_80GB_HBM3_")
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


def test_without_a_device_it_says_so(gv, capsys, monkeypatch):
    import gpuir._compat as compat

    monkeypatch.setattr(compat, "cuda_device", lambda: (False, "no driver here"))
    assert gv.main(["--steps", "scale"]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_table_of_device_results(gv):
    res = {"machine": {"device": "NVIDIA H100", "driver": "570", "cuda_runtime": 13000, "cuda_driver": 13000,
                       "cupy": "14.2", "nvrtc": "13.0", "gpuir": "0.1", "date": "d", "copy_bandwidth_gbs": 3000.0},
           "steps": {"tests": {"ok": True, "tail": ["40 passed"], "seconds": 30},
                     "racecheck": {"ok": False, "ran": True, "timed_out": True, "timeout_s": 90, "summary": []}},
           "cells": [{"step": "timings_small", "n_docs": 2700000, "batch": 1, "k": 10, "qps": 2000.0,
                      "p50_ms": 0.5, "fraction_of_floor": 0.25,
                      "phases_s": {"prep_s": 1e-4, "h2d_s": 1e-5, "score_s": 2e-4, "topk_s": 1e-4, "d2h_s": 1e-5}},
                     {"step": "bm25s", "n_docs": 2700000, "batch": 1024, "k": 10, "qps": 900.0}],
           "skipped": ["scale (budget)"]}
    md = gv.table(res)
    assert "NVIDIA H100" in md and "| 2700000 | 1 | 10 | 2000 | 0.500 |" in md and "0.250" in md
    assert "| tests | pass |" in md and "| racecheck | FAIL |" in md and "timed out after 90" in md
    assert "| 2700000 | 1024 | 10 | 900 |" in md and "scale (budget)" in md and "3000 GB/s" in md
    assert "not a GPU figure" not in md


def test_timed_repeats_stop_at_the_budget(gv):
    """A timed run is repeated only while one more, as long as the slowest so far, still ends inside the budget
    (less the reserve); the first is always timed. (A dry run on a slow CPU once ran 13 min on a 9-min budget:
    five repeats of a 47 s cell.)"""
    run = gv.Run(gv.parse_args(["--dry-run", "--budget-s", "100"]), report=None)
    assert run.another([], 5), "the first run is always timed"
    assert run.another([1.0, 2.0], 5) and not run.another([1.0] * 5, 5), "up to the number asked"
    assert not run.another([96.0], 5), "one more 96 s run would end past 100 s less the 5 s reserve"
    run.t0 -= 90  # 10 s left, 5 of them reserved
    assert run.another([4.0], 5) and not run.another([6.0], 5)
    assert run.another([], 5), "even past the budget a cell keeps one timing"


def test_the_memorys_gpu_tests_pass_on_the_kernel_model(gv):
    """The GPU-marked tests of the memory run here on the kernel model, as the dry run runs them: a GPU test
    whose own expectations are stale fails here, not first on a rare device run. (The device run of
    2026-11-27 found one: the cupy memory test still expected the sequence tie rule of mode="newest".)"""
    import subprocess

    (rest,) = gv.MODEL_TEST_MODULES[gv.REST_TEST_MODULES]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                        "gpuir.backends.model_device_plugin", "-m", "gpu", rest],
                       cwd=ROOT, check=False, capture_output=True, text=True, timeout=600)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "passed" in tail and int(tail.split(" passed")[0].split()[-1]) >= 5, tail


def test_provenance_names_the_commit_and_the_kernel_sources(gv, tmp_path, monkeypatch):
    """The kernel hash covers every .cu/.cuh by name and content (a one-byte change shows); the commit comes
    from git, else $GPUIR_COMMIT, else says why it is unknown."""
    import shutil

    src = ROOT / "kernels"
    a = tmp_path / "k"
    shutil.copytree(src, a)
    h = gv.kernel_hash(a)
    assert h == gv.kernel_hash(src) and len(h) == 64
    (a / "scatter.cu").write_bytes((a / "scatter.cu").read_bytes() + b" ")
    assert gv.kernel_hash(a) != h
    (a / "extra.cuh").write_text("//")
    assert len({gv.kernel_hash(a), h}) == 2
    (tmp_path / "k2").mkdir()
    with pytest.raises(FileNotFoundError):
        gv.kernel_hash(tmp_path / "k2")  # no kernel source there: never a hash of nothing
    monkeypatch.delenv("GPUIR_COMMIT", raising=False)
    assert gv.git_commit(tmp_path).startswith("unknown (")  # no git metadata there
    monkeypatch.setenv("GPUIR_COMMIT", "abc123")
    assert gv.git_commit(tmp_path) == "abc123"
    c = gv.git_commit()
    assert len(c.split("-")[0]) == 40 or c == "abc123" or c.startswith("unknown")
    pv = gv.provenance()
    assert set(pv) == {"commit", "kernel_sha256", "source_sha256"} and pv["kernel_sha256"] == h


def test_dry_run_memory_step_and_provenance_in_every_file(gv, tmp_path, monkeypatch):
    """The memory step on the kernel model: one and weekly partitions, B = 1 and 64, memory on cupy vs numba
    vs the static index on cupy, each cell checked bit for bit; every file names the commit and the hash."""
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setitem(gv.SIZES, "dry", {**gv.SIZES["dry"], "memory_records": 1200})
    assert gv.main(["--dry-run", "--repeats", "1", "--steps", "memory"]) == 0
    (js,) = tmp_path.glob("*.jsonl")
    events = _read_jsonl(js)
    assert events[0]["step"] == "provenance" and events[0]["kernel_sha256"] == gv.kernel_hash()
    cells = [e["cell"] for e in events if e["step"] == "memory" and "cell" in e]
    assert {(c["partition_days"], c["batch"]) for c in cells} == {(None, 1), (None, 64), (7.0, 1), (7.0, 64)}
    assert all(c["ok"] for c in cells) and all(c["memory_cupy"]["qps"] > 0 for c in cells)
    assert all(c["check"]["memory_cupy_vs_static_cupy"]["scores_bit_equal"] for c in cells)
    (res,) = [e["result"] for e in events if e.get("done")]
    assert res["ok"] and len(res["layouts"]) == 2
    for f in (js, js.with_suffix(".md"), js.with_suffix(".log")):
        text = f.read_text()
        assert gv.kernel_hash() in text and events[0]["commit"] in text, f.name
    assert "| memory: partition days |" in js.with_suffix(".md").read_text()


def test_a_memory_check_that_differs_fails(gv):
    """_same_hits fails on one other id or one score one ulp off."""
    from types import SimpleNamespace

    def res(ids, scores):
        return SimpleNamespace(ids=lambda i: ids[i], scores=np.asarray(scores, np.float32))

    a = res([["x", "y"]], [[2.0, 1.0]])
    assert gv._same_hits(a, res([["x", "y"]], [[2.0, 1.0]]), 1)["ok"]
    assert not gv._same_hits(a, res([["y", "x"]], [[2.0, 1.0]]), 1)["ok"]
    assert not gv._same_hits(a, res([["x", "y"]], [[2.0, np.nextafter(np.float32(1), np.float32(2))]]), 1)["ok"]
