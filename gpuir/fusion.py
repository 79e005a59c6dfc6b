"""Rank and score fusion of several retrieval channels (BM25, dense, late interaction).

Every function fuses *per query* over the **union of the candidates** that the
channels returned, and returns :class:`~gpuir.results.SearchResults` sorted by
the one tie rule of gpuir: higher fused score first, then lower document number.

Inputs come in two shapes, both accepted by :func:`fuse`:

* ``SearchResults`` per channel (ids ``(B, k_c)``, scores ``(B, k_c)``; padding id
  -1 / score -inf) -- the usual case, top-k lists of different channels;
* dense score rows per channel, ndarray ``(B, N)`` where column ``j`` is document
  number ``j`` and ``-inf`` (or NaN) marks a document the channel did not return.
  These may be NumPy or CuPy arrays; the arithmetic runs on their device.

How a candidate missing from one channel is scored (explicit, everywhere)
--------------------------------------------------------------------------
* **z-score and min-max fusion** (``missing="min"``, the default): a candidate
  the channel did not return gets the *lowest normalised score that channel gave
  any candidate of that query* -- the channel ranked it no higher than its worst
  retrieved document. ``missing="zero"`` gives it 0 instead (the channel's mean
  under z-scores, its minimum under min-max); a float gives that normalised value.
* **RRF, weighted RRF, score RRF, agent-aware RRF**: a missing candidate
  contributes 0 from that channel (rank = infinity), as in Cormack et al. (2009).
* A channel whose returned scores for a query are all equal (or that returned a
  single candidate) carries no ranking information: its normalised scores are 0
  for every candidate, retrieved or missing.
* A channel that returned nothing for a query contributes 0 to every candidate.

Formulas (``c`` runs over channels, ``w_c`` their weights, ranks 1-based):

* z-score:   ``sum_c w_c * (s_c - mean_c) / std_c`` (population std over the
  channel's returned candidates of that query); two channels with ``alpha``:
  ``alpha * z(bm25) + (1 - alpha) * z(dense)`` -- ``alpha`` is only ever this
  convex weight of the first of two channels (z-score and min-max fusion).
* min-max:   ``sum_c w_c * (s_c - min_c) / (max_c - min_c)``.
* RRF:       ``sum_c w_c / (k_rrf + rank_c)``, ``k_rrf = 60``.
* weighted RRF: ``sum_c w_c * sqrt(max(s_c, 0)) / (k_rrf + rank_c)``.
* score RRF (score-weighted RRF, as Arc Labs describe it): each channel
  contributes ``w_c * n_c / (k_rrf + rank_c)``, where ``n_c`` is the candidate's
  min-max normalised score in that channel for that query,
  ``(s_c - min_c) / (max_c - min_c)`` over the candidates the channel returned
  (its best gets 1, its worst 0); a channel whose returned scores are all equal
  (or that returned one candidate) gives ``n_c = 1`` to each of them, so it
  contributes plain weighted RRF; a candidate the channel did not return
  contributes 0. The rank keeps RRF's robustness, the normalised score how far
  apart the channel put its candidates.
* agent-aware RRF: ``RRF + recency_weight * exp(-dt / tau) + importance_weight *
  importance`` with ``dt = max(query_time - doc_time, 0)`` (same unit as
  ``tau``); documents with unknown time (NaN) get no recency bonus.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .results import SearchResults
from .topk import array_module as _xp
from .topk import topk_rows

__all__ = [
    "FUSION_METHODS",
    "Candidates",
    "agent_rrf_fusion",
    "fuse",
    "minmax_fusion",
    "rrf_fusion",
    "score_rrf_fusion",
    "topk_fused",
    "union_candidates",
    "weighted_rrf_fusion",
    "zscore_fusion",
]


@dataclass
class Candidates:
    """The candidate union of several channels for a batch of queries.

    Attributes
    ----------
    ids : ndarray, shape (B, U), int64
        Document numbers of the union, ascending within each row (ignoring -1
        entries); -1 marks padding.
    scores : list of C ndarrays, shape (B, U), float32
        Each channel's raw score of each candidate; NaN where the channel did not
        return the candidate (and on padding).
    ranks : list of C ndarrays, shape (B, U), float64
        1-based rank of the candidate in each channel's list (ties broken by the
        gpuir rule); +inf where missing.
    """

    ids: Any
    scores: list
    ranks: list


def _ranks_of_rows(scores, xp):
    """1-based ranks of finite entries of dense rows under the tie rule; inf elsewhere."""
    B, N = scores.shape
    key = xp.where(xp.isfinite(scores), -scores.astype(xp.float64), xp.inf)
    order = xp.argsort(key, axis=1, kind="stable")  # stable: ties keep lower doc first
    ranks = xp.empty((B, N), dtype=xp.float64)
    rows = xp.arange(B)[:, None]
    ranks[rows, order] = xp.arange(1, N + 1, dtype=xp.float64)[None, :]
    return xp.where(xp.isfinite(scores), ranks, xp.inf)


def union_candidates(channels: Sequence[Any]) -> Candidates:
    """Union the candidates of several channels, query by query.

    Parameters
    ----------
    channels : sequence of C items, each SearchResults (B, k_c) or ndarray (B, N)
        Top-k lists (host arrays) or dense score rows (NumPy or CuPy; -inf/NaN =
        not returned). All dense rows must share N; mixing both kinds is allowed
        (dense rows are then treated as lists over all their finite entries).

    Returns
    -------
    Candidates
        On the device of the dense inputs when all inputs are dense rows (then
        ``U = N`` and ``ids[b, j] = j``, or -1 where no channel returned document
        ``j``); on the host otherwise.
    """
    if not channels:
        raise ValueError("fusion needs at least one channel")
    if all(not isinstance(c, SearchResults) for c in channels):
        xp = _xp(channels[0])
        mats = [xp.asarray(c, dtype=xp.float32) for c in channels]
        shapes = {m.shape for m in mats}
        if len(shapes) != 1 or mats[0].ndim != 2:
            raise ValueError(f"dense channels must be 2-D of one shape, got {sorted(shapes)}")
        B, N = mats[0].shape
        scores = [xp.where(xp.isfinite(m), m, xp.nan).astype(xp.float32) for m in mats]
        ranks = [_ranks_of_rows(m, xp) for m in mats]
        ids = xp.broadcast_to(xp.arange(N, dtype=xp.int64)[None, :], (B, N)).copy()
        # a document no channel returned is no candidate (its column is padding)
        anywhere = xp.zeros((B, N), dtype=bool)
        for S in scores:
            anywhere |= ~xp.isnan(S)
        ids = xp.where(anywhere, ids, -1)
        return Candidates(ids, scores, ranks)

    lists = []
    for c in channels:
        if isinstance(c, SearchResults):
            lists.append((np.asarray(c.ids), np.asarray(c.scores, dtype=np.float32)))
        else:
            m = np.asarray(c.get() if hasattr(c, "get") else c, dtype=np.float32)
            ranks = _ranks_of_rows(m, np)
            k = int(np.isfinite(m).sum(axis=1).max(initial=0))
            order = np.argsort(ranks, axis=1, kind="stable")[:, :k]
            ids = np.where(np.take_along_axis(np.isfinite(m), order, 1), order, -1)
            sc = np.where(ids >= 0, np.take_along_axis(m, order, 1), -np.inf)
            lists.append((ids.astype(np.int64), sc.astype(np.float32)))
    B = lists[0][0].shape[0]
    if any(ids.shape[0] != B for ids, _ in lists):
        raise ValueError("all channels must hold the same number of queries")
    allids = np.concatenate([ids for ids, _ in lists], axis=1)
    per_row = [np.unique(r[r >= 0]) for r in allids]
    U = max((u.size for u in per_row), default=0)
    U = max(U, 1)
    ids = np.full((B, U), -1, dtype=np.int64)
    for b, u in enumerate(per_row):
        ids[b, : u.size] = u
    scores, ranks = [], []
    for cids, csc in lists:
        S = np.full((B, U), np.nan, dtype=np.float32)
        R = np.full((B, U), np.inf, dtype=np.float64)
        for b in range(B):
            valid = cids[b] >= 0
            if not valid.any():
                continue
            # channel list order is its rank order (SearchResults rows are sorted)
            cid = cids[b][valid]
            pos = np.searchsorted(ids[b, : per_row[b].size], cid)
            S[b, pos] = csc[b][valid]
            R[b, pos] = np.arange(1, cid.size + 1, dtype=np.float64)
        scores.append(S)
        ranks.append(R)
    return Candidates(ids, scores, ranks)


def _normalise(S, how: str, missing: Any, xp):
    """Per-row normalisation over present (non-NaN) entries, with imputation of missing."""
    present = ~xp.isnan(S)
    n = present.sum(axis=1, keepdims=True)
    S64 = S.astype(xp.float64)
    filled = xp.where(present, S64, 0.0)
    if how == "z":
        mean = filled.sum(axis=1, keepdims=True) / xp.maximum(n, 1)
        var = (xp.where(present, (S64 - mean) ** 2, 0.0)).sum(axis=1, keepdims=True) / xp.maximum(n, 1)
        std = xp.sqrt(var)
        degenerate = std <= 1e-12 * xp.maximum(xp.abs(mean), 1.0)
        Z = xp.where(degenerate, 0.0, (S64 - mean) / xp.where(degenerate, 1.0, std))
    elif how == "minmax":
        lo = xp.where(present, S64, xp.inf).min(axis=1, keepdims=True)
        hi = xp.where(present, S64, -xp.inf).max(axis=1, keepdims=True)
        rng = hi - lo
        degenerate = ~(rng > 1e-12 * xp.maximum(xp.abs(hi), 1.0))
        Z = xp.where(degenerate, 0.0, (S64 - lo) / xp.where(degenerate, 1.0, rng))
    else:  # pragma: no cover
        raise ValueError(how)
    Z = xp.where(present, Z, 0.0)
    if isinstance(missing, str):
        if missing == "min":
            zmin = xp.where(present, Z, xp.inf).min(axis=1, keepdims=True)
            fill = xp.where(n > 0, zmin, 0.0)
        elif missing == "zero":
            fill = xp.zeros_like(n, dtype=xp.float64)
        else:
            raise ValueError(f"missing must be 'min', 'zero' or a float, got {missing!r}")
    else:
        fill = xp.full(n.shape, float(missing))
    fill = xp.where(n > 0, fill, 0.0)  # a channel that returned nothing contributes 0
    return xp.where(present, Z, fill)


def _weights(weights, C: int, alpha) -> list[float]:
    if alpha is not None:
        if C != 2:
            raise ValueError(f"alpha fuses exactly two channels, got {C}; use weights=")
        if weights is not None:
            raise ValueError("give alpha or weights, not both")
        return [float(alpha), 1.0 - float(alpha)]
    if weights is None:
        return [1.0] * C
    w = [float(x) for x in weights]
    if len(w) != C:
        raise ValueError(f"weights has {len(w)} entries for {C} channels")
    return w


def _fused_results(cand: Candidates, fused, k: int, meta: dict, return_candidates: bool):
    """Top-k of the fused rows, with ``meta`` recorded as ``res.meta["fusion"]``.

    Parameters
    ----------
    cand : Candidates
        The candidate union the fused scores belong to.
    fused : ndarray, shape (B, U), float64
        Fused score of every candidate.
    k : int
        Results per query.
    meta : dict
        Fusion settings, stored under ``meta["fusion"]`` of the result.
    return_candidates : bool
        Also return ``cand`` and ``fused``.

    Returns
    -------
    SearchResults (B, k), host; with ``return_candidates`` the tuple
    ``(results, cand, fused)``.
    """
    res = topk_fused(cand.ids, fused, k)
    res.meta["fusion"] = meta
    return (res, cand, fused) if return_candidates else res


def topk_fused(ids, fused, k: int) -> SearchResults:
    """Top-k of fused candidate rows under the tie rule (score desc, doc number asc).

    Parameters
    ----------
    ids : ndarray, shape (B, U), int64, ascending per row, -1 padding (NumPy or CuPy)
    fused : ndarray, shape (B, U), float64; ignored where ``ids`` is -1
    k : int

    Returns
    -------
    SearchResults, ids (B, k) int64 and scores (B, k) float32 on the host.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    xp = _xp(ids)
    # columns are sorted by doc number, so the tie rule's "lower column" is "lower doc"
    out_ids, out_sc = topk_rows(xp.where(ids >= 0, fused, -xp.inf), k, col_ids=ids)
    if xp is not np:
        out_ids, out_sc = out_ids.get(), out_sc.get()
    return SearchResults(out_ids, out_sc)


