"""The compiled CPU backend (Numba): the NumPy reference's results, bit for bit, faster.

:class:`NumbaScorer` answers a batch with compiled kernels: the pruned search
of :mod:`gpuir.backends.cpu_maxscore` (MaxScore term at a time, survivors
rescored exactly) by default, the exhaustive document-at-a-time one of
:mod:`gpuir.backends.cpu_kernels` with ``prune=False`` and for
:meth:`~NumbaScorer.score_matrix`. Both add float32 posting weights per
document in ascending term id from 0.0f, so ids and scores equal
:class:`NumpyScorer`'s exactly, with the same tie rule (score desc, document
asc), filters and padding.

**Statistics per search.** The constructor lays the segment out once: doc ids,
raw tf and document lengths (read-only views of the index's arrays, no copy),
per-term tf/length summaries and a block index whose per-block summaries
(largest tf, smallest length) no statistic changes (:mod:`.block_layout`; a
memory saves it with each segment's file and hands it back when the segment is
opened, so a fresh process skips that pass). Each search applies its
:class:`~gpuir.backends.base.CollectionStats`: the kernels compute a posting's
weight from its tf and length with the search's idf and avgdl -- the float32
operations of :func:`~gpuir.backends.weights.weights_of`, in order -- and turn
the summaries into bounds with the current idf
(:func:`~gpuir.backends.weights.weight_bound`). A search with the scorer's own
default statistics (a static :class:`~gpuir.engine.BM25Index`) reads the weights
from a cache computed once on first use
(:class:`~gpuir.backends.batch_plan.StaticWeights`), with exact per-term and
per-block maxima: the same values, tighter bounds, no arithmetic per posting.
``live`` (tombstones) and allow-lists restrict candidates; ``consts`` sets the
bm25l/bm25+ row constants; ``theta`` (an extension of the contract) lets a
caller that already holds k results at some score skip what cannot reach it.

Why Numba: it compiles these loops to machine code from plain Python, ships
wheels for Linux, macOS and Windows (no compiler needed), caches what it
compiles (``cache=True``), and releases the GIL (``nogil=True``) so Python
threads score queries in parallel. bm25s uses it for the same reason.

Threads
-------
``threads`` (default: the ``GPUIR_THREADS`` environment variable, else every
core this process may run on) bounds how many queries of one batch run at once.
A batch is cut into chunks of queries handed to a thread pool (one pool per
thread count, shared by every scorer of the process: a memory holds a scorer
per segment); a single query, or ``threads=1``, runs in the calling thread with
no pool at all. The kernels keep no state between calls; each running chunk
takes a workspace of its own from a pool (N-sized arrays, made once and
reused), so searches from several Python threads at once are safe and return
what a serial search returns.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults, padded_arrays
from .base import CollectionStats, Scorer, WeightedQueries, own_weighing, weigh_queries
from .batch_plan import StaticWeights, check_live, weigh_static
from .block_layout import BlockLayout, lay_out_segment
from .block_layout import read_only as _ro
from .weights import BOUND_SLACK, has_absent_weight


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


def _rw(a: np.ndarray, dtype) -> np.ndarray:
    """A writeable C-contiguous array of ``dtype`` (per-search inputs: one kernel specialisation)."""
    if type(a) is np.ndarray and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable:
        return a
    return np.array(a, dtype=dtype, order="C")


_NO_F32 = _ro(np.zeros(0, np.float32), np.float32)
_NO_F64 = _ro(np.zeros(0, np.float64), np.float64)
_NO_BOOL = _ro(np.zeros(0, np.bool_), np.bool_)

_NO_I64 = np.zeros(0, np.int64)  # writeable, never written: the kernels' "no allow-lists"


@functools.lru_cache(maxsize=64)
def _minus_one(B: int) -> np.ndarray:
    """(B,) int64 of -1 (no row has an allow-list); shared, never written by a kernel."""
    return np.full(B, -1, dtype=np.int64)


@functools.lru_cache(maxsize=64)
def _minus_inf(B: int) -> np.ndarray:
    """(B,) float64 of -inf (no row has a theta); shared, never written by a kernel."""
    return np.full(B, -np.inf)


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _shared_pool(threads: int) -> ThreadPoolExecutor:
    """The process's thread pool of ``threads`` workers (made on first use, shared by every scorer)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpuir-numba")
        return pool


def shared_pool(threads: int) -> ThreadPoolExecutor:
    """The process's thread pool of ``threads`` workers, for other compiled CPU paths (``gpuir.memory.segscan``)."""
    return _shared_pool(threads)


def _check_threads(threads: int | None) -> int:
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive integer or None (all cores), got {threads!r}")
    return int(threads)


