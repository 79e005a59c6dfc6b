"""One home per concept: top-k with the tie rule, allow masks, "device unavailable", result unpacking."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import gpuir
from gpuir.backends import DeviceUnavailable, resolve_backend
from gpuir.filters import allow_mask, normalize_filters
from gpuir.results import SearchResults
from gpuir.topk import kth_largest, topk_pairs, topk_rows


def test_search_results_unpack():
    ids = np.array([[3, 1, -1]], np.int64)
    sc = np.array([[2.0, 1.0, -np.inf]], np.float32)
    res = SearchResults(ids, sc, {"backend": "numpy"})
    got_ids, got_scores = res
    assert got_ids is ids and got_scores is sc
    assert len(res) == 1  # still the number of queries


def test_search_returns_unpackable_results():
    from gpuir.engine import BM25Index

    index = BM25Index.build(["alpha beta", "beta gamma", "gamma delta alpha"], progress=False)
    ids, scores = index.search("alpha", k=2, backend="numpy")
    assert ids.shape == scores.shape == (1, 2)
    assert sorted(ids[0].tolist()) == [0, 2]


def test_topk_pairs_tie_rule():
    ids = np.array([9, 4, 7, 1, 5], np.int64)
    sc = np.array([1.0, 3.0, 3.0, 3.0, 0.5], np.float32)
    i, s = topk_pairs(ids, sc, 2)
    assert i.tolist() == [1, 4] and s.tolist() == [3.0, 3.0]  # ties: lower id first
    i, _ = topk_pairs(ids, sc, 10)
    assert i.tolist() == [1, 4, 7, 9, 5]
    assert topk_pairs(ids, sc, 0)[0].size == 0


def test_topk_rows_per_row_ids_and_nan():
    s = np.array([[0.5, 2.0, 2.0, np.nan], [1.0, -np.inf, 1.0, 3.0]])
    col = np.array([[2, 5, 8, 9], [0, 1, 4, 6]])
    ids, sc = topk_rows(s, 3, col_ids=col)
    assert ids.tolist() == [[5, 8, 2], [6, 0, 4]]
    assert sc.dtype == np.float32 and sc[0].tolist() == [2.0, 2.0, 0.5]
    ids, _ = topk_rows(s, 5)
    assert ids.tolist() == [[1, 2, 0, -1, -1], [3, 0, 2, -1, -1]]


def test_kth_largest_exact_on_large_input():
    rng = np.random.default_rng(1)
    v = rng.random(100_000).astype(np.float32)
    assert kth_largest(v, 7) == float(np.sort(v)[-7])


def test_allow_mask_matches_allow_lists():
    allow = normalize_filters([np.array([3, 1]), None, np.array([], np.int64)], 3, 5)
    m = allow_mask(allow, 5)
    assert m.tolist() == [[False, True, False, True, False], [True] * 5, [False] * 5]


def test_device_unavailable_is_one_type_with_one_line(monkeypatch):
    from gpuir import backends

    monkeypatch.delenv("GPUIR_BACKEND", raising=False)
    monkeypatch.setattr(backends, "cuda_device", lambda: (False, "no driver here"))
    with pytest.raises(DeviceUnavailable) as ei:
        resolve_backend("cupy")
    msg = str(ei.value)
    assert "\n" not in msg and "no driver here" in msg and "gpuir[gpu]" in msg
    assert isinstance(ei.value, RuntimeError) and isinstance(ei.value, ValueError)
    from gpuir.parity import NoGPUError

    assert NoGPUError is DeviceUnavailable


def test_cupy_scorer_without_device_raises_device_unavailable(monkeypatch):
    from gpuir.backends import cupy_backend, make_scorer
    from gpuir.engine import BM25Index

    monkeypatch.setattr(cupy_backend, "cuda_device", lambda: (False, "no driver here"))
    index = BM25Index.build(["alpha beta"], progress=False)
    with pytest.raises(DeviceUnavailable, match="no driver here"):
        make_scorer("cupy", index.csr, index.params)


def test_one_backend_resolver_and_one_kernel_loader():
    """No module but gpuir/backends resolves backends or builds a RawModule of its own."""
    root = Path(gpuir.__file__).parent
    for f in root.rglob("*.py"):
        rel = f.relative_to(root)
        if rel.parts[0] == "backends":
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                assert node.name != "_resolve_backend", f"{rel} defines its own backend resolver"
            if isinstance(node, ast.Attribute):
                assert node.attr != "RawModule", f"{rel} compiles a kernel outside gpuir.backends.kernels"


def test_eval_registry_and_bm25_variants_have_distinct_names():
    from gpuir import bm25
    from gpuir.eval import runner

    assert not hasattr(runner, "METHODS") and isinstance(runner.EVAL_METHODS, dict)
    assert "lucene" in bm25.METHODS


def test_encoder_device_follows_the_backend_request(monkeypatch):
    from gpuir.backends import torch_device

    monkeypatch.delenv("GPUIR_DISABLE_GPU", raising=False)
    monkeypatch.setenv("GPUIR_BACKEND", "numpy")
    assert torch_device("auto") == "cpu"
    monkeypatch.setenv("GPUIR_BACKEND", "numba")
    assert torch_device() == "cpu"
    monkeypatch.delenv("GPUIR_BACKEND")
    assert torch_device("numpy") == "cpu" and torch_device("cupy") == "cuda"
    monkeypatch.setenv("GPUIR_DISABLE_GPU", "1")
    assert torch_device("auto") == "cpu"
    with pytest.raises(ValueError, match="choose one of"):
        torch_device("tpu")


def test_topk_order_gathers_alike():
    from gpuir.topk import topk_order

    ids = np.array([9, 4, 7, 1, 5], np.int64)
    sc = np.array([1.0, 3.0, 3.0, 3.0, 0.5], np.float32)
    assert topk_order(ids, sc, 3).tolist() == [3, 1, 2]
    assert topk_order(ids, sc, 9).tolist() == [3, 1, 2, 0, 4]


def test_durability_has_one_home():
    """The service and the shards write through their memory's own log: neither appends to a log of its own."""
    root = Path(gpuir.__file__).parent
    own = []
    for pkg in ("service", "cluster"):
        for f in sorted((root / pkg).glob("*.py")):
            names = {n.id for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.Attribute)}
            if names & {"WriteAheadLog", "append_payloads", "write_payloads"}:
                own.append(f.name)
    assert own == []
    src = (root / "memory" / "durable.py").read_text()
    assert "WriteAheadLog(" in src and "write_payloads" in src
