"""Host (and CuPy-array) top-k under gpuir's one tie rule: higher score first, then lower id.

The one home of top-k selection outside the CUDA kernels. Every function
keeps every candidate tied at the k-th score until the final ordering, so the
result is exact (never "some k of the tied ones"):

* :func:`kth_largest` -- the k-th largest value of a vector (a pruning threshold);
* :func:`topk_pairs` -- the best k of one candidate set ``(ids, scores)``
  (:func:`topk_order`: their positions, to gather other arrays alike);
* :func:`topk_rows` -- the best k of each row of a dense score matrix (NumPy or
  CuPy), ``-inf`` (and NaN) marking non-candidates, with optional per-column ids;
* :func:`topk_rows_by_id` -- the order of the best k of each row of candidate
  (id, score) pairs in any order (several top-k lists side by side, say).

Only NumPy is imported; CuPy arrays are handled through their own module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["array_module", "kth_largest", "topk_order", "topk_pairs", "topk_rows", "topk_rows_by_id"]


def array_module(a: Any):
    """The array module (numpy or cupy) of ``a``."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def kth_largest(vals: np.ndarray, k: int) -> float:
    """The k-th largest value of ``vals`` (ndarray (n,), float32, host; 1 <= k <= n), exactly.

    On large inputs a strided sample's k-th largest (a lower bound) first
    discards most values, so the partition runs on a few thousand.
    """
    n = vals.size
    if n > 256 * k:
        sub = vals[:: n // (64 * k)]
        lb = np.partition(sub, sub.size - k)[sub.size - k]
        vals = vals[vals >= lb]  # still holds the k largest
        n = vals.size
    return float(np.partition(vals, n - k)[n - k])


def topk_order(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the best ``k`` of one candidate set, best first (score descending, then id ascending).

    Parameters
    ----------
    ids : ndarray, shape (m,), integer, host
        Candidate ids (distinct).
    scores : ndarray, shape (m,), float, host
        Their scores (no NaN).
    k : int
        How many to keep (>= 0); fewer when ``m < k``.

    Returns
    -------
    ndarray, shape (min(k, m),), int64, host: indices into ``ids`` / ``scores``
    (to gather other per-candidate arrays in the same order).
    """
    neg = -scores
    if ids.size <= k:
        return np.lexsort((ids, neg))[:k].astype(np.int64)
    th = np.partition(neg, k - 1)[k - 1] if k > 0 else -np.inf
    sel = np.flatnonzero(neg <= th)  # every candidate tied with the k-th stays
    return sel[np.lexsort((ids[sel], neg[sel]))[:k]].astype(np.int64)


def topk_pairs(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of one candidate set, sorted by score descending, then id ascending.

    Parameters
    ----------
    ids, scores, k : as :func:`topk_order`.

    Returns
    -------
    (ids, scores) : ndarrays, shape (min(k, m),), dtypes of the inputs, host.
    """
    order = topk_order(ids, scores, k)
    return ids[order], scores[order]


def topk_rows(scores: Any, k: int, col_ids: Any = None) -> tuple[Any, Any]:
    """Top-k of score rows under the tie rule (score desc, id asc); -inf and NaN excluded.

    Parameters
    ----------
    scores : ndarray, shape (B, N), float32 or float64, NumPy or CuPy
    k : int
        Results per row (>= 1); may exceed N (the rest is padding).
    col_ids : ndarray, shape (N,) or (B, N), int64, optional
        Id of each column, ascending along a row; default ``arange(N)``.

    Returns
    -------
    (ids, scores) : ndarrays (B, k) int64 / float32 on the input's device; -1 / -inf padding.
    """
    xp = array_module(scores)
    B, N = scores.shape
    kk = min(k, N)
    if N == 0:
        return xp.full((B, k), -1, xp.int64), xp.full((B, k), -xp.inf, xp.float32)
    valid_in = scores > -xp.inf  # False for -inf and NaN
    if kk < N:
        # candidates: everything >= the kk-th largest value (keeps all ties at the boundary)
        filled = xp.where(valid_in, scores, -xp.inf)
        part = xp.partition(filled, N - kk, axis=1)[:, N - kk: N - kk + 1]
        valid_in = valid_in & (filled >= part)
    key = xp.where(valid_in, -scores.astype(xp.float64), xp.inf)
    order = xp.argsort(key, axis=1, kind="stable")[:, :kk]  # stable: lower column first on ties
    sel_key = xp.take_along_axis(key, order, 1)
    valid = sel_key < xp.inf
    if col_ids is None:
        cols = order
    else:
        c = xp.asarray(col_ids)
        cols = c[order] if c.ndim == 1 else xp.take_along_axis(c, order, 1)
    ids = xp.where(valid, cols, -1).astype(xp.int64)
    sc = xp.where(valid, -sel_key, -xp.inf).astype(xp.float32)
    if kk < k:
        ids = xp.concatenate([ids, xp.full((B, k - kk), -1, xp.int64)], 1)
        sc = xp.concatenate([sc, xp.full((B, k - kk), -xp.inf, xp.float32)], 1)
    return ids, sc


def topk_rows_by_id(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the best ``k`` of each row of candidates, best first: score descending, then id ascending.

    Parameters
    ----------
    ids : ndarray, shape (B, M), int64, host
        Candidate ids, distinct within a row, in any order; padding slots hold any id with a ``-inf`` score.
    scores : ndarray, shape (B, M), float32, host
        Their scores (no NaN); ``-inf`` marks padding, which sorts after every candidate.
    k : int
        How many to keep per row (>= 1).

    Returns
    -------
    ndarray, shape (B, min(k, M)), int64, host: column positions into each row of ``ids`` / ``scores``
    (gather with ``np.take_along_axis``); positions of padding come last.
    """
    order = np.lexsort((ids, -scores), axis=1)
    return order[:, :min(k, ids.shape[1])].astype(np.int64, copy=False)
