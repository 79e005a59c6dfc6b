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
from .segments import merge_segments
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

    @property
    def empty(self) -> bool:
        return not self.terms


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
    neg = -h.scores
    sel = None
    if neg.size > k:
        th = np.partition(neg, k - 1)[k - 1]
        sel = np.flatnonzero(neg <= th)
        neg = neg[sel]
    seqs = h.seqs if sel is None else h.seqs[sel]
    order = np.lexsort((seqs, neg))[:k]
    if sel is not None:
        order = sel[order]
    return Hits(h.seqs[order], h.scores[order], h.vidx[order], h.rows[order])


# --------------------------------------------------------------------------- engines


@dataclass
class Job:
    """One query's work on one partition: its plan, filter and output slot."""

    qi: int
    plan: QueryPlan
    where: Where | None


class CpuEngine:
    """Exact BM25 over segments with NumPy, weighting only the postings it reads."""

    name = "numpy"

    def __init__(self, snap: Snapshot):
        self.snap = snap

    def scan(self, view_ids: tuple[int, ...], jobs: list[Job], k: int) -> dict[int, tuple[Hits, int]]:
        """Top-k of each job over the segments ``view_ids``; returns qi -> (hits, postings read)."""
        out = {}
        for job in jobs:
            parts, read = [], 0
            for vi in view_ids:
                h, r = self.segment_topk(vi, job.plan, job.where, k)
                parts.append(h)
                read += r
            out[job.qi] = (top_k(parts, k), read)
        return out

    def segment_topk(self, vi: int, plan: QueryPlan, where: Where | None, k: int) -> tuple[Hits, int]:
        snap = self.snap
        view = snap.views[vi]
        seg = view.seg
        csr = seg.csr
        lids = seg.local_terms(plan.gids)
        sel = lids >= 0
        if not sel.any():
            return Hits(), 0
        mask = view.live if where is None else where.mask(view, snap.dicts)
        if mask is not None and not mask.any():
            return Hits(), 0
        lt = lids[sel]
        starts = csr.offsets[lt]
        lens = csr.offsets[lt + 1] - starts
        total = int(lens.sum())
        ends = np.cumsum(lens)
        idx = np.repeat(starts - (ends - lens), lens) + np.arange(total, dtype=np.int64)
        d = csr.doc_ids[idx]
        tix = np.repeat(np.arange(lt.size, dtype=np.int64), lens)
        if mask is not None:
            keep = mask[d]
            d, idx, tix = d[keep], idx[keep], tix[keep]
            if d.size == 0:
                return Hits(), total
        # the reference's float32 operations, posting by posting (see the module docstring)
        w = plan.idf[sel][tix] * bm25.tfc(csr.tfs[idx], csr.doc_lens[d], snap.avgdl, snap.params)
        if plan.has_w0:
            w = w - plan.w0[sel][tix]
        m = plan.mult[sel]
        if np.any(m != 1):
            w = w * m.astype(np.float32)[tix]
        w = w.astype(np.float32, copy=False)
        n = seg.n_docs
        if d.size * 16 < n:  # few postings: a compact accumulator
            cand, inv = np.unique(d, return_inverse=True)
            acc = np.zeros(cand.size, dtype=np.float32)
            np.add.at(acc, inv, w)  # per document, in ascending term order
            scores = acc
        else:
            acc = np.zeros(n, dtype=np.float32)
            np.add.at(acc, d, w)
            touched = np.zeros(n, dtype=bool)
            touched[d] = True
            cand = np.flatnonzero(touched)
            scores = acc[cand]
        if plan.has_w0:
            scores = scores + plan.const
        rows = cand.astype(np.int64)
        h = top_k([Hits(seg.seqs[rows], scores, np.full(rows.size, vi, np.int64), rows)], k)
        return h, total


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
                lids = view.seg.local_terms(job.plan.gids)
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
        """Query ``i``'s hits, best first: dicts with ``id``, ``score``, ``text`` and the record's fields."""
        ok = self.seqs[i] >= 0
        out = []
        for v, r, s in zip(self.vidx[i][ok].tolist(), self.rows[i][ok].tolist(), self.scores[i][ok].tolist()):
            rec = self.snapshot.record(v, r)
            out.append({"id": rec.pop("id"), "score": float(s), **rec})
        return out
