"""The compiled CPU backend (Numba): the NumPy reference's results, bit for bit, faster.

:class:`NumbaScorer` answers a batch with compiled kernels: the pruned search
of :mod:`gpuir.backends.cpu_maxscore` (MaxScore term at a time, survivors
rescored exactly) by default, the exhaustive document-at-a-time one of
:mod:`gpuir.backends.cpu_kernels` with ``prune=False`` and for
:meth:`~NumbaScorer.score_matrix`. Both add the very float32 posting weights of
:func:`~gpuir.backends.weights.posting_weights`, per document in ascending
term id from 0.0f, so ids and scores equal :class:`NumpyScorer`'s exactly,
with the same tie rule (score desc, document asc), filters and padding.

Why Numba: it compiles these loops to machine code from plain Python, ships
wheels for Linux, macOS and Windows (no compiler needed), caches what it
compiles (``cache=True``), and releases the GIL (``nogil=True``) so Python
threads score queries in parallel. bm25s uses it for the same reason.

Threads
-------
``threads`` (default: the ``GPUIR_THREADS`` environment variable, else every
core this process may run on) bounds how many queries of one batch run at once.
A batch is cut into chunks of queries handed to a thread pool; a single query,
or ``threads=1``, runs in the calling thread with no pool at all. The kernels
keep no state between calls; each running chunk takes a workspace of its own
from a pool (N-sized arrays, made once and reused), so searches from several
Python threads at once are safe and return what a serial search returns.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults, padded_arrays
from .base import CollectionStats, Scorer
from .weights import posting_weights


def default_threads() -> int:
    """Threads a batch uses by default: ``GPUIR_THREADS``, else the cores this process may use.

    Raises
    ------
    ValueError
        ``GPUIR_THREADS`` is set but is not a positive integer.
    """
    env = os.environ.get("GPUIR_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"GPUIR_THREADS must be a positive integer, got {env!r}")
        return n
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _ro(a: np.ndarray, dtype) -> np.ndarray:
    """A read-only, C-contiguous ndarray view of ``a`` (a copy only when the dtype or layout differ).

    In-memory and memory-mapped (read-only) indexes then share one compiled
    specialisation of each kernel: numba types read-only arrays apart.
    """
    out = np.ascontiguousarray(np.asarray(a), dtype=dtype).view()
    out.flags.writeable = False
    return out


def _check_threads(threads: int | None) -> int:
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive integer or None (all cores), got {threads!r}")
    return int(threads)


class NumbaScorer(Scorer):
    """BM25 on the CPU with compiled (Numba) kernels.

    Parameters
    ----------
    index : CSRIndex
    params : BM25Params
    prune : bool
        MaxScore pruning (default); exact either way.
    stats : CollectionStats, optional
        Statistics the weights are computed from (default: the index's own).
    threads : int, optional
        Queries of one batch scored at once (default :func:`default_threads`).
    """

    name = "numba"
    #: Relative slack of the pruning bounds: far above the float32 rounding of a
    #: sum (plus 2^-23 per term added, for very long queries).
    _SLACK = 1e-5
    #: Queries per chunk handed to a thread: at least this many (pool overhead),
    #: and about this many chunks per thread (load balance).
    _MIN_CHUNK = 4
    _CHUNKS_PER_THREAD = 8

    def __init__(
        self,
        index: CSRIndex,
        params: BM25Params,
        prune: bool = True,
        stats: CollectionStats | None = None,
        threads: int | None = None,
    ):
        from . import cpu_kernels, cpu_maxscore  # numba compiles (or loads its cache) on first call

        super().__init__(index, params, stats)
        self._k, self._ms = cpu_kernels, cpu_maxscore
        self.threads = _check_threads(threads)
        pw = posting_weights(index, params, self.stats)
        #: float32 (V,): idf of each term.
        self.idf = pw.idf
        #: float32 (V,): weight of an absent query term (non-zero for bm25l/bm25+ only).
        self.w0 = pw.w0
        self._has_w0 = pw.has_w0
        #: float32 (P,), read-only: the weight of each posting.
        self.weights = _ro(pw.weights, np.float32)
        #: float64 (V,), read-only: the largest posting weight of each term (its MaxScore bound).
        self.ub = _ro(pw.ub, np.float64)
        # The bounds assume non-negative weights (true of every variant); never prune otherwise.
        #: Whether searches skip what cannot reach the top k (MaxScore); exact either way.
        self.prune = bool(prune) and not (self.weights.size and float(self.weights.min()) < 0)
        self._offsets = _ro(index.offsets, np.int64)
        self._doc_ids = _ro(index.doc_ids, np.int32)
        # whether a term has a posting of weight 0 (idf 0: robertson, atire): acc == 0 is then no proof
        zero_w = np.zeros(index.n_terms, dtype=bool)
        nz = np.flatnonzero(np.diff(self._offsets) > 0)
        if nz.size:
            zero_w[nz] = np.minimum.reduceat(self.weights, self._offsets[nz]) == 0
        self._zero_w = _ro(zero_w, bool)
        self._blocks = self._block_index()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._free: list[tuple[np.ndarray, ...]] = []  # idle workspaces (N-sized scratch)

    @contextmanager
    def _workspace(self):
        """One thread's N-sized scratch (acc, touched, sdoc, part, mark): 17 bytes a document, reused."""
        with self._pool_lock:
            ws = self._free.pop() if self._free else None
        if ws is None:
            N = self.index.n_docs
            ws = (np.zeros(N, np.float32), np.zeros(N, np.int32), np.zeros(N, np.int32), np.zeros(N, np.float32),
                  np.zeros(N, np.uint8))
        try:
            yield ws
        finally:
            with self._pool_lock:
                self._free.append(ws)

    def _block_index(self) -> tuple[np.ndarray, ...]:
        """Each term's postings cut into blocks of ``BLOCK``, with a doc-space directory.

        Returns
        -------
        blk_off : ndarray (V+1,), int64 -- term t's blocks are blk_off[t]:blk_off[t+1]
        blk_last : ndarray (NB,), int32 -- document of a block's last posting
        blk_max : ndarray (NB,), float32 -- largest posting weight in the block
        dir_off : ndarray (V+1,), int64; dir_shift : ndarray (V,), int64; blk_dir : ndarray (ND,), int64
            Term t's first block whose last document is >= d is at most a step or two
            after ``blk_dir[dir_off[t] + (d >> dir_shift[t])]``: the directory cuts the
            document space in 2**dir_shift[t]-sized cells, at least as many as the blocks.
        """
        bs, N = self._ms.BLOCK, max(self.index.n_docs, 1)
        lens = np.diff(self._offsets)
        V = lens.size
        nblk = -(-lens // bs)
        blk_off = np.zeros(V + 1, dtype=np.int64)
        np.cumsum(nblk, out=blk_off[1:])
        term = np.repeat(np.arange(V, dtype=np.int64), nblk)
        start = self._offsets[term] + (np.arange(blk_off[-1], dtype=np.int64) - blk_off[term]) * bs
        end = np.minimum(start + bs, self._offsets[term + 1])
        blk_last = self._doc_ids[end - 1]
        blk_max = np.maximum.reduceat(self.weights, start) if start.size else np.zeros(0, np.float32)
        # directory: 2**shift >= N / blocks cells
        shift = np.floor(np.log2(N / np.maximum(nblk, 1))).astype(np.int64).clip(0, 62)
        cells = ((N - 1) >> shift) + 1
        dir_off = np.zeros(V + 1, dtype=np.int64)
        np.cumsum(cells, out=dir_off[1:])
        dterm = np.repeat(np.arange(V, dtype=np.int64), cells)
        first_doc = (np.arange(dir_off[-1], dtype=np.int64) - dir_off[dterm]) << shift[dterm]
        blk_dir = np.searchsorted(term * (N + 1) + blk_last, dterm * (N + 1) + first_doc)
        return (_ro(blk_off, np.int64), _ro(blk_last, np.int32), _ro(blk_max, np.float32), _ro(dir_off, np.int64),
                _ro(shift, np.int64), _ro(blk_dir, np.int64))

    # -- batch preparation ----------------------------------------------------------
    def _flat_queries(self, queries: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Concatenated term ids, offsets and bm25l/bm25+ constants of a batch.

        Returns
        -------
        q_flat : ndarray (Q,), int64; q_off : ndarray (B+1,), int64; consts : ndarray (B,), float32
        """
        qs = [np.asarray(q).reshape(-1) for q in queries]
        for i, q in enumerate(qs):
            if q.size and q.dtype.kind not in "iu":
                raise TypeError(f"query {i} holds {q.dtype} values; queries must be integer term ids")
        B, V = len(qs), self.index.n_terms
        q_off = np.zeros(B + 1, dtype=np.int64)
        np.cumsum([q.size for q in qs], out=q_off[1:])
        q_flat = np.concatenate(qs).astype(np.int64, copy=False) if B else np.zeros(0, np.int64)
        if q_flat.size and (q_flat.min() < 0 or q_flat.max() >= V):
            bad = int(np.searchsorted(q_off, int(np.flatnonzero((q_flat < 0) | (q_flat >= V))[0]), "right")) - 1
            raise ValueError(f"query {bad} has a term id outside [0, {V}): term ids index the vocabulary")
        consts = np.zeros(B, dtype=np.float32)
        if self._has_w0:
            for i, q in enumerate(qs):  # the reference's expression, for the same bits
                if q.size:
                    terms, mult = np.unique(q.astype(np.int64), return_counts=True)
                    consts[i] = np.float32((self.w0[terms] * mult).sum(dtype=np.float32))
        return np.ascontiguousarray(q_flat), q_off, consts

    def _flat_allow(self, allow: Sequence[np.ndarray | None] | None, B: int) -> tuple[np.ndarray, ...]:
        """Allow-lists as one array and per-query bounds (a_lo = -1: no filter).

        Returns
        -------
        flat : ndarray (A,), int64; a_lo, a_hi : ndarray (B,), int64
        """
        a_lo = np.full(B, -1, dtype=np.int64)
        a_hi = np.full(B, -1, dtype=np.int64)
        if allow is None:
            return np.zeros(0, np.int64), a_lo, a_hi
        if len(allow) != B:
            raise ValueError(f"allow has {len(allow)} entries for {B} queries: give one (or None) per query")
        N = self.index.n_docs
        parts: list[np.ndarray] = []
        placed: dict[int, tuple[int, int]] = {}  # one copy of a list shared by many queries
        n = 0
        for i, a in enumerate(allow):
            if a is None:
                continue
            key = id(a)
            if key not in placed:
                arr = np.asarray(a)
                if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                    raise ValueError(f"allow-list of query {i} must be a 1-D array of document numbers")
                arr = arr.astype(np.int64, copy=False)
                if arr.size and (arr[0] < 0 or arr[-1] >= N or np.any(arr[1:] <= arr[:-1])):
                    raise ValueError(
                        f"allow-list of query {i} must hold sorted unique document numbers in [0, {N}): "
                        "normalise filters with gpuir.filters.normalize_filters"
                    )
                parts.append(arr)
                placed[key] = (n, n + arr.size)
                n += arr.size
            a_lo[i], a_hi[i] = placed[key]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return np.ascontiguousarray(flat), a_lo, a_hi

    # -- threads ----------------------------------------------------------------------
    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="gpuir-numba")
            return self._pool

    def _run_rows(self, fn, B: int) -> None:
        """Call ``fn(rows)`` over the queries 0..B-1, in chunks spread over the threads."""
        n_thr = min(self.threads, B)
        if n_thr <= 1:
            fn(np.arange(B, dtype=np.int64))
            return
        size = max(self._MIN_CHUNK, -(-B // (n_thr * self._CHUNKS_PER_THREAD)))
        chunks = [np.arange(s, min(B, s + size), dtype=np.int64) for s in range(0, B, size)]
        for f in [self._executor().submit(fn, c) for c in chunks]:
            f.result()  # re-raises a worker's exception here

    # -- the Scorer contract ---------------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> SearchResults:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        t0 = time.perf_counter()
        B = len(queries)
        ids, scores = padded_arrays(B, int(k))
        q_flat, q_off, consts = self._flat_queries(queries)
        a_flat, a_lo, a_hi = self._flat_allow(allow, B)
        counts = np.zeros((B, 4), dtype=np.int64)
        if self.prune:
            kern = self._ms.search_pruned
            args = (self._offsets, self._doc_ids, self.weights, self.ub, self._zero_w, self._blocks, q_flat, q_off,
                    consts, self._has_w0, a_flat, a_lo, a_hi, int(k), self._slack(q_off))

            def run(rows):
                with self._workspace() as ws:
                    kern(*args, rows, *ws, ids, scores, counts)
        else:
            kern = self._k.search_exhaustive
            args = (self._offsets, self._doc_ids, self.weights, self.index.n_docs, q_flat, q_off, consts,
                    self._has_w0, a_flat, a_lo, a_hi, int(k))

            def run(rows):
                kern(*args, rows, ids, scores, counts)

        self._run_rows(run, B)
        dt = time.perf_counter() - t0
        tot = counts.sum(axis=0)
        meta = {"backend": "numba", "timings": {"total_s": dt}, "postings_scanned": int(tot[0]),
                "threads": min(self.threads, max(B, 1))}
        if self.prune:
            dense = counts[:, 1] < 0
            meta.update(dense_queries=int(dense.sum()), docs_touched=int(counts[~dense, 1].sum()),
                        survivors=int(tot[2]), rescored=int(tot[3]))
        return SearchResults(ids, scores, meta)

    def _slack(self, q_off: np.ndarray) -> float:
        longest = int(np.diff(q_off).max()) if q_off.size > 1 else 0
        return self._SLACK + (longest + 2) * 2.0**-23

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        B, N = len(queries), self.index.n_docs
        rows = np.full((B, N), -np.inf, dtype=np.float32)
        q_flat, q_off, consts = self._flat_queries(queries)
        a_flat, a_lo, a_hi = self._flat_allow(allow, B)
        kern = self._k.score_dense
        args = (self._offsets, self._doc_ids, self.weights, q_flat, q_off, consts, self._has_w0, a_flat, a_lo, a_hi)

        def run(r):
            kern(*args, r, rows)

        self._run_rows(run, B)
        return rows
