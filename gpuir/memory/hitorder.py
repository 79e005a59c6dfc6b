"""What a search does with its top k at the edge: the tie rule of its mode, a score threshold, an order.

The engine ranks by score, then add order (lower sequence number first), in
every mode (:mod:`gpuir.memory.search`). On top of it, :meth:`Memory.search
<gpuir.memory.Memory.search>` applies:

``ties``
    ``"oldest"`` (the engine's rule, the default of ``mode="exhaustive"``) or
    ``"newest"`` (the default of ``mode="newest"`` and ``"budgeted"``): records
    of equal score come newest first -- later ``time`` first (records without
    a time after timed ones), then later add order. Exact at the k-th place:
    the engine is asked for k + 1 records, and when the (k+1)-th ties the k-th,
    for more until every record of that score is in hand (:func:`newest_ties`),
    so the k kept are the newest of the tied ones, not the first found.
``min_score``
    hits scoring below it are dropped (rows are padded as for fewer matches).
``order_by``
    ``"score"`` (default) or ``"time"``: the k hits chosen by score, returned in
    time order (oldest first, records without a time last, then add order).

The rules live here once, as functions over arrays of hits (sequence numbers,
float32 scores, epoch-ms times): :func:`rank_order`, :func:`time_order` and
:func:`merge_topk` (the top k of each question from several parts, for a
sharded memory's coordinator, :mod:`gpuir.cluster.sharded`). The ``Memory``'s
edge rules (:func:`newest_ties`, :func:`by_time`) call them too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .records import MISSING_TIME
from .search import Hits
from .snapshot import Snapshot

__all__ = ["HIT_ORDERS", "TIES", "by_time", "check_min_score", "hit_times", "merge_topk", "newest_ties", "rank_order",
           "resolve_ties", "threshold", "time_order"]

TIES = ("oldest", "newest")
HIT_ORDERS = ("score", "time")


def resolve_ties(ties: str | None, mode: str) -> str:
    """The tie rule of a search: ``ties`` when given, else "newest" for the recency modes, else "oldest"."""
    if ties is None:
        return "newest" if mode in ("newest", "budgeted") else "oldest"
    if ties not in TIES:
        raise ValueError(f"ties must be one of {', '.join(repr(t) for t in TIES)} or None, got {ties!r}")
    return ties


def check_min_score(min_score: float | None) -> float | None:
    """``min_score`` checked: None or a finite number."""
    if min_score is None:
        return None
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float, np.integer, np.floating)) or not (
            math.isfinite(float(min_score))):
        raise ValueError(f"min_score must be a finite number or None, got {min_score!r}")
    return float(min_score)


def hit_times(snap: Snapshot, vidx: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The time of each hit, gathered one segment at a time (no loop over hits).

    Parameters
    ----------
    snap : the snapshot the hits come from
    vidx, rows : ndarray, shape (m,), int64, host
        Each hit's view in ``snap.views`` and row there (every one a real hit, no padding).

    Returns
    -------
    ndarray, shape (m,), int64, host: epoch ms, :data:`~gpuir.memory.records.MISSING_TIME` when untimed.
    """
    vidx = np.asarray(vidx, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(vidx.shape, MISSING_TIME, dtype=np.int64)
    for v in np.unique(vidx).tolist():
        at = vidx == v
        out[at] = snap.views[v].seg.time[rows[at]]
    return out


def _times(snap: Snapshot, h: Hits) -> np.ndarray:
    return hit_times(snap, h.vidx, h.rows)


def rank_order(seqs: np.ndarray, scores: np.ndarray, times: np.ndarray | None, ties: str,
               groups: np.ndarray | None = None) -> np.ndarray:
    """Indices that sort hits best first under the tie rule ``ties`` (within each group, groups ascending).

    ``"oldest"``: score descending, then sequence number ascending (the engine's rule).
    ``"newest"``: score descending, timed before untimed, time descending, sequence number descending.

    Parameters
    ----------
    seqs : ndarray, shape (m,), int64, host
    scores : ndarray, shape (m,), float32, host
    times : ndarray, shape (m,), int64, host, or None
        Epoch ms (:data:`~gpuir.memory.records.MISSING_TIME` when untimed); needed by ``"newest"`` only.
    ties : {"oldest", "newest"}
    groups : ndarray, shape (m,), int, host, optional
        A question number per hit: the order sorts by group first.

    Returns
    -------
    ndarray, shape (m,), int64, host
    """
    neg = -np.asarray(scores).astype(np.float64)
    seqs = np.asarray(seqs, dtype=np.int64)
    if ties == "newest":
        if times is None:
            raise ValueError("ties='newest' orders by time: give the hits' times")
        t = np.asarray(times, dtype=np.int64)
        untimed = t == MISSING_TIME
        keys: tuple[np.ndarray, ...] = (-seqs, -np.where(untimed, 0, t), untimed, neg)
    elif ties == "oldest":
        keys = (seqs, neg)
    else:
        raise ValueError(f"ties must be one of {', '.join(repr(t) for t in TIES)}, got {ties!r}")
    if groups is not None:
        keys = (*keys, np.asarray(groups))
    return np.lexsort(keys).astype(np.int64, copy=False)


def time_order(seqs: np.ndarray, times: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Indices that sort hits by time (within each group): oldest first, untimed last, then add order.

    Parameters
    ----------
    seqs, times : ndarray, shape (m,), int64, host
    groups : ndarray, shape (m,), int, host, optional

    Returns
    -------
    ndarray, shape (m,), int64, host
    """
    t = np.asarray(times, dtype=np.int64)
    untimed = t == MISSING_TIME
    keys: tuple[np.ndarray, ...] = (np.asarray(seqs, dtype=np.int64), np.where(untimed, 0, t), untimed)
    if groups is not None:
        keys = (*keys, np.asarray(groups))
    return np.lexsort(keys).astype(np.int64, copy=False)


def merge_topk(seqs: np.ndarray, scores: np.ndarray, times: np.ndarray | None, groups: np.ndarray, k: int,
               ties: str = "oldest", order_by: str = "score") -> tuple[np.ndarray, np.ndarray]:
    """Each question's top ``k`` from hits gathered from several parts (each part's own top k), in one sort.

    Every part must have ranked with the same statistics and rule, and a
    record must appear in one part only (its sequence number is global): the
    result is then the top k one memory holding every part returns.

    Parameters
    ----------
    seqs : ndarray, shape (m,), int64, host
        Global sequence numbers of the hits of every question (no padding).
    scores : ndarray, shape (m,), float32, host
    times : ndarray, shape (m,), int64, host, or None
        Epoch ms (MISSING_TIME when untimed); needed for ``ties="newest"`` or ``order_by="time"``.
    groups : ndarray, shape (m,), int64, host
        The question of each hit.
    k : int, >= 0
    ties : {"oldest", "newest"}
    order_by : {"score", "time"}
        The k kept, returned best first or in time order (:func:`time_order`).

    Returns
    -------
    keep : ndarray, shape (n,), int64, host
        Indices of the kept hits, grouped by question (ascending), each question's in the order asked.
    col : ndarray, shape (n,), int64, host
        Each kept hit's place in its question's row (0 .. k-1).
    """
    groups = np.asarray(groups, dtype=np.int64)
    if not groups.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = rank_order(seqs, scores, times, ties, groups)
    g = groups[order]
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # where each question's run begins
    col = np.arange(g.size) - np.repeat(start, np.diff(np.r_[start, g.size]))
    keep = order[col < k]
    col = col[col < k]
    if order_by == "time" and keep.size:
        if times is None:
            raise ValueError("order_by='time' orders by time: give the hits' times")
        re = time_order(np.asarray(seqs)[keep], np.asarray(times)[keep], groups[keep])
        keep = keep[re]  # the same hits per question (groups stay in runs), now in time order; columns unchanged
    return keep, col


def _take(h: Hits, idx: np.ndarray) -> Hits:
    return Hits(h.seqs[idx], h.scores[idx], h.vidx[idx], h.rows[idx])


def newest_ties(h: Hits, k: int, snap: Snapshot, more: Callable[[int], Hits]) -> Hits:
    """The top ``k`` with ties newest first, from ``h`` (the engine's top k + 1 of one query).

    ``more(n)`` returns the engine's top ``n`` of the same query, asked for only
    when the (k+1)-th record ties the k-th.
    """
    if len(h) > k and h.scores[k] == h.scores[k - 1]:
        boundary = h.scores[k - 1]
        n = 2 * len(h)
        while True:
            h = more(n)
            if len(h) < n or h.scores[-1] < boundary:
                break
            n *= 2
        h = _take(h, np.flatnonzero(h.scores >= boundary))
    if not len(h):
        return h
    # score desc, timed before untimed, time desc, sequence desc
    return _take(h, rank_order(h.seqs, h.scores, _times(snap, h), "newest")[:k])


def threshold(h: Hits, min_score: float | None) -> Hits:
    """``h`` without the hits scoring below ``min_score``."""
    if min_score is None or not len(h):
        return h
    return _take(h, np.flatnonzero(h.scores.astype(np.float64) >= min_score))


def by_time(h: Hits, snap: Snapshot) -> Hits:
    """``h`` in time order: oldest first, records without a time last, then add order."""
    if len(h) < 2:
        return h
    return _take(h, time_order(h.seqs, _times(snap, h)))