def _combine_norm(channels, k, weights, alpha, missing, how, return_candidates):
    cand = union_candidates(channels)
    xp = _xp(cand.ids)
    w = _weights(weights, len(channels), alpha)
    fused = xp.zeros(cand.ids.shape, dtype=xp.float64)
    for wc, S in zip(w, cand.scores):
        fused += wc * _normalise(S, how, missing, xp)
    meta = {"method": how, "weights": w, "missing": missing}
    return _fused_results(cand, fused, k, meta, return_candidates)


def zscore_fusion(
    channels: Sequence[Any],
    k: int,
    weights: Sequence[float] | None = None,
    alpha: float | None = None,
    missing: Any = "min",
    return_candidates: bool = False,
):
    """z-score weighted fusion over the candidate union.

    Parameters
    ----------
    channels : sequence of C SearchResults (B, k_c) or ndarrays (B, N)
        See :func:`union_candidates`.
    k : int
        Results per query.
    weights : sequence of C floats, optional
        Channel weights (default all 1).
    alpha : float, optional
        Two channels only: weights ``(alpha, 1 - alpha)``, i.e.
        ``alpha * z(first) + (1 - alpha) * z(second)``.
    missing : "min" | "zero" | float
        Normalised score of a candidate a channel did not return (module doc).

    Returns
    -------
    SearchResults, (B, k), host; with ``return_candidates`` also the
    :class:`Candidates` and the fused matrix (B, U) float64.
    """
    return _combine_norm(channels, k, weights, alpha, missing, "z", return_candidates)


