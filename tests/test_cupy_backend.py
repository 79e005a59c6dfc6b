"""The cupy backend on a real device equals the NumPy reference BIT FOR BIT (tests marked ``gpu``).

Random CSR indexes of several sizes (N not a multiple of the tile, terms with
a block-max directory and terms without), every BM25 method, k = 1, k > the
number of matches, k = 1024 and k > 4096 (the sort path), empty and
out-of-vocabulary queries, repeated terms, filters on both paths (tiles and
haystack), chunking to a memory budget, the same batch twice, many threads at
once. Ids, scores (as float32 bits, up to the sign of zero, which the keys
fold), padding and tie order must equal ``NumpyScorer``'s exactly.
``test_select_kernel_on_adversarial_rows`` feeds the selection kernel
hand-made candidate sets (ties across the k-th place, scores a few ulp apart,
-0.0 next to +0.0, negative scores, thresholds). The same logic runs without a
device on the kernel model in ``tests/test_kernel_logic.py``; these tests are
what a device adds: the real kernel bodies, atomics, barriers, the memory model.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import METHODS, BM25Params
from gpuir.index.csr import CSRIndex


def scorers(index: CSRIndex, method: str, **opts):
    from gpuir.backends.cupy_backend import CupyScorer

    p = BM25Params(method=method)
    return NumpyScorer(index, p), CupyScorer(index, p, **opts)


def assert_exact(a, b, where=""):
    assert b.ids.shape == a.ids.shape and b.ids.dtype == np.int64 and b.scores.dtype == np.float32
    assert np.array_equal(a.ids, b.ids), where
    mag = np.uint32(0x7FFFFFFF)
    assert np.array_equal(a.scores.view(np.uint32) & mag, b.scores.view(np.uint32) & mag), where


SIZES = [(1000, 60, 9), (5003, 300, 40), (70001, 1500, 6)]


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"N{s[0]}")
def test_search_and_dense_rows_equal_numpy(method, size):
    N, V, B = size
    idx = random_index(N, V, seed=N)
    ref, gpu = scorers(idx, method)
    qs = random_queries(V, B, seed=1)
    for k in (1, 10, 1024):
        a, b = ref.search(qs, k), gpu.search(qs, k)
        assert_exact(a, b, f"{method} N={N} k={k}")
    gpu.timing = True
    b = gpu.search(qs, 10)
    assert set(b.meta["timings"]) >= {"prep_s", "h2d_s", "plan_s", "score_s", "topk_s", "d2h_s", "total_s"}
    assert np.array_equal(ref.score_matrix(qs), gpu.score_matrix(qs))


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_statistics_per_search_without_re_upload(method):
    """One upload; each search applies other statistics (a growing collection) and equals NumPy under them."""
    from gpuir.backends.base import CollectionStats

    idx = random_index(9001, 300, seed=5)
    p = BM25Params(method=method)
    gpu = scorers(idx, method)[1]
    qs = random_queries(300, 40, seed=6)
    rng = np.random.default_rng(7)
    for grow in (0, 50, 5000):
        stats = CollectionStats(idx.n_docs + grow, idx.df.astype(np.int64) + rng.integers(0, grow + 1, idx.n_terms),
                                idx.avgdl * (1 + grow / 10**4))
        assert_exact(NumpyScorer(idx, p, stats=stats).search(qs, 20), gpu.search(qs, 20, stats=stats), f"+{grow}")
    assert gpu.uploads == 1


@pytest.mark.gpu
def test_live_mask_hides_deleted_documents():
    """live=False documents are never candidates (tile and haystack paths); the same as allowing only live ones."""
    N = 7001
    idx = random_index(N, 200, seed=9)
    rng = np.random.default_rng(10)
    live = rng.random(N) > 0.3
    qs = random_queries(200, 30, seed=11)
    live_docs = np.flatnonzero(live)
    allow = [None if i % 2 else np.sort(rng.choice(N, 400, replace=False)) for i in range(len(qs))]
    both = [live_docs if a is None else np.intersect1d(a, live_docs) for a in allow]
    for method, hay in (("lucene", "never"), ("bm25l", "always")):
        ref, gpu = scorers(idx, method, haystack=hay)
        assert_exact(ref.search(qs, 15, both), gpu.search(qs, 15, allow, live=live), f"{method} {hay}")
        assert np.array_equal(ref.score_matrix(qs[:3], both[:3]), gpu.score_matrix(qs[:3], allow[:3], live=live))


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4096, 4097, 6000])
def test_large_k_sort_path(k):
    idx = random_index(5003, 200, seed=3)
    ref, gpu = scorers(idx, "lucene")
    qs = random_queries(200, 6, seed=3)
    assert_exact(ref.search(qs, k), gpu.search(qs, k))


@pytest.mark.gpu
def test_k_larger_than_matches_and_collection():
    idx = random_index(300, 40, seed=4, heavy_df=50)
    ref, gpu = scorers(idx, "bm25+")
    qs = [np.array([39], np.int64), np.array([1, 39], np.int64), np.zeros(0, np.int64)]
    b = gpu.search(qs, 500)
    assert_exact(ref.search(qs, 500), b)
    assert (b.ids[2] == -1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lucene", "bm25l"])
@pytest.mark.parametrize("haystack", ["auto", "never", "always"])
def test_filters_on_both_paths(method, haystack):
    N, V = 50003, 300
    idx = random_index(N, V, seed=5)
    ref, gpu = scorers(idx, method, haystack=haystack)
    qs = random_queries(V, 9, seed=5)
    rng = np.random.default_rng(5)
    allow = [
        None,
        np.zeros(0, np.int64),
        np.sort(rng.choice(N, 500, replace=False)).astype(np.int64),       # a scattered haystack
        np.arange(20000, 20500, dtype=np.int64),                           # a contiguous tenant
        np.arange(N, dtype=np.int64),
        np.array([N - 1], np.int64),
        None,
        np.arange(0, N, 3, dtype=np.int64),
        np.sort(rng.choice(N, N // 2, replace=False)).astype(np.int64),
    ]
    for k in (1, 10, 1024):
        assert_exact(ref.search(qs, k, allow), gpu.search(qs, k, allow), f"{haystack} k={k}")
    assert np.array_equal(ref.score_matrix(qs, allow), gpu.score_matrix(qs, allow))


@pytest.mark.gpu
def test_same_batch_twice_and_many_threads():
    idx = random_index(70001, 800, seed=6)
    ref, gpu = scorers(idx, "bm25+")
    qs = random_queries(800, 64, seed=6)
    want = ref.search(qs, 100)
    first, second = gpu.search(qs, 100), gpu.search(qs, 100)
    assert_exact(want, first)
    assert_exact(first, second)
    out: list = [None] * 8
    errors: list = []

    def work(i):
        try:
            out[i] = gpu.search(qs[i::8], 100)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for i in range(8):
        assert_exact(ref.search(qs[i::8], 100), out[i])


@pytest.mark.gpu
def test_memory_budget_chunks_and_errors():
    from gpuir.backends.cupy_backend import CupyScorer

    N, V = 70001, 500
    idx = random_index(N, V, seed=7)
    qs = random_queries(V, 37, seed=7)
    ref, _ = scorers(idx, "lucene")
    small = CupyScorer(idx, BM25Params(), memory_budget_bytes=300_000, graphs=False)
    b = small.search(qs, 100)
    assert_exact(ref.search(qs, 100), b)
    assert b.meta["n_chunks"] >= 2
    with pytest.raises(MemoryError, match="memory_budget_bytes"):
        CupyScorer(idx, BM25Params(), memory_budget_bytes=1000, graphs=False).search(qs, 10)
    with pytest.raises(ValueError, match="outside"):
        small.search(qs[:1], 10, [np.array([N])])


@pytest.mark.gpu
def test_engine_search_cupy_equals_numpy():
    from gpuir.engine import BM25Index

    texts = [f"memory {i % 7} session note {i % 13} agent {'alpha' if i % 3 else 'beta'}" for i in range(4099)]
    index = BM25Index.build(texts, analyzer="nostem", progress=False)  # no PyStemmer needed on the device
    qs = ["memory note", "alpha alpha beta", "zzzz unknown", "", "agent 3"]
    a = index.search(qs, k=20, backend="numpy")
    b = index.search(qs, k=20, backend="cupy")
    assert b.meta["backend"] == "cupy"
    assert_exact(a, b)


@pytest.mark.gpu
def test_parity_report_on_gpu():
    from gpuir.engine import BM25Index
    from gpuir.parity import parity_report

    texts = [f"doc {i} about topic {i % 11} and {i % 5}" for i in range(2000)]
    index = BM25Index.build(texts, analyzer="nostem", progress=False)
    qrels = {"0": {"5": 1}, "1": {"17": 2, "nope": 1}}
    rep = parity_report(index, ["topic 5", "topic 6 doc"], k=100, qrels=qrels)
    assert rep["topk_agree_share"] == 1.0 and rep["candidate_mismatches"] == 0
    assert rep["exact_share"] == 1.0 and rep["max_abs_dscore_dense"] == 0.0
    assert abs(rep["ndcg@10"]["delta"]) < 1e-12


def _adversarial_keys(N: int, seed: int) -> list[np.ndarray]:
    """Rows of (score) with -inf = not a candidate, that stress the radix select."""
    rng = np.random.default_rng(seed)
    f = np.float32
    rows = np.full((7, N), -np.inf, f)
    rows[0, rng.choice(N, N // 2, replace=False)] = f(2.5)
    idx = rng.choice(N, 2 * N // 3, replace=False)
    rows[1, idx] = rng.choice(np.array([1.0, 2.0, 3.0], f), idx.size)
    idx = rng.choice(N, N // 2, replace=False)
    rows[2, idx] = (np.array(f(1.0)).view(np.int32) + rng.integers(0, 2048, idx.size).astype(np.int32)).view(f)
    idx = rng.choice(N, N // 2, replace=False)
    rows[3, idx] = rng.choice(np.array([-0.0, 0.0, -1.5, -1e-30, 1e-30], f), idx.size)
    idx = rng.choice(N, 5 * N // 6, replace=False)
    rows[4, idx] = (rng.standard_normal(idx.size) * 3).astype(f)
    rows[6, [0, N - 1]] = f(1.0)
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 2, 100, 2049, 4096, 4097])
def test_select_kernel_on_adversarial_rows(k):
    """select_topk (k <= 4096) and the sort path over shuffled candidate keys, exactly the tie rule."""
    import cupy as cp

    from gpuir.backends import kernel_model as km
    from gpuir.backends.cupy_backend import CupyScorer

    N = 6001
    gpu = CupyScorer(random_index(N, 20, seed=8), BM25Params())
    rows = _adversarial_keys(N, seed=k)
    B = rows.shape[0]
    rng = np.random.default_rng(k)
    keys, off = [], [0]
    for b in range(B):
        d = rng.permutation(np.flatnonzero(rows[b] > -np.inf))
        keys.append(km.composite_key(rows[b, d], d))
        off.append(off[-1] + d.size + 3)  # spare slots that must never be read
    cand = np.zeros(off[-1], np.uint64)
    for b in range(B):
        cand[off[b]:off[b] + keys[b].size] = keys[b]
        cand[off[b] + keys[b].size: off[b + 1]] = np.uint64(0xDEADBEEF)  # garbage beyond counts
    counts = np.array([x.size for x in keys], np.int32)
    want = topk_from_dense(rows, k)
    ids = cp.empty((B, k), cp.int64)
    out = cp.empty((B, k), cp.float32)
    gpu._select(gpu._acquire(), cp.asarray(cand), cp.asarray(np.array(off, np.int64)), cp.asarray(counts),
                cp.zeros(B, cp.uint32), B, k, int(np.diff(off).max()), ids, out)
    assert np.array_equal(ids.get(), want.ids)
    assert np.array_equal(out.get(), want.scores)


def test_host_prep_without_device():
    """The host side (vectorised prep) runs without a GPU: pairs, multiplicities, idf, row constants, paths."""
    from gpuir.backends import cupy_backend as cb
    from gpuir.backends.base import CollectionStats, weigh_queries

    idx = random_index(5003, 50, seed=7)
    p = BM25Params(method="bm25l")
    ref = NumpyScorer(idx, p)
    qs = [np.array([0, 0, 1, 7], np.int64), np.zeros(0, np.int64), np.array([1], np.int64)]
    wq = weigh_queries(qs, CollectionStats.of(idx), p)
    f, ao, ad = cb.check_allow([None, None, np.array([3, 9], np.int64)], 3, 5003)
    b = cb.prepare_batch(wq, f, ao, ad, df=idx.df.astype(np.int64), n_tiles=2, tile=4096, postings_per_doc=3.0,
                         haystack="auto")
    assert b.qt_off.tolist() == [0, 3, 3, 4]
    assert b.qt_term.tolist() == [0, 1, 7, 1] and b.qt_mult.tolist() == [2.0, 1.0, 1.0, 1.0]
    assert np.array_equal(b.qt_idf, ref.idf[[0, 1, 7, 1]]) and np.array_equal(b.qt_w0, ref.w0[[0, 1, 7, 1]])
    terms, mult = np.unique(qs[0], return_counts=True)
    assert b.row_const[0] == np.float32((ref.w0[terms] * mult).sum(dtype=np.float32)) and b.row_const[1] == 0
    assert b.filtered.tolist() == [False, False, True] and b.allow_docs.tolist() == [3, 9]
    assert b.path.tolist() == [cb.PATH_TILES, cb.PATH_NONE, cb.PATH_HAYSTACK]
    sc = cb.search_consts(p, 7.25)
    assert sc.one_minus_b == np.float32(1) - np.float32(0.75) and sc.k1p1 == np.float32(1.2) + np.float32(1)
    assert sc.method == 3 and sc.has_w0 == 1 and all(type(x) in (np.int32, np.float32) for x in sc.args())
    bits = cb.live_bits(np.arange(70) % 3 != 0, 70)
    assert bits.dtype == np.uint32 and bits.size == 3
    assert [bool((bits[d >> 5] >> (d & 31)) & 1) for d in range(70)] == [d % 3 != 0 for d in range(70)]
    with pytest.raises(ValueError, match="bool array of shape"):
        cb.live_bits(np.ones(69, bool), 70)


def test_unsorted_postings_are_refused_before_upload():
    """The kernels' atomic-free accumulation needs strictly increasing doc ids per term: checked, clear error."""
    from gpuir.backends.cupy_backend import CupyScorer
    from gpuir.backends.kernel_model import fake_cupy_installed
    from gpuir.index.csr import check_postings_sorted

    idx = random_index(3000, 40, seed=3)
    check_postings_sorted(idx.offsets, idx.doc_ids)  # a built index passes
    t = int(np.flatnonzero(np.diff(idx.offsets) >= 3)[1])
    o = int(idx.offsets[t])
    for bad in ("swap", "repeat"):
        doc_ids = idx.doc_ids.copy()
        if bad == "swap":
            doc_ids[[o, o + 1]] = doc_ids[[o + 1, o]]
        else:
            doc_ids[o + 1] = doc_ids[o]
        broken = CSRIndex(idx.offsets, doc_ids, idx.tfs, idx.doc_lens, idx.vocab, idx.ids)
        with pytest.raises(ValueError, match=f"term {t}'s postings are not strictly increasing"):
            check_postings_sorted(broken.offsets, broken.doc_ids)
        with pytest.raises(ValueError, match="strictly increasing"):
            broken.validate()
        with fake_cupy_installed(seed=0), pytest.raises(ValueError, match=f"term {t}'s postings"):
            CupyScorer(broken, BM25Params())
    # a term boundary is not a violation: the last doc of one term may exceed the first of the next
    check_postings_sorted(np.array([0, 2, 4], np.int64), np.array([5, 9, 1, 2], np.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["lucene", "bm25l"])
def test_graphs_equal_the_ordinary_path(method):
    """Agent-sized batches (1-64 rows) through captured CUDA graphs: the same results as without graphs."""
    idx = random_index(20011, 400, seed=12)
    qs = [q for q in random_queries(400, 90, seed=13) if q.size][:64]
    rng = np.random.default_rng(14)
    allow = [None if i % 3 else np.sort(rng.choice(20011, 3000, replace=False)) for i in range(64)]
    ref, gpu = scorers(idx, method, haystack="never")
    plain = scorers(idx, method, haystack="never", graphs=False)[1]
    for B, k in ((1, 10), (1, 10), (5, 100), (64, 7), (33, 1)):
        sub, al = qs[:B], allow[:B]
        g = gpu.search(sub, k, al)
        assert_exact(ref.search(sub, k, al), g, f"B={B} k={k}")
        assert_exact(plain.search(sub, k, al), g, f"plain B={B}")
        assert g.meta["graph_runs"] == 1 and plain.search(sub, k, al).meta["graph_runs"] == 0
