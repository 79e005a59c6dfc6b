"""Parity of the cupy backend with the NumPy reference (needs a GPU: marked ``gpu``).

Random CSR indexes of several sizes (N not a multiple of any block size, terms
with more postings than one scoring chunk), every BM25 method, k = 1, k > the
number of matches, k = 1024 and k > 4096 (the sort path), empty and
out-of-vocabulary queries, repeated terms, filters, memory-budget chunking.
Scores are compared within float32 tolerance (atomics reorder additions) and
top-k up to ties (:func:`gpuir.parity.topk_agree`); single-term queries, whose
sums are exact, must match the reference exactly, tie order included.
``test_topk_kernels_on_adversarial_rows`` feeds the top-k kernels hand-made
rows (ties across the k-th place, scores a few ulp apart, -0.0 next to +0.0,
negative scores) and needs the reference's result exactly. The same logic is
checked without a GPU, by emulation, in ``tests/test_kernel_logic.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import METHODS, BM25Params
from gpuir.index.csr import CSRIndex
from gpuir.parity import topk_agree

RTOL, ATOL = 2e-5, 2e-6


def scorers(index: CSRIndex, method: str, **opts):
    from gpuir.backends.cupy_backend import CupyScorer

    p = BM25Params(method=method)
    return NumpyScorer(index, p), CupyScorer(index, p, **opts)


def check_search(ref, gpu, qs, k, allow=None):
    a = ref.search(qs, k, allow)
    b = gpu.search(qs, k, allow)
    assert b.ids.shape == (len(qs), k) and b.ids.dtype == np.int64 and b.scores.dtype == np.float32
    # Padding is -1 / -inf, exactly where the reference pads.
    assert np.array_equal(b.ids < 0, a.ids < 0)
    assert np.all(np.isneginf(b.scores[b.ids < 0]))
    ok = topk_agree(a.ids, a.scores, b.ids, b.scores, rtol=RTOL, atol=ATOL)
    assert ok.all(), f"top-k differ beyond ties for queries {np.flatnonzero(~ok).tolist()}"
    # Rows sorted by the tie rule.
    for i in range(len(qs)):
        m = b.ids[i] >= 0
        s, d = b.scores[i][m], b.ids[i][m]
        assert np.all((s[:-1] > s[1:]) | ((s[:-1] == s[1:]) & (d[:-1] < d[1:])))
    return a, b


SIZES = [(1000, 60, 9), (5003, 300, 40), (70001, 1500, 6)]


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"N{s[0]}")
def test_dense_rows_match(method, size):
    N, V, B = size
    idx = random_index(N, V, seed=N)
    ref, gpu = scorers(idx, method)
    qs = random_queries(V, B, seed=1)
    a, b = ref.score_matrix(qs), gpu.score_matrix(qs)
    assert b.shape == (B, N) and b.dtype == np.float32
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), "candidate sets differ"
    m = np.isfinite(a)
    np.testing.assert_allclose(b[m], a[m], rtol=RTOL, atol=ATOL)
    # The kernel top-k against the reference top-k of the GPU's own dense rows.
    for k in (1, 17, 1024):
        ref_k = topk_from_dense(b, k)
        got = gpu.search(qs, k)
        assert topk_agree(ref_k.ids, ref_k.scores, got.ids, got.scores, rtol=RTOL, atol=ATOL).all()


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"N{s[0]}")
@pytest.mark.parametrize("k", [1, 10, 1024])
def test_search_matches(method, size, k):
    N, V, B = size
    idx = random_index(N, V, seed=N)
    ref, gpu = scorers(idx, method)
    qs = random_queries(V, B, seed=2)
    a, b = check_search(ref, gpu, qs, k)
    # One-term queries have exact sums: identical results, tie order included.
    for i in (2, 3, 4):
        assert np.array_equal(a.ids[i], b.ids[i])
        assert np.array_equal(a.scores[i], b.scores[i])
    assert set(b.meta["timings"]) >= {"h2d_s", "score_s", "topk_s", "d2h_s", "total_s"}


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4097, 6000])
def test_large_k_sort_path(k):
    idx = random_index(5003, 200, seed=3)
    ref, gpu = scorers(idx, "lucene")
    qs = random_queries(200, 6, seed=3)
    check_search(ref, gpu, qs, k)


@pytest.mark.gpu
def test_k_larger_than_matches_and_collection():
    idx = random_index(300, 40, seed=4, heavy_df=50)
    ref, gpu = scorers(idx, "bm25+")
    qs = [np.array([39], np.int64), np.array([1, 39], np.int64), np.zeros(0, np.int64)]
    _, b = check_search(ref, gpu, qs, 500)
    assert (b.ids[2] == -1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lucene", "bm25l"])
def test_filters(method):
    N, V = 5003, 300
    idx = random_index(N, V, seed=5)
    ref, gpu = scorers(idx, method)
    qs = random_queries(V, 8, seed=5)
    rng = np.random.default_rng(5)
    allow = [
        None,
        np.zeros(0, np.int64),                                            # nothing allowed
        np.sort(rng.choice(N, 50, replace=False)).astype(np.int64),       # small allow-list
        np.sort(rng.choice(N, N // 2, replace=False)).astype(np.int64),   # half
        np.arange(N, dtype=np.int64),                                     # everything
        np.array([N - 1], np.int64),                                      # the last document
        None,
        np.arange(0, N, 3, dtype=np.int64),
    ]
    for k in (1, 10, 1024):
        _, b = check_search(ref, gpu, qs, k, allow)
        for i, al in enumerate(allow):
            if al is not None:
                got = b.ids[i][b.ids[i] >= 0]
                assert np.isin(got, al).all()
    da, db = ref.score_matrix(qs, allow), gpu.score_matrix(qs, allow)
    assert np.array_equal(np.isfinite(da), np.isfinite(db))


@pytest.mark.gpu
def test_memory_budget_chunks_and_errors():
    N, V = 70001, 500
    idx = random_index(N, V, seed=6)
    qs = random_queries(V, 37, seed=6)
    ref, _ = scorers(idx, "lucene")
    from gpuir.backends.cupy_backend import CupyScorer

    small = CupyScorer(idx, BM25Params(), memory_budget_bytes=5 * (4 * N + 8 * ((N + 31) // 32) + 12 * 100))
    _, b = check_search(ref, small, qs, 100)
    assert b.meta["n_chunks"] >= 7 and b.meta["rows_per_chunk"] <= 5
    tiny = CupyScorer(idx, BM25Params(), memory_budget_bytes=1000)
    with pytest.raises(MemoryError, match="memory_budget_bytes"):
        tiny.search(qs, 10)
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        CupyScorer(idx, BM25Params(), memory_budget_bytes=-1)


@pytest.mark.gpu
def test_engine_search_cupy_matches_numpy():
    from gpuir.engine import BM25Index

    texts = [f"memory {i % 7} session note {i % 13} agent {'alpha' if i % 3 else 'beta'}" for i in range(4099)]
    index = BM25Index.build(texts, progress=False)
    qs = ["memory note", "alpha alpha beta", "zzzz unknown", "", "agent 3"]
    a = index.search(qs, k=20, backend="numpy")
    b = index.search(qs, k=20, backend="cupy")
    assert b.meta["backend"] == "cupy"
    assert topk_agree(a.ids, a.scores, b.ids, b.scores, rtol=RTOL, atol=ATOL).all()


@pytest.mark.gpu
def test_parity_report_on_gpu():
    from gpuir.engine import BM25Index
    from gpuir.parity import parity_report

    texts = [f"doc {i} about topic {i % 11} and {i % 5}" for i in range(2000)]
    index = BM25Index.build(texts, progress=False)
    qrels = {"0": {"5": 1}, "1": {"17": 2, "nope": 1}}
    rep = parity_report(index, ["topic 5", "topic 6 doc"], k=100, qrels=qrels)
    assert rep["topk_agree_share"] == 1.0 and rep["candidate_mismatches"] == 0
    assert abs(rep["ndcg@10"]["delta"]) < 1e-9


def test_host_prep_without_device():
    """The host side of the cupy backend (pairs, chunks, row constants) runs without a GPU."""
    from gpuir import bm25
    from gpuir.backends import kernels as K
    from gpuir.backends.cupy_backend import CupyScorer

    idx = random_index(5003, 50, seed=7)
    p = BM25Params(method="bm25l")
    s = object.__new__(CupyScorer)  # bypass the device upload
    s.index, s.params = idx, p
    idf = bm25.idf(idx.df, idx.n_docs, p.method)
    s.w0 = bm25.absent_weight(idf, p)
    s._df = idx.df
    qs = [np.array([0, 0, 1, 7], np.int64), np.zeros(0, np.int64), np.array([1], np.int64)]
    h = s._prep(qs, [None, None, np.array([3, 9], np.int64)])
    assert h["pair_q"].tolist() == [0, 0, 0, 2]
    assert h["pair_t"].tolist() == [0, 1, 7, 1]
    assert h["pair_m"].tolist() == [2.0, 1.0, 1.0, 1.0]
    expect = np.concatenate([[0], np.cumsum(-(-idx.df[[0, 1, 7, 1]] // K.SCORE_CHUNK))])
    assert h["chunk_start"].tolist() == expect.tolist()
    assert h["chunk_start"][1] - h["chunk_start"][0] == -(-5002 // K.SCORE_CHUNK)  # several chunks
    assert h["row_const"][1] == 0 and h["row_const"][0] > 0
    ref = NumpyScorer(idx, p)
    terms, mult = np.unique(qs[0], return_counts=True)
    assert h["row_const"][0] == np.float32((ref.w0[terms] * mult).sum(dtype=np.float32))
    assert h["allow_row"].tolist() == [-1, -1, 0]
    assert h["allow_docs"].tolist() == [3, 9] and h["allow_rows"].tolist() == [0, 0]


def _adversarial_dense(N: int, seed: int) -> np.ndarray:
    """Rows of raw sums (-inf = not a candidate) that stress the radix select."""
    rng = np.random.default_rng(seed)
    f = np.float32
    rows = np.full((7, N), -np.inf, f)
    rows[0, rng.choice(N, N // 2, replace=False)] = f(2.5)                       # all tied
    idx = rng.choice(N, 2 * N // 3, replace=False)
    rows[1, idx] = rng.choice(np.array([1.0, 2.0, 3.0], f), idx.size)              # ties straddle k
    idx = rng.choice(N, N // 2, replace=False)                                     # 1.0 + j ulp:
    rows[2, idx] = (np.array(f(1.0)).view(np.int32) + rng.integers(0, 2048, idx.size).astype(np.int32)).view(f)
    idx = rng.choice(N, N // 2, replace=False)
    rows[3, idx] = rng.choice(np.array([-0.0, 0.0, -1.5, -1e-30, 1e-30], f), idx.size)  # signs, -0.0
    idx = rng.choice(N, 5 * N // 6, replace=False)
    rows[4, idx] = (rng.standard_normal(idx.size) * 3).astype(f)
    rows[6, [0, N - 1]] = f(1.0)                                                   # row 5: none
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 2, 100, 2049, 4096, 4097])
def test_topk_kernels_on_adversarial_rows(k):
    """topk_rows (k <= 4096) and the sort path against the reference tie rule, exactly."""
    import cupy as cp

    from gpuir.backends.cupy_backend import CupyScorer

    N = 6001
    idx = random_index(N, 20, seed=8)
    gpu = CupyScorer(idx, BM25Params())
    raw = _adversarial_dense(N, seed=k)
    B, W = raw.shape[0], gpu.n_words
    touched = np.zeros((B, W), np.uint32)
    for b in range(B):
        d = np.flatnonzero(raw[b] > -np.inf)
        np.bitwise_or.at(touched[b], d >> 5, (np.uint32(1) << (d & 31).astype(np.uint32)))
    for c in (np.float32(0), np.float32(0.5)):
        row_const = np.full(B, c, np.float32)
        scores = np.where(np.isfinite(raw), raw, np.float32(7)).astype(np.float32)  # junk where untouched
        want = topk_from_dense(np.where(np.isfinite(raw), raw + c, -np.inf).astype(np.float32), k)
        ids, out = gpu._topk_chunk(cp.asarray(scores), cp.asarray(touched), cp.asarray(row_const), B, k)
        assert np.array_equal(ids.get(), want.ids), f"k={k} c={c}"
        assert np.array_equal(out.get(), want.scores), f"k={k} c={c}"
