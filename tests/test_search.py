"""Search semantics on random corpora, against an independent brute-force BM25."""

import math
from collections import Counter

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import METHODS, BM25Index
from gpuir.backends import topk_from_dense


def brute_force(docs, query, method, k1=1.2, b=0.75, delta=0.5):
    """BM25 of every document by the textbook formulas, in float64 (no gpuir code)."""
    toks = [d.split() for d in docs]
    N = len(docs)
    avgdl = sum(map(len, toks)) / N or 1.0
    df = Counter(t for d in toks for t in set(d))
    out = np.full(N, -np.inf)
    q = [t for t in query.split() if t in df]
    for i, d in enumerate(toks):
        tf = Counter(d)
        if not any(t in tf for t in q):
            continue
        L = 1 - b + b * len(d) / avgdl
        s = 0.0
        for t in q:
            n, f = df[t], tf.get(t, 0)
            if method == "lucene":
                s += math.log(1 + (N - n + 0.5) / (n + 0.5)) * f / (f + k1 * L)
            elif method == "robertson":
                s += math.log(max(1.0, (N - n + 0.5) / (n + 0.5))) * f / (f + k1 * L)
            elif method == "atire":
                s += math.log(N / n) * f * (k1 + 1) / (f + k1 * L)
            elif method == "bm25l":
                c = f / L
                s += math.log((N + 1) / (n + 0.5)) * (k1 + 1) * (c + delta) / (k1 + c + delta)
            elif method == "bm25+":
                s += math.log((N + 1) / n) * (f * (k1 + 1) / (f + k1 * L) + delta)
        out[i] = s
    return out


@pytest.fixture(scope="module")
def corpus():
    return random_corpus(1500, 300, seed=1)


@pytest.fixture(scope="module")
def index(corpus):
    return BM25Index.build(corpus, analyzer="plain")


QUERIES = ["w0 w1", "w5 w5 w17", "w250", "w3 w9 w40 w41 w299", "nothere", "", "w2 nothere w2"]


@pytest.mark.parametrize("method", METHODS)
def test_scores_match_brute_force(corpus, index, method, backend):
    idx = index.with_params(method=method)
    res = idx.search(QUERIES, k=20, backend=backend)
    for i, q in enumerate(QUERIES):
        ref = brute_force(corpus, q, method)
        valid = res.ids[i] >= 0
        got_ids, got = res.ids[i][valid], res.scores[i][valid]
        np.testing.assert_allclose(got, ref[got_ids], rtol=2e-6, atol=1e-6)
        n_cand = int(np.isfinite(ref).sum())
        assert valid.sum() == min(20, n_cand)
        if n_cand:  # nothing outside the list beats its last entry (up to float32 rounding)
            outside = np.setdiff1d(np.flatnonzero(np.isfinite(ref)), got_ids)
            if outside.size:
                assert ref[outside].max() <= got[-1] + 1e-5 * abs(got[-1])


def test_matches_dense_reference_exactly(index):
    sc = index.scorer("numpy")
    terms = index.query_terms(QUERIES)
    for k in (1, 7, 50, 5000):
        res = sc.search(terms, k)
        ref = topk_from_dense(sc.score_matrix(terms), k)
        np.testing.assert_array_equal(res.ids, ref.ids)
        np.testing.assert_array_equal(res.scores, ref.scores)


def test_padding_and_k_beyond_corpus(backend):
    idx = BM25Index.build(["a b", "b c", "c d"], analyzer="plain")
    res = idx.search(["b", "zzz"], k=10, backend=backend)
    assert res.shape == (2, 3)  # k is clamped to N (issue 23: nothing k-sized is allocated)
    assert res.ids[0].tolist() == [0, 1, -1]
    assert np.isneginf(res.scores[0][2:]).all() and np.isfinite(res.scores[0][:2]).all()
    assert (res.ids[1] == -1).all() and np.isneginf(res.scores[1]).all()


@pytest.mark.parametrize("query", ["", "   ", "the of and", "qwertyuiop", "!!! ???"])
def test_empty_stopword_and_unknown_queries_give_no_hits(query, backend):
    idx = BM25Index.build(["the cat sat", "a dog ran"], analyzer="default")
    res = idx.search([query], k=3, backend=backend)
    assert (res.ids == -1).all()


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "3"])
def test_bad_k_is_a_clear_error(index, k):
    with pytest.raises(ValueError, match="k must be a positive integer"):
        index.search("w1", k=k)


def test_non_string_query_is_a_clear_error(index):
    with pytest.raises(TypeError, match="query 1"):
        index.search(["w1", 3], k=3)


def test_empty_batch(index):
    res = index.search([], k=4)
    assert res.shape == (0, 4)


