"""The design card's kernel on the device: batched term-at-a-time scatter, then top-k from sentinels.

A second CuPy scoring engine, independent of the pruned tiles of :mod:`gpuir.backends.cupy_backend`
(no tiles, bounds or thresholds), used as the exhaustive mode of the cupy backend
(``make_scorer("cupy", index, params, kernel="scatter")``), as a cross-check of the tiles in the
tests, and as the engine that scores a memory's whole snapshot in one pass
(:mod:`gpuir.memory.devicespace`).

**The pass** (``kernels/scatter.cu``; its header comment gives the exactness argument):

1. ``acc`` (rows x width float32) and ``touched`` (rows x width/32 uint32) are zeroed;
2. round r (one launch of ``scatter_round`` per round, r = 0, 1, ...): the r-th term (ascending) of
   every row adds each posting's contribution ``scaled(w, mult)`` with ``atomicAdd``; each (row,
   document) slot receives at most one add per round, so each sum is formed in ascending term
   order, the NumPy reference's order, bit for bit;
3. ``scatter_keys`` turns every slot into a composite key (score + C, document), or the sentinel 0
   (id -1, score -inf) for a slot that is no candidate (untouched, deleted, not allowed);
4. ``select_topk`` (``kernels/topk.cu``) keeps each row's k largest keys under the tie rule; slots
   past the candidates stay sentinels (id -1, score -inf).

The document space is cut into windows of ``width`` documents and the batch into groups of rows so
that the buffers (12.125 bytes per row and document) fit ``budget_bytes``; each window's top k of each
row (raw keys) is merged by one more ``select_topk``. Work is described by **spans**: one posting list
(a slice of the concatenated posting arrays) of one row's r-th term in one segment whose rows start at
global row ``base``. A static index is one segment (base 0); a memory's snapshot is many, scored as one
document space.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._compat import device_unavailable
from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults
from . import kernels as K
from .base import CollectionStats, Scorer, weigh_queries
from .batch_plan import StaticWeights
from .weights import has_absent_weight

_log = logging.getLogger(__name__)

_FILE = "scatter.cu"
_TOPK_FILE = "topk.cu"
#: Device bytes per (row, document) of a window: float32 score, uint64 key, one touched bit.
BYTES_PER_SLOT = 4 + 8 + 1 / 8
#: The most rows of one keys launch (CUDA's grid.y limit).
_MAX_GRID_Y = 65535
#: The narrowest document window (fewer rows per window rather than narrower windows).
MIN_WIDTH = 1024
#: Device budget of the scatter buffers when no budget is given and free memory cannot be read (bytes).
DEFAULT_BUDGET = 1 << 30
#: Share of the free device memory the buffers may take when no budget is given.
BUDGET_FRACTION = 0.4


def default_budget(cp: Any) -> int:
    """Bytes the scatter buffers may take: :data:`BUDGET_FRACTION` of the free device memory (else
    :data:`DEFAULT_BUDGET`)."""
    try:
        free = int(cp.cuda.runtime.memGetInfo()[0])
    except Exception:  # noqa: BLE001 - no memory query: the fixed default
        return DEFAULT_BUDGET
    return max(64 << 20, int(BUDGET_FRACTION * free))


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


@dataclass
class Spans:
    """The posting lists one batch adds, one span per (row, term position, segment).

    Attributes
    ----------
    rnd : ndarray (S,), int64, host -- the round (the term's position among the row's terms, ascending)
    row : ndarray (S,), int64, host -- the query row
    start : ndarray (S,), int64, host -- first posting in the concatenated posting arrays
    length : ndarray (S,), int64, host -- postings
    base : ndarray (S,), int64, host -- global row of the segment's row 0
    idf, w0, mult : ndarray (S,), float32, host
    """

    rnd: np.ndarray
    row: np.ndarray
    start: np.ndarray
    length: np.ndarray
    base: np.ndarray
    idf: np.ndarray
    w0: np.ndarray
    mult: np.ndarray


@dataclass
class ScatterStats:
    """What one :func:`scatter_topk` did (the tests count passes and launches)."""

    passes: int = 0            # scoring passes over the document space (1 per batch)
    rounds: int = 0            # scatter_round launches
    windows: int = 0           # (row group, document window) pieces
    postings: int = 0          # postings the rounds walked
    launches: list = field(default_factory=list)


def round_order(n_rounds: int) -> list[int]:
    """The order rounds are launched in: ascending term position (the reference's float order).

    A function of its own so that a test can plant the bug of another order and see it caught.
    """
    return list(range(n_rounds))


def scatter_topk(cp: Any, device_id: int, k: int, n_rows: int, n_docs: int, spans: Spans, *,
                 doc_ids: Any, tfs: Any, doc_lens: Any, weights: Any | None, consts: np.ndarray, has_w0: bool,
                 sc_args: tuple, live: Any | None = None, allow_bits: Any | None = None,
                 row_allow: np.ndarray | None = None, row_key: Any | None = None, max_key: int | None = None,
                 budget_bytes: int = DEFAULT_BUDGET, sm_count: int = 108,
                 stats: ScatterStats | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top k of every row over one document space by the scatter kernels (see the module docstring).

    Parameters
    ----------
    cp : module
        ``cupy`` (or the tests' stand-in).
    device_id : int
    k : int
        Results per row, >= 1.
    n_rows, n_docs : int
        Rows of the batch; documents (global rows) of the space, < 2^31.
    spans : Spans
        What each row adds (host arrays).
    doc_ids, tfs : device arrays (P,), int32
        The concatenated posting arrays (rows local to each posting's segment).
    doc_lens : device array (N,), int32
        Length of each global row.
    weights : device array (P,), float32, or None
        Each posting's cached weight (then tfs and lengths are not read), or None: weights computed
        in the kernel from the span's idf and w0 and ``sc_args``.
    consts : ndarray (B,), float32, host
        ``C`` of each row (added when ``has_w0``).
    sc_args : tuple
        :meth:`gpuir.backends.cupy_backend.SearchConsts.args` of the search.
    live : device array (ceil(N/32),), uint32, optional
        Bitmap of the live global rows (None: all).
    allow_bits : device array (A, ceil(N/32)), uint32, optional
        Bitmaps of allow-lists; ``row_allow`` (B,) int32 names each row's (-1: none).
    row_key : device array (N,), int32, optional
        The document number the key and the result carry for each global row (a memory's sequence
        numbers, so ties break by add order); default the row itself.
    max_key : int, optional
        The largest key document number (default n_docs - 1): the selection's radix passes cover its bits.
    budget_bytes : int
        Device bytes the buffers may take.

    Returns
    -------
    ids : ndarray (B, k), int64, host -- key document numbers, -1 pads
    scores : ndarray (B, k), float32, host -- -inf pads
    """
    B = int(n_rows)
    st = stats if stats is not None else ScatterStats()
    ids = np.full((B, k), -1, np.int64)
    scores = np.full((B, k), -np.inf, np.float32)
    if B == 0 or n_docs == 0 or spans.row.size == 0:
        return ids, scores
    st.passes += 1
    T = K.SCATTER_THREADS
    doc_bits = max(1, int(max_key if max_key is not None else n_docs - 1).bit_length())
    # windows: as wide as the budget allows for all rows, at least MIN_WIDTH documents (fewer rows then)
    width = int(min(n_docs, max(MIN_WIDTH, budget_bytes // (BYTES_PER_SLOT * B))))
    width = max(32, -(-width // 32) * 32) if width < n_docs else n_docs
    rows_per = int(max(1, min(B, budget_bytes // (BYTES_PER_SLOT * width), _MAX_GRID_Y)))
    n_win = -(-n_docs // width)
    words = -(-width // 32)
    live_arr = live if live is not None else cp.zeros(1, dtype=cp.uint32)
    has_allow = allow_bits is not None and row_allow is not None and bool((np.asarray(row_allow) >= 0).any())
    allow_arr = allow_bits if has_allow else cp.zeros(1, dtype=cp.uint32)
    allow_words = np.int64(allow_arr.shape[-1] if has_allow else 0)
    key_arr = row_key if row_key is not None else cp.zeros(1, dtype=cp.int32)
    w_arr = weights if weights is not None else cp.zeros(1, dtype=cp.float32)
    # spans sorted by (round, row): each round's spans are one contiguous range
    order = np.lexsort((spans.row, spans.rnd))
    sp = {n: np.asarray(getattr(spans, n))[order] for n in ("rnd", "row", "start", "length", "base", "idf", "w0",
                                                            "mult")}
    n_rounds = int(sp["rnd"].max()) + 1
    kk = min(k, n_docs)
    big_k = k > K.SELECT_MAX_K
    kpad = _next_pow2(kk)
    sel = f"select_topk<{K.SELECT_THREADS}>"

    def launch(fname: str, name: str, grid: tuple, args: tuple, shared_mem: int = 0, block: int = T) -> None:
        st.launches.append(name)
        fn = K.kernel(fname, name, device_id)
        if shared_mem:
            fn(grid, (block,), args, shared_mem=shared_mem)
        else:
            fn(grid, (block,), args)

    dummy_f = cp.zeros(1, dtype=cp.float32)
    for r0 in range(0, B, rows_per):
        r1 = min(B, r0 + rows_per)
        R = r1 - r0
        in_rows = (sp["row"] >= r0) & (sp["row"] < r1)
        rs = {n: a[in_rows] for n, a in sp.items()}
        bounds = np.searchsorted(rs["rnd"], np.arange(n_rounds + 1))
        d_const = cp.asarray(np.ascontiguousarray(consts[r0:r1], np.float32))
        ra = np.full(R, -1, np.int32) if not has_allow else np.ascontiguousarray(row_allow[r0:r1], np.int32)
        d_row_allow = cp.asarray(ra)
        acc = cp.empty(R * width, dtype=cp.float32)
        touched = cp.empty(R * words, dtype=cp.uint32)
        keys = cp.empty(R * width, dtype=cp.uint64)
        # each window's top k of each row, as raw keys, when there is more than one window
        part = cp.empty((R, n_win * kk), dtype=cp.int64) if n_win > 1 else None
        # the round's span arrays, uploaded once for all windows
        dev_rounds = []
        for rnd in round_order(n_rounds):
            a, b = int(bounds[rnd]), int(bounds[rnd + 1])
            if a == b:
                continue
            ln = rs["length"][a:b]
            cum = np.zeros(b - a + 1, np.int64)
            np.cumsum(ln, out=cum[1:])
            if cum[-1] == 0:
                continue
            dev_rounds.append((int(cum[-1]), b - a, tuple(cp.asarray(x) for x in (
                np.ascontiguousarray(rs["start"][a:b], np.int64), cum,
                np.ascontiguousarray(rs["row"][a:b] - r0, np.int32), np.ascontiguousarray(rs["base"][a:b], np.int32),
                np.ascontiguousarray(rs["idf"][a:b], np.float32), np.ascontiguousarray(rs["w0"][a:b], np.float32),
                np.ascontiguousarray(rs["mult"][a:b], np.float32)))))
        for wi in range(n_win):
            doc0 = wi * width
            wd = min(width, n_docs - doc0)
            st.windows += 1
            acc.fill(0)
            touched.fill(0)
            for total, n_sp, (d_start, d_cum, d_row, d_base, d_idf, d_w0, d_mult) in dev_rounds:
                grid = (int(max(1, min(-(-total // T), 8 * sm_count))),)
                if n_win > 1:  # walk only this window's postings: each span cut to it on the device
                    w_start, w_len = cp.empty(n_sp, dtype=cp.int64), cp.empty(n_sp, dtype=cp.int64)
                    launch(_FILE, f"scatter_clip<{T}>", (int(max(1, min(-(-n_sp // T), 8 * sm_count))),),
                           (doc_ids, d_start, d_cum, d_base, np.int32(n_sp), np.int64(doc0), np.int32(width),
                            w_start, w_len))
                    w_cum = cp.zeros(n_sp + 1, dtype=cp.int64)
                    w_cum[1:] = cp.cumsum(w_len)
                    d_start, d_cum = w_start, w_cum
                launch(_FILE, f"scatter_round<{T}>", grid,
                       (doc_ids, tfs, w_arr, doc_lens, d_start, d_cum, d_row, d_base, d_idf, d_w0, d_mult,
                        np.int32(n_sp), np.int32(weights is not None), np.int64(doc0), np.int32(width), acc, touched,
                        np.int32(words), *sc_args))
                st.rounds += 1
                st.postings += total
            gx = int(max(1, min(-(-wd // T), 4 * sm_count)))
            launch(_FILE, f"scatter_keys<{T}>", (gx, R),
                   (acc, touched, np.int32(words), np.int64(doc0), np.int32(width), live_arr,
                    np.int32(live is not None), allow_arr, allow_words, d_row_allow, key_arr,
                    np.int32(row_key is not None), d_const, np.int32(has_w0), keys))
            # the window's top k: straight into the result (one window), else raw keys into `part`
            if big_k:
                top = _sorted_top(cp, keys.reshape(R, width)[:, :wd], kk)
                if part is None:
                    _decode(cp, top, ids, scores, r0, r1)
                else:
                    part[:, wi * kk:(wi + 1) * kk] = top.view(cp.int64)
                continue
            cand_off = cp.arange(R + 1, dtype=cp.int64) * np.int64(width)
            counts = cp.full(R, wd, dtype=cp.int32)
            theta = cp.zeros(R, dtype=cp.uint32)
            segs = 1 if 2 * R > sm_count else int(max(1, min(sm_count // R, wd // (4 * max(kk, 256)), 64)))
            cand = keys
            if segs > 1:
                stage = cp.empty((R * segs, kk), dtype=cp.int64)
                launch(_TOPK_FILE, sel, (R * segs,), (cand, cand_off, counts, theta, np.int32(doc_bits), np.int32(kk),
                                                      np.int32(kpad), np.int32(segs), np.int32(1), stage, dummy_f),
                       shared_mem=8 * kpad, block=K.SELECT_THREADS)
                cand = stage.view(cp.uint64).reshape(-1)
                cand_off = cp.arange(R + 1, dtype=cp.int64) * np.int64(segs * kk)
                counts = cp.full(R, segs * kk, dtype=cp.int32)
            if part is None:
                o_ids, o_sc = cp.empty((R, kk), dtype=cp.int64), cp.empty((R, kk), dtype=cp.float32)
                launch(_TOPK_FILE, sel, (R,), (cand, cand_off, counts, theta, np.int32(doc_bits), np.int32(kk),
                                               np.int32(kpad), np.int32(1), np.int32(0), o_ids, o_sc),
                       shared_mem=8 * kpad, block=K.SELECT_THREADS)
                ids[r0:r1, :kk] = _host(o_ids)
                scores[r0:r1, :kk] = _host(o_sc)
            else:
                o_raw = cp.empty((R, kk), dtype=cp.int64)
                launch(_TOPK_FILE, sel, (R,), (cand, cand_off, counts, theta, np.int32(doc_bits), np.int32(kk),
                                               np.int32(kpad), np.int32(1), np.int32(1), o_raw, dummy_f),
                       shared_mem=8 * kpad, block=K.SELECT_THREADS)
                part[:, wi * kk:(wi + 1) * kk] = o_raw
        if part is not None:  # merge the windows' top k (keys of distinct documents: exact)
            m = n_win * kk
            if big_k:
                _decode(cp, _sorted_top(cp, part.view(cp.uint64), kk), ids, scores, r0, r1)
            else:
                o_ids, o_sc = cp.empty((R, kk), dtype=cp.int64), cp.empty((R, kk), dtype=cp.float32)
                launch(_TOPK_FILE, sel, (R,), (part.view(cp.uint64).reshape(-1),
                                               cp.arange(R + 1, dtype=cp.int64) * np.int64(m),
                                               cp.full(R, m, dtype=cp.int32), cp.zeros(R, dtype=cp.uint32),
                                               np.int32(doc_bits), np.int32(kk), np.int32(kpad), np.int32(1),
                                               np.int32(0), o_ids, o_sc), shared_mem=8 * kpad, block=K.SELECT_THREADS)
                ids[r0:r1, :kk] = _host(o_ids)
                scores[r0:r1, :kk] = _host(o_sc)
    return ids, scores


def _sorted_top(cp: Any, keys2d: Any, k: int) -> Any:
    """k > SELECT_MAX_K: each row's k largest keys, descending (a device sort), as a contiguous (R, k) uint64."""
    s = cp.ascontiguousarray(keys2d).copy()
    s.sort(axis=-1)
    kk = min(k, s.shape[1])
    out = cp.zeros((s.shape[0], k), dtype=cp.uint64)
    out[:, :kk] = s[:, ::-1][:, :kk]
    return cp.ascontiguousarray(out)


def _decode(cp: Any, top: Any, ids: np.ndarray, scores: np.ndarray, r0: int, r1: int) -> None:
    """Raw keys (R, k) -> ids and scores rows r0:r1 (the sentinel 0 -> -1, -inf), on the host."""
    from .kernel_model import key_doc, key_score

    h = _host(top).astype(np.uint64)
    kk = h.shape[1]
    ok = h != 0
    ids[r0:r1, :kk] = np.where(ok, key_doc(h), -1)
    scores[r0:r1, :kk] = np.where(ok, key_score(h), np.float32(-np.inf))


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def allow_bitmaps(allow: Sequence[np.ndarray | None] | None, n_rows: int, n_docs: int
                  ) -> tuple[np.ndarray | None, np.ndarray]:
    """Allow-lists as bitmaps: (A, ceil(N/32)) uint32 (None: no list) and each row's bitmap (B,) int32 (-1: none)."""
    from .cupy_backend import check_allow

    filtered, off, docs = check_allow(allow, n_rows, n_docs)
    row_allow = np.full(n_rows, -1, np.int32)
    if not filtered.any():
        return None, row_allow
    fr = np.flatnonzero(filtered)
    row_allow[fr] = np.arange(fr.size, dtype=np.int32)
    words = -(-n_docs // 32)
    bits = np.zeros((fr.size, words * 32), bool)
    for j, q in enumerate(fr.tolist()):
        bits[j, docs[off[q]:off[q + 1]]] = True
    packed = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)
    return np.ascontiguousarray(packed), row_allow


class ScatterScorer(Scorer):
    """BM25 on a CUDA device by the design card's scatter kernel (``make_scorer("cupy", ..., kernel="scatter")``).

    Exhaustive: every posting of every query term is scored (no pruning); bit-identical to
    :class:`~gpuir.backends.numpy_backend.NumpyScorer` for every variant.

    Parameters
    ----------
    index : CSRIndex
        Uploaded once, here (doc_ids, tfs, doc_lens); the default statistics' weights are cached
        on the device on first use.
    params : BM25Params
    stats : CollectionStats, optional
    memory_budget_bytes : int, optional
        Device bytes the score and key buffers may take (default :func:`default_budget`: a share of
        the free device memory); the document space is scored in windows that fit it.
    device : int, optional
    """

    name = "cupy"
    kernel = "scatter"

    def __init__(self, index: CSRIndex, params: BM25Params, stats: CollectionStats | None = None,
                 memory_budget_bytes: int | None = None, device: int | None = None):
        super().__init__(index, params, stats)
        from . import cupy_backend as cb

        usable, why = cb.cuda_device()  # looked up at call time: the tests' fake device replaces it there
        if not usable:
            raise device_unavailable("the cupy backend needs a usable CUDA device", why)
        if memory_budget_bytes is not None and (not isinstance(memory_budget_bytes, (int, np.integer))
                                                or isinstance(memory_budget_bytes, bool) or memory_budget_bytes <= 0):
            raise ValueError(f"memory_budget_bytes must be a positive int (bytes) or None, got {memory_budget_bytes!r}")
        if index.n_docs >= 2**31:
            raise ValueError(f"the scatter kernel handles fewer than 2^31 documents, got {index.n_docs}")
        import cupy

        self._cp = cupy
        self.budget_bytes = int(memory_budget_bytes or default_budget(cupy))
        self.device_id = cupy.cuda.Device().id if device is None else int(device)
        with cupy.cuda.Device(self.device_id):
            a = cupy.asarray
            self.d_doc_ids = a(np.ascontiguousarray(index.doc_ids, dtype=np.int32))
            self.d_tfs = a(np.ascontiguousarray(index.tfs, dtype=np.int32))
            self.d_doc_lens = a(np.ascontiguousarray(index.doc_lens, dtype=np.int32))
            try:
                sms = int(cupy.cuda.Device(self.device_id).attributes["MultiProcessorCount"])
            except Exception:  # noqa: BLE001 - informational
                sms = 132
        self.sm_count = max(1, sms)
        self._offsets = np.asarray(index.offsets, np.int64)
        self._lock = threading.Lock()
        self._d_weights: Any = None
        self._live: tuple[Any, Any] = (None, None)
        #: What the last search did (:class:`ScatterStats`).
        self.last_stats = ScatterStats()

    def _static_weights(self) -> Any:
        with self._lock:
            if self._d_weights is None:
                w = StaticWeights.of(self.index, self.params, self.stats).pw.weights
                with self._cp.cuda.Device(self.device_id):
                    self._d_weights = self._cp.asarray(np.ascontiguousarray(w, np.float32))
            return self._d_weights

    def _live_bits(self, live: np.ndarray | None) -> Any:
        if live is None:
            return None
        from .cupy_backend import live_bits

        with self._lock:
            host, dev = self._live
            if host is not live:
                dev = self._cp.asarray(live_bits(live, self.index.n_docs))
                self._live = (live, dev)
            return dev

    def search(self, queries: Sequence[np.ndarray], k: int, allow: Sequence[np.ndarray | None] | None = None, *,
               stats: CollectionStats | None = None, consts: np.ndarray | None = None,
               live: np.ndarray | None = None) -> SearchResults:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        k = int(k)
        t0 = time.perf_counter()
        st = self.search_stats(stats)
        wq = weigh_queries(queries, st, self.params, consts)
        B = wq.n_rows
        if live is not None:
            live = np.asarray(live)
        bits, row_allow = allow_bitmaps(allow, B, self.index.n_docs)
        from .cupy_backend import search_consts

        sc = search_consts(self.params, wq.avgdl)
        lens = np.diff(wq.off)
        row = np.repeat(np.arange(B, dtype=np.int64), lens)
        rnd = np.arange(wq.terms.size, dtype=np.int64) - np.repeat(wq.off[:-1], lens)
        off = self._offsets
        spans = Spans(rnd, row, off[wq.terms], off[wq.terms + 1] - off[wq.terms], np.zeros(row.size, np.int64),
                      wq.idf.astype(np.float32), wq.w0.astype(np.float32), wq.mult.astype(np.float32))
        cp = self._cp
        stt = ScatterStats()
        with cp.cuda.Device(self.device_id):
            weights = self._static_weights() if st is self.stats else None
            ids, scores = scatter_topk(
                cp, self.device_id, k, B, self.index.n_docs, spans, doc_ids=self.d_doc_ids, tfs=self.d_tfs,
                doc_lens=self.d_doc_lens, weights=weights, consts=np.asarray(wq.const, np.float32),
                has_w0=bool(wq.has_w0), sc_args=sc.args(), live=self._live_bits(live),
                allow_bits=None if bits is None else cp.asarray(bits), row_allow=row_allow,
                budget_bytes=self.budget_bytes, sm_count=self.sm_count, stats=stt)
        self.last_stats = stt
        per_row = np.bincount(row, weights=spans.length, minlength=B).astype(np.int64)
        return SearchResults(ids, scores, meta={
            "backend": "cupy", "kernel": "scatter", "postings_scanned": int(per_row.sum()),
            "postings_rows": per_row, "windows": stt.windows, "rounds": stt.rounds,
            "search_s": time.perf_counter() - t0})

    def score_matrix(self, queries: Sequence[np.ndarray], allow: Sequence[np.ndarray | None] | None = None, *,
                     stats: CollectionStats | None = None, consts: np.ndarray | None = None,
                     live: np.ndarray | None = None) -> np.ndarray:
        """Dense scores through the NumPy reference (the scatter kernel returns only the top k)."""
        from .numpy_backend import NumpyScorer

        return NumpyScorer(self.index, self.params, stats=self.stats).score_matrix(
            queries, allow, stats=stats, consts=consts, live=live)


__all__ = [
    "BYTES_PER_SLOT",
    "DEFAULT_BUDGET",
    "ScatterScorer",
    "ScatterStats",
    "Spans",
    "allow_bitmaps",
    "default_budget",
    "has_absent_weight",
    "round_order",
    "scatter_topk",
]
