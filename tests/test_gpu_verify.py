"""bench/gpu_verify.py without a device: argument parsing, the checks it applies, a tiny dry run."""

from __future__ import annotations

import importlib.util
import json
import sys
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


def test_arguments(gv):
    a = gv.parse_args([])
    assert a.parts == list(gv.PARTS) and a.n_docs == [190_000, 2_700_000, 8_800_000]
    assert a.batch == [1, 16, 128, 1024] and a.k == [10, 100, 1000] and a.budget_s == 540
    q = gv.parse_args(["--quick", "--parts", "tests", "timings"])
    assert q.parts == ["tests", "timings"] and max(q.n_docs) == 2_700_000
    d = gv.parse_args(["--dry-run", "-k", "5", "--n-docs", "1000"])
    assert d.dry_run and d.k == [5] and d.n_docs == [1000] and d.batch == gv.DRY["batch"]
    for bad in (["--parts", "nope"], ["-k", "0"], ["--budget-s", "-1"]):
        with pytest.raises(SystemExit):
            gv.parse_args(bad)


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


def test_dry_run_writes_json_and_table(gv, tmp_path, capsys):
    rc = gv.main(["--dry-run", "--out", str(tmp_path), "--parts", "sanitize", "scale", "timings", "filtered",
                  "--repeats", "1"])
    assert rc == 0
    (js,) = tmp_path.glob("gpu_verify_dryrun_*.json")
    res = json.loads(js.read_text())
    assert res["machine"]["dry_run"] is True
    assert res["parts"]["scale"]["ok"] and res["parts"]["filtered"]["ok"]
    assert {c["case"] for c in res["parts"]["scale"]["cases"]} == {"batch", "k>4096"}
    assert all(not v["ran"] for v in res["parts"]["sanitize"].values())
    assert res["parts"]["filtered"]["shapes"]["scattered"]["haystack_rows"] > 0
    md = (tmp_path / js.name.replace(".json", ".md")).read_text()
    assert "no figure below is a GPU figure" in md and "| filtered contiguous | pass |" in md
    assert md in capsys.readouterr().out


def test_without_a_device_it_says_so(gv, capsys, monkeypatch):
    import gpuir._compat as compat

    monkeypatch.setattr(compat, "cuda_device", lambda: (False, "no driver here"))
    assert gv.main(["--parts", "scale"]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_table_of_device_results(gv):
    res = {"machine": {"device": "NVIDIA H100", "driver": "570", "cuda_runtime": 12090, "cuda_driver": 12080,
                       "cupy": "14.0", "nvrtc": "12.9", "gpuir": "0.1", "date": "d"},
           "parts": {"timings": {"copy_bandwidth_gbs": 2900.0, "cells": [
               {"n_docs": 2700000, "batch": 1, "k": 10, "qps": 2000.0, "p50_ms": 0.5, "fraction_of_floor": 0.25,
                "phases_s": {"prep_s": 1e-4, "h2d_s": 1e-5, "score_s": 2e-4, "topk_s": 1e-4, "d2h_s": 1e-5}}]},
               "bm25s": {"skipped": "bm25s / numba not installed"}}, "skipped": ["timings N=8800000"]}
    md = gv.table(res)
    assert "NVIDIA H100" in md and "| 2700000 | 1 | 10 | 2000 | 0.500 |" in md and "0.250" in md
    assert "bm25s-numba: skipped" in md and "timings N=8800000" in md
    assert "not a GPU figure" not in md
