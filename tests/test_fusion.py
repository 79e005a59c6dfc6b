"""Fusion formulas pinned on hand-made inputs (expected values computed by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuir.eval.selection import select_alpha_loco
from gpuir.fusion import (
    agent_rrf_fusion,
    fuse,
    minmax_fusion,
    rrf_fusion,
    score_rrf_fusion,
    union_candidates,
    weighted_rrf_fusion,
    zscore_fusion,
)
from gpuir.results import SearchResults


def sr(ids, scores):
    return SearchResults(np.asarray(ids, np.int64), np.asarray(scores, np.float32))


# Channel A (BM25-like) returns docs 2, 0, 5; channel B (dense-like) returns 0, 7.
# Union {0, 2, 5, 7}: doc 7 is missing from A, docs 2 and 5 are missing from B.
A = sr([[2, 0, 5]], [[3.0, 2.0, 1.0]])
B = sr([[0, 7, -1]], [[0.9, 0.5, -np.inf]])


def test_union():
    c = union_candidates([A, B])
    assert c.ids.tolist() == [[0, 2, 5, 7]]
    assert np.isnan(c.scores[0][0, 3]) and np.isnan(c.scores[1][0, 1])
    assert c.ranks[0].tolist() == [[2, 1, 3, math.inf]]
    assert c.ranks[1].tolist() == [[1, math.inf, math.inf, 2]]


def test_zscore_missing_min_and_tie():
    # z(A): mean 2, std sqrt(2/3) -> doc2 +1.224745, doc0 0, doc5 -1.224745; doc7 missing -> min -1.224745
    # z(B): mean 0.7, std 0.2 -> doc0 +1, doc7 -1; docs 2, 5 missing -> min -1
    r = zscore_fusion([A, B], k=4, alpha=0.5)
    s = 1 / math.sqrt(2 / 3)
    assert r.ids.tolist() == [[0, 2, 5, 7]]  # docs 5 and 7 tie: lower doc number first
    np.testing.assert_allclose(r.scores[0], [0.5, 0.5 * s - 0.5, -0.5 * s - 0.5, -0.5 * s - 0.5], rtol=1e-6)


def test_zscore_missing_zero():
    r = zscore_fusion([A, B], k=4, alpha=0.5, missing="zero")
    s = 1 / math.sqrt(2 / 3)
    assert r.ids.tolist() == [[2, 0, 7, 5]]
    np.testing.assert_allclose(r.scores[0], [0.5 * s, 0.5, -0.5, -0.5 * s], rtol=1e-6)


def test_zscore_alpha_weights():
    # alpha=1 -> pure z(A); doc7 gets A's minimum, tying with doc5 -> doc5 first
    r = zscore_fusion([A, B], k=4, alpha=1.0)
    assert r.ids.tolist() == [[2, 0, 5, 7]]
    r2 = zscore_fusion([A, B], k=4, weights=[1.0, 0.0])
    np.testing.assert_array_equal(r.ids, r2.ids)
    with pytest.raises(ValueError):
        zscore_fusion([A, B], k=4, alpha=0.5, weights=[1, 1])


def test_minmax():
    # A: doc2 1, doc0 .5, doc5 0, doc7 (missing) 0 ; B: doc0 1, doc7 0, missing 0
    r = minmax_fusion([A, B], k=4, alpha=0.5)
    assert r.ids.tolist() == [[0, 2, 5, 7]]
    np.testing.assert_allclose(r.scores[0], [0.75, 0.5, 0.0, 0.0], atol=1e-7)


def test_rrf():
    r = rrf_fusion([A, B], k=4)
    assert r.ids.tolist() == [[0, 2, 7, 5]]
    np.testing.assert_allclose(r.scores[0], [1 / 62 + 1 / 61, 1 / 61, 1 / 62, 1 / 63], rtol=1e-6)


def test_rrf_tie_lower_doc_first():
    r = rrf_fusion([sr([[9, 4]], [[2.0, 1.0]]), sr([[4, 9]], [[2.0, 1.0]])], k=2)
    assert r.ids.tolist() == [[4, 9]]
    assert r.scores[0, 0] == r.scores[0, 1]


def test_weighted_rrf():
    r = weighted_rrf_fusion([A, B], k=4)
    exp = {0: math.sqrt(2) / 62 + math.sqrt(0.9) / 61, 2: math.sqrt(3) / 61, 5: 1 / 63, 7: math.sqrt(0.5) / 62}
    assert r.ids.tolist() == [[0, 2, 5, 7]]
    np.testing.assert_allclose(r.scores[0], [exp[d] for d in (0, 2, 5, 7)], rtol=1e-6)
    # a negative score is clipped to 0: that channel then adds nothing
    r = weighted_rrf_fusion([sr([[1]], [[-4.0]]), sr([[1]], [[4.0]])], k=1)
    np.testing.assert_allclose(r.scores[0, 0], 2 / 61, rtol=1e-6)


def test_agent_rrf_recency_and_importance():
    times = np.zeros(8)
    times[[0, 2, 5, 7]] = [0.0, 90.0, 100.0, 100.0]
    r = agent_rrf_fusion([A, B], k=4, doc_times=times, query_times=np.array([100.0]), recency_weight=0.005,
                         tau=30)
    e = {
        0: 1 / 62 + 1 / 61 + 0.005 * math.exp(-100 / 30),
        2: 1 / 61 + 0.005 * math.exp(-10 / 30),
        5: 1 / 63 + 0.005,
        7: 1 / 62 + 0.005,
    }
    assert r.ids.tolist() == [[0, 7, 5, 2]]
    np.testing.assert_allclose(r.scores[0], [e[d] for d in (0, 7, 5, 2)], rtol=1e-6)
    imp = np.zeros(8)
    imp[2] = 1.0
    r = agent_rrf_fusion([A, B], k=4, doc_times=times, query_times=100.0, importance=imp, importance_weight=0.01)
    assert r.ids.tolist() == [[0, 2, 7, 5]]
    np.testing.assert_allclose(r.scores[0, 1], e[2] + 0.01, rtol=1e-6)
    # a document later than the query gets dt = 0 (full bonus); unknown time: none
    times2 = times.copy()
    times2[7] = 200.0
    times2[5] = np.nan
    r = agent_rrf_fusion([A, B], k=4, doc_times=times2, query_times=100.0)
    got = dict(zip(r.ids[0].tolist(), r.scores[0].tolist()))
    assert got[7] == pytest.approx(1 / 62 + 0.005, rel=1e-6)
    assert got[5] == pytest.approx(1 / 63, rel=1e-6)


def test_degenerate_channel_contributes_nothing():
    one = sr([[3]], [[7.0]])
    r = zscore_fusion([A, one], k=4, alpha=0.5)
    r0 = zscore_fusion([A, sr([[-1]], [[-np.inf]])], k=4, alpha=0.5)
    # same order as A alone; doc 3 enters the union with A's minimum
    assert r.ids.tolist() == [[2, 0, 3, 5]]
    assert r0.ids.tolist()[0][:3] == [2, 0, 5]


def test_padding_and_k_larger_than_union():
    r = rrf_fusion([A, B], k=6)
    assert r.ids[0, 4:].tolist() == [-1, -1]
    assert np.all(np.isneginf(r.scores[0, 4:]))
    with pytest.raises(ValueError):
        fuse([A, B], 3, method="nope")


def _dense(res, n):
    m = np.full((len(res), n), -np.inf, np.float32)
    for b in range(len(res)):
        ok = res.ids[b] >= 0
        m[b, res.ids[b][ok]] = res.scores[b][ok]
    return m


@pytest.mark.parametrize("method", ["z", "minmax", "rrf", "weighted_rrf", "score_rrf", "agent_rrf"])
def test_parity_dense_rows_and_lists(backend, method):
    """Dense (B, N) rows on either backend fuse exactly like top-k lists on the host."""
    rng = np.random.default_rng(0)
    B, N = 7, 300
    a = rng.normal(size=(B, N)).astype(np.float32) + 3
    d = rng.normal(size=(B, N)).astype(np.float32)
    a[rng.random((B, N)) < 0.5] = -np.inf  # BM25 non-candidates
    a[0, :] = -np.inf  # a query BM25 matches nothing
    d[:, ::7] = np.round(d[:, ::7], 1)  # ties
    kw = {"alpha": 0.3} if method in ("z", "minmax") else {}
    if method == "agent_rrf":
        kw = {"doc_times": rng.random(N) * 100, "query_times": np.full(B, 100.0), "recency_weight": 0.01, "tau": 30}
    ref = fuse([a, d], 25, method=method, **kw)
    # the same channels as lists covering all their candidates
    la = SearchResults(*_topk_all(a))
    ld = SearchResults(*_topk_all(d))
    lst = fuse([la, ld], 25, method=method, **kw)
    np.testing.assert_array_equal(ref.ids, lst.ids)
    np.testing.assert_allclose(ref.scores, lst.scores, rtol=1e-5, atol=1e-6)
    if backend == "cupy":
        import cupy

        dev = fuse([cupy.asarray(a), cupy.asarray(d)], 25, method=method, **kw)
        np.testing.assert_allclose(dev.scores, ref.scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(dev.ids, ref.ids)


def _topk_all(m):
    from gpuir.backends.base import topk_from_dense

    r = topk_from_dense(m, m.shape[1])
    return r.ids, r.scores


def test_select_alpha_loco():
    groups = np.array(["a", "a", "b", "b", "c", "c"])
    # held out a: on b+c, 0.2 -> .5 and 0.8 -> .75 -> 0.8; held out b: a+c tie (.5/.5) ->
    # smaller alpha 0.2; held out c: a+b, 0.2 -> 1.0 beats .25
    table = {
        0.2: np.array([1, 1, 1, 1, 0, 0.0]),
        0.8: np.array([0, 0, 0, 1, 1, 1.0]),
    }
    out = select_alpha_loco(lambda a: table[a], groups, [0.2, 0.8])
    assert out["alpha_per_group"] == {"a": 0.8, "b": 0.2, "c": 0.2}
    np.testing.assert_array_equal(out["per_query"], [0, 0, 1, 1, 0, 0])


def test_document_missing_from_every_channel_is_no_candidate():
    a = np.array([[2.0, -np.inf, 1.0, -np.inf]], np.float32)
    d = np.array([[0.1, -np.inf, 0.3, 0.2]], np.float32)
    for m in ("z", "minmax", "rrf", "weighted_rrf", "score_rrf", "agent_rrf"):
        r = fuse([a, d], 4, method=m)
        assert 1 not in r.ids[0].tolist() and r.ids[0, 3] == -1, m


def test_score_rrf_hand_computed():
    # A min-max: doc2 (3.0) -> 1, doc0 (2.0) -> 0.5, doc5 (1.0) -> 0; B: doc0 (0.9) -> 1, doc7 (0.5) -> 0.
    # doc0 = 0.5/(60+2) + 1/(60+1); doc2 = 1/61 (missing from B: 0); docs 5, 7 = 0 (their channel's worst).
    r = fuse([A, B], 4, method="score_rrf", k_rrf=60)
    assert r.ids.tolist() == [[0, 2, 5, 7]]  # 5 and 7 tie at 0: lower doc number first
    np.testing.assert_allclose(r.scores[0], [0.5 / 62 + 1 / 61, 1 / 61, 0.0, 0.0], rtol=1e-6, atol=1e-9)
    assert r.meta["fusion"] == {"method": "score_rrf", "weights": [1.0, 1.0], "k_rrf": 60}
    # weights scale each channel: 2 * 1/61 beats 2 * 0.5/62 + 1/61
    r = fuse([A, B], 2, method="score_rrf", weights=[2.0, 1.0], k_rrf=60)
    assert r.ids.tolist() == [[2, 0]]
    np.testing.assert_allclose(r.scores[0], [2 / 61, 1 / 62 + 1 / 61], rtol=1e-6)
    # k_rrf enters the denominator
    r = score_rrf_fusion([A, B], 1, k_rrf=0)
    np.testing.assert_allclose(r.scores[0, 0], 0.5 / 2 + 1 / 1, rtol=1e-6)


def test_score_rrf_degenerate_channel_counts_as_plain_rrf():
    one = sr([[3]], [[7.0]])  # one candidate: normalised score 1, so 1 / (60 + 1)
    r = score_rrf_fusion([A, one], k=4)
    assert r.ids.tolist() == [[2, 3, 0, 5]]  # docs 2 and 3 tie at 1/61: lower doc number first
    np.testing.assert_allclose(r.scores[0], [1 / 61, 1 / 61, 0.5 / 62, 0.0], rtol=1e-6)


def test_fusion_weight_names_say_what_they_weigh():
    import inspect

    params = inspect.signature(agent_rrf_fusion).parameters
    assert "recency_weight" in params and "importance_weight" in params
    assert "alpha" not in params and "beta" not in params
    with pytest.raises(TypeError):
        agent_rrf_fusion([A, B], k=2, alpha=0.1)
