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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .records import MISSING_TIME
from .search import Hits
from .snapshot import Snapshot

__all__ = ["HIT_ORDERS", "TIES", "by_time", "check_min_score", "newest_ties", "resolve_ties", "threshold"]

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


def _times(snap: Snapshot, h: Hits) -> np.ndarray:
    return np.fromiter((snap.views[v].seg.time[r] for v, r in zip(h.vidx.tolist(), h.rows.tolist())),
                       dtype=np.int64, count=len(h))


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
    t = _times(snap, h)
    untimed = t == MISSING_TIME
    # score desc, timed before untimed, time desc, sequence desc
    order = np.lexsort((-h.seqs, -np.where(untimed, 0, t), untimed, -h.scores.astype(np.float64)))
    return _take(h, order[:k])


def threshold(h: Hits, min_score: float | None) -> Hits:
    """``h`` without the hits scoring below ``min_score``."""
    if min_score is None or not len(h):
        return h
    return _take(h, np.flatnonzero(h.scores.astype(np.float64) >= min_score))


def by_time(h: Hits, snap: Snapshot) -> Hits:
    """``h`` in time order: oldest first, records without a time last, then add order."""
    if len(h) < 2:
        return h
    t = _times(snap, h)
    untimed = t == MISSING_TIME
    return _take(h, np.lexsort((h.seqs, np.where(untimed, 0, t), untimed)))
