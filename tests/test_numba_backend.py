"""The compiled CPU backend (numba) equals the NumPy reference bit for bit, and is safe to share.

Every comparison is exact (``assert_array_equal`` on ids and float32 scores),
never a tolerance: the numba kernels add the very float32 weights of
``posting_weights`` in the reference's order. The corpora have many exact ties
(quantised lengths, small tfs), a term in every document but one (idf 0 under
robertson: zero weights), rare terms, and queries that run both regimes of the
pruned kernel (dense: long lists; sparse: short ones) and stop early.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _helpers import random_corpus, random_index, random_queries

pytest.importorskip("numba")

from gpuir import METHODS, BM25Index
from gpuir.backends import make_scorer, resolve_backend
from gpuir.backends.base import CollectionStats
from gpuir.backends.numba_backend import NumbaScorer, default_threads
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import BM25Params

N_DOCS, N_TERMS = 3000, 400


def assert_same(a, b):
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.scores.dtype == b.scores.dtype == np.float32 and a.ids.dtype == b.ids.dtype == np.int64


@pytest.fixture(scope="module")
def rindex():
    return random_index(N_DOCS, N_TERMS, seed=3, heavy_df=2000)


@pytest.fixture(scope="module")
def rqueries():
    qs = random_queries(N_TERMS, 120, seed=4, max_terms=9)
    rng = np.random.default_rng(5)
    # a rare term with heavy ones (MaxScore stops early), and long queries (> 32 distinct terms)
    qs += [np.array([N_TERMS - 3, 0, 1, 2], np.int64), np.array([N_TERMS - 5, 1, 1, 7], np.int64)]
    qs += [rng.choice(N_TERMS, 40, replace=False).astype(np.int64) for _ in range(3)]
    qs += [np.concatenate([np.arange(2, 60), [0, 1]]).astype(np.int64)]
    return qs


@pytest.fixture(scope="module")
def rallow(rqueries):
    rng = np.random.default_rng(6)
    sizes = [0, 1, 5, 300, 2900]  # nothing, a private haystack, nearly everything
    out = []
    for i in range(len(rqueries)):
        if i % 3 == 0:
            out.append(None)
        else:
            m = sizes[i % len(sizes)]
            out.append(np.sort(rng.choice(N_DOCS, m, replace=False)).astype(np.int64))
    return out


@pytest.mark.parametrize("method", METHODS)
def test_equals_reference_every_variant_filter_k_and_mode(rindex, rqueries, rallow, method):
    params = BM25Params(method=method)
    ref = NumpyScorer(rindex, params)
    pruned = NumbaScorer(rindex, params, prune=True, threads=2)
    full = NumbaScorer(rindex, params, prune=False, threads=1)
    regimes = set()
    for k in (1, 3, 10, 100, N_DOCS + 5):
        for allow in (None, rallow):
            want = ref.search(rqueries, k, allow)
            got = pruned.search(rqueries, k, allow)
            assert_same(got, want)
            assert_same(full.search(rqueries, k, allow), want)
            if got.meta["dense_queries"]:
                regimes.add("dense")
            if got.meta["dense_queries"] < len(rqueries):
                regimes.add("sparse")
    # both regimes of the pruned kernel ran (robertson's heavy terms weigh 0: sparse only)
    assert regimes == ({"sparse"} if method == "robertson" else {"dense", "sparse"})


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_built_corpus_identifiers_and_zipf_words(method):
    """Realistic shape: rare identifiers plus Zipf words; pruned never reads more, returns the same."""
    rng = np.random.default_rng(7)
    docs = random_corpus(4000, 500, seed=8)
    docs = [d + (f" id{rng.integers(60)}" if rng.random() < 0.05 else "") for d in docs]
    idx = BM25Index.build(docs, analyzer="plain", method=method, progress=False)
    words = [f"w{i}" for i in range(500)] + [f"id{i}" for i in range(60)]
    queries = [" ".join(rng.choice(words, size=rng.integers(1, 10))) for _ in range(150)]
    queries += ["id3 w0 w1 w2", "w0 w1 w2 w3 w4 w5", "id7 id7 w0", "w0"]
    terms = idx.query_terms(queries)
    ref = NumpyScorer(idx.csr, idx.params, prune=False)
    nb = NumbaScorer(idx.csr, idx.params, threads=1)
    full = NumbaScorer(idx.csr, idx.params, prune=False, threads=1)
    for k in (1, 10, 50):
        want = ref.search(terms, k)
        got = nb.search(terms, k)
        assert_same(got, want)
        assert got.meta["postings_scanned"] <= full.search(terms, k).meta["postings_scanned"]


@pytest.mark.parametrize("method", ["lucene", "atire", "bm25l"])
def test_pruning_skips_long_posting_lists(method):
    """The point of it: a rare term plus a very common one never scans the common list."""
    docs = [f"common word{i % 7}" for i in range(20000)] + ["needle common"] * 3
    idx = BM25Index.build(docs, analyzer="plain", method=method, progress=False)
    terms = idx.query_terms(["needle common", "common needle needle"])
    res = NumbaScorer(idx.csr, idx.params, threads=1).search(terms, k=3)
    assert res.ids.tolist() == [[20000, 20001, 20002]] * 2
    assert res.meta["postings_scanned"] == 2 * 3  # only the needle's postings: 'common' is probed
    full = NumbaScorer(idx.csr, idx.params, prune=False).search(terms, k=3)
    assert full.meta["postings_scanned"] == 2 * 20006
    assert_same(res, full)
    assert_same(res, NumpyScorer(idx.csr, idx.params).search(terms, k=3))


def test_score_matrix_equals_reference(rindex, rqueries, rallow):
    for method in ("robertson", "bm25l"):
        params = BM25Params(method=method)
        want = NumpyScorer(rindex, params).score_matrix(rqueries[:40], rallow[:40])
        got = NumbaScorer(rindex, params).score_matrix(rqueries[:40], rallow[:40])
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float32 and got.shape == (40, N_DOCS)


def test_private_haystack_is_scored_from_the_allowed_records():
    """A filter of a few hundred records costs about |allow| x terms, not the posting lists."""
    docs = [f"common word{i % 7} filler" for i in range(30000)]
    idx = BM25Index.build(docs, analyzer="plain", progress=False)
    rng = np.random.default_rng(9)
    allow = np.sort(rng.choice(30000, 300, replace=False)).astype(np.int64)
    terms = idx.query_terms(["common word3", "filler common"])
    got = NumbaScorer(idx.csr, idx.params, threads=1).search(terms, 10, [allow, allow])
    assert_same(got, NumpyScorer(idx.csr, idx.params).search(terms, 10, [allow, allow]))
    assert got.meta["postings_scanned"] <= 2 * 2 * allow.size  # 2 queries x 2 terms x |allow|
    assert np.isin(got.ids[got.ids >= 0], allow).all()


def test_collection_stats_of_a_segment_equal_the_reference(rindex, rqueries):
    """Memory segments: weights from whole-collection statistics, exactly as NumPy computes them."""
    rng = np.random.default_rng(10)
    stats = CollectionStats(n_docs=rindex.n_docs * 3, df=rindex.df + rng.integers(0, 50, rindex.n_terms),
                            avgdl=rindex.avgdl * 1.3)
    for method in ("lucene", "bm25l"):
        params = BM25Params(method=method)
        want = NumpyScorer(rindex, params, stats=stats).search(rqueries, 10)
        got = make_scorer("numba", rindex, params, stats=stats).search(rqueries, 10)
        assert_same(got, want)
        own = NumbaScorer(rindex, params).search(rqueries, 10)
        assert not np.array_equal(own.scores, got.scores)  # the statistics were used
    with pytest.raises(ValueError, match="collection"):
        NumbaScorer(rindex, BM25Params(), stats=CollectionStats(10, rindex.df[:5], 1.0))


def test_eight_threads_share_a_scorer_and_equal_serial(rindex, rqueries, rallow):
    nb = NumbaScorer(rindex, BM25Params(), threads=2)
    serial = [nb.search(rqueries, k, rallow if k % 2 else None) for k in (5, 10, 20, 33)]
    out: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(w):
        try:
            barrier.wait()
            out[w] = [nb.search(rqueries, k, rallow if k % 2 else None) for k in (5, 10, 20, 33) for _ in range(3)]
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for w in range(8):
        for j, res in enumerate(out[w]):
            assert_same(res, serial[j // 3])


def test_threads_setting_and_environment(rindex, rqueries, monkeypatch):
    one = NumbaScorer(rindex, BM25Params(), threads=1).search(rqueries, 10)
    four = NumbaScorer(rindex, BM25Params(), threads=4)
    assert_same(four.search(rqueries, 10), one)
    assert four.search(rqueries, 10).meta["threads"] == 4
    four.search(rqueries[:1], 10)
    single = NumbaScorer(rindex, BM25Params(), threads=4)
    import gpuir.backends.numba_backend as nbm

    def no_pool(n):
        raise AssertionError("a thread pool was used for one query")

    with monkeypatch.context() as mp:
        mp.setattr(nbm, "_shared_pool", no_pool)
        assert single.search(rqueries[:1], 10).meta["threads"] == 1  # no pool for one query
        with pytest.raises(AssertionError, match="thread pool"):
            single.search(rqueries[:8], 10)  # the check can fail: a batch does use the pool
    monkeypatch.setenv("GPUIR_THREADS", "3")
    assert default_threads() == 3 and NumbaScorer(rindex, BM25Params()).threads == 3
    assert NumbaScorer(rindex, BM25Params(), threads=2).threads == 2  # an explicit argument wins
    monkeypatch.setenv("GPUIR_THREADS", "many")
    with pytest.raises(ValueError, match="GPUIR_THREADS"):
        default_threads()
    monkeypatch.delenv("GPUIR_THREADS")
    assert default_threads() >= 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            NumbaScorer(rindex, BM25Params(), threads=bad)


def test_bad_input_is_a_clear_error(rindex):
    nb = NumbaScorer(rindex, BM25Params())
    with pytest.raises(ValueError, match="query 1 has term ids outside"):
        nb.search([np.array([1]), np.array([N_TERMS])], 5)
    with pytest.raises(TypeError, match="integer term ids"):
        nb.search([np.array([1.5])], 5)
    with pytest.raises(ValueError, match="sorted unique"):
        nb.search([np.array([1])], 5, [np.array([5, 3])])
    with pytest.raises(ValueError, match="sorted unique"):
        nb.search([np.array([1])], 5, [np.array([0, N_DOCS])])
    with pytest.raises(ValueError, match="one \\(or None\\) per query"):
        nb.search([np.array([1])], 5, [None, None])
    with pytest.raises(ValueError, match="positive integer"):
        nb.search([np.array([1])], 0)


def test_empty_batches_queries_and_filters(rindex):
    nb = NumbaScorer(rindex, BM25Params())
    res = nb.search([], 4)
    assert res.ids.shape == (0, 4)
    res = nb.search([np.zeros(0, np.int64), [1], [1]], 4, [None, np.zeros(0, np.int64), None])
    assert (res.ids[:2] == -1).all() and np.isneginf(res.scores[:2]).all() and (res.ids[2] >= 0).all()


def test_engine_and_memory_mapped_index(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUIR_BACKEND", raising=False)
    docs = random_corpus(800, 120, seed=11)
    idx = BM25Index.build(docs, analyzer="plain", method="bm25+", progress=False)
    queries = ["w0 w1 w7", "w3 w3", "w100 w0", "nothing", "w2 w5 w9 w11"]
    want = idx.search(queries, k=7, backend="numpy")
    assert_same(idx.search(queries, k=7, backend="numba"), want)
    idx.save(tmp_path / "ix")
    loaded = BM25Index.load(tmp_path / "ix", mmap=True)
    assert not loaded.csr.doc_ids.flags.writeable
    got = loaded.search(queries, k=7, backend="numba")
    assert_same(got, want)
    assert got.meta["backend"] == "numba"
    monkeypatch.setenv("GPUIR_BACKEND", "numba")
    name, reason = resolve_backend("auto")
    assert name == "numba" and "GPUIR_BACKEND" in reason


def test_negative_weights_disable_pruning(rindex, monkeypatch):
    """The bounds assume weights >= 0 (true of every variant); a scorer never prunes otherwise."""
    import gpuir.backends.batch_plan as bp
    from gpuir.backends.weights import PostingWeights, posting_weights

    def shifted(index, params, stats=None):
        pw = posting_weights(index, params, stats)
        return PostingWeights(pw.idf, pw.w0, (pw.weights - np.float32(0.5)).astype(np.float32), pw.ub - 0.5)

    monkeypatch.setattr(bp, "posting_weights", shifted)
    nb = NumbaScorer(rindex, BM25Params(), prune=True)
    assert nb.prune is False
    res = nb.search(rqueries_small := [np.array([0, 1, 5]), np.array([7, 9])], 5)
    assert res.meta["exhaustive_queries"] == len(rqueries_small)
    assert_same(res, NumbaScorer(rindex, BM25Params(), prune=False).search(rqueries_small, 5))
