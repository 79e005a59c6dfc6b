"""Late interaction: session scores pooled from turn scores.

A session (document) is a segment of consecutive turns. Each query scores every
turn (a dense inner product, or BM25 at turn level); the session score is a
pooling of its turns' scores:

=======  =====================================================================
op       session score of turn scores ``v_1..v_n``
=======  =====================================================================
mean     ``(1/n) sum v_j`` -- equals ``q . mean(turn vectors)``: early pooling
max      ``max v_j`` (max-sim)
topk     mean of the ``min(pool_k, n)`` largest ``v_j``
lse      ``(1/beta) log sum exp(beta v_j)`` (log-sum-exp; -> max as beta -> inf,
         and grows with n by at most ``log(n)/beta``)
lme      ``(1/beta) log mean exp(beta v_j)`` (log-mean-exp; between mean and max)
=======  =====================================================================

Empty sessions score ``-inf``. :func:`segment_reduce` runs the NumPy reference or
the CUDA kernel ``kernels/segment_reduce.cu``, loaded and compiled by the one
kernel loader :mod:`gpuir.backends.kernels` (one block per (session, query),
double accumulation, no atomics).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends import resolve_array_backend
from ..results import SearchResults

__all__ = [
    "POOLING_OPS",
    "bm25_turn_late_interaction",
    "compile_segment_reduce",
    "kernel_source",
    "late_interaction_scores",
    "pool_turn_scores",
    "segment_reduce",
    "segment_reduce_numpy",
    "segments_from_labels",
]

#: Pooling operators in the order of their integer codes in the CUDA kernel.
POOLING_OPS: tuple[str, ...] = ("mean", "max", "topk", "lse", "lme")

_KERNEL_FILE = "segment_reduce.cu"


def _pool_k(pool_k: int, k: int | None, fn: str) -> int:
    """``pool_k``, or the deprecated spelling ``k=`` of it (which says "results per query" elsewhere)."""
    if k is None:
        return pool_k
    warnings.warn(f"{fn}(k=...) is renamed pool_k=... (turns averaged by topk pooling)",
                  DeprecationWarning, stacklevel=3)
    return int(k)


def segments_from_labels(turn_session: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Group turns by session.

    Parameters
    ----------
    turn_session : sequence of T ints
        Session number (0 .. S-1) of each turn, in any order.

    Returns
    -------
    order : ndarray, shape (T,), int64
        Permutation that sorts turns by session (stable: turn order kept inside a session).
    offsets : ndarray, shape (S + 1,), int64
        Session ``s`` owns sorted turns ``order[offsets[s]:offsets[s+1]]``;
        ``S = max(turn_session) + 1`` (sessions without turns are empty).
    """
    lab = np.asarray(turn_session, dtype=np.int64)
    if lab.ndim != 1:
        raise ValueError("turn_session must be 1-D")
    if lab.size and lab.min() < 0:
        raise ValueError("session numbers must be >= 0")
    order = np.argsort(lab, kind="stable")
    S = int(lab.max()) + 1 if lab.size else 0
    counts = np.bincount(lab, minlength=S)
    offsets = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return order, offsets


def _check(op: str, pool_k: int, beta: float) -> int:
    if op not in POOLING_OPS:
        raise ValueError(f"unknown pooling {op!r}; choose from {POOLING_OPS}")
    if op == "topk" and pool_k < 1:
        raise ValueError(f"topk pooling needs pool_k >= 1, got {pool_k}")
    if op in ("lse", "lme") and not beta > 0:
        raise ValueError(f"{op} pooling needs beta > 0, got {beta}")
    return POOLING_OPS.index(op)


