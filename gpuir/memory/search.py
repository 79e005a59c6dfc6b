"""Scoring a snapshot's segments with exact global BM25, and the results of a memory search.

**Exactness.** A fresh :class:`~gpuir.engine.BM25Index` over the live records
scores a document as the float32 sum, in ascending term order, of its posting
weights ``w = float32(idf(df, N)) * tfc(tf, |d|, avgdl)`` (minus the absent-term
weight ``w0`` for bm25l/bm25+, then ``+ C`` with ``C`` the float32 sum of the
query terms' ``w0``), and ranks by score, then document number. Here every
segment's posting weights are computed from the *snapshot's* N, df and avgdl
(global over the live records), by the same functions (:mod:`gpuir.bm25`) with
the same float32 operations, and summed in the same order (a segment's sorted
vocabulary keeps ascending term order), so each live record's score equals its
score in the fresh index bit for bit; document numbers of the fresh index follow
the add order, which is the sequence-number order used here for ties.

**Two engines.**

* :class:`CpuEngine` (backend "numpy") computes the weights of only the postings
  a query reads, as the CUDA kernels do: the snapshot's statistics change with
  every add, and a scorer that precomputes every posting's weight
  (:class:`~gpuir.backends.numpy_backend.NumpyScorer`) would have to redo all
  of them for every new snapshot, O(all postings) before the first search.
  It keeps no state between calls, so any number of threads may search at once.
* :class:`ScorerEngine` (any other backend: "cupy", and later compiled CPU
  backends) builds one backend scorer per segment through
  :func:`~gpuir.backends.make_scorer` with the snapshot's
  :class:`~gpuir.backends.base.CollectionStats`, once per snapshot. A segment
  with tombstones is first purged into a private copy (a scorer must see live
  documents only: its statistics must cover its own). Such a scorer adds the
  absent-term constant of its own segment's terms; the engine swaps it for the
  global one, which is exact for lucene, robertson and atire and within float32
  rounding for bm25l/bm25+ (the GPU's own contract is rounding-level parity).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import bm25
from ..backends import make_scorer
from ..backends.base import CollectionStats
from ..topk import kth_largest, topk_order
from .segments import Segment, merge_segments
from .snapshot import Snapshot, thread_analyzer
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


def plan_queries(snap: Snapshot, queries: list[str]) -> list[QueryPlan]:
    """Analyse queries against ``snap`` (terms unknown to its live records are dropped)."""
    an = thread_analyzer(snap.analyzer_config)
    params = snap.params
    t0 = float(bm25.tfc(np.zeros(1), np.ones(1), 1.0, params)[0])
    plans = []
    G = snap.df.shape[0]
    for q in queries:
        counts = Counter(an(q))
        toks = sorted(counts)
        gids = snap.terms.lookup_many(toks)
        ok = (gids >= 0) & (gids < G)
        ok[ok] = snap.df[gids[ok]] > 0
        terms = [t for t, o in zip(toks, ok.tolist()) if o]
        g = gids[ok]
        mult = np.fromiter((counts[t] for t in terms), dtype=np.int64, count=len(terms))
        idf64 = bm25.idf(snap.df[g], snap.n_docs, params.method)
        w0 = bm25.absent_weight(idf64, params)
        has_w0 = t0 != 0.0
        const = np.float32((w0 * mult).sum(dtype=np.float32)) if has_w0 else np.float32(0)
        plans.append(QueryPlan(terms, g, mult, idf64.astype(np.float32), w0, has_w0, const))
    return plans


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


def shortlist(seg: Segment, vi: int, rows: np.ndarray, scores: np.ndarray, k: int) -> Hits:
    """The candidates of one segment that can be in its top k (every one scoring at least its
    k-th best score, ties included), unsorted: a superset :func:`top_k` orders later."""
    if scores.size > k:
        th = kth_largest(scores, k)
        keep = np.flatnonzero(scores >= th)
        rows, scores = rows[keep], scores[keep]
    rows = rows.astype(np.int64, copy=False)
    return Hits(seg.seqs[rows], scores, np.full(rows.size, vi, np.int64), rows)


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


#: Longest posting list whose weights are computed per query without caching (short lists are cheap).
CACHE_MIN_POSTINGS = 512
#: Most posting weights a snapshot caches (float32 each).
CACHE_MAX_POSTINGS = 64_000_000


def term_weights(snap: Snapshot, vi: int, seg: Segment, t: int, s: int, n: int, plan: QueryPlan, j: int) -> np.ndarray:
    """The float32 weights of local term ``t``'s postings (``s`` .. ``s + n``) in view ``vi``, under the
    snapshot's statistics: ``idf * tfc(tf, |d|) - w0``, the reference's operations.

    Long lists are cached per snapshot (the statistics are fixed for its lifetime), so the
    common terms of many queries are weighted once.

    Returns
    -------
    ndarray (n,), float32, host (read only)
    """
    key = (vi, t)
    cache = snap._wcache
    w = cache.get(key)
    if w is not None:
        return w
    csr = seg.csr
    w = plan.idf[j] * bm25.tfc(csr.tfs[s: s + n], csr.doc_lens[csr.doc_ids[s: s + n]], snap.avgdl, snap.params)
    if plan.has_w0:
        w = w - plan.w0[j]
    w = w.astype(np.float32, copy=False)
    if n >= CACHE_MIN_POSTINGS and snap._wcache_size + n <= CACHE_MAX_POSTINGS:
        w.flags.writeable = False
        cache[key] = w
        snap._wcache_size += n
    return w


_tls = threading.local()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's zeroed accumulator (float32) and touched flags (bool), at least ``n`` long.

    Callers reset the entries they touched, so the buffers stay zero between calls.
    """
    acc = getattr(_tls, "acc", None)
    if acc is None or acc.size < n:
        size = max(n, 2 * (0 if acc is None else acc.size))
        _tls.acc, _tls.touched = np.zeros(size, np.float32), np.zeros(size, bool)
    return _tls.acc, _tls.touched


