"""The ``"numba"`` engine of the segment-set contract: a snapshot's segments in one compiled call.

:class:`NumbaSegmentsEngine` (:mod:`gpuir.backends.contract`) hands the compiled CPU engine every
query through :func:`search_compiled` (a query's allow-list per segment): one call of :func:`gpuir.backends.cpu_segments.search_segments` scores all the
segments it may read, largest first, the k-th best score found so far carried
into each next segment as its pruning bound, the hits merged in the memory's
order (score descending, then sequence number ascending). The per-segment
Python round trip of the generic path (a scorer call, its argument checks and
result arrays, per segment) is gone; what remains per search is one call.

**All segments as one.** A query without
a ``where`` whose lists are long in every segment (the dense regime:
natural-language questions) over segments of one time partition (see
:data:`UNION`) is searched over all the segments at once, as over one merged segment
(:func:`gpuir.backends.cpu_segments.union_row`): one accumulator over all their
rows, terms scanned in the order of their bound over all segments, one k-th
best partial score pruning every segment's lists. Segment by segment, each
segment's search starts from the k-th score of the segments before it: a lower
bound, so more survivors to finish (on the LongMemEval turns grown to 15
segments, the kernel's time went from about 1.6x to about 1.2-1.3x a single
merged index's; see ``docs/benchmarks.md``). The segments' arrays reach it by
address (:mod:`gpuir.backends.raw_views`): a typed list's item costs a
reference count per array, which per term and segment cost more than the
postings. The workspace then spans all the segments' rows (17 bytes a row).

**The weights of a snapshot.** The statistics of a snapshot never change, so the
weight of every posting its searches read is computed once per (snapshot,
segment), on first use, term by term
(:func:`gpuir.backends.cpu_segments.fill_weights`: the kernels' own float32
operations, hence the same bits), with each term's and each block's exact
largest weight; later searches read them like a static index reads its cache,
with its exact bounds. A snapshot searched only once (a memory written between
every two searches) does not pay for filling: the cache is used from a
snapshot's second search on, or at once for a batch of several queries --
except for searches whose every query has a ``where``: a tenant's search reads
its own rows only, so its unfilled terms are weighed on the way rather than
filled for every tenant's postings. Sealed segments themselves are never re-laid
out: the cache belongs to the snapshot and dies with it.

**A snapshot searched once** (an agent adds a record, then asks) computes the weights of the postings it
reads instead of reading a cache: with the tf-part table of the snapshot
(:func:`gpuir.backends.cpu_kernels.tfc_table`, 18 KB, made once per snapshot) and each posting's key in it
(:func:`gpuir.backends.cpu_kernels.tf_keys`, made once per segment), nearly every weight is one table read
and one product, with no division and no random read of the document's length. What a segment needs
(its scorer and block layout, its keys, its sorted term codes; a small segment's row) is made when it
appears, off the search path (:meth:`NumbaSegmentsEngine.prepare`: the memory calls it in the merge's thread
or the writer's call), and the layout of a snapshot's large segments is shared by every snapshot holding
them, so a write that adds one small segment costs the next search no setup.

Both paths return exactly the generic path's results (tested): the same
kernels, the same float32 arithmetic, the same tie rule.
"""

from __future__ import annotations

import threading

import numpy as np

from . import cpu_segments
from .block_layout import read_only as _ro
from .contract import QueryBatch, SegmentEngine, SegmentHits, SegmentSet
from .cpu_kernels import tf_keys, tfc_table
from .numba_backend import default_threads, shared_pool
from .raw_views import check_dtypes
from .segment_engines import search_own, segment_scorer
from .weights import BOUND_SLACK, has_absent_weight

#: Batches of at least this many queries fill the snapshot's weight cache on their first search.
BATCH_FILLS = 4

#: When to search the rows that allow it over all segments at once
#: (:func:`gpuir.backends.cpu_segments.union_row`): ``"auto"`` when the segments hold one time
#: partition, ``"always"``, or ``"never"`` (segment by segment). The results are the same (tests compare
#: them). Segments of several partitions differ (each holds its own weeks' words), and one by one the
#: search can skip those whose best possible score cannot reach the k-th score found so far; all at once
#: read fewer postings there but gained no time (``bench/bench_union.py``), so "auto" leaves them be.
UNION = "auto"


