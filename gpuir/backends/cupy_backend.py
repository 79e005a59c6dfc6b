"""The CuPy backend: BM25 scoring and top-k with the CUDA kernels in ``kernels/``.

Per batch of B queries (chunked so that the dense buffers fit a memory budget):

1. **Host prep + host→device.** Each query's distinct terms become pairs
   (row, term, multiplicity); each pair's postings are cut into chunks of
   :data:`~gpuir.backends.kernels.SCORE_CHUNK` postings (``chunk_start``, an
   int64 prefix sum). Allow-lists are concatenated. Only these small arrays are
   uploaded per batch; the CSR arrays were uploaded once, by the constructor.
2. **Score.** ``bm25_score<method>`` adds every posting of every pair into a
   zeroed (B, N) float32 buffer with atomicAdd and sets the document's bit in a
   (B, ceil(N/32)) uint32 ``touched`` bitmap, skipping documents the query's
   allow bitmap excludes (see ``kernels/bm25_score.cu``).
3. **Top-k.** ``topk_rows`` (radix select + bitonic sort, one block per row, see
   ``kernels/topk.cu``) for k <= 4096; above that a device sort of composite
   (score, doc) keys per row.
4. **Device→host** of the (B, k) ids and scores.

Scores equal the NumPy reference's to float32 rounding (atomics add in no fixed
order); top-k sets agree up to ties at the k-th score.

Memory: per query row the batch needs ``4 N`` (scores) ``+ 4 ceil(N/32)``
(touched) ``[+ 4 ceil(N/32)`` (allow bits, filtered queries)] ``+ 12 k`` bytes
(``+ 32 N`` for k > 4096: keys, CuPy's segment keys, sort buffers). Rows per
chunk = budget // bytes per row, where the budget is ``memory_budget_bytes`` or
``memory_fraction`` of the free device memory (plus what CuPy's pool holds
free). On
``cupy.cuda.memory.OutOfMemoryError`` the chunk is halved and retried; a single
row that still does not fit raises :class:`MemoryError` saying what to change.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import bm25
from .._compat import cuda_device
from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults, empty_results, padded_arrays
from . import kernels as K
from .base import Scorer

_SCORE_FILE, _TOPK_FILE = "bm25_score.cu", "topk.cu"
_ELEMWISE_BLOCK = 256
_MAX_GRID = 1 << 20


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


class _Timer:
    """Per-phase device time from CUDA events on the current stream (seconds)."""

    def __init__(self, cupy: Any):
        self.cp = cupy
        self.marks: list[tuple[str, Any, Any]] = []

    def phase(self, name: str):
        cp, marks = self.cp, self.marks

        class _Ctx:
            def __enter__(self_inner):
                self_inner.start = cp.cuda.Event()
                self_inner.start.record()

            def __exit__(self_inner, *exc):
                end = cp.cuda.Event()
                end.record()
                marks.append((name, self_inner.start, end))
                return False

        return _Ctx()

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, a, b in self.marks:
            b.synchronize()
            out[name] = out.get(name, 0.0) + self.cp.cuda.get_elapsed_time(a, b) / 1e3
        return out


class CupyScorer(Scorer):
    """BM25 on a CUDA device through CuPy (see the module docstring).

    Parameters
    ----------
    index : CSRIndex
        Host arrays; uploaded to the device once, here.
    params : BM25Params
    memory_budget_bytes : int, optional
        Device bytes the per-batch buffers may use. Default: ``memory_fraction``
        of the free device memory at each search.
    memory_fraction : float
        Share of free device memory used when no budget is given, in (0, 1].
    device : int, optional
        CUDA device number; default the current CuPy device.

    Raises
    ------
    RuntimeError
        No usable CUDA device (the message says how to fix it).
    """

    name = "cupy"

    def __init__(
        self,
        index: CSRIndex,
        params: BM25Params,
        memory_budget_bytes: int | None = None,
        memory_fraction: float = 0.5,
        device: int | None = None,
    ):
        super().__init__(index, params)
        usable, why = cuda_device()
        if not usable:
            raise RuntimeError(
                f"the cupy backend needs a usable CUDA device, but {why}. Fix: run on a machine "
                "with an NVIDIA GPU and install 'gpuir[gpu]' (CUDA 12) or 'gpuir[gpu-cuda13]', "
                "or use backend='numpy'"
            )
        if memory_budget_bytes is not None and (
            not isinstance(memory_budget_bytes, (int, np.integer)) or memory_budget_bytes <= 0
        ):
            raise ValueError(
                f"memory_budget_bytes must be a positive int (bytes) or None, got {memory_budget_bytes!r}"
            )
        if not (0.0 < float(memory_fraction) <= 1.0):
            raise ValueError(f"memory_fraction must lie in (0, 1], got {memory_fraction!r}")
        import cupy

        self._cp = cupy
        self.memory_budget_bytes = None if memory_budget_bytes is None else int(memory_budget_bytes)
        self.memory_fraction = float(memory_fraction)
        self.device_id = cupy.cuda.Device().id if device is None else int(device)
        N = index.n_docs
        self.n_words = (N + 31) // 32
        self.doc_bits = max(1, int(N - 1).bit_length()) if N > 0 else 1
        idf64 = bm25.idf(index.df, N, params.method)
        #: float32 (V,), host: idf of each term (computed in float64, rounded once).
        self.idf = idf64.astype(np.float32)
        #: float32 (V,), host: absent-term weight (non-zero for bm25l/bm25+ only).
        self.w0 = bm25.absent_weight(idf64, params)
        self._df = np.asarray(index.df, dtype=np.int64)
        t0 = time.perf_counter()
        with cupy.cuda.Device(self.device_id):
            a = cupy.asarray
            #: Device copies of the index: offsets (V+1,) int64, doc_ids (P,) int32,
            #: tfs (P,) int32, doc_lens (N,) int32, idf (V,) float32, w0 (V,) float32.
            self.d_offsets = a(np.ascontiguousarray(index.offsets, dtype=np.int64))
            self.d_doc_ids = a(np.ascontiguousarray(index.doc_ids, dtype=np.int32))
            self.d_tfs = a(np.ascontiguousarray(index.tfs, dtype=np.int32))
            self.d_doc_lens = a(np.ascontiguousarray(index.doc_lens, dtype=np.int32))
            self.d_idf = a(self.idf)
            self.d_w0 = a(self.w0)
            cupy.cuda.Device().synchronize()
        #: Seconds spent uploading the index.
        self.upload_s = time.perf_counter() - t0
        self._device_name = self._name()

    def _name(self) -> str:
        try:
            props = self._cp.cuda.runtime.getDeviceProperties(self.device_id)
            n = props["name"]
            return n.decode() if isinstance(n, bytes) else str(n)
        except Exception:  # noqa: BLE001  # pragma: no cover - informational only
            return f"CUDA device {self.device_id}"

    # -- memory --------------------------------------------------------------------
    def row_bytes(self, k: int, filtered: bool = False, dense_out: bool = False) -> int:
        """Device bytes one query row of a batch needs (see the module docstring)."""
        N, W = self.index.n_docs, self.n_words
        b = 4 * N + 4 * W + (4 * W if filtered else 0)
        if dense_out:
            return b
        b += 12 * k
        if k > K.TOPK_MAX_K:
            # Sort path: the uint64 keys (8N), CuPy's per-element size_t segment
            # keys for a row-wise sort (8N) and thrust's sort-by-key buffers (~16N).
            b += 32 * N
        return b

    def budget_bytes(self) -> int:
        """The byte budget for one batch's buffers, now."""
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        cp = self._cp
        with cp.cuda.Device(self.device_id):
            free, _ = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        return int(self.memory_fraction * (free + pool.free_bytes()))

    def rows_per_chunk(self, k: int, filtered: bool = False, dense_out: bool = False) -> int:
        """Query rows per batch chunk under the current budget (>= 1).

        Raises
        ------
        MemoryError
            Not even one row fits the budget.
        """
        per_row = self.row_bytes(k, filtered, dense_out)
        budget = self.budget_bytes()
        if per_row > budget:
            raise MemoryError(
                f"one query over {self.index.n_docs} documents needs {per_row} bytes of device "
                f"memory but the budget is {budget} bytes: pass a larger memory_budget_bytes "
                "(or memory_fraction) to the cupy scorer, free device memory, lower k, or use "
                "backend='numpy'"
            )
        return max(1, budget // per_row)

    # -- host prep -----------------------------------------------------------------
    def _check(self, queries: Sequence[np.ndarray], allow: Any) -> list[np.ndarray]:
        V = self.index.n_terms
        qs = []
        for i, q in enumerate(queries):
            q = np.asarray(q)
            if q.ndim != 1 or (q.size and q.dtype.kind not in "iu"):
                raise TypeError(f"query {i} must be a 1-D array of integer term ids, got {q.dtype} {q.shape}")
            q = q.astype(np.int64, copy=False)
            if q.size and (q.min() < 0 or q.max() >= V):
                raise ValueError(
                    f"query {i} has term ids outside [0, {V}): analyse queries with the "
                    "index's own vocabulary (BM25Index.query_terms)"
                )
            qs.append(q)
        if allow is not None and len(allow) != len(qs):
            raise ValueError(f"allow has {len(allow)} entries for {len(qs)} queries: give one per query")
        return qs

    def _prep(self, queries: list[np.ndarray], allow: Any) -> dict[str, np.ndarray]:
        """Host arrays of one chunk: pairs, chunk starts, row constants, allow-lists."""
        B = len(queries)
        pq, pt, pm = [], [], []
        row_const = np.zeros(B, dtype=np.float32)
        for i, q in enumerate(queries):
            if q.size == 0:
                continue
            terms, mult = np.unique(q, return_counts=True)
            # As the NumPy reference computes it (float32 products, float32 sum).
            row_const[i] = np.float32((self.w0[terms] * mult).sum(dtype=np.float32))
            keep = self._df[terms] > 0
            pq.append(np.full(int(keep.sum()), i, dtype=np.int32))
            pt.append(terms[keep].astype(np.int32))
            pm.append(mult[keep].astype(np.float32))
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt, copy=False) if xs else np.zeros(0, dt))
        pair_q, pair_t, pair_m = cat(pq, np.int32), cat(pt, np.int32), cat(pm, np.float32)
        n_chunks = -(-self._df[pair_t] // K.SCORE_CHUNK) if pair_t.size else np.zeros(0, np.int64)
        chunk_start = np.zeros(pair_t.size + 1, dtype=np.int64)
        np.cumsum(n_chunks, out=chunk_start[1:])
        allow_row = np.full(B, -1, dtype=np.int32)
        docs, rows = [], []
        if allow is not None:
            for i, a in enumerate(allow):
                if a is None:
                    continue
                r = len(docs)
                allow_row[i] = r
                a = np.asarray(a, dtype=np.int32)
                docs.append(a)
                rows.append(np.full(a.size, r, dtype=np.int32))
        return {
            "pair_q": pair_q, "pair_t": pair_t, "pair_m": pair_m, "chunk_start": chunk_start,
            "row_const": row_const, "allow_row": allow_row, "n_filtered": np.int64(len(docs)),
            "allow_docs": cat(docs, np.int32), "allow_rows": cat(rows, np.int32),
        }

    # -- device work ------------------------------------------------------------------
    def _score_chunk(self, host: dict[str, np.ndarray], B: int, timer: _Timer):
        """Scores (B, N) float32 and touched (B, W) uint32 on the device for one chunk."""
        cp = self._cp
        N, W = self.index.n_docs, self.n_words
        with timer.phase("h2d_s"):
            dev = {k: cp.asarray(v) for k, v in host.items() if isinstance(v, np.ndarray)}
        with timer.phase("score_s"):
            scores = cp.zeros((B, N), dtype=cp.float32)
            touched = cp.zeros((B, W), dtype=cp.uint32)
            F = int(host["n_filtered"])
            allow_bits = cp.zeros((max(F, 1), W), dtype=cp.uint32)
            n_allow = int(host["allow_docs"].size)
            if n_allow:
                g = min(_MAX_GRID, -(-n_allow // _ELEMWISE_BLOCK))
                K.kernel(_SCORE_FILE, "scatter_allow_bits", self.device_id)(
                    (g,), (_ELEMWISE_BLOCK,),
                    (dev["allow_docs"], dev["allow_rows"], np.int64(n_allow), allow_bits, np.int32(W)),
                )
            n_pairs = int(host["pair_t"].size)
            n_chunks = int(host["chunk_start"][-1])
            if n_chunks:
                p = self.params
                name = f"bm25_score<{p.code}, {K.SCORE_THREADS}, {K.SCORE_PER_THREAD}>"
                K.kernel(_SCORE_FILE, name, self.device_id)(
                    (min(n_chunks, _MAX_GRID),), (K.SCORE_THREADS,),
                    (
                        self.d_offsets, self.d_doc_ids, self.d_tfs, self.d_doc_lens,
                        dev["pair_q"], dev["pair_t"], dev["pair_m"], dev["chunk_start"], np.int32(n_pairs),
                        self.d_idf, self.d_w0, allow_bits, dev["allow_row"], scores, touched,
                        np.int64(N), np.int32(W),
                        np.float32(p.k1), np.float32(p.b), np.float32(p.delta), np.float32(self.index.avgdl),
                    ),
                )
        return scores, touched, dev["row_const"]

    def _topk_chunk(self, scores, touched, row_const, B: int, k: int):
        cp = self._cp
        N, W = self.index.n_docs, self.n_words
        if k <= K.TOPK_MAX_K:
            kpad = _next_pow2(k)
            ids = cp.empty((B, k), dtype=cp.int64)
            out = cp.empty((B, k), dtype=cp.float32)
            K.kernel(_TOPK_FILE, f"topk_rows<{K.TOPK_THREADS}>", self.device_id)(
                (B,), (K.TOPK_THREADS,),
                (scores, touched, row_const, np.int64(N), np.int32(W), np.int32(self.doc_bits),
                 np.int32(k), np.int32(kpad), ids, out),
                shared_mem=8 * kpad,
            )
            return ids, out
        # Slow path (k > TOPK_MAX_K): sort composite keys of every document.
        keys = cp.empty((B, N), dtype=cp.uint64)
        total = B * N
        g = min(_MAX_GRID, max(1, -(-total // _ELEMWISE_BLOCK)))
        K.kernel(_TOPK_FILE, "composite_keys", self.device_id)(
            (g,), (_ELEMWISE_BLOCK,),
            (scores, touched, row_const, np.int32(B), np.int64(N), np.int32(W), keys),
        )
        del scores
        keys.sort(axis=-1)
        kk = min(k, N)
        top = cp.ascontiguousarray(keys[:, ::-1][:, :kk])
        ids = cp.full((B, k), -1, dtype=cp.int64)
        out = cp.full((B, k), -np.inf, dtype=cp.float32)
        if kk:
            ids_k = cp.empty((B, kk), dtype=cp.int64)
            out_k = cp.empty((B, kk), dtype=cp.float32)
            n = B * kk
            K.kernel(_TOPK_FILE, "decode_keys", self.device_id)(
                (min(_MAX_GRID, -(-n // _ELEMWISE_BLOCK)),), (_ELEMWISE_BLOCK,),
                (top, np.int64(n), ids_k, out_k),
            )
            ids[:, :kk] = ids_k
            out[:, :kk] = out_k
        return ids, out

    def _chunked(self, B: int, rows: int, work) -> None:
        """Run ``work(start, stop)`` over [0, B) in chunks of ``rows``, halving on OOM."""
        cp = self._cp
        start = 0
        while start < B:
            stop = min(B, start + rows)
            try:
                work(start, stop)
                oom = False
            except cp.cuda.memory.OutOfMemoryError as e:
                if rows == 1:
                    raise MemoryError(
                        f"the GPU ran out of memory scoring even one query over {self.index.n_docs} "
                        f"documents ({e}). Fix: free device memory (other processes, CuPy's pool), "
                        "lower k, pass a smaller memory_budget_bytes/memory_fraction so other "
                        "allocations fit, or use backend='numpy'"
                    ) from e
                oom = True
            if oom:
                # Outside the except block: there the traceback still references
                # work()'s frames and so the failed chunk's device arrays, and
                # free_all_blocks() could not give their memory back.
                cp.get_default_memory_pool().free_all_blocks()
                rows = max(1, rows // 2)
                continue
            start = stop

    # -- the Scorer contract ----------------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> SearchResults:
        """Top-k of each query on the device (see :meth:`Scorer.search`).

        Returns
        -------
        SearchResults
            ids (B, k) int64 and scores (B, k) float32 on the host;
            ``meta["timings"]`` holds ``h2d_s``, ``score_s``, ``topk_s``, ``d2h_s``
            (device time, from CUDA events) and ``total_s`` (wall clock).
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = int(k)
        qs = self._check(queries, allow)
        B = len(qs)
        t0 = time.perf_counter()
        if B == 0 or self.index.n_docs == 0:
            res = empty_results(B, k)
            res.meta = {"backend": "cupy", "device": self._device_name, "timings": {"total_s": 0.0}}
            return res
        cp = self._cp
        ids, out = padded_arrays(B, k)
        filtered = allow is not None and any(a is not None for a in allow)
        timer = _Timer(cp)
        n_chunks = [0]
        rows = self.rows_per_chunk(k, filtered)

        def work(s: int, e: int) -> None:
            host = self._prep(qs[s:e], None if allow is None else list(allow[s:e]))
            scores, touched, row_const = self._score_chunk(host, e - s, timer)
            with timer.phase("topk_s"):
                d_ids, d_out = self._topk_chunk(scores, touched, row_const, e - s, k)
                del scores, touched
            with timer.phase("d2h_s"):
                ids[s:e] = d_ids.get()
                out[s:e] = d_out.get()
            n_chunks[0] += 1

        with cp.cuda.Device(self.device_id):
            self._chunked(B, rows, work)
            timings = timer.totals()
        timings["total_s"] = time.perf_counter() - t0
        meta = {
            "backend": "cupy", "device": self._device_name, "timings": timings,
            "rows_per_chunk": min(rows, B), "n_chunks": n_chunks[0],
        }
        return SearchResults(ids, out, meta)

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        """Dense scores (B, N) float32 on the host; -inf for non-candidates."""
        qs = self._check(queries, allow)
        B, N, W = len(qs), self.index.n_docs, self.n_words
        rows_out = np.full((B, N), -np.inf, dtype=np.float32)
        if B == 0 or N == 0:
            return rows_out
        cp = self._cp
        filtered = allow is not None and any(a is not None for a in allow)
        timer = _Timer(cp)

        def work(s: int, e: int) -> None:
            host = self._prep(qs[s:e], None if allow is None else list(allow[s:e]))
            scores, touched, row_const = self._score_chunk(host, e - s, timer)
            total = (e - s) * N
            K.kernel(_SCORE_FILE, "finalize_dense", self.device_id)(
                (min(_MAX_GRID, -(-total // _ELEMWISE_BLOCK)),), (_ELEMWISE_BLOCK,),
                (scores, touched, row_const, np.int32(e - s), np.int64(N), np.int32(W)),
            )
            rows_out[s:e] = scores.get()

        with cp.cuda.Device(self.device_id):
            self._chunked(B, self.rows_per_chunk(1, filtered, dense_out=True), work)
        return rows_out
