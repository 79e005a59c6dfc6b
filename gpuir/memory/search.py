"""Scoring a snapshot's segments with exact global BM25, and the results of a memory search.

**Exactness.** A fresh :class:`~gpuir.engine.BM25Index` over the live records
scores a document as the float32 sum, in ascending term order, of its posting
weights ``w = float32(idf(df, N)) * tfc(tf, |d|, avgdl)`` (minus the absent-term
weight ``w0`` for bm25l/bm25+, then ``+ C`` with ``C`` the float32 sum of the
query terms' ``w0``), and ranks by score, then document number. Here every
segment is scored by the one engine (:mod:`gpuir.backends`) with the
*snapshot's* N, df and avgdl (global over the live records) applied per search,
the global ``C`` of each query and the segment's tombstones, by the same float32
operations in the same order (a segment's sorted vocabulary keeps ascending
term order), so each live record's score equals its score in the fresh index bit
for bit, for every variant; document numbers of the fresh index follow the add
order, which is the sequence-number order used here for ties.

**One engine.** :class:`SegmentEngine` searches each segment through its
backend's :class:`~gpuir.backends.base.Scorer` (:func:`segment_scorer`): one
scorer per sealed segment and backend for the segment's lifetime, made on the
segment's first search and cached on the :class:`~gpuir.memory.segments.Segment`
(never per snapshot: a segment is laid out once and never re-weighted or
re-uploaded when later adds change the statistics). Each search passes

* ``stats``: ``CollectionStats(snap.n_docs, snap.df[seg.l2g], snap.avgdl)``, made
  once per (snapshot, segment) (:meth:`SegmentEngine.stats`);
* ``consts``: each query's global ``C`` (terms absent from the segment included);
* ``live``: the view's tombstones; a ``where`` filter as an allow-list of rows;
* ``theta`` (scorers with ``supports_theta``): the k-th best score already held
  (from newer partitions, or from the larger segments of this scan: segments are
  searched largest first), below which nothing is wanted.

Scorers with ``search_weighted`` (the CPU engines) get each query weighed once
for all segments -- its slice of the query's terms (local ids, ascending), idf,
``w0`` and ``C`` under the snapshot's statistics -- instead of term ids plus a
:class:`~gpuir.backends.base.CollectionStats` (the same numbers; both paths are
tested to give the same bits).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import make_scorer
from ..backends.base import CollectionStats, Scorer, WeightedQueries
from ..backends.weights import has_absent_weight, term_weights
from ..bm25 import BM25Params
from ..topk import kth_largest, topk_order, topk_rows_by_id
from .segments import Segment
from .snapshot import Snapshot, thread_analyzer
from .termstats import TermStats
from .where import Where


@dataclass
class QueryPlan:
    """One analysed query against one snapshot.

    Attributes
    ----------
    terms : list of str
        Distinct query terms present in the live collection, ascending.
    gids : ndarray (T,), int64
        Their global term codes.
    mult : ndarray (T,), int64
        Occurrences of each term in the query.
    idf : ndarray (T,), float32
    w0 : ndarray (T,), float32
        Absent-term weights (zero unless bm25l/bm25+ with delta > 0).
    has_w0 : bool
    const : numpy.float32
        ``C``: the float32 sum of ``w0 * mult``, as the NumPy reference sums it.
    """

    terms: list[str]
    gids: np.ndarray
    mult: np.ndarray
    idf: np.ndarray
    w0: np.ndarray
    has_w0: bool
    const: np.float32
    _local: dict = field(default_factory=dict, repr=False)

    @property
    def empty(self) -> bool:
        return not self.terms

    def local_terms(self, vi: int, seg: Segment) -> np.ndarray:
        """:meth:`Segment.local_terms` of this query's terms in view ``vi`` (cached per plan)."""
        lids = self._local.get(vi)
        if lids is None:
            lids = self._local[vi] = seg.local_terms(self.gids)
        return lids