def minmax_fusion(
    channels: Sequence[Any],
    k: int,
    weights: Sequence[float] | None = None,
    alpha: float | None = None,
    missing: Any = "min",
    return_candidates: bool = False,
):
    """Min-max weighted fusion over the candidate union; arguments as :func:`zscore_fusion`."""
    return _combine_norm(channels, k, weights, alpha, missing, "minmax", return_candidates)


#: How RRF variants scale a channel's 1 / (k_rrf + rank): not at all, by the
#: square root of the raw score (weighted RRF), by the min-max normalised score (score RRF).
_RRF_SCALES = ("none", "sqrt", "minmax")


def _rrf_union(channels: Sequence[Any], weights, k_rrf: float, scale: str):
    """Candidate union, its array module, the channel weights and the (scaled) RRF matrix."""
    cand = union_candidates(channels)
    xp = _xp(cand.ids)
    w = _weights(weights, len(channels), None)
    return cand, xp, w, _rrf_matrix(cand, w, k_rrf, scale, xp)


def _combine_rrf(channels, k, weights, k_rrf, scale, method, return_candidates):
    """RRF scaled per :data:`_RRF_SCALES`, recorded as ``meta["fusion"]["method"] = method``."""
    cand, _, w, fused = _rrf_union(channels, weights, k_rrf, scale)
    meta = {"method": method, "weights": w, "k_rrf": k_rrf}
    return _fused_results(cand, fused, k, meta, return_candidates)