def segment_reduce_numpy(
    values: np.ndarray, offsets: np.ndarray, op: str = "max", pool_k: int = 3, beta: float = 10.0,
    *, k: int | None = None,
) -> np.ndarray:
    """NumPy reference of :func:`segment_reduce`.

    Parameters
    ----------
    values : ndarray, shape (B, T), float32 or float64, host
        Turn scores, turns grouped by segment.
    offsets : ndarray, shape (S + 1,), int64
        Segment boundaries (non-decreasing, ``offsets[0] = 0``, ``offsets[-1] = T``).
    op : {"mean", "max", "topk", "lse", "lme"}
    pool_k : int
        Turns averaged by ``topk`` (``k=`` is its deprecated spelling).
    beta : float
        Temperature of ``lse`` / ``lme``.

    Returns
    -------
    ndarray, shape (B, S), dtype of ``values``, host. ``-inf`` for empty segments.
    """
    pool_k = _pool_k(pool_k, k, "segment_reduce_numpy")
    _check(op, pool_k, beta)
    values = np.asarray(values)
    if values.ndim != 2:
        raise ValueError(f"values must be (B, T), got shape {values.shape}")
    B, T = values.shape
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != T or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must be non-decreasing from 0 to T (the number of turns)")
    S = offsets.size - 1
    out = np.full((B, S), -np.inf, dtype=np.float64)
    v64 = values.astype(np.float64)
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    if T == 0 or not nonempty.any():
        return out.astype(values.dtype)
    starts = offsets[:-1][nonempty]
    if op == "mean":
        out[:, nonempty] = np.add.reduceat(v64, starts, axis=1) / lengths[nonempty]
    elif op == "max":
        out[:, nonempty] = np.maximum.reduceat(v64, starts, axis=1)
    elif op == "topk":
        for s in np.flatnonzero(nonempty):
            seg = v64[:, offsets[s]: offsets[s + 1]]
            kk = min(pool_k, seg.shape[1])
            top = -np.sort(-seg, axis=1)[:, :kk]
            out[:, s] = top.mean(axis=1)
    else:
        m = np.maximum.reduceat(beta * v64, starts, axis=1)  # (B, S')
        seg_of = np.repeat(np.arange(starts.size), lengths[nonempty])
        e = np.exp(beta * v64 - m[:, seg_of])
        acc = np.add.reduceat(e, starts, axis=1)
        lse = m + np.log(acc)
        if op == "lme":
            lse = lse - np.log(lengths[nonempty])
        out[:, nonempty] = lse / beta
    return out.astype(values.dtype)


def kernel_source() -> str:
    """The CUDA source of the kernel, with a ``#line`` directive naming its file
    (:func:`gpuir.backends.kernels.load_source`)."""
    from ..backends.kernels import load_source

    return load_source(_KERNEL_FILE)


def compile_segment_reduce(arch: str = "sm_80") -> bytes:
    """Compile the kernel for ``arch`` with NVRTC, without needing a device.

    The one kernel loader compiles it (:mod:`gpuir.backends.kernels`), with the
    options and name expressions every ``.cu`` file gets (``OPTIONS``,
    ``NAME_EXPRESSIONS["segment_reduce.cu"]`` and CuPy's implicit ones).

    Parameters
    ----------
    arch : str
        ``"sm_80"``, ``"sm_90"``, ...

    Returns
    -------
    bytes
        The CUBIN.
    """
    from ..backends import kernels as K

    return K._compile_nvrtc(_KERNEL_FILE, K.load_source(_KERNEL_FILE), K._arch_number(arch), False)


def _segment_reduce_cupy(values, offsets, op: str, pool_k: int, beta: float):
    import cupy

    from ..backends.kernels import kernel

    code = _check(op, pool_k, beta)
    values = cupy.asarray(values)
    if values.dtype not in (cupy.float32, cupy.float64):
        values = values.astype(cupy.float32)
    values = cupy.ascontiguousarray(values)
    B, T = values.shape
    offs = cupy.asarray(offsets, dtype=cupy.int64)
    S = int(offs.size) - 1
    out = cupy.empty((B, S), dtype=values.dtype)
    if B == 0 or S == 0:
        return out
    name = "segment_reduce<float>" if values.dtype == cupy.float32 else "segment_reduce<double>"
    fn = kernel(_KERNEL_FILE, name)
    block = 128
    step = 65535  # gridDim.y limit
    for b0 in range(0, B, step):
        sub = values[b0: b0 + step]
        osub = out[b0: b0 + step]
        fn(
            (S, sub.shape[0]), (block,),
            (sub, offs, osub, np.int64(T), np.int32(S), np.int32(code), np.int32(pool_k), np.float64(beta)),
        )
    return out


