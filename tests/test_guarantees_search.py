"""Guarantees of search (docs/guarantees.md, "Search"): thread safety, finite scores, validated input."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import METHODS, BM25Index, BM25Params
from gpuir.bm25 import DELTA_MAX, K1_RANGE

N_DOCS = 2500


@pytest.fixture(scope="module")
def index():
    return BM25Index.build(random_corpus(N_DOCS, 400, seed=11), analyzer="plain")


def _workload(seed: int = 0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(400)]
    queries = [" ".join(rng.choice(words, size=rng.integers(1, 7))) for _ in range(96)]
    filters = [np.sort(rng.choice(N_DOCS, size=rng.integers(1, 600), replace=False)) if i % 2 else None
               for i in range(len(queries))]
    return queries, filters


# -- thread safety: concurrent answers equal the serial ones, every backend


@pytest.mark.parametrize("filtered", [False, True], ids=["unfiltered", "filtered"])
def test_concurrent_search_equals_serial(index, backend, filtered):
    queries, filters = _workload()
    if not filtered:
        filters = None
    ks = (1, 5, 20)
    serial = {}
    for k in ks:
        r = index.search(queries, k=k, filters=filters, backend=backend)
        serial[k] = (r.ids.copy(), r.scores.copy())
    # one at a time: each task is one query at one k, spread over 8 threads
    tasks = [(i, k) for _ in range(3) for k in ks for i in range(len(queries))]
    rng = np.random.default_rng(1)
    rng.shuffle(tasks)
    barrier = threading.Barrier(8)

    def one(task):
        i, k = task
        f = None if filters is None else [filters[i]]
        r = index.search([queries[i]], k=k, filters=f, backend=backend)
        return task, r.ids[0], r.scores[0]

    def start(_):
        barrier.wait()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(start, range(8)))
        results = list(pool.map(one, tasks))
    wrong = [(i, k) for (i, k), ids, sc in results
             if not (np.array_equal(ids, serial[k][0][i]) and np.array_equal(sc, serial[k][1][i]))]
    assert wrong == [], f"{len(wrong)} of {len(results)} concurrent searches differ from the serial answer"


def test_concurrent_batches_equal_serial(index, backend):
    queries, filters = _workload(seed=3)
    ref = index.search(queries, k=10, filters=filters, backend=backend)

    def batch(_):
        return index.search(queries, k=10, filters=filters, backend=backend)

    with ThreadPoolExecutor(6) as pool:
        for r in pool.map(batch, range(12)):
            np.testing.assert_array_equal(r.ids, ref.ids)
            np.testing.assert_array_equal(r.scores, ref.scores)


def test_an_interrupted_search_leaves_the_scorer_clean(index, monkeypatch):
    """An exception inside a query (e.g. KeyboardInterrupt) must not poison later answers."""
    queries, _ = _workload(seed=4)
    sc = index.scorer("numpy")
    ref = index.search(queries, k=10, backend="numpy")
    real = np.take
    calls = {"n": 0}

    def dying_take(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(np, "take", dying_take)
    with pytest.raises(KeyboardInterrupt):
        sc.search(index.query_terms(queries), 10)
    monkeypatch.undo()
    again = index.search(queries, k=10, backend="numpy")
    np.testing.assert_array_equal(again.ids, ref.ids)
    np.testing.assert_array_equal(again.scores, ref.scores)


# -- finite scores for every accepted parameter, clear errors outside


def _extreme_corpus():
    docs = random_corpus(60, 30, seed=2)
    docs += ["w1", "w2 " * 5000, "w3 w1 " * 2000, "w0"]  # very short and very long documents
    return docs


@pytest.mark.parametrize("method", METHODS)
def test_scores_are_finite_at_the_limits_of_every_parameter(method, backend):
    base = BM25Index.build(_extreme_corpus(), analyzer="plain")
    queries = ["w0", "w1 w1 w1 w2", "w3 w1 w0 w5 w9", "w2 " * 200]
    k1s = (K1_RANGE[0], 1e-3, 1.2, 1e3, K1_RANGE[1])
    deltas = (0.0, 0.5, DELTA_MAX) if method in ("bm25l", "bm25+") else (0.5,)
    for k1 in k1s:
        for b in (0.0, 0.5, 1.0):
            for delta in deltas:
                idx = base.with_params(method=method, k1=k1, b=b, delta=delta)
                res = idx.search(queries, k=8, backend=backend)
                real = res.ids >= 0
                assert real.any(axis=1).all()
                assert np.isfinite(res.scores[real]).all(), (method, k1, b, delta)


@pytest.mark.parametrize(
    "field, value",
    [("k1", 1e-320), ("k1", 0.0), ("k1", -1.0), ("k1", 1e39), ("k1", float("inf")), ("k1", float("nan")),
     ("k1", K1_RANGE[1] * 10), ("k1", K1_RANGE[0] / 10),
     ("delta", 1e39), ("delta", -0.1), ("delta", DELTA_MAX * 10), ("delta", float("nan")),
     ("b", 1.5), ("b", -0.01), ("b", float("nan")), ("k1", "1.2"), ("b", None), ("k1", True)],
)
@pytest.mark.parametrize("method", METHODS)
def test_parameters_outside_the_safe_range_are_clear_errors(method, field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        BM25Params(method=method, **{field: value})


# -- input validation


def test_k_beyond_the_corpus_is_clamped_before_the_scorer_works(index, monkeypatch):
    """A huge k reaches the scorer as N, and the result is N wide: nothing is k wide (issue 23)."""
    sc = index.scorer("numpy")
    seen = []
    real = sc.search
    monkeypatch.setattr(sc, "search", lambda terms, k, allow=None: seen.append(k) or real(terms, k, allow))
    r = index.search(["w1 w2", "w3"], k=N_DOCS * 3, backend="numpy")
    assert seen == [N_DOCS]
    assert r.shape == (2, N_DOCS)
    ref = index.search(["w1 w2", "w3"], k=N_DOCS, backend="numpy")
    np.testing.assert_array_equal(r.ids, ref.ids)


def test_a_bare_string_is_not_a_corpus():
    with pytest.raises(TypeError, match="texts"):
        BM25Index.build("one document")
    with pytest.raises(TypeError, match="texts"):
        BM25Index.build(b"bytes")


@pytest.mark.parametrize("ids, where", [("ab", "ids"), ([1, 2], "ids"), (["a", None], "ids"), (["a", b"b"], "ids")])
def test_ids_must_be_strings(ids, where):
    with pytest.raises(TypeError, match=where):
        BM25Index.build(["x y", "y z"], ids=ids)
