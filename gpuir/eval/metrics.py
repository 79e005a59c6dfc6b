"""Ranking metrics, vectorised over queries, computed as trec_eval computes them.

All functions take a **relevance matrix**: the grade of each retrieved document,
``rel`` of shape (B, k) (0 for non-relevant documents and for -1 padding), plus,
where the metric needs it, each query's judged relevant grades. Build both with
:func:`relevance_matrix` from a run of document numbers and per-query gold.

Conventions (checked against pytrec_eval in ``tests/test_eval_metrics.py``):

* A document is relevant when its grade is >= 1 (trec_eval's ``relevance_level``).
* ``hit@k`` = ``recall_any@k`` = 1 if any relevant document is in the top k
  (trec_eval ``success_k``).
* ``recall@k`` = relevant in top k / all relevant (trec_eval ``recall_k``);
  ``recall_all@k`` = 1 if every relevant document is in the top k.
* ``precision@k`` = relevant in top k / k, padding counted as non-relevant
  (trec_eval ``P_k``).
* ``mrr`` = 1 / rank of the first relevant document over the whole run row
  (trec_eval ``recip_rank``), 0 when none; ``mrr@k`` cuts the row at k.
* ``ndcg@k`` with exponential gain ``(2^rel - 1) / log2(rank + 1)``, the ideal
  ranking made from all judged relevant documents (trec_eval ``ndcg_cut_k`` run on
  qrels whose grades are replaced by ``2^rel - 1``; for binary grades the two agree).
  ``gain="linear"`` gives trec_eval's own ``ndcg_cut_k`` on the raw grades.
* A query with no relevant document scores 0 on every metric.

Rank order is the row order of the run: callers keep their own tie rule
(gpuir's: higher score, then lower document number). trec_eval instead re-sorts
by score, then by document id *descending*, so it only agrees on runs without ties.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..metrics_core import check_k, n_rel, ndcg_at_k, recall_at_k, relevance_matrix

#: Metric families understood by :func:`compute_metrics`.
METRICS: tuple[str, ...] = (
    "hit", "recall_any", "recall_all", "recall", "precision", "mrr", "ndcg",
)
DEFAULT_CUTOFFS: tuple[int, ...] = (1, 3, 5, 10)


def hit_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """1.0 where a relevant document is in the top k.

    Parameters
    ----------
    rel : ndarray, shape (B, K), int
    k : int

    Returns
    -------
    ndarray, shape (B,), float64
    """
    k = check_k(rel, k)
    return (rel[:, :k] >= 1).any(axis=1).astype(np.float64)


def recall_any_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """LongMemEval's recall_any@k: the same as :func:`hit_at_k`. Shape (B,), float64."""
    return hit_at_k(rel, k)


def recall_all_at_k(rel: np.ndarray, ideal: np.ndarray, k: int) -> np.ndarray:
    """1.0 where every relevant document is in the top k (LongMemEval's recall_all@k). Shape (B,), float64."""
    k = check_k(rel, k)
    found = (rel[:, :k] >= 1).sum(axis=1)
    n = n_rel(ideal)
    return ((found == n) & (n > 0)).astype(np.float64)


def precision_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """Relevant documents in the top k, divided by k (trec_eval ``P_k``). Shape (B,), float64."""
    k = check_k(rel, k)
    return (rel[:, :k] >= 1).sum(axis=1) / float(k)


def mrr(rel: np.ndarray, k: int | None = None) -> np.ndarray:
    """Reciprocal rank of the first relevant document (0 if none), over the first k columns or all.

    Returns
    -------
    ndarray, shape (B,), float64
    """
    r = rel if k is None else rel[:, : check_k(rel, k)]
    hit = r >= 1
    first = hit.argmax(axis=1)
    return np.where(hit.any(axis=1), 1.0 / (first + 1.0), 0.0)


def metric_names(metrics: Sequence[str] = METRICS, cutoffs: Sequence[int] = DEFAULT_CUTOFFS) -> list[str]:
    """Column names :func:`compute_metrics` produces, e.g. ``["hit@1", ..., "mrr", "ndcg@10"]``."""
    out = []
    for m in metrics:
        if m not in METRICS:
            raise ValueError(f"unknown metric {m!r}: choose from {', '.join(METRICS)}")
        if m == "mrr":
            out.append("mrr")
        else:
            out.extend(f"{m}@{c}" for c in cutoffs)
    return out


def compute_metrics(
    ranked: np.ndarray,
    gold: Sequence[Mapping[int, int]],
    cutoffs: Sequence[int] = DEFAULT_CUTOFFS,
    metrics: Sequence[str] = METRICS,
    gain: str = "exponential",
) -> dict[str, np.ndarray]:
    """Every requested metric for every query.

    Parameters
    ----------
    ranked : ndarray, shape (B, k), integer
        Document numbers best first, -1 padding.
    gold : sequence of B mappings int -> int
        Per-query document number -> grade (see :func:`relevance_matrix`).
    cutoffs : sequence of int
        Cut-offs for the @k metrics (may exceed k: padding counts as non-relevant).
    metrics : sequence of str
        Families from :data:`METRICS`.
    gain : {"exponential", "linear"}
        nDCG gain.

    Returns
    -------
    dict of name -> ndarray, shape (B,), float64
        Names as :func:`metric_names`; ``mrr`` is over the whole row.
    """
    ranked = np.asarray(ranked)
    rel, ideal = relevance_matrix(ranked, gold)
    kmax = max([rel.shape[1], *cutoffs]) if cutoffs else rel.shape[1]
    if kmax > rel.shape[1]:
        rel = np.pad(rel, ((0, 0), (0, kmax - rel.shape[1])))
    out: dict[str, np.ndarray] = {}
    for m in metrics:
        if m not in METRICS:
            raise ValueError(f"unknown metric {m!r}: choose from {', '.join(METRICS)}")
        if m == "mrr":
            out["mrr"] = mrr(rel)
            continue
        for c in cutoffs:
            if m == "hit":
                v = hit_at_k(rel, c)
            elif m == "recall_any":
                v = recall_any_at_k(rel, c)
            elif m == "recall_all":
                v = recall_all_at_k(rel, ideal, c)
            elif m == "recall":
                v = recall_at_k(rel, ideal, c)
            elif m == "precision":
                v = precision_at_k(rel, c)
            else:
                v = ndcg_at_k(rel, ideal, c, gain)
            out[f"{m}@{c}"] = v
    return out


__all__ = [
    "DEFAULT_CUTOFFS",
    "METRICS",
    "compute_metrics",
    "hit_at_k",
    "metric_names",
    "mrr",
    "ndcg_at_k",
    "precision_at_k",
    "recall_all_at_k",
    "recall_any_at_k",
    "recall_at_k",
    "relevance_matrix",
]
