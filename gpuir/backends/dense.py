"""The engine's one dense path: exact inner products of query and stored vectors, top-k with the tie rule.

Every dense search in the package (a memory's stored vectors:
:meth:`gpuir.Memory.search_vectors`, and through it the Retriever's ``dense``
and ``late`` channels) ends in :func:`dense_topk` over one block of stored
vectors (one memory segment's column).

**The score, bit for bit on every backend.** A score is the float32 rounding
of the inner product of a query vector (float32) and a stored vector (float32,
or float16: exactly widened) accumulated in float64. Each product of two
float32 values is exact in float64, and a sum of ``d`` of them carries an
error near ``sqrt(d) * 2**-53`` relative, a million times below the float32
spacing; so NumPy's float64 matrix product, the compiled loop and cuBLAS,
which add in different orders, round to the same float32 score unless the
exact sum lies within that error of a float32 rounding boundary (about one
score in 10**8; the tests' fixed data has none). The plain float32 product
``q @ v.T`` differs from it by at most a float32 rounding or two ("equal to
float32 rounding").

**Ties**: higher score first, then lower row (rows of a memory segment are in
sequence order, so this is "then lower sequence number"); rows the ``allow``
mask refuses are never candidates; padding is row -1, score -inf.

Backends (``backend``):

==========  ===================================================================
numpy       the reference: float64 matrix product (BLAS) over row chunks
numba       a compiled loop (GIL released; rows split over ``GPUIR_THREADS``
            threads), float64 accumulation from the stored dtype (no float64
            copy of the vectors)
cupy        float64 matrix product on the GPU over a device copy of the
            vectors (cached by the caller), top-k on the device
==========  ===================================================================
"""

from __future__ import annotations

import functools
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..topk import topk_pairs, topk_rows

__all__ = ["DENSE_BACKENDS", "VECTOR_DTYPES", "dense_scores", "dense_topk", "normalize_rows"]

#: Backends of :func:`dense_topk`.
DENSE_BACKENDS = ("numpy", "numba", "cupy")
#: Storage dtypes of stored vectors.
VECTOR_DTYPES = ("float32", "float16")
#: Budget of one float64 score / vector block (bytes).
CHUNK_BYTES = 64 << 20


def normalize_rows(x: Any, dtype: str = "float32") -> np.ndarray:
    """Rows of ``x`` divided by their L2 norm (computed in float64), cast to ``dtype``; zero rows stay zero.

    Parameters
    ----------
    x : array-like, shape (n, d), finite numbers, host
    dtype : {"float32", "float16"}

    Returns
    -------
    ndarray, shape (n, d), ``dtype``, host, C-contiguous.
    """
    a = np.asarray(x, dtype=np.float64)
    n = np.sqrt(np.einsum("ij,ij->i", a, a))[:, None]
    return np.ascontiguousarray(a / np.where(n > 0, n, 1.0), dtype=np.dtype(dtype))


@functools.cache
def _kernel():
    """The compiled scorer (numba imported on first use). It releases the GIL; threads split the rows
    (numba's own parallel layer is not used: the process's threads are gpuir's, as in the BM25 scorer)."""
    from numba import njit

    @njit(cache=True, nogil=True)
    def scores(q, v, out, r0, r1):  # q (B, d) f64, v (n, d) f32, out (B, n) f32; rows [r0, r1)
        B, d = q.shape
        for i in range(r0, r1):
            for b in range(B):
                s = 0.0
                for j in range(d):
                    s += q[b, j] * np.float64(v[i, j])
                out[b, i] = np.float32(s)

    return scores


_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pool_lock:
        p = _pools.get(threads)
        if p is None:
            p = _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpuir-dense")
        return p


