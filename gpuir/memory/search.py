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

**One contract.** Every segment search goes through the segment-set contract
(:mod:`gpuir.backends.contract`): :class:`SnapshotSearch` hands the engine that
serves the backend (:func:`gpuir.backends.engine_for`: "numpy", the reference;
"numba", every segment in one compiled call; "cupy") the snapshot -- its views,
N, df and avgdl -- and a :class:`~gpuir.backends.contract.QueryBatch`: each
query's terms as global codes with their idf, ``w0`` and ``C`` under the
snapshot's statistics (weighed once per snapshot and term, :func:`plan_queries`),
its bound ``theta`` (the k-th best score already held, from newer partitions),
and a ``where`` as an allow-list per segment. The engine returns the merged top
k (score descending, then sequence number ascending); what it keeps per segment
(scorers, layouts, device copies) lives in the segment's ``cache`` for the
segment's lifetime, never re-weighted or re-uploaded when later adds change the
statistics.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import bm25
from ..backends import contract, engine_for
from ..backends.contract import has_absent_weight, term_weights
from ..topk import topk_order
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
    params = snap.params
    if has_absent_weight(params):
        idf, w0 = term_weights(df[ok], snap.n_docs, params)
        w0_list = w0.tolist()
    else:  # (w0 is read only by bm25l / bm25+: zeros, without computing idf * tfc(0))
        idf = bm25.idf(df[ok], snap.n_docs, params.method).astype(np.float32)
        w0_list = [0.0] * idf.size
    it = iter(zip(gids[ok].tolist(), idf.tolist(), w0_list))
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


class SnapshotSearch:
    """A snapshot searched through one engine of the contract (:mod:`gpuir.backends.contract`).

    Turns the memory's query plans, ``where`` filters and bounds into the
    contract's :class:`~gpuir.backends.contract.QueryBatch` (a ``where`` as an
    allow-list per segment, :meth:`gpuir.memory.where.Where.rows`, evaluated once
    per distinct filter and segment) and the engine's merged top k back into
    :class:`Hits`. Which engine serves a backend name is the contract's routing
    (:func:`gpuir.backends.engine_for`). Keeps no state, so any number of
    threads may search at once.
    """

    def __init__(self, snap: Snapshot, backend: str):
        self.snap = snap
        self.name = backend
        self.engine = engine_for(backend)

    def _batch(self, view_ids: tuple[int, ...], plans: list[QueryPlan], wheres: list[Where | None] | None,
               thetas: list[float] | None) -> contract.QueryBatch:
        B = len(plans)
        if B == 1:
            p = plans[0]
            off = np.array([0, len(p.terms)], np.int64)
            gids, mult, idf, w0 = p.gids, p.mult, p.idf, p.w0
            const = np.array([p.const], np.float32)
        else:
            off = np.zeros(B + 1, np.int64)
            np.cumsum(np.fromiter((len(p.terms) for p in plans), np.int64, B), out=off[1:])
            gids = np.concatenate([p.gids for p in plans]).astype(np.int64, copy=False)
            mult = np.concatenate([p.mult for p in plans]).astype(np.int64, copy=False)
            idf = np.concatenate([p.idf for p in plans]).astype(np.float32, copy=False)
            w0 = np.concatenate([p.w0 for p in plans]).astype(np.float32, copy=False)
            const = np.array([p.const for p in plans], np.float32)
        theta = np.full(B, -np.inf) if thetas is None else np.array(thetas, np.float64)
        allow = None
        if wheres is not None and any(w is not None for w in wheres):
            snap, seen = self.snap, {}
            allow = []
            for w in wheres:
                if w is None:
                    allow.append(None)
                    continue
                got = seen.get(id(w))
                if got is None:
                    got = seen[id(w)] = [w.rows(snap.views[vi], snap.dicts) for vi in view_ids]
                allow.append(got)
        return contract.QueryBatch(off, gids, mult, idf, w0, const, bool(plans[0].has_w0), theta, allow)

    def scan(self, view_ids: tuple[int, ...], jobs: list[Job], k: int) -> dict[int, tuple[Hits, int]]:
        """Top-k of each job over the segments ``view_ids``; returns qi -> (hits, postings read)."""
        if not jobs:
            return {}
        batch = self._batch(view_ids, [j.plan for j in jobs], [j.where for j in jobs], [j.theta for j in jobs])
        got = self.engine.search(self.snap, view_ids, batch, k)
        out = {}
        for i, job in enumerate(jobs):
            m = int(np.count_nonzero(got.seqs[i] >= 0))
            h = Hits(got.seqs[i, :m], got.scores[i, :m], got.views[i, :m], got.rows[i, :m]) if m else Hits()
            out[job.qi] = (h, int(got.postings[i]))
        return out

    def search_all(self, view_ids: tuple[int, ...], plans: list[QueryPlan], k: int) -> contract.SegmentHits:
        """Every plan over the segments ``view_ids``, no filter, as the engine's arrays (no per-query
        objects on the way)."""
        return self.engine.search(self.snap, view_ids, self._batch(view_ids, plans, None, None), k)


def make_engine(snap: Snapshot, backend: str) -> SnapshotSearch:
    """The snapshot's search through the engine serving a concrete backend name ("numpy", "numba", "cupy")."""
    return SnapshotSearch(snap, backend)


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
        recs = self.snapshot.records(self.vidx[i][ok].tolist(), self.rows[i][ok].tolist())
        out = []
        for rec, s in zip(recs, self.scores[i][ok].tolist()):
            rec = public_record(rec)
            out.append({"id": rec.pop("id"), "score": float(s), **rec})
        return out
