"""The CuPy segment-set engine: a snapshot's sealed segments scored on the device in ONE pass.

Implements the segment-set search contract (``gpuir/backends/contract.py``: ``search(segset,
view_ids, batch, k) -> SegmentHits``) for the cupy backend, on the design card's scatter kernel
(:mod:`gpuir.backends.cupy_scatter`):

* **Device copies per segment.** A sealed segment's postings (doc_ids, tfs), lengths and sequence
  numbers go to the device once, when a search first meets it (:func:`device_segment`), and live in
  ``seg.cache`` for the segment's lifetime: a merge makes a new segment (uploaded once when first
  searched) and the merged-away segments' copies are released with them. :data:`UPLOADS` counts
  uploads by segment uid (the tests check "once").
* **One document space per segment set.** The searched segments are concatenated on the device
  (device-to-device copies, no host transfer) into one row space: segment j's rows start at
  ``row_base[j]``, its postings at ``post_base[j]``. Kept per set of segment uids (a new snapshot
  that shares the same segments -- a delete, a statistics change -- reuses it; :data:`SPACES` holds
  the last few). The host keeps a table global term -> (segment, posting list), a CSR over the
  global term codes: one gather finds every (query term, segment) posting list of a batch, with no
  per-segment loop.
* **One pass per batch.** Each query's terms (ascending term strings, hence ascending local ids in
  every segment) are rounds; round r adds, for every query, its r-th term's posting list in every
  segment that has it. Segments cover disjoint rows, so each (query, record) slot still receives at
  most one add per round: the sums are the NumPy reference's, bit for bit, whatever the number of
  segments. Weights are computed in the kernel from tf and length with the set's idf/w0 (the
  snapshot's global statistics); tombstones are a device bitmap over the row space; allow-lists
  (``where``) device bitmaps; ties break by sequence number (the key's document word is the
  record's sequence number); the top k of all segments is selected on the device and copied back
  once.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cupy_scatter import ScatterStats, Spans, default_budget, scatter_topk
from .segment_engines import search_own

try:  # the segment-set contract (gpuir/backends/contract.py), where present
    from .contract import SegmentEngine as _EngineBase  # type: ignore[import-not-found]
    from .contract import SegmentHits  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - before the contract lands: the same result type, here
    _EngineBase = object  # type: ignore[assignment,misc]

    @dataclass
    class SegmentHits:  # type: ignore[no-redef]
        """Each query's merged top k (see the contract): (B, k) seqs, scores, views, rows; (B,) postings."""

        seqs: np.ndarray
        scores: np.ndarray
        views: np.ndarray
        rows: np.ndarray
        postings: np.ndarray

#: Device uploads of each segment uid (a segment is uploaded once in its lifetime).
UPLOADS: collections.Counter = collections.Counter()
#: The document spaces kept (most recent last), keyed by the identity of their segments.
SPACES: collections.OrderedDict = collections.OrderedDict()
#: How many document spaces are kept (each holds a device copy of its segments' postings).
SPACES_KEPT = 2
_lock = threading.Lock()


@dataclass
class DeviceSegment:
    """One sealed segment's device copy (arrays on the device, made once).

    Attributes
    ----------
    doc_ids, tfs : device (P,), int32
    doc_lens : device (n,), int32
    seqs : device (n,), int32 -- sequence numbers (the tie rule's key)
    """

    doc_ids: Any
    tfs: Any
    doc_lens: Any
    seqs: Any


def device_segment(cp: Any, seg: Any) -> DeviceSegment:
    """The device copy of ``seg``, uploaded on first use and kept in ``seg.cache`` for its lifetime."""
    key = ("cupy", "device_segment")
    got = seg.cache.get(key)
    if got is None:
        with _lock:
            got = seg.cache.get(key)
            if got is None:
                csr = seg.csr
                seqs = np.asarray(seg.seqs, np.int64)
                if seqs.size and int(seqs.max()) >= 2**31:
                    raise ValueError(f"segment {seg.uid}: sequence numbers reach 2^31; the device engine keys "
                                     "records by 31-bit sequence numbers")
                a = cp.asarray
                got = DeviceSegment(a(np.ascontiguousarray(csr.doc_ids, np.int32)),
                                    a(np.ascontiguousarray(csr.tfs, np.int32)),
                                    a(np.ascontiguousarray(csr.doc_lens, np.int32)), a(seqs.astype(np.int32)))
                seg.cache[key] = got
                UPLOADS[seg.uid] += 1
    return got


