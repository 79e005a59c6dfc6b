"""Ranking-metric primitives below the evaluation layer: relevance matrix, recall@k, nDCG@k.

The one home of these (trec_eval conventions, see :mod:`gpuir.eval.metrics`,
which builds every evaluation metric on them). They live here so that library
tools such as ``gpuir parity`` compute nDCG and recall without importing
:mod:`gpuir.eval` (the evaluation is a client of the library, never the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["ndcg_at_k", "recall_at_k", "relevance_matrix"]


def relevance_matrix(
    ranked: np.ndarray, gold: Sequence[Mapping[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Grades of the retrieved documents, and the judged relevant grades, per query.

    Parameters
    ----------
    ranked : ndarray, shape (B, k), integer
        Document numbers, best first; -1 is padding. Within a row each document
        should appear at most once.
    gold : sequence of B mappings int -> int
        Per query, document number -> grade. Grades <= 0 are non-relevant.
        Relevant documents absent from the collection may be given any key
        that never occurs in ``ranked`` (e.g. negative numbers below -1): they
        count in the number of relevant documents.

    Returns
    -------
    rel : ndarray, shape (B, k), int32
        Grade of each retrieved document (0 for non-relevant and padding).
    ideal : ndarray, shape (B, G), int32
        Each query's relevant grades (>= 1), sorted descending, right-padded with 0;
        ``G`` = the largest number of relevant documents of any query (at least 1).
    """
    ranked = np.asarray(ranked)
    if ranked.ndim != 2:
        raise ValueError(f"ranked must be 2-D (n_queries, k), got shape {ranked.shape}")
    B, k = ranked.shape
    if len(gold) != B:
        raise ValueError(f"gold has {len(gold)} entries but ranked has {B} rows")
    ranked = ranked.astype(np.int64, copy=False)
    q_list, d_list, g_list = [], [], []
    n_rel = np.zeros(B, dtype=np.int64)
    for i, g in enumerate(gold):
        if not g:
            continue
        docs = np.fromiter(g.keys(), dtype=np.int64, count=len(g))
        grades = np.fromiter(g.values(), dtype=np.int64, count=len(g))
        keep = grades >= 1
        n_rel[i] = int(keep.sum())
        q_list.append(np.full(int(keep.sum()), i, dtype=np.int64))
        d_list.append(docs[keep])
        g_list.append(grades[keep])
    G = max(1, int(n_rel.max()) if B else 1)
    ideal = np.zeros((B, G), dtype=np.int32)
    rel = np.zeros((B, k), dtype=np.int32)
    if not q_list:
        return rel, ideal
    qq = np.concatenate(q_list)
    dd = np.concatenate(d_list)
    gg = np.concatenate(g_list)
    # ideal: grades sorted descending within each query
    order = np.lexsort((-gg, qq))
    qs, gs = qq[order], gg[order]
    starts = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(n_rel, out=starts[1:])
    pos = np.arange(qs.size) - starts[qs]
    ideal[qs, pos] = gs
    # lookup of retrieved documents: keys (query, doc) over the non-negative docs
    ok = dd >= 0
    if not ok.any() or k == 0:
        return rel, ideal
    stride = int(max(dd[ok].max(), ranked.max(initial=0))) + 1
    keys = qq[ok] * stride + dd[ok]
    srt = np.argsort(keys, kind="stable")
    keys, vals = keys[srt], gg[ok][srt]
    valid = ranked >= 0
    rk = np.arange(B, dtype=np.int64)[:, None] * stride + np.where(valid, ranked, 0)
    at = np.searchsorted(keys, rk)
    at_c = np.minimum(at, keys.size - 1)
    found = valid & (keys[at_c] == rk)
    rel[found] = vals[at_c[found]]
    return rel, ideal


def check_k(rel: np.ndarray, k: int) -> int:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"cutoff k must be a positive integer, got {k!r}")
    return int(k)


def n_rel(ideal: np.ndarray) -> np.ndarray:
    return (ideal >= 1).sum(axis=1)


def recall_at_k(rel: np.ndarray, ideal: np.ndarray, k: int) -> np.ndarray:
    """Fraction of the relevant documents in the top k (trec_eval ``recall_k``). Shape (B,), float64."""
    k = check_k(rel, k)
    found = (rel[:, :k] >= 1).sum(axis=1)
    n = n_rel(ideal)
    return np.divide(found, n, out=np.zeros(rel.shape[0]), where=n > 0)


def _gain(g: np.ndarray, gain: str) -> np.ndarray:
    g = np.maximum(g, 0).astype(np.float64)
    if gain == "exponential":
        return np.exp2(g) - 1.0
    if gain == "linear":
        return g
    raise ValueError(f"gain must be 'exponential' or 'linear', got {gain!r}")


def ndcg_at_k(rel: np.ndarray, ideal: np.ndarray, k: int, gain: str = "exponential") -> np.ndarray:
    """nDCG@k: DCG of the run's top k over DCG of the ideal top k.

    Parameters
    ----------
    rel : ndarray, shape (B, K), int
    ideal : ndarray, shape (B, G), int, sorted descending per row
    k : int
    gain : {"exponential", "linear"}
        ``2^rel - 1`` (default, the field's convention) or ``rel``.

    Returns
    -------
    ndarray, shape (B,), float64
    """
    k = check_k(rel, k)
    disc = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    r = rel[:, :k]
    dcg = (_gain(r, gain) * disc[: r.shape[1]]).sum(axis=1)
    ig = ideal[:, :k]
    idcg = (_gain(ig, gain) * disc[: ig.shape[1]]).sum(axis=1)
    return np.divide(dcg, idcg, out=np.zeros(rel.shape[0]), where=idcg > 0)