@dataclass(frozen=True)
class _StaticLayout:
    """The default statistics' cache, as the kernels read it."""

    sw: StaticWeights
    weights: np.ndarray  # (P,) float32, read-only
    blk_max: np.ndarray  # (NB,) float32, read-only: each block's largest weight
    ub: np.ndarray  # (V,) float64, read-only: each term's largest weight
    zero_w: np.ndarray  # (V,) bool, read-only: a term with a weight <= 0


class NumbaScorer(Scorer):
    """BM25 on the CPU with compiled (Numba) kernels.

    Parameters
    ----------
    index : CSRIndex
    params : BM25Params
    prune : bool
        MaxScore pruning (default); exact either way.
    stats : CollectionStats, optional
        Default statistics of a search (default: the index's own).
    threads : int, optional
        Queries of one batch scored at once (default :func:`default_threads`).
    layout : BlockLayout, optional
        The index's block index, made earlier (:func:`~gpuir.backends.block_layout.from_saved`: a
        segment file's); default: laid out now (:func:`~gpuir.backends.block_layout.lay_out_segment`).
    """

    name = "numba"
    #: Whether :meth:`search` takes ``theta`` (per-row lower bounds of the scores worth keeping).
    supports_theta = True
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
        layout: BlockLayout | None = None,
    ):
        from . import cpu_kernels, cpu_maxscore  # numba compiles (or loads its cache) on first call

        super().__init__(index, params, stats)
        self._k, self._ms = cpu_kernels, cpu_maxscore
        self.threads = _check_threads(threads)
        self._prune = bool(prune)
        self._offsets = _ro(index.offsets, np.int64)
        self._doc_ids = _ro(index.doc_ids, np.int32)
        #: The segment as the kernels read it: offsets, doc_ids, tfs, doc lengths (read-only).
        self._ix = (self._offsets, self._doc_ids, _ro(index.tfs, np.int32), _ro(index.doc_lens, np.int32))
        #: The block index and per-term tf / length summaries (the statistics-independent part of the
        #: bounds): laid out here, or the one given (read back from a segment file, :mod:`.block_layout`).
        if layout is None:
            layout = self._block_index()
        elif (layout.block != cpu_maxscore.BLOCK or layout.blocks[0].shape != (self._offsets.size,)
              or layout.blocks[7].shape != (int(layout.blocks[0][-1]),)):
            raise ValueError("layout does not fit this index (another block size or vocabulary)")
        self.layout = layout
        self._blocks, self.summaries = layout.blocks, layout.summaries
        sm = self.summaries
        self._summ = tuple(_ro(a, np.int32) for a in (sm.maxtf, sm.mindl, sm.mintf, sm.maxdl))
        self._has_w0 = bool(has_absent_weight(params))
        self._code = int(params.code)
        self._static: _StaticLayout | None = None
        self._static_lock = threading.Lock()
        self._args_cache: tuple | None = None  # ((avgdl, per-search?), the kernels' read-only argument tuples)
        self._pool_lock = threading.Lock()
        self._free: list[tuple[np.ndarray, ...]] = []  # idle workspaces (N-sized scratch)

    # -- the default statistics' cache ------------------------------------------------
    def _static_layout(self) -> _StaticLayout:
        st = self._static
        if st is None:
            with self._static_lock:
                if self._static is None:
                    sw = StaticWeights.of(self.index, self.params, self.stats)
                    w = _ro(sw.pw.weights, np.float32)
                    starts = self._blocks[7]
                    blk_max = np.maximum.reduceat(w, starts) if starts.size else np.zeros(0, np.float32)
                    self._static = _StaticLayout(sw, w, _ro(blk_max, np.float32), _ro(sw.pw.ub, np.float64),
                                                 _ro(sw.zero_w, np.bool_))
                st = self._static
        return st

    def static_weights(self) -> StaticWeights:
        """Every posting's weight under the default statistics (computed once, on first use)."""
        return self._static_layout().sw

    @property
    def prune(self) -> bool:
        """Whether searches under the default statistics skip what cannot reach the top k (MaxScore).

        False when asked, or when a weight is negative (the bounds assume weights >= 0).
        """
        return self._prune and not self.static_weights().negative

    @property
    def weights(self) -> np.ndarray:
        """float32 (P,), read-only: each posting's weight under the default statistics."""
        return self._static_layout().weights

    @property
    def idf(self) -> np.ndarray:
        """float32 (V,): each term's idf under the default statistics."""
        return self.static_weights().pw.idf

    @property
    def w0(self) -> np.ndarray:
        """float32 (V,): weight of an absent query term under the default statistics (bm25l/bm25+ only)."""
        return self.static_weights().pw.w0

    @property
    def ub(self) -> np.ndarray:
        """float64 (V,): the largest posting weight of each term under the default statistics."""
        return self.static_weights().pw.ub

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

    def _block_index(self) -> BlockLayout:
        """Each term's postings cut into blocks of ``BLOCK``, with a doc-space directory, and the
        per-term summaries; one compiled pass over the postings
        (:func:`gpuir.backends.block_layout.lay_out_segment`; the arrays: :class:`BlockLayout`)."""
        ix = self._ix
        return lay_out_segment(ix[0], ix[1], ix[2], ix[3], self.index.n_docs, self._ms.BLOCK)

    # -- batch preparation ----------------------------------------------------------
    def _weigh(self, queries: Sequence[np.ndarray], stats: CollectionStats | None,
               consts: np.ndarray | None) -> tuple[WeightedQueries, _StaticLayout | None]:
        """The batch under the search's statistics, and the static cache when they are the default."""
        st = self.search_stats(stats)
        if st is self.stats:
            layout = self._static_layout()
            wq = own_weighing(queries, self, consts)  # (a static index's batch, weighed once for the contract)
            return (weigh_static(queries, layout.sw, self.params, consts) if wq is None else wq), layout
        return weigh_queries(queries, st, self.params, consts), None

    def _kernel_args(self, wq: WeightedQueries, layout: _StaticLayout | None) -> tuple:
        """(wt, qs, bix, bp, tb): the kernels' weight, batch, block-index, bound-parameter and term-bound
        tuples (see :mod:`gpuir.backends.cpu_kernels` and :func:`gpuir.backends.cpu_maxscore.search_pruned`)."""
        qs = (_rw(wq.off, np.int64), _rw(wq.terms, np.int64), _rw(wq.mult, np.int64), _rw(wq.idf, np.float32),
              _rw(wq.w0, np.float32), _rw(wq.const, np.float32))
        key = (float(wq.avgdl), layout is None)
        cached = self._args_cache  # a store searches many times under one avgdl: the rest is reused
        if cached is not None and cached[0] == key:
            wt, bix, bp, tb = cached[1]
            return wt, qs, bix, bp, tb
        p = self.params
        f = np.float32
        k1, b, delta, avgdl = f(p.k1), f(p.b), f(p.delta), f(wq.avgdl)
        fp = np.array([f(1) - b, b, k1, k1 + f(1), delta, avgdl], dtype=np.float32)
        wt = (_NO_F32 if layout is None else layout.weights, fp, self._code, self._has_w0)
        bl = self._blocks
        bix = (bl[0], bl[1], _NO_F32 if layout is None else layout.blk_max, bl[2], bl[3], bl[4], bl[5], bl[6])
        bp = np.array([p.k1, p.b, p.delta, float(avgdl), BOUND_SLACK], dtype=np.float64)
        sm = self._summ
        if layout is None:
            tb = (_NO_F64, _NO_BOOL, *sm, False)
        else:
            tb = (layout.ub, layout.zero_w, *sm, layout.sw.negative)
        self._args_cache = (key, (wt, bix, bp, tb))
        return wt, qs, bix, bp, tb

    def _flat_allow(self, allow: Sequence[np.ndarray | None] | None, B: int,
                    live: np.ndarray | None) -> tuple[np.ndarray, ...]:
        """Allow-lists (restricted to live documents) as one array and per-query bounds (a_lo = -1: no filter).

        Returns
        -------
        flat : ndarray (A,), int64; a_lo, a_hi : ndarray (B,), int64
        """
        if allow is None:
            none = _minus_one(B)
            return _NO_I64, none, none
        a_lo = np.full(B, -1, dtype=np.int64)
        a_hi = np.full(B, -1, dtype=np.int64)
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
                if live is not None:
                    arr = arr[live[arr]]
                parts.append(arr)
                placed[key] = (n, n + arr.size)
                n += arr.size
            a_lo[i], a_hi[i] = placed[key]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return np.ascontiguousarray(flat), a_lo, a_hi

    # -- threads ----------------------------------------------------------------------
    def _run_rows(self, fn, B: int) -> None:
        """Call ``fn(rows)`` over the queries 0..B-1, in chunks spread over the threads."""
        n_thr = min(self.threads, B)
        if n_thr <= 1:
            fn(np.arange(B, dtype=np.int64))
            return
        size = max(self._MIN_CHUNK, -(-B // (n_thr * self._CHUNKS_PER_THREAD)))
        chunks = [np.arange(s, min(B, s + size), dtype=np.int64) for s in range(0, B, size)]
        pool = _shared_pool(self.threads)
        for f in [pool.submit(fn, c) for c in chunks]:
            f.result()  # re-raises a worker's exception here

    # -- the Scorer contract ---------------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
        theta: np.ndarray | None = None,
    ) -> SearchResults:
        """Top-k documents of each query (see :meth:`Scorer.search`).

        Parameters
        ----------
        theta : ndarray (B,), float, optional
            Per query, a score below which results are not wanted (the caller
            already holds k results scoring at least that): rows may then hold
            fewer than k documents, every one scoring >= theta, each with its
            exact score, in the usual order. -inf: no bound.
        """
        self._check_k(k)
        t0 = time.perf_counter()
        wq, layout = self._weigh(queries, stats, consts)
        return self._search(wq, layout, int(k), allow, live, theta, t0)

    def search_weighted(
        self,
        wq: WeightedQueries,
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        live: np.ndarray | None = None,
        theta: np.ndarray | None = None,
    ) -> SearchResults:
        """:meth:`search` of a batch whose statistics the caller applied already.

        For a store that weighs its queries once for many segments (``gpuir.memory``):
        ``wq`` holds each row's distinct terms (this index's ids, ascending, each
        with df > 0 in the statistics), their multiplicities, idf and w0
        (:func:`~gpuir.backends.weights.term_weights` of the store's N and df),
        the rows' C and the store's avgdl -- what
        :func:`~gpuir.backends.base.weigh_queries` makes. Nothing is re-checked.
        """
        self._check_k(k)
        return self._search(wq, None, int(k), allow, live, theta, time.perf_counter())

    @staticmethod
    def _check_k(k) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")

    def _search(self, wq: WeightedQueries, layout: _StaticLayout | None, k: int, allow, live, theta,
                t0: float) -> SearchResults:
        B = wq.n_rows
        ids, scores = padded_arrays(B, k)
        lv = None if live is None else check_live(live, self.index.n_docs)
        a_flat, a_lo, a_hi = self._flat_allow(allow, B, lv)
        wt, qs, bix, bp, tb = self._kernel_args(wq, layout)
        lv = _NO_BOOL if lv is None else lv
        counts = np.zeros((B, 4), dtype=np.int64)
        if self._prune:
            if theta is None:
                thetas = _minus_inf(B)
            else:
                thetas = np.array(theta, dtype=np.float64).reshape(-1)
                if thetas.shape != (B,):
                    raise ValueError(f"theta must hold one number per query ({B}), got shape {thetas.shape}")
                thetas[np.isnan(thetas)] = -np.inf
            kern = self._ms.search_pruned
            args = (self._ix, wt, lv, bix, bp, qs, tb, thetas, a_flat, a_lo, a_hi, k, self._slack(wq))

            def run(rows):
                with self._workspace() as ws:
                    kern(*args, rows, *ws, ids, scores, counts)
        else:
            kern = self._k.search_exhaustive
            args = (self._ix, wt, lv, qs, a_flat, a_lo, a_hi, k)

            def run(rows):
                kern(*args, rows, ids, scores, counts)

        self._run_rows(run, B)
        dt = time.perf_counter() - t0
        tot = counts.sum(axis=0).tolist()
        meta = {"backend": "numba", "timings": {"total_s": dt}, "postings_scanned": tot[0],
                "postings_rows": counts[:, 0].copy(), "threads": min(self.threads, max(B, 1))}
        if self._prune:  # dense rows count -1 touched documents, exhaustive ones -1 rescored
            n_dense = int(np.count_nonzero(counts[:, 1] < 0))
            n_exh = int(np.count_nonzero(counts[:, 3] < 0))
            meta.update(dense_queries=n_dense, docs_touched=tot[1] + n_dense, survivors=tot[2],
                        rescored=tot[3] + n_exh, exhaustive_queries=n_exh)
        return SearchResults(ids, scores, meta)

    @classmethod
    def _slack(cls, wq: WeightedQueries) -> float:
        off = wq.off
        if off.size == 2:
            longest = int(off[1] - off[0])
        else:
            longest = int((off[1:] - off[:-1]).max()) if off.size > 1 else 0
        return cls._SLACK + (longest + 2) * 2.0**-23

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> np.ndarray:
        B, N = len(queries), self.index.n_docs
        rows = np.full((B, N), -np.inf, dtype=np.float32)
        wq, layout = self._weigh(queries, stats, consts)
        lv = check_live(live, N)
        a_flat, a_lo, a_hi = self._flat_allow(allow, B, lv)
        wt, qs, _, _, _ = self._kernel_args(wq, layout)
        kern = self._k.score_dense
        args = (self._ix, wt, _NO_BOOL if lv is None else lv, qs, a_flat, a_lo, a_hi)

        def run(r):
            kern(*args, r, rows)

        self._run_rows(run, B)
        return rows