_NO_BOOL = _ro(np.zeros(0, np.bool_), np.bool_)
_NO_PTRS = np.zeros((0, 2 * len(cpu_segments.UNION_COLUMNS)), np.int64)  # (no union: never read)


class SnapshotLayout:
    """What one compiled call over some of a snapshot's segments reads (built once per snapshot and segment set).

    Attributes
    ----------
    segs : numba typed list of segment tuples (:func:`gpuir.backends.cpu_segments.search_segments`)
    max_docs : int
        Rows of the largest segment (the workspace's size).
    slot_of : dict global term code -> int
        The terms searched so far, each with a row of ``locs``.
    locs : ndarray (S, segments), int64, host
        Each slot's local id in each segment (-1: absent), found once per snapshot and term
        (:func:`gpuir.backends.cpu_segments.locate_terms`): a search reads a term's ids in every
        segment from one row instead of a binary search per segment (4-5% of a question's time
        on the LongMemEval turns grown to 15 segments).
    """

    def __init__(self, snap: SegmentSet, view_ids: tuple[int, ...], scorers: list, caches: list):
        self.max_docs = 1
        self.total_docs = 0
        #: The same segments' arrays by address (:func:`gpuir.backends.cpu_segments.pointer_rows`), made when
        #: first searched all at once (valid while :attr:`segs` holds the arrays).
        self.ptrs: np.ndarray | None = None
        #: Each segment's slot in the results (its position in the list: the caller maps slots to the
        #: views of the snapshot searched, so that the next snapshot can search the same list).
        self.vis = np.arange(len(view_ids), dtype=np.int64)
        #: Serialises :meth:`slots` of a layout shared by several snapshots.
        self.lock = threading.Lock()
        #: Whether they all hold one time partition (slices of one stream, alike: see :data:`UNION`).
        self.one_partition = len({snap.views[v].seg.partition for v in view_ids}) == 1
        segs = None
        #: The views of the segments, in the list's order (largest first).
        self.order = tuple(view_ids)
        for j, (vi, sc, cache) in enumerate(zip(view_ids, scorers, caches)):
            view = snap.views[vi]
            seg = view.seg
            live = _NO_BOOL if view.live is None else _ro(view.live, np.bool_)
            bl = sc._blocks
            bix = (bl[0], bl[1], _ro(np.zeros(0, np.float32), np.float32), bl[2], bl[3], bl[4], bl[5], bl[6])
            seqs = _ro(seg.seqs, np.int64)
            ix = keyed_ix(seg, sc)
            item = (np.int64(j), _ro(seg.g_sorted, np.int64), _ro(seg.g_order, np.int64),
                    seqs, ix, bix, sc._summ, live, cache, bl[7])
            if segs is None:  # the arrays the union reads by address must have the dtypes it reads them as
                check_dtypes({"offsets": ix[0], "doc_ids": ix[1], "pre": cache[0], "live": live,
                              "ub": cache[2], "zero": cache[3], "neg": cache[4], "seqs": seqs, "blk_off": bl[0],
                              "blk_last": bl[1], "dir_off": bl[4], "dir_shift": bl[5], "blk_dir": bl[6],
                              "tfs": ix[2], "doc_lens": ix[3], "maxtf": sc._summ[0], "mindl": sc._summ[1],
                              "mintf": sc._summ[2], "maxdl": sc._summ[3], "blk_maxtf": bl[2], "blk_mindl": bl[3]},
                             cpu_segments.UNION_COLUMNS)
            if segs is None:  # (the list is made and filled in compiled code: see cpu_segments.segment_list)
                segs = cpu_segments.segment_list(item)
            else:
                cpu_segments.segment_list_append(segs, item)
            self.max_docs = max(self.max_docs, int(sc.index.n_docs))
            self.total_docs += int(sc.index.n_docs)
        self.segs = segs
        #: Global term codes whose weights are in every one of these segments' caches.
        self.filled: set[int] = set()
        #: Term slots: global code -> row of :attr:`locs` (its local id in each segment).
        self.slot_of: dict[int, int] = {}
        self.locs = np.empty((64, len(view_ids)), np.int64)

    def slots(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slots of global codes ``gids`` (new ones located in every segment first) and the slot table
        to read them from: ((T,) int64, (S, segments) int64). Caller holds the snapshot state's lock (a
        grown table is a new array: searches reading the old one keep it)."""
        get = self.slot_of.get
        got = [get(g) for g in gids.tolist()]
        if None in got:
            new = list(dict.fromkeys(g for g, x in zip(gids.tolist(), got) if x is None))
            n0 = len(self.slot_of)
            if n0 + len(new) > self.locs.shape[0]:
                grown = np.empty((max(2 * self.locs.shape[0], n0 + len(new)), self.locs.shape[1]), np.int64)
                grown[:n0] = self.locs[:n0]
                self.locs = grown
            cpu_segments.locate_terms(self.segs, np.array(new, np.int64), self.locs, n0)
            for i, g in enumerate(new):
                self.slot_of[g] = n0 + i
            got = [get(g) for g in gids.tolist()]
        return np.array(got, np.int64), self.locs


def keyed_ix(seg, scorer) -> tuple[np.ndarray, ...]:
    """The scorer's ``ix`` (offsets, doc_ids, tfs, doc_lens) with each posting's key in the tf-part table in
    place of its tf (:func:`~gpuir.backends.cpu_kernels.tf_keys`), as every search of a snapshot layout
    reads it (with the table in its ``fp``): made once per segment, kept in its cache."""
    got = seg.cache.get(("numba", "tf_keys"))
    if got is None:
        ix = scorer._ix
        got = seg.cache[("numba", "tf_keys")] = (ix[0], ix[1], _ro(tf_keys(ix[1], ix[2], ix[3]), np.int32), ix[3])
    return got


def new_cache(scorer) -> tuple[np.ndarray, ...]:
    """An empty weight cache for one segment (pages are touched only as terms are filled).

    Returns
    -------
    (pre (P,) float32, blk_max (NB,) float32, ub (V,) float64, zero (V,) bool, neg (V,) bool, filled (V,) bool)
    """
    P = int(scorer._ix[1].size)
    NB = int(scorer._blocks[1].size)
    V = int(scorer._ix[0].size - 1)
    return (np.empty(P, np.float32), np.empty(NB, np.float32), np.empty(V, np.float64), np.empty(V, np.bool_),
            np.empty(V, np.bool_), np.zeros(V, np.bool_))


class SnapshotWeights:
    """The per-snapshot state of the compiled path: weight caches, layouts, a fill lock, a search count,
    and the BM25 arguments every search of the snapshot passes (:meth:`params`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.searches = 0
        self.caches: dict[int, tuple[np.ndarray, ...]] = {}
        self.layouts: dict[tuple[int, ...], SnapshotLayout] = {}
        self._params: tuple[np.ndarray, np.ndarray, int, bool] | None = None

    def params(self, snap: SegmentSet) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """(head (11,) float64, fp float32, method, has_w0): the first 11 entries of
        :func:`~gpuir.backends.cpu_segments.search_segments`'s ``par`` and its ``fp``, the weight parameters
        with the tf-part table (:func:`~gpuir.backends.cpu_kernels.tfc_table`), under the snapshot's statistics
        (made once: they do not change while the snapshot lives)."""
        got = self._params
        if got is None:
            params = snap.params
            f = np.float32
            k1, b, delta, avgdl = f(params.k1), f(params.b), f(params.delta), f(snap.avgdl)
            head = np.empty(11, np.float64)
            head[:6] = (f(1) - b, b, k1, k1 + f(1), delta, avgdl)
            head[6:11] = (params.k1, params.b, params.delta, float(avgdl), BOUND_SLACK)
            fp = tfc_table(head[:6].astype(np.float32), int(params.code))  # (the layouts' ix hold tf keys)
            got = self._params = (head, fp, int(params.code), bool(has_absent_weight(params)))
        return got


_ws_lock = threading.Lock()
_ws_free: list[np.ndarray] = []


def _take_workspace(n: int) -> np.ndarray:
    """A workspace for at least ``n`` documents: (17 m,) uint8, m >= n, zero (acc, touched, sdoc, part, mark).

    A new one has room for an eighth more rows than asked (in steps of 4,096): a memory that grows by one
    record per add asks for one more row each time, and a fresh workspace per search (megabytes, zeroed
    page by page) cost an agent's question up to a millisecond."""
    with _ws_lock:
        for i, ws in enumerate(_ws_free):
            if ws.size >= 17 * n:
                return _ws_free.pop(i)
    m = -(-(n + n // 8) // 4096) * 4096
    return np.zeros(17 * m, np.uint8)


def _give_workspace(ws: np.ndarray) -> None:
    with _ws_lock:
        _ws_free.append(ws)
        if len(_ws_free) > 8:  # keep the largest few
            _ws_free.sort(key=lambda w: -w.size)
            del _ws_free[8:]


# Shared "no filter" arguments (writeable, as the built ones are: one compiled signature; never written)
_NO_FILTER_1 = np.zeros(1, np.bool_)
_NO_OFFSETS = np.zeros((1, 1), np.int64)
_NO_ROWS = np.zeros(0, np.int64)


def _allow_lists(order: tuple[int, ...], view_ids: tuple[int, ...],
                 batch: QueryBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each filtered query's allowed rows in each of the segments ``order`` (view positions, a subset of
    ``view_ids``, which the batch's allow-lists follow), flattened for the compiled call.

    Returns
    -------
    filt : (B,) bool -- the queries with an allow-list
    a_off : (B, len(order) + 1) int64 -- query i's rows of segment j are ``allow_flat[a_off[i, j]:a_off[i, j + 1]]``
    allow_flat : (A,) int64
    """
    B = batch.size
    filt = np.zeros(B, np.bool_)
    a_off = np.zeros((B, len(order) + 1), np.int64)
    pos = {vi: j for j, vi in enumerate(view_ids)}
    at_of = [pos[vi] for vi in order]
    parts: list[np.ndarray] = []
    seen: dict = {}  # an allow-list shared by several queries (one tenant's batch) is flattened once
    at = 0
    for i, al in enumerate(batch.allow or ()):
        if al is None:
            continue
        filt[i] = True
        got = seen.get(id(al))
        if got is None:
            rows = [al[j] for j in at_of]
            off = np.zeros(len(rows) + 1, np.int64)
            np.cumsum([r.size for r in rows], out=off[1:])
            got = seen[id(al)] = (at, off)
            parts.extend(rows)
            at += int(off[-1])
        a_off[i] = got[0] + got[1]
    allow_flat = np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)
    return filt, a_off, allow_flat


#: Segments of at most this many rows are *small*: scored exhaustively, document at a time, from their
#: postings as they are (:func:`gpuir.backends.cpu_segments.search_small`), with no scorer, block index or
#: weight cache made for them -- an agent's memory makes a one-record segment with every ``add``, and the
#: search after it pays nothing to set one up. The results are the same bits (tested with 0: every segment
#: through the block-index path). 64 covers an agent's one-record adds and their first tiers of merges
#: (merge_factor 8: 8, then 64 records); a batch's segments of ~1,000 rows score faster through the block
#: index (LongMemEval-S grown in adds of 1,000, 499 questions as one batch on one core: 2,157 q/s with
#: 1,024 here, 3,094 with 64; one question p50 0.68 -> 0.50 ms).
SMALL_ROWS = 64

# an uncached search never reads a weight cache: a shared layout's segments carry these empty ones
_NO_CACHE = (np.empty(0, np.float32), np.empty(0, np.float32), np.empty(0, np.float64), np.empty(0, np.bool_),
             np.empty(0, np.bool_), np.zeros(0, np.bool_))


def _small_row(seg, live: np.ndarray | None) -> tuple[np.ndarray, tuple]:
    """A small segment with tombstones ``live`` as a row of :func:`~gpuir.backends.cpu_segments.search_small`'s
    table (its arrays by address), with the arrays it points to (kept in the segment's cache with the
    tombstones it was made for: the arrays live as long as the segment)."""
    got = seg.cache.get(("numba", "small"))
    if got is not None and got[0] is live:
        return got[1], got[2]
    csr = seg.csr
    arrs = (np.ascontiguousarray(seg.g_sorted, np.int64), np.ascontiguousarray(seg.g_order, np.int64),
            np.ascontiguousarray(seg.seqs, np.int64), np.ascontiguousarray(csr.offsets, np.int64),
            np.ascontiguousarray(csr.doc_ids, np.int32), np.ascontiguousarray(csr.tfs, np.int32),
            np.ascontiguousarray(csr.doc_lens, np.int32),
            np.zeros(0, np.bool_) if live is None else np.ascontiguousarray(live, np.bool_))
    # (the dtypes and layout are made above: what search_small reads them as, cpu_segments.SMALL_COLUMNS)
    row = np.array([x for a in arrs for x in ((a.__array_interface__["data"][0] if a.size else 0), a.size)],
                   np.int64)
    seg.cache[("numba", "small")] = (live, row, arrs)
    return row, arrs


_small_lock = threading.Lock()
#: (segment, tombstones) ids -> (table, views, the arrays its rows point to): the latest few. An entry keeps
#: what its rows point to alive itself: a segment's cached row may be replaced by another thread's (two
#: threads making one segment's row at once), and its arrays must outlive every table made of them.
_small_tables: dict[tuple, tuple[np.ndarray, list, list]] = {}


def _small_table(views: list) -> tuple[np.ndarray, list]:
    """The table of the small segments ``views`` for :func:`~gpuir.backends.cpu_segments.search_small`: the
    previous snapshot's when the same, or it plus the newest segment's row (a write adds one small segment),
    else made row by row. Each table is kept with its views and arrays (alive, their ids theirs); the caller
    holds the arrays returned beside the table through its call (an entry may be dropped meanwhile)."""
    key = tuple((id(v.seg), id(v.live)) for v in views)
    with _small_lock:
        got = _small_tables.get(key)
        prev = _small_tables.get(key[:-1]) if got is None else None
    if got is not None:
        return got[0], got[2]
    if prev is not None:
        row, arrs = _small_row(views[-1].seg, views[-1].live)
        table, held = np.vstack([prev[0], row]), [*prev[2], arrs]
    else:
        rows = [_small_row(v.seg, v.live) for v in views]
        table, held = np.stack([r for r, _ in rows]), [a for _, a in rows]
    with _small_lock:
        _small_tables[key] = (table, list(views), held)
        while len(_small_tables) > 8:
            del _small_tables[next(iter(_small_tables))]
    return table, held


def _shared_layout(snap: SegmentSet, order: tuple[int, ...]) -> SnapshotLayout:
    """The layout of the large segments ``order`` for a search that reads no weight cache, shared by every
    snapshot holding the same segments with the same tombstones: kept in the largest segment's cache (the
    latest one only), so a write that leaves the large segments alone costs the next search no layout."""
    views = [snap.views[v] for v in order]
    key = tuple((id(v.seg), id(v.live)) for v in views)
    holder = views[0].seg.cache
    got = holder.get(("numba", "layout"))
    if got is not None and got[0] == key:
        return got[1]
    scorers = [segment_scorer(v.seg, "numba", snap.params) for v in views]
    layout = SnapshotLayout(snap, order, scorers, [_NO_CACHE] * len(order))
    holder[("numba", "layout")] = (key, layout, [(v.seg, v.live) for v in views])  # (ids stay theirs)
    return layout


class NumbaSegmentsEngine(SegmentEngine):
    """The contract's ``"numba"`` engine: every query over all the searched segments in one compiled call
    (:func:`search_compiled`), on the compiled scorer's threads."""

    name = "numba"
    backend = "numba"

    def search(self, segset: SegmentSet, view_ids: tuple[int, ...], batch: QueryBatch, k: int) -> SegmentHits:
        if getattr(segset, "own_stats", False):  # a static index: its scorer's cached weights and MaxScore
            return search_own("numba", segset, view_ids, batch, k)
        B = batch.size
        if not view_ids or not batch.gids.size:
            return SegmentHits.empty(B, k)
        out_i, out_f, counts = search_compiled(segset, view_ids, batch, k, threads=default_threads())
        return SegmentHits(out_i[0], out_f, out_i[1], out_i[2], counts[:, 0].copy())

    def warm(self, segset: SegmentSet) -> None:
        """The shared layout of the set's large segments (:func:`_shared_layout`) and their addresses for
        the union, as a search of every view makes them: a merge's new set of large segments costs the
        question after it no typed-list build (about a millisecond)."""
        big = _large_first(segset, tuple(range(len(segset.views))))
        if len(big) > 0:
            layout = _shared_layout(segset, big)
            if len(big) > 1 and layout.ptrs is None:
                layout.ptrs = cpu_segments.pointer_rows(layout.segs)

    def prepare(self, seg, params, cheap: bool = False) -> None:
        """What searches read of a new segment, made before any of them meets it: a large segment's scorer
        and block layout (:func:`~gpuir.backends.segment_engines.segment_scorer`), its postings' tf keys
        (:func:`keyed_ix`) and its sorted term codes, unless ``cheap`` (a batch's segment, in the writer's
        call: a layout costs about a tenth of the add); a small one's (:data:`SMALL_ROWS`) table row."""
        if seg.n_docs > SMALL_ROWS:
            if cheap:
                return
            _ = seg.g_sorted  # (the sorted term codes every search of the segment looks terms up in)
            keyed_ix(seg, segment_scorer(seg, "numba", params))
        else:
            _small_row(seg, None)


def _large_first(snap: SegmentSet, view_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The large segments (more than :data:`SMALL_ROWS` rows) of ``view_ids``, largest first (the order a
    layout is keyed by)."""
    views = snap.views
    return tuple(sorted((v for v in view_ids if views[v].seg.n_docs > SMALL_ROWS),
                        key=lambda v: (-views[v].n_live, v)))


def search_compiled(snap: SegmentSet, view_ids: tuple[int, ...], batch: QueryBatch, k: int,
                    threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k of each query of ``batch`` over the segments ``view_ids``, as the compiled calls leave them.

    The large segments go through one call of :func:`gpuir.backends.cpu_segments.search_segments` (block
    index, pruning, the snapshot's weight cache from its second search on), the small ones
    (:data:`SMALL_ROWS`) through one call of :func:`gpuir.backends.cpu_segments.search_small`, which merges
    their hits into the first call's.

    Returns
    -------
    out_i : (3, B, k) int64, host -- each hit's sequence number, view position and row, best first (-1 pads)
    out_f : (B, k) float32, host -- its score (-inf pads)
    counts : (B, 4) int64, host -- postings read, then the kernel's counters
        (:func:`gpuir.backends.cpu_segments.search_segments`)
    """
    B = batch.size
    params = snap.params
    views = snap.views
    big = _large_first(snap, view_ids)
    small = tuple(v for v in view_ids if views[v].seg.n_docs <= SMALL_ROWS)
    state: SnapshotWeights = snap.cached(("compiled",), SnapshotWeights)
    with state.lock:
        state.searches += 1
        first = state.searches == 1
    cached = bool(big) and (not first or B >= BATCH_FILLS)
    if cached and batch.filtered() and all(a is not None for a in batch.allow):  # type: ignore[union-attr]
        # every query is filtered (a tenant's search reads its own rows only): filling whole lists would
        # weigh every tenant's postings; the weights of the rows read are computed on the way instead
        layout = state.layouts.get(big)
        if layout is None or not layout.filled:
            cached = False
    gid = np.asarray(batch.gids, np.int64)
    T = int(gid.size)
    out_i = np.full((3, B, k), -1, np.int64)
    out_f = np.full((B, k), -np.inf, np.float32)
    counts = np.zeros((B, 4), np.int64)
    head, fp, method, has_w0 = state.params(snap)
    if big:
        if cached:
            with state.lock:
                layout = state.layouts.get(big)
                if layout is None:
                    scorers = [segment_scorer(views[vi].seg, "numba", params) for vi in big]
                    caches = []
                    for vi, sc in zip(big, scorers):
                        c = state.caches.get(vi)
                        if c is None:
                            c = state.caches[vi] = new_cache(sc)
                        caches.append(c)
                    layout = state.layouts[big] = SnapshotLayout(snap, big, scorers, caches)
                slots, locs = layout.slots(gid)
        else:
            layout = _shared_layout(snap, big)
            with layout.lock:
                slots, locs = layout.slots(gid)
        _search_large(state, layout, big, view_ids, batch, k, gid, slots, locs, head, fp, method, has_w0, cached,
                      threads, out_i, out_f, counts)
    if small:
        filt, a_off, allow_flat = ((_NO_FILTER_1 if B == 1 else np.zeros(B, np.bool_)), _NO_OFFSETS, _NO_ROWS) \
            if not batch.filtered() else _allow_lists(small, view_ids, batch)
        table, held = _small_table([views[v] for v in small])
        cpu_segments.search_small(table, len(big), head, method, has_w0, k, B, np.asarray(batch.off, np.int64), gid,
                                  np.asarray(batch.mult, np.int64), np.asarray(batch.idf, np.float32),
                                  np.asarray(batch.w0, np.float32), np.asarray(batch.const, np.float32), filt,
                                  a_off, allow_flat, out_i, out_f, counts)
        del held  # (held through the call: the table points into these arrays)
    if T:  # list slots -> the views of this snapshot
        slot_view = np.array(big + small, np.int64)
        v = out_i[1]
        np.copyto(v, slot_view[np.maximum(v, 0)], where=v >= 0)
    return out_i, out_f, counts


def _search_large(state: SnapshotWeights, layout: SnapshotLayout, big: tuple[int, ...], view_ids: tuple[int, ...],
                  batch: QueryBatch, k: int, gid: np.ndarray, slots: np.ndarray, locs: np.ndarray, head: np.ndarray,
                  fp: np.ndarray, method: int, has_w0: bool, cached: bool, threads: int, out_i: np.ndarray,
                  out_f: np.ndarray, counts: np.ndarray) -> None:
    """The large segments' call (:func:`gpuir.backends.cpu_segments.search_segments`), into the outputs."""
    B = batch.size
    T = int(gid.size)
    qi = np.empty(B + 1 + 2 * T, np.int64)
    qi[:B + 1] = batch.off
    qi[B + 1:B + 1 + T] = slots
    qi[B + 1 + T:] = batch.mult
    qf = np.empty(2 * T + B, np.float32)
    qf[:T] = batch.idf
    qf[T:2 * T] = batch.w0
    qf[2 * T:] = batch.const
    if not batch.filtered():  # (the common case: nothing to build)
        filt, a_off, allow_flat = (_NO_FILTER_1 if B == 1 else np.zeros(B, np.bool_)), _NO_OFFSETS, _NO_ROWS
    else:
        filt, a_off, allow_flat = _allow_lists(big, view_ids, batch)
    par = np.empty(11 + B, np.float64)
    par[:11] = head
    par[11:] = batch.theta
    if cached and T:
        if B == 1:  # a plan's terms are distinct
            g_list = gid.tolist()
            if layout.filled.issuperset(g_list):
                u = None
            else:
                sel = np.array([g not in layout.filled for g in g_list])
                u, ui, uw = gid[sel], qf[:T][sel], qf[T:2 * T][sel]
        else:
            u, first_at = np.unique(gid, return_index=True)
            ui, uw = qf[:T][first_at], qf[T:2 * T][first_at]
        if u is not None and filt.all() and not layout.filled.issuperset(u.tolist()):
            cached, u = False, None  # (every query filtered: see search_compiled)
        if u is not None:
            with state.lock:  # fills never rewrite a filled term: searches reading filled terms go on meanwhile
                cpu_segments.fill_segments(layout.segs, fp, method, has_w0,
                                           np.ascontiguousarray(u), np.ascontiguousarray(ui),
                                           np.ascontiguousarray(uw))
                layout.filled.update(u.tolist())
    union = len(layout.order) > 1 and (UNION == "always" or (UNION == "auto" and layout.one_partition))
    if union and layout.ptrs is None:
        layout.ptrs = cpu_segments.pointer_rows(layout.segs)
    ptrs = layout.ptrs if union else _NO_PTRS

    def run(r0: int, r1: int) -> None:
        ws = _take_workspace(layout.total_docs if union else layout.max_docs)
        try:
            cpu_segments.search_segments(layout.segs, ptrs, layout.vis, locs, par, fp, method, has_w0, cached,
                                         union, k, B, qi, qf, filt, a_off, allow_flat, r0, r1, ws, out_i, out_f,
                                         counts)
        finally:
            _give_workspace(ws)

    if threads <= 1 or B == 1:
        run(0, B)
    else:
        size = max(4, -(-B // (min(threads, B) * 8)))
        pool = shared_pool(threads)
        for fut in [pool.submit(run, s, min(B, s + size)) for s in range(0, B, size)]:
            fut.result()