class DocSpace:
    """Segments concatenated into one row space on the device, and the host table that finds posting lists.

    Attributes
    ----------
    uids : tuple of int
    doc_ids, tfs : device (P,), int32 -- postings (rows local to their segment)
    doc_lens : device (N,), int32 ; seqs : device (N,), int32
    row_base, post_base : ndarray (S+1,), int64, host
    n_docs : int -- N, rows of all the segments
    max_key : int -- the largest sequence number
    """

    def __init__(self, cp: Any, segs: list[Any]):
        self.uids = tuple(s.uid for s in segs)
        self.segs = tuple(segs)  # held while the space is kept (its key is their identity)
        devs = [device_segment(cp, s) for s in segs]
        n = np.array([s.n_docs for s in segs], np.int64)
        p = np.array([s.csr.n_postings for s in segs], np.int64)
        self.row_base = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        self.post_base = np.concatenate([[0], np.cumsum(p)]).astype(np.int64)
        self.n_docs = int(self.row_base[-1])
        if self.n_docs >= 2**31:
            raise ValueError(f"the device engine scores fewer than 2^31 records at once, got {self.n_docs}")

        def cat(get):
            parts = [get(d) for d in devs]
            return parts[0] if len(parts) == 1 else cp.concatenate(parts)

        self.doc_ids, self.tfs = cat(lambda d: d.doc_ids), cat(lambda d: d.tfs)
        self.doc_lens, self.seqs = cat(lambda d: d.doc_lens), cat(lambda d: d.seqs)
        # global term -> its posting list in each segment that has it: a CSR over global codes (term_off)
        # of entries (segment, first posting, postings), made once per space
        G = int(max([int(s.g_sorted[-1]) + 1 if s.g_sorted.size else 1 for s in segs] + [1]))
        self.G = G
        gs, starts, lens, segj = [], [], [], []
        for j, s in enumerate(segs):
            o = np.asarray(s.csr.offsets, np.int64)
            lid = np.asarray(s.g_order, np.int64)
            gs.append(np.asarray(s.g_sorted, np.int64))
            starts.append(o[lid] + self.post_base[j])
            lens.append(o[lid + 1] - o[lid])
            segj.append(np.full(lid.size, j, np.int64))
        g_all = np.concatenate(gs) if segs else np.zeros(0, np.int64)
        order = np.argsort(g_all, kind="stable")  # runs already sorted per segment: a merge of S runs
        self.start = (np.concatenate(starts) if segs else np.zeros(0, np.int64))[order]
        self.length = (np.concatenate(lens) if segs else np.zeros(0, np.int64))[order]
        self.seg_of = (np.concatenate(segj) if segs else np.zeros(0, np.int64))[order]
        self.term_off = np.zeros(G + 1, np.int64)
        np.cumsum(np.bincount(g_all, minlength=G), out=self.term_off[1:])
        host_seqs = np.concatenate([np.asarray(s.seqs, np.int64) for s in segs]) if segs else np.zeros(0, np.int64)
        self.max_key = int(host_seqs.max()) if host_seqs.size else 0
        # sequence number -> global row (results come back as sequence numbers)
        self._seq_order = np.argsort(host_seqs, kind="stable")
        self._seq_sorted = host_seqs[self._seq_order]

    def find(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every (term, segment) posting list of ``gids`` ((T,) int64): (term index, segment, start, length),
        host arrays (no loop over segments: one gather through the space's term table)."""
        gids = np.asarray(gids, np.int64)
        ok = (gids >= 0) & (gids < self.G)
        g = np.where(ok, gids, 0)
        lo = self.term_off[g]
        cnt = np.where(ok, self.term_off[g + 1] - lo, 0)
        total = int(cnt.sum())
        term = np.repeat(np.arange(gids.size, dtype=np.int64), cnt)
        first = np.cumsum(cnt) - cnt
        pos = lo[term] + (np.arange(total, dtype=np.int64) - first[term])
        return term, self.seg_of[pos], self.start[pos], self.length[pos]

    def locate(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment position, row) of each sequence number (-1 for -1)."""
        ok = seqs >= 0
        i = np.minimum(np.searchsorted(self._seq_sorted, np.where(ok, seqs, 0)), max(0, self._seq_sorted.size - 1))
        g = self._seq_order[i] if self._seq_order.size else np.zeros_like(seqs)
        j = np.searchsorted(self.row_base, g, side="right") - 1
        return np.where(ok, j, -1), np.where(ok, g - self.row_base[np.maximum(j, 0)], -1)


def doc_space(cp: Any, segs: list[Any]) -> DocSpace:
    """The document space of ``segs`` (reused while the same segments are searched together)."""
    key = tuple(id(s) for s in segs)  # the space holds the segments, so their ids stay theirs while it is kept
    with _lock:
        sp = SPACES.get(key)
        if sp is not None:
            SPACES.move_to_end(key)
            return sp
    sp = DocSpace(cp, segs)
    with _lock:
        SPACES[key] = sp
        while len(SPACES) > SPACES_KEPT:
            SPACES.popitem(last=False)
    return sp


def _bits(mask: np.ndarray) -> np.ndarray:
    words = -(-mask.size // 32)
    out = np.zeros(words * 4, np.uint8)
    packed = np.packbits(mask, bitorder="little")
    out[:packed.size] = packed
    return out.view(np.uint32)


class CupySegmentsEngine(_EngineBase):  # type: ignore[misc,valid-type]
    """The contract's ``search`` on the device, one scoring pass over all the searched segments.

    Parameters
    ----------
    budget_bytes : int, optional
        Device bytes of the scatter buffers (default: a share of the free device memory, read per search).
    """

    name = "cupy"
    backend = "cupy"

    def __init__(self, budget_bytes: int | None = None):
        #: Device bytes of the scatter buffers (None: :func:`~gpuir.backends.cupy_scatter.default_budget`).
        self.budget_bytes = None if budget_bytes is None else int(budget_bytes)
        #: What the last search did (:class:`~gpuir.backends.cupy_scatter.ScatterStats`; the tests count passes).
        self.last_stats = ScatterStats()
        self._sm: int | None = None

    def _cp(self) -> Any:
        from . import cupy_backend as cb

        usable, why = cb.cuda_device()
        if not usable:
            from .._compat import device_unavailable

            raise device_unavailable("the cupy segment engine needs a usable CUDA device", why)
        import cupy

        return cupy

    def prepare(self, seg: Any, params: Any, cheap: bool = False) -> None:
        """Upload ``seg`` now (:func:`device_segment`): a segment is copied to the device when it appears
        (the memory calls this for the segments of its adds and merges), not by the first search to meet it;
        ``cheap`` or not (a copy of a batch's postings costs its add little)."""
        device_segment(self._cp(), seg)

    def search(self, segset: Any, view_ids: tuple[int, ...], batch: Any, k: int) -> SegmentHits:
        """Each query's top k over the views ``view_ids`` of ``segset`` (the contract's operation).

        ``batch`` carries (contract ``QueryBatch``): off (B+1,), gids/mult/idf/w0 (T,), const (B,), has_w0,
        optionally allow (per query, one row list per searched view, or None). Host in, host out.
        """
        from .cupy_backend import search_consts

        if getattr(segset, "own_stats", False):  # a static index: its tile scorer (graphs, cached weights)
            return search_own("cupy", segset, view_ids, batch, k)
        cp = self._cp()
        B = int(batch.off.size - 1)
        view_ids = tuple(view_ids)
        # one document space per snapshot: every view's segment, the unsearched ones masked out (a scan of a
        # few partitions, or a filtered search, reuses it rather than concatenating its subset again)
        sp = doc_space(cp, [v.seg for v in segset.views])
        if self._sm is None:
            try:
                self._sm = int(cp.cuda.Device().attributes["MultiProcessorCount"])
            except Exception:  # noqa: BLE001 - informational
                self._sm = 132
        lens = np.diff(batch.off)
        qrow = np.repeat(np.arange(B, dtype=np.int64), lens)
        rnd = np.arange(qrow.size, dtype=np.int64) - np.repeat(batch.off[:-1], lens)
        term, seg, start, length = sp.find(np.asarray(batch.gids, np.int64))
        spans = Spans(rnd[term], qrow[term], start, length, sp.row_base[seg],
                      np.asarray(batch.idf, np.float32)[term], np.asarray(batch.w0, np.float32)[term],
                      np.asarray(batch.mult, np.float32)[term])
        live = self._live(cp, segset, view_ids, sp)
        allow_bits, row_allow = self._allow(cp, batch, view_ids, sp)
        sc = search_consts(segset.params, float(segset.avgdl))
        st = ScatterStats()
        seqs, scores = scatter_topk(
            cp, cp.cuda.Device().id, k, B, sp.n_docs, spans, doc_ids=sp.doc_ids, tfs=sp.tfs, doc_lens=sp.doc_lens,
            weights=None, consts=np.asarray(batch.const, np.float32), has_w0=bool(batch.has_w0), sc_args=sc.args(),
            live=live, allow_bits=allow_bits, row_allow=row_allow, row_key=sp.seqs, max_key=sp.max_key,
            budget_bytes=self.budget_bytes or default_budget(cp), sm_count=self._sm, stats=st)
        self.last_stats = st
        j, rows = sp.locate(seqs)
        vpos = np.where(j >= 0, j, -1)  # positions in segset.views (the space holds them all, in order)
        postings = np.bincount(qrow[term], weights=length, minlength=B).astype(np.int64) if term.size \
            else np.zeros(B, np.int64)
        return SegmentHits(seqs, scores, vpos.astype(np.int64), rows.astype(np.int64), postings)

    @staticmethod
    def _live(cp: Any, segset: Any, view_ids: tuple[int, ...], sp: DocSpace) -> Any:
        """The searched views' live rows (tombstones applied; the views not searched all dead) as one device
        bitmap over the snapshot's row space (None: every row live), per searched set."""
        views = segset.views
        searched = set(view_ids)
        if len(searched) == len(views) and all(v.live is None for v in views):
            return None

        def make():
            mask = np.concatenate([np.zeros(v.seg.n_docs, bool) if i not in searched else
                                   np.ones(v.seg.n_docs, bool) if v.live is None else np.asarray(v.live, bool)
                                   for i, v in enumerate(views)])
            return cp.asarray(_bits(mask))

        cached = getattr(segset, "cached", None)
        return cached(("cupy", "live_bits", view_ids), make) if cached is not None else make()

    @staticmethod
    def _allow(cp: Any, batch: Any, view_ids: tuple[int, ...], sp: DocSpace) -> tuple[Any, np.ndarray | None]:
        """Allow-lists (one per distinct list object; entry j lists rows of view ``view_ids[j]``) as device
        bitmaps over the row space, and each query's."""
        allow = getattr(batch, "allow", None)
        B = int(batch.off.size - 1)
        if allow is None or all(a is None for a in allow):
            return None, None
        row_allow = np.full(B, -1, np.int32)
        seen: dict[int, int] = {}
        masks = []
        for q, a in enumerate(allow):
            if a is None:
                continue
            i = seen.get(id(a))
            if i is None:
                m = np.zeros(sp.n_docs, bool)
                for j, rows in enumerate(a):
                    rows = np.asarray(rows, np.int64)
                    m[rows + sp.row_base[view_ids[j]]] = True
                i = seen[id(a)] = len(masks)
                masks.append(_bits(m))
            row_allow[q] = i
        return cp.asarray(np.ascontiguousarray(np.stack(masks))), row_allow


def register() -> bool:
    """Route the contract's "cupy" engine here (``gpuir.backends.contract.register_engine``); False where the
    contract module is absent (then :mod:`gpuir.backends.devicesearch` routes the memory's cupy searches)."""
    try:
        from .contract import register_engine  # type: ignore[import-not-found]
    except ImportError:
        return False
    register_engine("cupy", CupySegmentsEngine)
    return True


__all__ = ["SPACES", "UPLOADS", "CupySegmentsEngine", "DeviceSegment", "DocSpace", "SegmentHits", "device_segment",
           "doc_space", "register"]
