"""Channels: each returns the top ``depth`` candidates of every query as :class:`~gpuir.results.SearchResults`.

Each built-in kind is a channel class registered in
:mod:`gpuir.retrieve.registry` (at the end of this module), exactly as a
third-party channel is. Candidates are numbered so that fusion can compare them across channels:
record channels (``bm25``, ``dense``) return record **sequence numbers** (the
memory's add order, which is also its tie order), session channels
(``bm25_session``, ``bm25_pool``, ``late``) return **session numbers** of the
:class:`~gpuir.retrieve.catalog.Catalog` (order of first appearance). Every
channel applies the same ``where`` (:mod:`gpuir.memory.where`); padding is -1 /
-inf and rows follow the tie rule (higher score, then lower number).

* ``bm25``: :meth:`Memory.search` at ``depth`` (of the catalog's record index when the
  configuration's analyzer is not the memory's).
* ``bm25_session``: BM25 over session documents (a session's records as one text).
* ``bm25_pool``: record BM25 at ``depth``, pooled per session (max, top-``pool_k``
  mean, log-sum-exp with ``lse_beta``) by :func:`gpuir.dense.segment_reduce_numpy`.
  With ``depth`` at least the number of matching records, pooling is exact.
* ``dense``: cosine of the query's vector and the records' vectors stored in the memory
  (:meth:`Memory.search_vectors`, exact), top ``depth``.
* ``late``: late interaction over sessions: the cosines of all allowed records (their stored
  vectors) pooled per session, top ``depth`` sessions (:mod:`gpuir.retrieve.dense_channels`).
* ``temporal``: the records inside the query's parsed time window
  (:func:`gpuir.retrieve.temporal.parse_time_window`, AND-ed with ``where``): first
  those BM25 scores (by their BM25 score), then the other records of the window,
  newest first, with score 0. A query without a window gets an empty row (the
  channel is skipped for it).
* ``entity``: :meth:`gpuir.retrieve.entity_graph.EntityGraph.score` over the records
  ``where`` allows (hop scores 1.0 / 0.6 / 0.35 / 0.15; at most 2 hops, 3 when
  the graph calls the query multi-hop). A query without a known entity gets an
  empty row.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..dense.late_interaction import segment_reduce_numpy
from ..results import SearchResults, padded_arrays
from ..topk import topk_pairs
from .dense_channels import MemoryEmbedding, as_results, search_records
from .entity_graph import EntityGraph
from .registry import Change, Channel, ChannelContext, ChannelRequest, register_channel
from .wheres import and_where, row_where

__all__ = [
    "BM25Channel",
    "BM25PoolChannel",
    "BM25SessionChannel",
    "DenseChannel",
    "EntityChannel",
    "EntityGraphResource",
    "LateChannel",
    "MemoryEmbedding",
    "TemporalChannel",
    "drop_below",
    "pool_rows",
    "ranked_rows",
    "sorted_rows",
]


def sorted_rows(nums: list[np.ndarray], scores: list[np.ndarray], depth: int) -> SearchResults:
    """Rows of (number, score) pairs, each sorted by score desc then number asc, cut at ``depth``."""
    width = max([min(depth, n.size) for n in nums] + [1])
    ids, sc = padded_arrays(len(nums), width)
    for i, (n, s) in enumerate(zip(nums, scores)):
        if n.size == 0:
            continue
        n2, s2 = topk_pairs(n, s, width)
        ids[i, : n2.size] = n2
        sc[i, : s2.size] = s2
    return SearchResults(ids, sc)


def pool_rows(sessions: np.ndarray, scores: np.ndarray, op: str, pool_k: int, beta: float,
              depth: int) -> SearchResults:
    """Pool record scores to sessions, row by row.

    Parameters
    ----------
    sessions : ndarray, shape (B, D), int64
        Session number of each record hit (-1: padding).
    scores : ndarray, shape (B, D), float32
    op : {"max", "topk", "lse"}
    pool_k, beta : topk size and lse temperature.
    depth : int
        Sessions kept per row.

    Returns
    -------
    SearchResults over session numbers, (B, <= depth).
    """
    nums, vals = [], []
    for srow, vrow in zip(sessions, scores):
        ok = srow >= 0
        s, v = srow[ok], vrow[ok]
        if s.size == 0:
            nums.append(np.zeros(0, np.int64))
            vals.append(np.zeros(0, np.float32))
            continue
        order = np.argsort(s, kind="stable")
        s, v = s[order], v[order]
        uniq, starts = np.unique(s, return_index=True)
        offsets = np.append(starts, s.size).astype(np.int64)
        pooled = segment_reduce_numpy(v[None, :].astype(np.float64), offsets, op, pool_k=pool_k, beta=beta)[0]
        nums.append(uniq.astype(np.int64))
        vals.append(pooled.astype(np.float32))
    return sorted_rows(nums, vals, depth)


def _search_memory(memory, queries: list[str], depth: int, where: Any, backend: str):
    """``memory.search`` where a per-query ``where`` of False means "no candidates"."""
    if isinstance(where, list) and any(w is False for w in where):
        keep = [i for i, w in enumerate(where) if w is not False]
        seqs = np.full((len(queries), depth), -1, np.int64)
        scores = np.full((len(queries), depth), -np.inf, np.float32)
        if keep:
            r = memory.search([queries[i] for i in keep], k=depth, where=[where[i] for i in keep], backend=backend)
            w = r.seqs.shape[1]  # min(depth, live records): the memory clamps k
            seqs[keep, :w], scores[keep, :w] = r.seqs, r.scores
            return seqs, scores, r
        return seqs, scores, None
    r = memory.search(queries, k=depth, where=where, backend=backend)
    seqs = np.full((len(queries), depth), -1, np.int64)
    scores = np.full((len(queries), depth), -np.inf, np.float32)
    w = r.seqs.shape[1]
    seqs[:, :w], scores[:, :w] = r.seqs, r.scores
    return seqs, scores, r


def _rows(nums: list[np.ndarray], scores: list[np.ndarray], depth: int) -> SearchResults:
    """Rows already in their final order, cut at ``depth`` and padded."""
    width = max([min(depth, n.size) for n in nums] + [1])
    ids, sc = padded_arrays(len(nums), width)
    for i, (n, v) in enumerate(zip(nums, scores)):
        m = min(width, n.size)
        ids[i, :m], sc[i, :m] = n[:m], v[:m]
    return SearchResults(ids, sc)


def drop_below(res: SearchResults, min_score: float | None) -> SearchResults:
    """``res`` without the candidates scoring below ``min_score`` (each row keeps its order, padded at the end)."""
    if min_score is None:
        return res
    ok = (res.ids >= 0) & (res.scores.astype(np.float64) >= min_score)
    if ok[res.ids >= 0].all():
        return res
    ids, sc = padded_arrays(res.ids.shape[0], res.ids.shape[1])
    for i in range(res.ids.shape[0]):
        keep = np.flatnonzero(ok[i])
        ids[i, : keep.size], sc[i, : keep.size] = res.ids[i, keep], res.scores[i, keep]
    return SearchResults(ids, sc)


def ranked_rows(rows: Any, unit: str, catalog: Any, allowed: list[np.ndarray | None], depth: int) -> SearchResults:
    """B lists of ``(id, score)`` pairs (a plug-in channel's answer) as numbered, ordered rows.

    Ids the catalog does not hold, and records (sessions: sessions without a record)
    outside ``allowed``, are dropped; each row is ordered by score descending, then
    number ascending, and cut at ``depth``.

    Parameters
    ----------
    rows : sequence of B sequences of (str, float)
    unit : {"record", "session"}
    allowed : list of B (ndarray of allowed record sequence numbers, or None: all)

    Returns
    -------
    SearchResults over record sequence numbers or session numbers, (B, <= depth).
    """
    rows = list(rows)
    if len(rows) != len(allowed):
        raise ValueError(f"a channel returned {len(rows)} ranked lists for {len(allowed)} queries")
    nums, vals = [], []
    for row, a in zip(rows, allowed):
        got: dict[int, float] = {}
        pairs = [(key, score) for key, score in row]
        for n, (_, score) in zip(catalog.numbers([key for key, _ in pairs], unit), pairs):
            if n is None:
                continue
            got[n] = max(float(score), got.get(n, -np.inf))
        n_arr = np.fromiter(got, np.int64, len(got))
        v_arr = np.fromiter(got.values(), np.float32, len(got))
        if a is not None and n_arr.size:
            ok_nums = a if unit == "record" else np.unique(catalog.seq_session[a])
            keep = np.isin(n_arr, ok_nums)
            n_arr, v_arr = n_arr[keep], v_arr[keep]
        ok = np.isfinite(v_arr)
        nums.append(n_arr[ok])
        vals.append(v_arr[ok])
    return sorted_rows(nums, vals, depth)


def _record_bm25(catalog, snap, queries: list[str], depth: int, where: Any, backend: str):
    """Record BM25 of the catalog's record index; (memory sequence numbers (B, depth), MemoryResults)."""
    records = catalog.records
    r = records.search(queries, k=depth, where=where, backend=backend,
                       snapshot=snap if records is catalog.memory else None)
    return catalog.record_seqs(r), r


# ---------------------------------------------------------------------------- shared resources


class EntityGraphResource:
    """The entity graph of the ``entity`` channels, kept in step with the catalog.

    Only added / removed records are touched on a sync; saved as ``entity_graph/``
    and ``entity_graph_seqs.json`` (the sequence numbers it holds) in the retriever's folder.
    """

    def __init__(self):
        self.graph = EntityGraph()
        self.seqs: set[int] = set()

    def sync(self, change: Change) -> None:
        cat, g, snap = change.catalog, self.graph, change.snapshot
        gone = [s for s in change.removed_seqs if s in self.seqs]
        if len(self.seqs) > len(snap) + len(gone):  # after open: records deleted meanwhile
            held = np.asarray(sorted(self.seqs - set(gone)), dtype=np.int64)
            gone += held[~cat.holds(held)].tolist()
        if gone:
            g.remove(np.asarray(gone, dtype=np.int64))
            self.seqs.difference_update(gone)
        new = [s for s in change.added_seqs if s not in self.seqs]
        if new:
            seqs = np.asarray(new, dtype=np.int64)
            g.add(seqs, snap.strings("text", seqs), cat.speakers(snap, seqs))  # the memory's own columns
            self.seqs.update(new)

    def save(self, folder) -> None:
        self.graph.save(folder / "entity_graph")
        (folder / "entity_graph_seqs.json").write_text(json.dumps(sorted(self.seqs)), encoding="utf-8")

    def open(self, folder) -> None:
        if (folder / "entity_graph").exists():
            self.graph = EntityGraph.load(folder / "entity_graph")
            held = folder / "entity_graph_seqs.json"
            self.seqs = set(json.loads(held.read_text(encoding="utf-8"))) if held.exists() else set()


# ---------------------------------------------------------------------------- built-in channels


class BM25Channel(Channel):
    """``bm25``: :meth:`Memory.search` at ``depth`` (of the catalog's record index with another analyzer)."""

    unit = "record"

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        seqs, r = _record_bm25(request.catalog, request.snapshot, queries, k, where, request.backend)
        request.offer_records(self, r)
        return SearchResults(seqs, r.scores.astype(np.float32))


class BM25PoolChannel(Channel):
    """``bm25_pool``: record BM25 at ``depth``, pooled per session (max / topk mean / lse)."""

    unit = "session"

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        ch, cat = self.config, request.catalog
        seqs, r = _record_bm25(cat, request.snapshot, queries, k, where, request.backend)
        request.offer_records(self, r)
        sess = np.where(seqs >= 0, cat.seq_session[np.maximum(seqs, 0)], -1)
        return pool_rows(sess, r.scores, ch.pooling, ch.pool_k, ch.lse_beta, k)


class BM25SessionChannel(Channel):
    """``bm25_session``: BM25 over session documents (a session's records as one text)."""

    unit = "session"

    def __init__(self, config, context: ChannelContext):
        super().__init__(config, context)
        context.catalog.keep_sessions()

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        cat = request.catalog
        sw = cat.session_wheres(request.snapshot, where, len(queries))
        seqs, scores, r = _search_memory(cat.sessions, queries, k, sw, request.backend)
        # session-memory record ids are session ids: map to session numbers
        nums = np.full(seqs.shape, -1, np.int64)
        if r is not None:
            rows = np.flatnonzero((seqs >= 0).any(axis=1))
            ids_by_row = {}
            if isinstance(sw, list) and any(w is False for w in sw):
                keep = [i for i, w in enumerate(sw) if w is not False]
                for j, i in enumerate(keep):
                    ids_by_row[i] = r.ids(j)
            else:
                for i in rows.tolist():
                    ids_by_row[i] = r.ids(i)
            for i, names in ids_by_row.items():
                nums[i, : len(names)] = [cat.session_num[s] for s in names]
        return SearchResults(nums, scores.astype(np.float32))


class DenseChannel(Channel):
    """``dense``: the top ``depth`` records by cosine with their vectors stored in the memory (exact;
    :mod:`gpuir.retrieve.dense_channels`)."""

    unit = "record"
    needs_encoder = True

    def __init__(self, config, context: ChannelContext):
        super().__init__(config, context)
        self.embedding = context.resource("embeddings", lambda: MemoryEmbedding(context))

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        rows = search_records(self.context, self.embedding.name, request, where, len(queries), lambda i: k)
        return as_results(rows, k)


class LateChannel(DenseChannel):
    """``late``: late interaction over sessions -- a session's records' stored vectors are its multi-vector
    representation, its score pools the query's cosine with each of them (max / top-k mean / lse), every
    allowed record scored; top ``depth`` sessions."""

    unit = "session"

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        ch, cat = self.config, request.catalog
        allowed = cat.allowed_seqs(request.snapshot, where, len(queries))
        n_all = request.snapshot.n_docs
        rows = search_records(self.context, self.embedding.name, request, where, len(queries),
                              lambda i: n_all if allowed[i] is None else allowed[i].size)
        nums, vals = [], []
        for seqs, sims in rows:
            if seqs.size == 0:
                nums.append(np.zeros(0, np.int64))
                vals.append(np.zeros(0, np.float32))
                continue
            sess = cat.seq_session[seqs]
            pr = pool_rows(sess[None, :], sims[None, :], ch.pooling, ch.pool_k, ch.lse_beta, k)
            ok = pr.ids[0] >= 0
            nums.append(pr.ids[0][ok])
            vals.append(pr.scores[0][ok])
        return sorted_rows(nums, vals, k)


class TemporalChannel(Channel):
    """``temporal`` (module docstring): BM25 hits inside the query's window first, then the window newest first.

    Returns SearchResults over record sequence numbers, (B, <= depth); BM25 hits
    first (score desc, number asc), then the rest of the window by time desc, number
    asc, score 0. A query without a window gets an empty row (the optimiser skips it).
    """

    unit = "record"
    needs_windows = True

    def applies(self, request: ChannelRequest) -> np.ndarray:
        return np.array([w is not None for w in request.windows], bool)

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        cat, snap, windows = request.catalog, request.snapshot, request.windows
        B = len(queries)
        keep = [i for i in range(B) if windows[i] is not None and row_where(where, i) is not False]
        nums = [np.zeros(0, np.int64) for _ in range(B)]
        vals = [np.zeros(0, np.float32) for _ in range(B)]
        if keep:
            wk = [and_where(row_where(where, i), windows[i].where()) for i in keep]
            seqs, r = _record_bm25(cat, snap, [queries[i] for i in keep], k, wk, request.backend)
            scores = r.scores.astype(np.float32)
            allowed = cat.allowed_seqs(snap, wk, len(keep))
            for j, i in enumerate(keep):
                ok = seqs[j] >= 0
                hit, hs = seqs[j][ok], scores[j][ok]
                a = allowed[j] if allowed[j] is not None else np.zeros(0, np.int64)
                rest = a[~np.isin(a, hit)]
                rest = rest[np.lexsort((rest, -snap.times(rest).astype(np.float64)))]
                nums[i] = np.concatenate([hit, rest]).astype(np.int64)
                vals[i] = np.concatenate([hs, np.zeros(rest.size, np.float32)])
        return _rows(nums, vals, k)


class EntityChannel(Channel):
    """``entity``: :meth:`EntityGraph.score` of each query naming an entity the graph knows."""

    unit = "record"

    def __init__(self, config, context: ChannelContext):
        super().__init__(config, context)
        self.state = context.resource("entity_graph", EntityGraphResource)

    @property
    def graph(self) -> EntityGraph:
        return self.state.graph

    def applies(self, request: ChannelRequest) -> np.ndarray:
        known = request.cache.get("entity_known")
        if known is None:
            known = request.cache["entity_known"] = np.array(
                [bool(self.graph.query_entities(q)) for q in request.queries], bool)
        return known

    def search(self, queries, k, where, at, request: ChannelRequest) -> SearchResults:
        cat, graph = request.catalog, self.graph
        B = len(queries)
        allowed = cat.allowed_seqs(request.snapshot, where, B) if where is not None else [None] * B
        nums = [np.zeros(0, np.int64) for _ in range(B)]
        vals = [np.zeros(0, np.float32) for _ in range(B)]
        known = self.applies(request)
        for i in range(B):
            if row_where(where, i) is False or not known[i]:
                continue
            hops = 3 if graph.is_multi_hop(queries[i]) else 2
            seqs, sc = graph.score(queries[i], allowed=allowed[i], max_hops=hops, depth=k)
            seqs = np.asarray(seqs, np.int64)
            sc = np.asarray(sc, np.float32)
            live = cat.holds(seqs)  # live records of the snapshot
            nums[i], vals[i] = seqs[live], sc[live]
        return sorted_rows(nums, vals, k)


register_channel("bm25", BM25Channel)
register_channel("bm25_session", BM25SessionChannel)
register_channel("bm25_pool", BM25PoolChannel)
register_channel("dense", DenseChannel)
register_channel("late", LateChannel)
register_channel("temporal", TemporalChannel)
register_channel("entity", EntityChannel)