def _minmax_present(S, present, xp):
    """Row-wise min-max of the present entries to [0, 1]; 1 for every entry of a degenerate row."""
    S64 = S.astype(xp.float64)
    lo = xp.where(present, S64, xp.inf).min(axis=1, keepdims=True)
    hi = xp.where(present, S64, -xp.inf).max(axis=1, keepdims=True)
    rng = hi - lo
    degenerate = ~(rng > 1e-12 * xp.maximum(xp.abs(hi), 1.0))  # also rows with nothing present
    return xp.where(degenerate, 1.0, (S64 - lo) / xp.where(degenerate, 1.0, rng))


def _rrf_matrix(cand: Candidates, w, k_rrf: float, scale: str, xp):
    if scale not in _RRF_SCALES:  # pragma: no cover - internal
        raise ValueError(scale)
    fused = xp.zeros(cand.ids.shape, dtype=xp.float64)
    for wc, S, R in zip(w, cand.scores, cand.ranks):
        present = xp.isfinite(R)
        contrib = wc / (k_rrf + xp.where(present, R, 1.0))
        if scale == "sqrt":
            s = xp.where(present, S.astype(xp.float64), 0.0)
            contrib = contrib * xp.sqrt(xp.maximum(s, 0.0))
        elif scale == "minmax":
            contrib = contrib * _minmax_present(S, present, xp)
        fused += xp.where(present, contrib, 0.0)
    return fused


def rrf_fusion(
    channels: Sequence[Any],
    k: int,
    weights: Sequence[float] | None = None,
    k_rrf: float = 60.0,
    return_candidates: bool = False,
):
    """Reciprocal rank fusion: ``sum_c w_c / (k_rrf + rank_c)``; missing contributes 0.

    Parameters
    ----------
    channels : sequence of C SearchResults (B, k_c) or ndarrays (B, N)
    k : int
    weights : sequence of C floats, optional (default all 1)
    k_rrf : float, default 60

    Returns
    -------
    SearchResults (B, k), host.
    """
    return _combine_rrf(channels, k, weights, k_rrf, "none", "rrf", return_candidates)


def weighted_rrf_fusion(
    channels: Sequence[Any],
    k: int,
    weights: Sequence[float] | None = None,
    k_rrf: float = 60.0,
    return_candidates: bool = False,
):
    """Score-weighted RRF: ``sum_c w_c * sqrt(max(s_c, 0)) / (k_rrf + rank_c)``.

    Raw channel scores are used (negative scores are clipped to 0, so such a
    candidate gets nothing from that channel); missing candidates contribute 0.
    Arguments and result as :func:`rrf_fusion`.
    """
    return _combine_rrf(channels, k, weights, k_rrf, "sqrt", "weighted_rrf", return_candidates)