def segment_reduce(
    values: Any,
    offsets: Any,
    op: str = "max",
    pool_k: int = 3,
    beta: float = 10.0,
    backend: str = "auto",
    *,
    k: int | None = None,
) -> Any:
    """Pool turn scores into session scores.

    Parameters
    ----------
    values : ndarray, shape (B, T), float32/float64, NumPy (host) or CuPy (device)
        Turn scores, turns grouped by session (see :func:`segments_from_labels`).
    offsets : ndarray, shape (S + 1,), int64
    op : {"mean", "max", "topk", "lse", "lme"}
    pool_k : int, default 3
        Turns averaged by ``topk`` (``k=`` is its deprecated spelling: ``k``
        means results per query everywhere else).
    beta : float, default 10
        Temperature of ``lse`` / ``lme``.
    backend : {"auto", "numpy", "numba", "cupy"}
        Resolved by :func:`gpuir.backends.resolve_array_backend`: ``auto`` is
        ``GPUIR_BACKEND`` when set, else CuPy when ``values`` is a CuPy array or
        a device can be used; "numba" runs on NumPy.

    Returns
    -------
    ndarray, shape (B, S), dtype of ``values``: NumPy for the numpy backend, CuPy
    (on the device) for the cupy backend.
    """
    pool_k = _pool_k(pool_k, k, "segment_reduce")
    b, _ = resolve_array_backend(backend, values)
    if b == "cupy":
        return _segment_reduce_cupy(values, offsets, op, pool_k, beta)
    if hasattr(values, "get"):
        values = values.get()
    return segment_reduce_numpy(np.asarray(values), np.asarray(offsets), op, pool_k, beta)


def pool_turn_scores(
    turn_scores: Any,
    turn_session: Sequence[int],
    op: str = "max",
    pool_k: int = 3,
    beta: float = 10.0,
    backend: str = "auto",
    *,
    k: int | None = None,
) -> np.ndarray:
    """Session scores from turn scores given a turn -> session map (any turn order).

    Parameters
    ----------
    turn_scores : ndarray, shape (B, T), float, host or device
        Score of every turn for every query. ``-inf`` turns (filtered out) make
        ``max`` ignore them but poison ``mean``; give finite scores.
    turn_session : sequence of T ints
        Session number of each turn (0 .. S-1).
    op, pool_k, beta, backend : see :func:`segment_reduce`.

    Returns
    -------
    ndarray, shape (B, S), float, host (NumPy).
    """
    pool_k = _pool_k(pool_k, k, "pool_turn_scores")
    order, offsets = segments_from_labels(turn_session)
    b, _ = resolve_array_backend(backend, turn_scores)
    if b == "cupy":
        import cupy

        v = cupy.asarray(turn_scores)[:, cupy.asarray(order)]
        return cupy.asnumpy(_segment_reduce_cupy(v, offsets, op, pool_k, beta))
    v = np.asarray(turn_scores.get() if hasattr(turn_scores, "get") else turn_scores)[:, order]
    return segment_reduce_numpy(v, offsets, op, pool_k, beta)


