"""Metrics against pytrec_eval on the same run and qrels (within 1e-6)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuir.eval.metrics import (
    compute_metrics,
    hit_at_k,
    mrr,
    ndcg_at_k,
    recall_all_at_k,
    relevance_matrix,
)

pytrec_eval = pytest.importorskip("pytrec_eval")

CUTOFFS = (1, 3, 5, 10, 20)


def _random_case(seed: int, n_queries=200, n_docs=60, k=15, graded=False, pad=True):
    """A run without score ties (trec_eval re-sorts ties by docid descending) and qrels."""
    rng = np.random.default_rng(seed)
    ranked = np.full((n_queries, k), -1, dtype=np.int64)
    gold = []
    for i in range(n_queries):
        n_ret = int(rng.integers(0, k + 1)) if pad else k
        ranked[i, :n_ret] = rng.choice(n_docs, size=n_ret, replace=False)
        n_rel = int(rng.integers(1, 8))
        docs = rng.choice(n_docs, size=n_rel, replace=False)
        grades = rng.integers(1, 4, size=n_rel) if graded else np.ones(n_rel, dtype=int)
        g = {int(d): int(r) for d, r in zip(docs, grades)}
        if rng.random() < 0.2:  # judged non-relevant documents
            g[int(rng.integers(n_docs, n_docs + 5))] = 0
        if rng.random() < 0.1:  # a relevant document missing from the collection
            g[-(2 + i)] = 1
        gold.append(g)
    return ranked, gold


def _trec(ranked, gold, gain="exponential"):
    run, qrels = {}, {}
    for i in range(ranked.shape[0]):
        row = [int(d) for d in ranked[i] if d >= 0]
        # strictly decreasing scores: no ties for trec_eval to re-sort
        run[f"q{i}"] = {f"d{d}": float(len(row) - r) for r, d in enumerate(row)}
        if not run[f"q{i}"]:
            run[f"q{i}"] = {"dnone": -1e9}  # trec_eval needs at least one line; never relevant
        qrels[f"q{i}"] = {
            f"d{d}": (int(2**g - 1) if (gain == "exponential" and g > 0) else int(g))
            for d, g in gold[i].items()
        }
    cut = ",".join(map(str, CUTOFFS))
    ev = pytrec_eval.RelevanceEvaluator(
        qrels, {f"success.{cut}", f"recall.{cut}", f"P.{cut}", "recip_rank", f"ndcg_cut.{cut}"}
    )
    res = ev.evaluate(run)
    return [res[f"q{i}"] for i in range(ranked.shape[0])]


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("gain", ["exponential", "linear"])
def test_metrics_match_pytrec_eval(graded, gain):
    ranked, gold = _random_case(seed=1 + graded, graded=graded)
    ours = compute_metrics(ranked, gold, cutoffs=CUTOFFS, gain=gain)
    trec = _trec(ranked, gold, gain)
    # recall_all@k from trec's fractional recall
    for c in CUTOFFS:
        t_hit = np.array([t[f"success_{c}"] for t in trec])
        t_rec = np.array([t[f"recall_{c}"] for t in trec])
        t_p = np.array([t[f"P_{c}"] for t in trec])
        t_ndcg = np.array([t[f"ndcg_cut_{c}"] for t in trec])
        np.testing.assert_allclose(ours[f"hit@{c}"], t_hit, atol=1e-6)
        np.testing.assert_allclose(ours[f"recall_any@{c}"], t_hit, atol=1e-6)
        np.testing.assert_allclose(ours[f"recall@{c}"], t_rec, atol=1e-6)
        np.testing.assert_allclose(ours[f"recall_all@{c}"], (t_rec > 1 - 1e-12).astype(float), atol=1e-6)
        np.testing.assert_allclose(ours[f"precision@{c}"], t_p, atol=1e-6)
        np.testing.assert_allclose(ours[f"ndcg@{c}"], t_ndcg, atol=1e-6)
    np.testing.assert_allclose(ours["mrr"], [t["recip_rank"] for t in trec], atol=1e-6)


def test_binary_gain_equals_linear():
    ranked, gold = _random_case(seed=5)
    a = compute_metrics(ranked, gold, metrics=["ndcg"], gain="exponential")
    b = compute_metrics(ranked, gold, metrics=["ndcg"], gain="linear")
    for key in a:
        np.testing.assert_allclose(a[key], b[key])


def test_relevance_matrix_and_edge_cases():
    ranked = np.array([[3, 1, -1], [-1, -1, -1], [7, 8, 9]])
    gold = [{1: 2, 5: 1}, {0: 1}, {}]
    rel, ideal = relevance_matrix(ranked, gold)
    assert rel.tolist() == [[0, 2, 0], [0, 0, 0], [0, 0, 0]]
    assert ideal.tolist() == [[2, 1], [1, 0], [0, 0]]
    assert hit_at_k(rel, 1).tolist() == [0, 0, 0]
    assert hit_at_k(rel, 2).tolist() == [1, 0, 0]
    assert mrr(rel).tolist() == [0.5, 0, 0]
    assert recall_all_at_k(rel, ideal, 3).tolist() == [0, 0, 0]
    # a query without relevant documents scores 0, not nan
    v = ndcg_at_k(rel, ideal, 3)
    assert np.isfinite(v).all() and v[2] == 0
    exp = (3 / np.log2(3)) / (3 + 1 / np.log2(3))
    assert v[0] == pytest.approx(exp)


def test_cutoff_beyond_run_depth_and_bad_input():
    ranked = np.array([[0, 1]])
    m = compute_metrics(ranked, [{1: 1}], cutoffs=(10,), metrics=["precision", "recall_all"])
    assert m["precision@10"][0] == pytest.approx(0.1)
    assert m["recall_all@10"][0] == 1.0
    with pytest.raises(ValueError, match="gold has"):
        relevance_matrix(ranked, [])
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(ranked, [{1: 1}], metrics=["map"])
    with pytest.raises(ValueError, match="gain"):
        compute_metrics(ranked, [{1: 1}], metrics=["ndcg"], gain="log")