class CpuEngine:
    """Exact BM25 over segments with NumPy, weighting only the postings it reads.

    One query's work on one partition is one vectorised pass: the query terms'
    posting slices of every segment of the partition are gathered (a Python
    loop over segments and terms, slicing only), weighted in one go and added
    into one accumulator over the partition's rows.
    """

    name = "numpy"

    def __init__(self, snap: Snapshot):
        self.snap = snap

    def scan(self, view_ids: tuple[int, ...], jobs: list[Job], k: int) -> dict[int, tuple[Hits, int]]:
        """Top-k of each job over the segments ``view_ids``; returns qi -> (hits, postings read)."""
        return {job.qi: self.partition_topk(view_ids, job, k) for job in jobs}

    def partition_topk(self, view_ids: tuple[int, ...], job: Job, k: int) -> tuple[Hits, int]:
        """Top-k of one query over some segments, and the number of postings read.

        With a threshold ``job.theta`` (the k-th best score found in newer
        partitions), see :meth:`_maxscore`.
        """
        snap, plan = self.snap, job.plan
        todo = []  # (vi, seg, sel, starts, lens, mask)
        for vi in view_ids:
            view = snap.views[vi]
            seg = view.seg
            lids = plan.local_terms(vi, seg)
            sel = lids >= 0
            if not sel.any():
                continue
            mask = view.live if job.where is None else job.where.mask(view, snap.dicts)
            if mask is not None and not mask.any():
                continue
            lt = lids[sel]
            starts = seg.csr.offsets[lt]
            todo.append((vi, seg, sel, starts, seg.csr.offsets[lt + 1] - starts, mask))
        if not todo:
            return Hits(), 0
        if job.theta > -np.inf and len(plan.terms) > 1:
            pruned = self._maxscore(todo, plan, k, job.theta)
            if pruned is not None:
                return pruned
        h, r = self._scan(todo, plan, k)
        return top_k([h], k), r

    def _gather(self, todo: list, plan: QueryPlan, only: np.ndarray | None = None):
        """The postings of the query terms (all, or the plan terms flagged in ``only``) in the segments
        of ``todo``, live and passing the filter, concatenated.

        Returns
        -------
        key : ndarray (m,), int: segment base + row (ascending term order within each segment)
        w : ndarray (m,), float32: weights times the terms' multiplicities
        bases : ndarray (len(todo),), int64: each segment's first key
        total : int: rows of all segments
        read : int: postings read
        """
        snap = self.snap
        ds, ws, bases = [], [], []
        base = read = 0
        for vi, seg, sel, starts, lens, mask in todo:
            csr = seg.csr
            tids = np.flatnonzero(sel)
            lt = plan.local_terms(vi, seg)[sel]
            pick = range(tids.size) if only is None else np.flatnonzero(only[tids]).tolist()
            dd, ww = [], []
            for i in pick:
                j, t, s0, n = int(tids[i]), int(lt[i]), int(starts[i]), int(lens[i])
                dd.append(csr.doc_ids[s0: s0 + n])
                w = term_weights(snap, vi, seg, t, s0, n, plan, j)
                ww.append(w if plan.mult[j] == 1 else w * np.float32(plan.mult[j]))
                read += n
            bases.append(base)
            if dd:
                d = dd[0] if len(dd) == 1 else np.concatenate(dd)
                w = ww[0] if len(ww) == 1 else np.concatenate(ww)
                if mask is not None:
                    keep = mask[d]
                    d, w = d[keep], w[keep]
                ds.append(d if base == 0 else d + np.int32(base))
                ws.append(w)
            base += seg.n_docs
        cat = (lambda xs: xs[0] if len(xs) == 1 else np.concatenate(xs))
        key = cat(ds) if ds else np.zeros(0, np.int64)
        w = cat(ws) if ws else np.zeros(0, np.float32)
        return key, w, np.asarray(bases, dtype=np.int64), base, read

    def _scan(self, todo: list, plan: QueryPlan, k: int) -> tuple[Hits, int]:
        """Every posting of the query terms in the segments of ``todo``, in one vectorised pass."""
        key, w, barr, base, read = self._gather(todo, plan)
        if key.size == 0:
            return Hits(), read
        if key.size * 16 < base:  # few postings: a compact accumulator
            cand, inv = np.unique(key, return_inverse=True)
            scores = np.zeros(cand.size, dtype=np.float32)
            np.add.at(scores, inv, w)  # per record, in ascending term order
        else:
            acc, touched = _scratch(base)
            np.add.at(acc, key, w)  # per record, in ascending term order
            touched[key] = True
            cand = np.flatnonzero(touched[:base])
            scores = acc[cand]
            acc[cand] = 0.0  # leave the scratch buffers clean
            touched[cand] = False
        if plan.has_w0:
            scores = scores + plan.const
        if scores.size > k:  # a superset of the top k (ties included); top_k orders it
            keep = np.flatnonzero(scores >= kth_largest(scores, k))
            cand, scores = cand[keep], scores[keep]
        which = np.searchsorted(barr, cand, side="right") - 1
        vis = np.asarray([t[0] for t in todo], dtype=np.int64)[which]
        rows = cand.astype(np.int64) - barr[which]
        seqs = np.empty(rows.size, dtype=np.int64)
        for j, t in enumerate(todo):
            m = which == j
            if m.any():
                seqs[m] = t[1].seqs[rows[m]]
        return Hits(seqs, scores, vis, rows), read

    def _maxscore(self, todo: list, plan: QueryPlan, k: int, theta: float) -> tuple[Hits, int] | None:
        """MaxScore against ``theta`` over the segments of ``todo`` (None when it would not read less).

        1. Split the query terms: the largest set of smallest-bound terms whose
           bounds (plus C) sum to less than ``theta`` is non-essential: a record
           holding only those scores below ``theta`` and cannot enter the top k.
        2. Scan only the essential terms' postings into partial scores (one pass).
        3. Keep the records whose partial score plus the non-essential bounds can
           still reach ``theta``.
        4. Score the survivors exactly: look each up in every query term's
           postings of its segment, adding in ascending term order (the
           reference's float32 operations and order).
        """
        from .partitions import slack, term_bounds

        snap = self.snap
        T = len(plan.terms)
        ub = np.full(T, -np.inf)
        total = 0
        for vi, seg, sel, starts, lens, _ in todo:
            ub[sel] = np.maximum(ub[sel], term_bounds(seg, plan.local_terms(vi, seg)[sel], plan, sel, snap))
            total += int(lens.sum())
        present = np.flatnonzero(ub > -np.inf)
        ubm = ub[present] * plan.mult[present]
        order = np.argsort(ubm, kind="stable")
        sl = 1.0 + slack(plan)
        c = float(plan.const)
        csum = np.cumsum(ubm[order]) * sl + c * sl
        n_ne = int(np.searchsorted(csum, theta, side="left"))
        while n_ne > 0 and not csum[n_ne - 1] < theta:
            n_ne -= 1
        if n_ne == 0:
            return None
        if n_ne == present.size:  # even every query term together stays below theta
            return Hits(), 0
        essential = np.zeros(T, dtype=bool)
        essential[present[order[n_ne:]]] = True
        rest = float(ubm[order[:n_ne]].sum())
        # 2. the essential postings, in one pass
        key, w, barr, base, read = self._gather(todo, plan, essential)
        if read * 2 > total:
            return None
        if key.size == 0:
            return Hits(), read
        acc, touched = _scratch(base)
        np.add.at(acc, key, w)  # partial sums in any order: only compared, with slack
        touched[key] = True
        cand = np.flatnonzero(touched[:base])
        partial = acc[cand]
        acc[cand] = 0.0
        touched[cand] = False
        # 3. survivors: those that can still reach theta
        cand = cand[(partial.astype(np.float64) + rest + c) * sl >= theta * (1.0 - slack(plan))]
        if cand.size == 0:
            return Hits(), read
        # 4. exact scores, segment by segment
        which = np.searchsorted(barr, cand, side="right") - 1
        parts = []
        for si in np.unique(which).tolist():
            vi, seg, sel, starts, lens, _ = todo[si]
            csr = seg.csr
            rows = (cand[which == si] - barr[si]).astype(np.int64)
            out = np.zeros(rows.size, dtype=np.float32)
            tids = np.flatnonzero(sel)
            lt = plan.local_terms(vi, seg)[sel]
            for i in range(lt.size):  # ascending term order
                j, t, s0, n = int(tids[i]), int(lt[i]), int(starts[i]), int(lens[i])
                plist = csr.doc_ids[s0: s0 + n]
                pos = np.minimum(np.searchsorted(plist, rows), n - 1)
                found = plist[pos] == rows
                read += int(rows.size)  # binary-search lookups
                if not found.any():
                    continue
                cached = snap._wcache.get((vi, t))
                if cached is not None:
                    wj = cached[pos[found]]
                else:
                    wj = plan.idf[j] * bm25.tfc(csr.tfs[s0 + pos[found]], csr.doc_lens[rows[found]], snap.avgdl,
                                                snap.params)
                    if plan.has_w0:
                        wj = wj - plan.w0[j]
                if plan.mult[j] != 1:
                    wj = wj * np.float32(plan.mult[j])
                out[found] += wj
            if plan.has_w0:
                out = out + plan.const
            parts.append(shortlist(seg, vi, rows, out, k))
        return top_k(parts, k), read