def plan_queries(snap: Snapshot, queries: list[str], stats: TermStats | None = None) -> list[QueryPlan]:
    """Analyse queries against ``snap`` (terms unknown to its live records are dropped).

    Each term's global code, idf and ``w0`` under the snapshot's statistics are
    looked up once per snapshot and kept (:func:`term_table`): a snapshot
    searched many times weighs each distinct term once. The batch's arrays are
    made once for all its queries; each plan holds views of them.

    ``stats`` (a shard's search, :mod:`gpuir.memory.termstats`): ``snap`` is
    restated under the whole collection's statistics, and each query's ``C``
    sums ``w0`` over every query term with a df > 0 in ``stats`` -- also the
    terms this memory does not hold, as one memory holding every record would.
    """
    an = thread_analyzer(snap.analyzer_config)
    params = snap.params
    has_w0 = has_absent_weight(params)
    table = term_table(snap)
    counts = [Counter(an(q)) for q in queries]
    toks = [sorted(c) for c in counts]
    missing = [t for ts in toks for t in ts if t not in table]
    if missing:
        _weigh_terms(snap, table, list(dict.fromkeys(missing)))
    got = [[(t, e) for t in ts if (e := table[t]) is not None] for ts in toks]
    flat = [e for g in got for _, e in g]
    n = len(flat)
    g_all = np.fromiter((e[0] for e in flat), dtype=np.int64, count=n)
    idf_all = np.fromiter((e[1] for e in flat), dtype=np.float32, count=n)
    w0_all = np.fromiter((e[2] for e in flat), dtype=np.float32, count=n)
    mult_all = np.fromiter((c[t] for c, g in zip(counts, got) for t, _ in g), dtype=np.int64, count=n)
    plans = []
    at = 0
    one = len(queries) == 1
    for q_toks, c, g in zip(toks, counts, got):
        end = at + len(g)
        w0, mult = (w0_all, mult_all) if one else (w0_all[at:end], mult_all[at:end])
        const = np.float32((w0 * mult).sum(dtype=np.float32)) if has_w0 else np.float32(0)
        if stats is not None and has_w0:
            gdf = np.fromiter((stats.df.get(t, 0) for t in q_toks), dtype=np.int64, count=len(q_toks))
            m = gdf > 0
            _, w0_st = term_weights(gdf[m], snap.n_docs, params)
            m_st = np.fromiter((c[t] for t, o in zip(q_toks, m.tolist()) if o), dtype=np.int64,
                               count=int(m.sum()))
            const = np.float32((w0_st * m_st).sum(dtype=np.float32))
        plans.append(QueryPlan([t for t, _ in g], g_all if one else g_all[at:end], mult,
                               idf_all if one else idf_all[at:end], w0, has_w0, const))
        at = end
    return plans


def term_table(snap: Snapshot) -> dict:
    """The snapshot's table term -> (global code, idf, w0) (float32 scalars), or None for a term no live
    record holds; filled as queries name terms (:func:`plan_queries`)."""
    return snap.cached(("term_table",), dict)


def _weigh_terms(snap: Snapshot, table: dict, toks: list[str]) -> None:
    """Enter ``toks`` into the snapshot's term table (values the same for every thread that races here)."""
    G = snap.df.shape[0]
    gids = snap.terms.lookup_many(toks)
    ok = (gids >= 0) & (gids < G)
    df = np.zeros(len(toks), np.int64)
    df[ok] = snap.df[gids[ok]]
    ok &= df > 0
    idf, w0 = term_weights(df[ok], snap.n_docs, snap.params)
    it = iter(zip(gids[ok].tolist(), idf.tolist(), w0.tolist()))
    for t, o in zip(toks, ok.tolist()):
        table[t] = next(it) if o else None


# --------------------------------------------------------------------------- top-k

_EMPTY_I = np.zeros(0, np.int64)
_EMPTY_F = np.zeros(0, np.float32)


@dataclass
class Hits:
    """Candidates of one query: sequence numbers, scores, and where each record lives.

    Attributes
    ----------
    seqs : ndarray (m,), int64
    scores : ndarray (m,), float32
    vidx : ndarray (m,), int64: position of the record's segment in ``snapshot.views``
    rows : ndarray (m,), int64: row in that segment
    """

    seqs: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    scores: np.ndarray = field(default_factory=lambda: _EMPTY_F)
    vidx: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    rows: np.ndarray = field(default_factory=lambda: _EMPTY_I)

    def __len__(self) -> int:
        return int(self.seqs.size)

    def kth(self, k: int) -> float:
        """The k-th best score, or -inf with fewer than k candidates."""
        return float(self.scores[k - 1]) if self.seqs.size >= k else -np.inf