class TestFilters:
    def test_allow_list_only_returns_allowed_matching_docs(self, corpus, index, backend):
        rng = np.random.default_rng(3)
        allow = [np.sort(rng.choice(len(corpus), 40, replace=False)) for _ in QUERIES]
        res = index.search(QUERIES, k=50, filters=allow, backend=backend)
        full = index.scorer("numpy").score_matrix(index.query_terms(QUERIES))
        for i in range(len(QUERIES)):
            got = res.ids[i][res.ids[i] >= 0]
            assert set(got) <= set(allow[i])
            # never zero-score filler: exactly the allowed candidates come back
            expected = [d for d in allow[i] if np.isfinite(full[i, d])]
            assert sorted(got.tolist()) == sorted(expected)

    def test_mask_and_string_ids_equal_allow_list(self, corpus, index):
        allow = np.arange(0, len(corpus), 3)
        mask = np.zeros(len(corpus), bool)
        mask[allow] = True
        a = index.search(QUERIES, k=10, filters=allow)
        m = index.search(QUERIES, k=10, filters=mask)
        s = index.search(QUERIES, k=10, filters=[[str(d) for d in allow]] * len(QUERIES))
        np.testing.assert_array_equal(a.ids, m.ids)
        np.testing.assert_array_equal(a.ids, s.ids)

    def test_filter_applies_before_topk(self, index):
        top = index.search("w0", k=5).ids[0]
        excluded = np.setdiff1d(np.arange(index.n_docs), top[:3])
        res = index.search("w0", k=5, filters=excluded)
        assert not set(res.ids[0].tolist()) & set(top[:3].tolist())
        assert (res.ids[0] >= 0).all()  # still 5 real hits

    def test_per_query_none_means_unfiltered(self, index):
        res = index.search(["w0", "w0"], k=5, filters=[None, np.array([1, 2, 3])])
        np.testing.assert_array_equal(res.ids[0], index.search("w0", k=5).ids[0])

    @pytest.mark.parametrize(
        "bad, err",
        [
            (np.array([-1]), "must lie in"),
            (np.array([10**9]), "must lie in"),
            (np.zeros(3, bool), "one entry per document"),
            ([np.array([1])], "one filter"),
            ([["no-such-id"]] * 7, "unknown document id"),
            ([np.array([0.5])] * 7, "dtype"),
        ],
    )
    def test_bad_filters_are_clear_errors(self, index, bad, err):
        with pytest.raises((ValueError, TypeError), match=err):
            index.search(QUERIES, k=3, filters=bad)


class TestPruning:
    """MaxScore pruning never changes a result: ids and scores equal the exhaustive path's, bit for bit."""

    @pytest.mark.parametrize("method", METHODS)
    @pytest.mark.parametrize("seed", [0, 1])
    def test_pruned_equals_exhaustive(self, method, seed):
        from gpuir.backends.numpy_backend import NumpyScorer

        rng = np.random.default_rng(seed)
        docs = random_corpus(3000, 400, seed=seed + 10)
        # rare "identifier" terms in a few documents, as in agent memory
        docs = [d + (f" id{rng.integers(50)}" if rng.random() < 0.05 else "") for d in docs]
        idx = BM25Index.build(docs, analyzer="plain", method=method)
        words = [f"w{i}" for i in range(400)] + [f"id{i}" for i in range(50)]
        queries = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(150)]
        queries += ["w0 w1 w2 w3", "id3 w0 w1 w2", "w0 w0 w0 id7", "id1 id2"]
        terms = idx.query_terms(queries)
        pruned = NumpyScorer(idx.csr, idx.params, prune=True)
        full = NumpyScorer(idx.csr, idx.params, prune=False)
        allow = [None if i % 3 else np.sort(rng.choice(3000, 700, replace=False)) for i in range(len(queries))]
        for k in (1, 3, 10, 100):
            for flt in (None, allow):
                a, b = pruned.search(terms, k, flt), full.search(terms, k, flt)
                np.testing.assert_array_equal(a.ids, b.ids)
                np.testing.assert_array_equal(a.scores, b.scores)

    def test_ties_across_the_cut_survive_pruning(self):
        from gpuir.backends.numpy_backend import NumpyScorer

        # 40 identical documents holding the rare term and a common one: every score ties
        docs = ["rare common"] * 40 + ["common filler"] * 500 + ["filler"] * 100
        idx = BM25Index.build(docs, analyzer="plain")
        terms = idx.query_terms(["rare common", "common rare rare"])
        for k in (1, 5, 39, 40, 41):
            a = NumpyScorer(idx.csr, idx.params, prune=True).search(terms, k)
            b = NumpyScorer(idx.csr, idx.params, prune=False).search(terms, k)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.scores, b.scores)
            assert a.ids[0][: min(k, 40)].tolist() == list(range(min(k, 40)))

    def test_pruning_skips_long_posting_lists(self):
        """The point of it: a rare term plus a very common one never scans the common list."""
        from gpuir.backends.numpy_backend import NumpyScorer

        docs = [f"common word{i % 7}" for i in range(20000)] + ["needle common"] * 3
        idx = BM25Index.build(docs, analyzer="plain")
        terms = idx.query_terms(["needle common"])
        res = NumpyScorer(idx.csr, idx.params, prune=True).search(terms, k=3)
        assert res.ids[0].tolist() == [20000, 20001, 20002]
        assert res.meta["postings_scanned"] == 3  # only the needle's postings
        full = NumpyScorer(idx.csr, idx.params, prune=False).search(terms, k=3)
        assert full.meta["postings_scanned"] == 20006
        np.testing.assert_array_equal(res.scores, full.scores)