def _numba_scores(q64: np.ndarray, v: np.ndarray) -> np.ndarray:
    from .numba_backend import default_threads

    n = v.shape[0]
    out = np.empty((q64.shape[0], n), dtype=np.float32)
    if not (n and q64.shape[0]):
        return out
    kern = _kernel()
    threads = min(default_threads(), max(1, n // 4096))
    if threads <= 1:
        kern(q64, v, out, 0, n)
        return out
    bounds = np.linspace(0, n, threads + 1).astype(np.int64)
    futs = [_pool(threads).submit(kern, q64, v, out, int(a), int(b)) for a, b in itertools.pairwise(bounds)]
    for f in futs:
        f.result()
    return out


def _cupy():
    import cupy

    return cupy


def cupy_module():
    """The CuPy module (raises where CuPy is missing)."""
    return _cupy()


def dense_scores(queries: np.ndarray, vectors: Any, backend: str = "numpy") -> Any:
    """Scores of every query against every stored vector (module docstring): (B, n) float32.

    Parameters
    ----------
    queries : ndarray, shape (B, d), float32, host
    vectors : ndarray, shape (n, d), float32 or float16 (host; a CuPy array for "cupy")
    backend : {"numpy", "numba", "cupy"}

    Returns
    -------
    ndarray, shape (B, n), float32: host, or on the device for "cupy".
    """
    q64 = np.asarray(queries, dtype=np.float64)
    if backend == "numba":
        v = vectors if vectors.dtype == np.float32 else np.asarray(vectors, dtype=np.float32)  # exact widening
        return _numba_scores(np.ascontiguousarray(q64), np.ascontiguousarray(v))
    if backend == "cupy":
        cp = _cupy()
        return (cp.asarray(q64) @ vectors.astype(cp.float64).T).astype(cp.float32)
    if backend != "numpy":
        raise ValueError(f"unknown dense backend {backend!r}: choose one of {', '.join(DENSE_BACKENDS)}")
    return (q64 @ np.asarray(vectors, dtype=np.float64).T).astype(np.float32)


def dense_topk(queries: np.ndarray, vectors: Any, k: int, allow: np.ndarray | None = None,
               backend: str = "numpy") -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows of ``vectors`` for each query (score desc, then row asc); exact.

    Parameters
    ----------
    queries : ndarray, shape (B, d), float32, host
        Query vectors (normalised by the caller when cosines are wanted).
    vectors : ndarray, shape (n, d), float32 or float16
        Host, or a CuPy array for ``backend="cupy"``.
    k : int, >= 1
    allow : ndarray, shape (B, n) or (n,), bool, host, optional
        Candidate rows of each query (None: every row).
    backend : {"numpy", "numba", "cupy"}

    Returns
    -------
    (rows, scores) : ndarrays, shape (B, min(k, n)), int64 / float32, host; -1 / -inf padding.
    """
    q = np.asarray(queries, dtype=np.float32)
    B, n = q.shape[0], int(vectors.shape[0])
    kk = max(1, min(int(k), n))
    rows_out = np.full((B, kk), -1, dtype=np.int64)
    sc_out = np.full((B, kk), -np.inf, dtype=np.float32)
    if n == 0 or B == 0:
        return rows_out, sc_out
    if allow is not None:
        allow = np.asarray(allow, dtype=bool)
        if allow.ndim == 1:
            allow = np.broadcast_to(allow, (B, n))
    step = max(1024, CHUNK_BYTES // (8 * max(B, int(vectors.shape[1]), 1)))
    parts_r, parts_s = [], []
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        S = dense_scores(q, vectors[r0:r1], backend)
        if backend == "cupy":
            cp = _cupy()
            if allow is not None:
                S = cp.where(cp.asarray(allow[:, r0:r1]), S, cp.float32(-np.inf))
            cr, cs = topk_rows(S, kk)
            cr, cs = _host(cr), _host(cs)
        else:
            if allow is not None:
                S = np.where(allow[:, r0:r1], S, np.float32(-np.inf))
            cr, cs = topk_rows(S, kk)
        parts_r.append(np.where(cr >= 0, cr + r0, -1))
        parts_s.append(cs)
    if len(parts_r) == 1:
        rr, ss = parts_r[0], parts_s[0]
        w = rr.shape[1]
        rows_out[:, :w], sc_out[:, :w] = rr, ss
        return rows_out, sc_out
    R, S = np.concatenate(parts_r, axis=1), np.concatenate(parts_s, axis=1)
    for b in range(B):
        ok = R[b] >= 0
        r, s = topk_pairs(R[b][ok], S[b][ok], kk)
        rows_out[b, : r.size], sc_out[b, : s.size] = r, s
    return rows_out, sc_out


def _host(a: Any) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") else a)