def top_k(parts: list[Hits], k: int) -> Hits:
    """The best ``k`` of several candidate sets: score descending, then sequence number ascending."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return Hits()
    if len(parts) == 1:
        h = parts[0]
    else:
        h = Hits(*(np.concatenate([getattr(p, a) for p in parts]) for a in ("seqs", "scores", "vidx", "rows")))
    order = topk_order(h.seqs, h.scores, k)
    return Hits(h.seqs[order], h.scores[order], h.vidx[order], h.rows[order])


# --------------------------------------------------------------------------- engines


@dataclass
class Job:
    """One query's work on one partition.

    Attributes
    ----------
    qi : int
        The query's row in the batch.
    plan : QueryPlan
    where : Where or None
    theta : float
        The k-th best score found so far in other partitions (-inf: none, or no
        pruning wanted). Records scoring below it cannot enter the top k.
    """

    qi: int
    plan: QueryPlan
    where: Where | None
    theta: float = -np.inf


_build_lock = threading.Lock()


def segment_scorer(seg: Segment, backend: str, params: BM25Params) -> Scorer:
    """The scorer of ``seg`` for a concrete backend: made once, on first use, and cached on the segment.

    The scorer lays the segment out (raw tf, lengths, block summaries; a device
    upload for "cupy") for the segment's lifetime; every search passes the
    statistics of its snapshot. Two threads asking at once get the same scorer.
    The compiled CPU scorer takes the block index the segment's file saved, when
    it saved one (:meth:`~gpuir.memory.segments.Segment.saved_layout`).
    """
    key = ("scorer", backend, params)
    sc = seg.cache.get(key)
    if sc is None:
        with _build_lock:
            lock = seg.cache.setdefault(("scorer_lock",), threading.Lock())
        with lock:
            sc = seg.cache.get(key)
            if sc is None:
                opts = {}
                if backend == "numba":
                    lay = seg.saved_layout()
                    if lay is not None:
                        opts["layout"] = lay
                sc = seg.cache[key] = make_scorer(backend, seg.csr, params, **opts)
    return sc


_SEGSCAN = None


def _devicesearch():
    """:mod:`gpuir.memory.devicesearch` (the cupy backend's one-pass searches)."""
    from . import devicesearch

    return devicesearch


def _segscan():
    """:mod:`gpuir.memory.segscan` (imported on first use: it loads numba)."""
    global _SEGSCAN
    if _SEGSCAN is None:
        from . import segscan

        _SEGSCAN = segscan
    return _SEGSCAN


class SegmentEngine:
    """Exact BM25 over a snapshot's segments through one backend's scorers (see the module docstring).

    Keeps no state between calls besides the per-snapshot statistics, so any
    number of threads may search at once.
    """

    def __init__(self, snap: Snapshot, backend: str):
        self.snap = snap
        self.name = backend

    def stats(self, vi: int) -> CollectionStats:
        """The snapshot's statistics over view ``vi``'s vocabulary (made once per snapshot and view)."""
        snap = self.snap

        def make() -> CollectionStats:
            seg = snap.views[vi].seg
            return CollectionStats(snap.n_docs, snap.df[seg.l2g], snap.avgdl)

        return snap.cached(("stats", vi), make)

    def scan(self, view_ids: tuple[int, ...], jobs: list[Job], k: int) -> dict[int, tuple[Hits, int]]:
        """Top-k of each job over the segments ``view_ids``; returns qi -> (hits, postings read).

        One scorer call per segment answers every job that can match there; with the compiled
        engine, every job goes through one call for all segments, a ``where`` as an allow-list per
        segment (:func:`gpuir.memory.segscan.scan_compiled`).
        """
        if self.name == "cupy" and jobs and view_ids and _devicesearch().ONE_PASS:  # one device pass
            got = _devicesearch().scan(self.snap, view_ids, jobs, k)
            return {qi: (Hits() if h is None else Hits(*h), r) for qi, (h, r) in got.items()}
        threads = self._compiled_threads(view_ids) if jobs else None
        if threads is not None:
            raw = _segscan().scan_compiled(self.snap, view_ids, jobs, k, self._scorer_of, threads=threads)
            return {qi: (Hits(*r[:4]) if r[0].size else Hits(), r[4]) for qi, r in raw.items()}
        return self._scan_each(view_ids, jobs, k)

    def search_all(self, view_ids: tuple[int, ...], plans: list[QueryPlan],
                   k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Every plan over the segments ``view_ids``, no filter, as arrays: one compiled call, and no
        per-query objects on the way (:func:`gpuir.memory.segscan.search_compiled`'s (out_i, out_f,
        counts)); None when the compiled engine does not serve these segments (then :meth:`scan`)."""
        if self.name == "cupy" and plans and view_ids and _devicesearch().ONE_PASS:  # one device pass
            return _devicesearch().search_all(self.snap, view_ids, plans, k)
        threads = self._compiled_threads(view_ids)
        if threads is None:
            return self._search_all_each(view_ids, plans, k) if self.batch_each else None
        jobs = [Job(i, p, None) for i, p in enumerate(plans)]
        return _segscan().search_compiled(self.snap, view_ids, jobs, k, self._scorer_of, threads=threads)

    #: :meth:`search_all` on backends without the one compiled call ("numpy", "cupy"): one scorer
    #: call per segment for the whole batch (:meth:`_search_all_each`); False: None (then :meth:`scan`).
    batch_each = True

    def _search_all_each(self, view_ids: tuple[int, ...], plans: list[QueryPlan],
                         k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`search_all` through each segment's scorer: the whole batch in one call per segment.

        The batch's terms are mapped to each segment's local ids at once (no per-query loop), every
        row weighed as :meth:`_search_segment` weighs it, and the segments' top k merged under the tie
        rule (:func:`gpuir.topk.topk_rows_by_id`). No bound passes between segments: a device scorer
        pays per call, not per posting, so fewer calls beat fewer postings there.

        Returns
        -------
        As :func:`gpuir.memory.segscan.search_compiled`: out_i (3, B, k) int64 (sequence number, view
        position, row; -1 pads), out_f (B, k) float32 (-inf pads), counts (B, 1) int64 (postings read),
        host.
        """
        snap = self.snap
        B = len(plans)
        lens = np.fromiter((len(p.terms) for p in plans), np.int64, B)
        prow = np.repeat(np.arange(B, dtype=np.int64), lens)
        gids = np.concatenate([p.gids for p in plans]).astype(np.int64, copy=False)
        mult = np.concatenate([p.mult for p in plans]).astype(np.int64, copy=False)
        idf = np.concatenate([p.idf for p in plans]).astype(np.float32, copy=False)
        w0 = np.concatenate([p.w0 for p in plans]).astype(np.float32, copy=False)
        consts = np.array([p.const for p in plans], np.float32)
        has_w0 = plans[0].has_w0
        read = np.zeros(B, np.int64)
        got_i, got_s, got_v, got_r = [], [], [], []
        for vi in view_ids:
            view = snap.views[vi]
            seg = view.seg
            lids = seg.local_terms(gids)
            keep = lids >= 0
            if not keep.any():
                continue
            rows = prow[keep]
            off = np.zeros(B + 1, np.int64)
            np.cumsum(np.bincount(rows, minlength=B), out=off[1:])
            lt = lids[keep]
            scorer = self._scorer_of(vi)
            opts: dict[str, Any] = {"live": view.live}
            if self.use_weighted and hasattr(scorer, "search_weighted"):
                wq = WeightedQueries(off, lt, mult[keep], idf[keep], w0[keep], consts, has_w0, snap.avgdl)
                res = scorer.search_weighted(wq, k, None, **opts)
            else:  # each row's terms, repeats kept, as Scorer.search takes them (slices: np.split costs 4x)
                flat = np.repeat(lt, mult[keep])
                ends = np.cumsum(np.bincount(rows, weights=mult[keep], minlength=B).astype(np.int64)).tolist()
                queries = [flat[a:b] for a, b in zip([0, *ends[:-1]], ends)]
                res = scorer.search(queries, k, None, stats=self.stats(vi), consts=consts, **opts)
            per_row = res.meta.get("postings_rows")
            if per_row is None:
                per_row = np.bincount(rows, weights=seg.csr.offsets[lt + 1] - seg.csr.offsets[lt], minlength=B)
            read += np.asarray(per_row, np.int64)
            loc = res.ids
            ok = loc >= 0
            got_i.append(np.where(ok, seg.seqs[np.where(ok, loc, 0)], -1))
            got_s.append(res.scores)
            got_v.append(np.where(ok, vi, -1))
            got_r.append(np.where(ok, loc, -1))
        out_i = np.full((3, B, k), -1, np.int64)
        out_f = np.full((B, k), -np.inf, np.float32)
        if got_i:
            seqs, scores = np.concatenate(got_i, 1), np.concatenate(got_s, 1)
            order = topk_rows_by_id(seqs, scores, k)
            w = order.shape[1]
            out_i[0, :, :w] = np.take_along_axis(seqs, order, 1)
            out_i[1, :, :w] = np.take_along_axis(np.concatenate(got_v, 1), order, 1)
            out_i[2, :, :w] = np.take_along_axis(np.concatenate(got_r, 1), order, 1)
            out_f[:, :w] = np.take_along_axis(scores, order, 1)
        return out_i, out_f, read[:, None]

    def _scorer_of(self, vi: int) -> Scorer:
        return segment_scorer(self.snap.views[vi].seg, self.name, self.snap.params)

    def _compiled_threads(self, view_ids: tuple[int, ...]) -> int | None:
        """The compiled engine's threads when it serves the segments ``view_ids`` in one call (numba's
        pruning scorer, :attr:`compiled` on), else None."""
        if not (self.compiled and self.name == "numba" and view_ids):
            return None
        sc = self._scorer_of(view_ids[0])
        return sc.threads if getattr(sc, "_prune", False) and hasattr(sc, "_blocks") else None

    def _scan_each(self, view_ids: tuple[int, ...], jobs: list[Job], k: int) -> dict[int, tuple[Hits, int]]:
        """:meth:`scan` with one scorer call per segment (the generic path: any backend, ``where`` filters)."""
        snap = self.snap
        read = {j.qi: 0 for j in jobs}
        found: dict[int, list[Hits]] = {j.qi: [] for j in jobs}
        kth = {j.qi: -np.inf for j in jobs}  # each job's k-th score so far: the next segment's theta
        # largest segments first: their k-th scores let the smaller ones skip more
        for vi in sorted(view_ids, key=lambda v: -snap.views[v].n_live):
            view = snap.views[vi]
            seg = view.seg
            todo = []
            for job in jobs:
                lids = job.plan.local_terms(vi, seg)
                sel = lids >= 0
                if not sel.any():
                    continue
                allow = None
                if job.where is not None:
                    allow = job.where.rows(view, snap.dicts)
                    if not allow.size:
                        continue
                todo.append((job, lids, sel, allow))
            if not todo:
                continue
            thetas = [max(job.theta, kth[job.qi]) for job, *_ in todo]
            res = self._search_segment(vi, todo, k, thetas)
            rows_read = res.meta.get("postings_rows")
            for i, (job, lids, sel, _) in enumerate(todo):
                r = res.ids[i]
                local = r[r >= 0]
                if local.size:
                    hs = found[job.qi]
                    hs.append(Hits(seg.seqs[local], res.scores[i][: local.size], np.full(local.size, vi, np.int64),
                                   local.astype(np.int64)))
                    sc = hs[0].scores if len(hs) == 1 else np.concatenate([h.scores for h in hs])
                    if sc.size >= k:
                        kth[job.qi] = kth_largest(sc, k)
                if rows_read is not None:
                    read[job.qi] += int(rows_read[i])
                else:
                    lt = lids[sel]
                    read[job.qi] += int((seg.csr.offsets[lt + 1] - seg.csr.offsets[lt]).sum())
        return {qi: (top_k(found[qi], k), read[qi]) for qi in read}

    #: Score the jobs over all segments in one compiled call (:mod:`gpuir.memory.segscan`)
    #: when the backend is "numba"; False: one scorer call per segment (the generic path, for tests).
    compiled = True

    #: Hand CPU scorers the batch already weighted (:meth:`NumbaScorer.search_weighted`) rather than
    #: term ids and statistics (:meth:`Scorer.search`): the same numbers, without re-deriving them per segment.
    use_weighted = True

    def _search_segment(self, vi: int, todo: list, k: int, thetas: list[float]):
        """One scorer call for the jobs ``todo`` (job, local term ids, which are present, allow-list) on view vi,
        wanting nothing below ``thetas`` (one per job; -inf: no bound)."""
        snap = self.snap
        view = snap.views[vi]
        scorer = segment_scorer(view.seg, self.name, snap.params)
        opts: dict[str, Any] = {"live": view.live}
        if getattr(scorer, "supports_theta", False) and any(t > -np.inf for t in thetas):
            opts["theta"] = np.array(thetas, dtype=np.float64)
        allows = [t[3] for t in todo]
        allow = None if all(a is None for a in allows) else allows
        consts = np.array([t[0].plan.const for t in todo], dtype=np.float32)
        if self.use_weighted and hasattr(scorer, "search_weighted"):
            # each plan's terms are ascending strings, so their local ids ascend too (sorted vocabularies)
            p0 = todo[0][0].plan
            if len(todo) == 1:
                _, lids, sel, _ = todo[0]
                lt = lids[sel]
                wq = WeightedQueries(np.array([0, lt.size], np.int64), lt, p0.mult[sel], p0.idf[sel], p0.w0[sel],
                                     consts, p0.has_w0, snap.avgdl)
            else:
                lens = np.fromiter((int(np.count_nonzero(t[2])) for t in todo), np.int64, len(todo))
                off = np.zeros(len(todo) + 1, np.int64)
                np.cumsum(lens, out=off[1:])

                def cat(get):
                    return np.concatenate([get(job.plan, lids, sel) for job, lids, sel, _ in todo])

                wq = WeightedQueries(off, cat(lambda p, lids, sel: lids[sel]), cat(lambda p, lids, sel: p.mult[sel]),
                                     cat(lambda p, lids, sel: p.idf[sel]), cat(lambda p, lids, sel: p.w0[sel]),
                                     consts, p0.has_w0, snap.avgdl)
            return scorer.search_weighted(wq, k, allow, **opts)
        queries = [np.repeat(lids[sel], job.plan.mult[sel]) for job, lids, sel, _ in todo]
        return scorer.search(queries, k, allow, stats=self.stats(vi), consts=consts, **opts)


def make_engine(snap: Snapshot, backend: str) -> SegmentEngine:
    """The engine of a concrete backend name ("numpy", "numba", "cupy")."""
    return SegmentEngine(snap, backend)


# --------------------------------------------------------------------------- results


@dataclass
class MemoryResults:
    """Top-k records of a batch of queries.

    Attributes
    ----------
    seqs : ndarray, shape (B, k), int64, host
        Sequence number (add order) of each hit, best first; -1 pads.
    scores : ndarray, shape (B, k), float32, host
        -inf at padding. Rows are sorted by score descending, then add order.
    snapshot : Snapshot
        The state the search saw (hits are read from it).
    meta : dict
        ``backend``, ``backend_reason``, ``mode``, ``postings_read`` (B,),
        ``partitions_scanned`` (B,), ``snapshot_version``, ``timings``.
    """

    seqs: np.ndarray
    scores: np.ndarray
    snapshot: Snapshot
    vidx: np.ndarray
    rows: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.seqs.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return self.seqs.shape  # type: ignore[return-value]

    def ids(self, i: int) -> list[str]:
        """Record ids of query ``i``'s hits, best first."""
        ok = self.seqs[i] >= 0
        views = self.snapshot.views
        return [views[v].seg.ids[r] for v, r in zip(self.vidx[i][ok].tolist(), self.rows[i][ok].tolist())]

    def hits(self, i: int) -> list[dict[str, Any]]:
        """Query ``i``'s hits, best first: dicts with ``id``, ``score``, ``text`` and the record's fields
        (``time`` and ``expires_at`` as ISO 8601 strings)."""
        from .timeutil import public_record

        ok = self.seqs[i] >= 0
        out = []
        for v, r, s in zip(self.vidx[i][ok].tolist(), self.rows[i][ok].tolist(), self.scores[i][ok].tolist()):
            rec = public_record(self.snapshot.record(v, r))
            out.append({"id": rec.pop("id"), "score": float(s), **rec})
        return out