def score_rrf_fusion(
    channels: Sequence[Any],
    k: int,
    weights: Sequence[float] | None = None,
    k_rrf: float = 60.0,
    return_candidates: bool = False,
):
    """Score-weighted RRF: ``sum_c w_c * n_c / (k_rrf + rank_c)``, ``n_c`` the min-max normalised score.

    ``n_c = (s_c - min_c) / (max_c - min_c)`` over the candidates channel ``c``
    returned for the query (1 for all of them when their scores are all equal);
    a candidate the channel did not return contributes 0 from it (see the module
    docstring). Arguments and result as :func:`rrf_fusion`.
    """
    return _combine_rrf(channels, k, weights, k_rrf, "minmax", "score_rrf", return_candidates)


def agent_rrf_fusion(
    channels: Sequence[Any],
    k: int,
    doc_times: Any = None,
    query_times: Any = None,
    recency_weight: float = 0.005,
    tau: float = 30.0,
    importance: Any = None,
    importance_weight: float = 0.0,
    weights: Sequence[float] | None = None,
    k_rrf: float = 60.0,
    return_candidates: bool = False,
):
    """Agent-aware RRF: RRF plus a recency bonus and an importance term.

    ``fused = sum_c w_c / (k_rrf + rank_c) + recency_weight * exp(-dt / tau)
    + importance_weight * importance[d]``
    with ``dt = max(query_time - doc_time, 0)``. The bonus is added to every
    candidate of the union (never to documents no channel returned).

    Parameters
    ----------
    channels : sequence of C SearchResults (B, k_c) or ndarrays (B, N)
    k : int
    doc_times : ndarray, shape (N,), float64, optional
        Time of each document (e.g. days since an epoch); NaN = unknown (no bonus).
    query_times : ndarray, shape (B,) float64, or a float, optional
        Time of each query, same unit as ``doc_times``.
    recency_weight : float, default 0.005
        Weight of the recency bonus.
    tau : float, default 30
        Decay constant, same unit as the times (30 days with times in days).
    importance : ndarray, shape (N,), float, optional
        Importance weight of each document (0 when absent).
    importance_weight : float, default 0
        Weight of the importance term.
    weights, k_rrf : as :func:`rrf_fusion`.

    Returns
    -------
    SearchResults (B, k), host.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    cand, xp, w, fused = _rrf_union(channels, weights, k_rrf, "none")
    safe = xp.maximum(cand.ids, 0)
    if doc_times is not None and recency_weight:
        if query_times is None:
            raise ValueError("doc_times given without query_times")
        dt_doc = xp.asarray(doc_times, dtype=xp.float64)[safe]
        qt = xp.asarray(query_times, dtype=xp.float64)
        qt = qt.reshape(-1, 1) if qt.ndim else qt
        dt = xp.maximum(qt - dt_doc, 0.0)
        bonus = xp.where(xp.isnan(dt), 0.0, recency_weight * xp.exp(-xp.where(xp.isnan(dt), 0.0, dt) / tau))
        fused = fused + bonus
    if importance is not None and importance_weight:
        imp = xp.asarray(importance, dtype=xp.float64)[safe]
        fused = fused + importance_weight * xp.where(xp.isnan(imp), 0.0, imp)
    meta = {"method": "agent_rrf", "weights": w, "k_rrf": k_rrf, "recency_weight": recency_weight, "tau": tau,
            "importance_weight": importance_weight}
    return _fused_results(cand, fused, k, meta, return_candidates)


FUSION_METHODS: dict[str, Callable[..., Any]] = {
    "z": zscore_fusion,
    "zscore": zscore_fusion,
    "minmax": minmax_fusion,
    "rrf": rrf_fusion,
    "weighted_rrf": weighted_rrf_fusion,
    "score_rrf": score_rrf_fusion,
    "agent_rrf": agent_rrf_fusion,
}


def fuse(channels: Sequence[Any], k: int, method: str = "z", **kw) -> SearchResults:
    """Fuse channels with a named method (``z``, ``minmax``, ``rrf``, ``weighted_rrf``, ``score_rrf``, ``agent_rrf``).

    ``kw`` goes to the method's function, e.g.
    ``fuse(results, k, method="score_rrf", weights=[1.0, 0.5], k_rrf=60)``.
    """
    try:
        fn = FUSION_METHODS[method]
    except KeyError:
        raise ValueError(f"unknown fusion method {method!r}; choose from {sorted(FUSION_METHODS)}") from None
    return fn(channels, k, **kw)