class ScorerEngine:
    """BM25 over segments through a backend's :class:`~gpuir.backends.base.Scorer` (see the module docstring)."""

    def __init__(self, snap: Snapshot, backend: str):
        self.snap = snap
        self.name = backend

    def _scorer(self, vi: int):
        snap, view = self.snap, self.snap.views[vi]

        def make():
            seg = view.seg
            rows = None
            if view.live is not None:  # purge tombstones: a scorer's statistics must cover its documents
                key = "purged"
                if key not in view.cache:
                    view.cache[key] = merge_segments([view], seg.uid, seg.partition, snap.terms)
                seg, rows = view.cache[key], view.live_rows()
            stats = CollectionStats(snap.n_docs, snap.df[seg.l2g], snap.avgdl)
            # One lock per scorer: the NumPy scorer reuses buffers across calls (issue 8 makes it
            # thread-safe; until then concurrent searches take turns on a segment's scorer).
            return seg, rows, make_scorer(self.name, seg.csr, snap.params, stats=stats), threading.Lock()

        return snap.cached(("scorer", self.name, vi), make)

    def scan(self, view_ids: tuple[int, ...], jobs: list[Job], k: int) -> dict[int, tuple[Hits, int]]:
        snap = self.snap
        parts: dict[int, list[Hits]] = {j.qi: [] for j in jobs}
        read = {j.qi: 0 for j in jobs}
        for vi in view_ids:
            view = snap.views[vi]
            todo = []
            for job in jobs:
                lids = job.plan.local_terms(vi, view.seg)
                sel = lids >= 0
                if not sel.any():
                    continue
                mask = None if job.where is None else job.where.mask(view, snap.dicts)
                if mask is not None and not mask.any():
                    continue
                todo.append((job, lids, sel, mask))
            if not todo:
                continue
            seg, rows, scorer, lock = self._scorer(vi)
            qs, allow, kept = [], [], []
            for job, _, _, mask in todo:
                lids = seg.local_terms(job.plan.gids)  # in the (possibly purged) scorer's segment
                sel = lids >= 0
                if not sel.any():
                    continue
                lt = lids[sel]
                qs.append(np.repeat(lt, job.plan.mult[sel]))
                if mask is None:
                    allow.append(None)
                else:
                    m = mask if rows is None else mask[rows]
                    allow.append(np.flatnonzero(m).astype(np.int64))
                read[job.qi] += int((seg.csr.offsets[lt + 1] - seg.csr.offsets[lt]).sum())
                kept.append((job, sel))
            if not kept:
                continue
            with lock:
                res = scorer.search(qs, k, None if all(a is None for a in allow) else allow)
            for i, (job, sel) in enumerate(kept):
                r = res.ids[i]
                ok = r >= 0
                local = r[ok]
                sc = res.scores[i][ok]
                p = job.plan
                if p.has_w0:  # the scorer added its own segment's absent-term sum: use the global one
                    c_local = (p.w0[sel] * p.mult[sel]).sum(dtype=np.float32)
                    sc = (sc.astype(np.float64) - float(c_local) + float(p.const)).astype(np.float32)
                orig = local if rows is None else rows[local]
                parts[job.qi].append(Hits(seg.seqs[local], sc, np.full(local.size, vi, np.int64),
                                          orig.astype(np.int64)))
        return {qi: (top_k(ps, k), read[qi]) for qi, ps in parts.items()}


def make_engine(snap: Snapshot, backend: str):
    """The engine for a concrete backend name ("numpy" -> :class:`CpuEngine`)."""
    return CpuEngine(snap) if backend == "numpy" else ScorerEngine(snap, backend)


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