def late_interaction_scores(
    query_vecs: Any,
    turn_vecs: Any,
    turn_session: Sequence[int],
    op: str = "max",
    pool_k: int = 3,
    beta: float = 10.0,
    backend: str = "auto",
    *,
    k: int | None = None,
) -> np.ndarray:
    """Dense late interaction: inner products with every turn, pooled per session.

    Parameters
    ----------
    query_vecs : ndarray, shape (B, d), float32
    turn_vecs : ndarray, shape (T, d), float32 (normalised for cosine)
    turn_session : sequence of T ints
    op, pool_k, beta, backend : see :func:`segment_reduce`.

    Returns
    -------
    ndarray, shape (B, S), float32, host.
    """
    pool_k = _pool_k(pool_k, k, "late_interaction_scores")
    b, _ = resolve_array_backend(backend, query_vecs)
    if b == "cupy":
        import cupy

        q = cupy.asarray(query_vecs, dtype=cupy.float32)
        t = cupy.asarray(turn_vecs, dtype=cupy.float32)
        return pool_turn_scores(q @ t.T, turn_session, op, pool_k, beta, backend="cupy")
    q = np.asarray(query_vecs, dtype=np.float32)
    t = np.asarray(turn_vecs, dtype=np.float32)
    return pool_turn_scores(q @ t.T, turn_session, op, pool_k, beta, backend="numpy")


def bm25_turn_late_interaction(
    turn_scores: Any,
    turn_session: Sequence[int],
    n_sessions: int | None = None,
    op: str = "max",
    pool_k: int = 2,
    beta: float = 1.0,
    *,
    k: int | None = None,
) -> np.ndarray:
    """BM25 turn-level late interaction: score a session by its best turns under BM25.

    Parameters
    ----------
    turn_scores : SearchResults (B, k_t) over turn numbers, or ndarray (B, T) float
        Turn-level BM25. Dense rows may hold ``-inf`` for turns without any query
        term; a top-k list leaves unreturned turns out. Both count such turns as
        BM25 score 0 (their true score), so ``max``/``topk`` see only real matches
        and ``mean`` averages over all of a session's turns.
    turn_session : sequence of T ints
        Session of each turn (0 .. S-1).
    n_sessions : int, optional
        S (default ``max(turn_session) + 1``).
    op : {"max", "topk", "mean", "lse", "lme"}, default "max"
    pool_k, beta : see :func:`segment_reduce`.

    Returns
    -------
    ndarray, shape (B, S), float32, host; ``-inf`` for sessions in which no turn
    matched (non-candidates, as in session-level BM25), or that have no turns.
    """
    pool_k = _pool_k(pool_k, k, "bm25_turn_late_interaction")
    lab = np.asarray(turn_session, dtype=np.int64)
    T = lab.size
    if isinstance(turn_scores, SearchResults):
        B = turn_scores.ids.shape[0]
        dense = np.full((B, T), -np.inf, dtype=np.float32)
        rows, cols = np.nonzero(turn_scores.ids >= 0)
        dense[rows, turn_scores.ids[rows, cols]] = turn_scores.scores[rows, cols]
    else:
        dense = np.asarray(turn_scores.get() if hasattr(turn_scores, "get") else turn_scores, dtype=np.float32)
    matched = np.isfinite(dense) & (dense > 0)
    filled = np.where(np.isfinite(dense), dense, 0.0).astype(np.float32)
    S = int(n_sessions) if n_sessions is not None else (int(lab.max()) + 1 if T else 0)
    if T and lab.max() >= S:
        raise ValueError(f"turn_session names session {lab.max()} but n_sessions is {S}")
    order, offs = segments_from_labels(lab)
    # pad with empty sessions up to S (sessions with no turns at the end)
    offs = np.concatenate([offs, np.full(S + 1 - offs.size, offs[-1] if offs.size else 0, np.int64)])
    pooled = segment_reduce_numpy(filled[:, order], offs, op, pool_k, beta)
    any_match = np.zeros((dense.shape[0], S), dtype=bool)
    if T:
        hit = np.zeros((dense.shape[0], S), dtype=np.int64)
        np.add.at(hit.T, lab, matched.T.astype(np.int64))
        any_match = hit > 0
    return np.where(any_match, pooled, -np.inf).astype(np.float32)
