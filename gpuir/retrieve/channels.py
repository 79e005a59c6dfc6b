"""Channels: each returns the top ``depth`` candidates of every query as :class:`~gpuir.results.SearchResults`.

Candidates are numbered so that fusion can compare them across channels:
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
* ``dense``: cosine of the query and record embeddings, exact, top ``depth``.
* ``late``: the cosines of all allowed records pooled per session, top ``depth`` sessions.
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

from typing import Any

import numpy as np

from ..dense.late_interaction import segment_reduce_numpy
from ..results import SearchResults, padded_arrays
from ..topk import topk_pairs
from .catalog import Catalog
from .config import ChannelConfig
from .wheres import and_where, row_where

__all__ = ["entity_channel", "pool_rows", "run_channel", "temporal_channel"]


def _sorted_rows(nums: list[np.ndarray], scores: list[np.ndarray], depth: int) -> SearchResults:
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
    return _sorted_rows(nums, vals, depth)


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


def temporal_channel(ch: ChannelConfig, catalog: Catalog, snap, queries: list[str], where: Any, backend: str,
                     windows: list[Any]) -> SearchResults:
    """The ``temporal`` channel (module docstring).

    Parameters
    ----------
    windows : list of B (TimeWindow or None)
        Each query's parsed window (None: the query gets an empty row).

    Returns
    -------
    SearchResults over record sequence numbers, (B, <= depth); BM25 hits first
    (score desc, number asc), then the rest of the window by time desc, number asc, score 0.
    """
    B = len(queries)
    keep = [i for i in range(B) if windows[i] is not None and row_where(where, i) is not False]
    nums = [np.zeros(0, np.int64) for _ in range(B)]
    vals = [np.zeros(0, np.float32) for _ in range(B)]
    if keep:
        wk = [and_where(row_where(where, i), windows[i].where()) for i in keep]
        records = catalog.records
        r = records.search([queries[i] for i in keep], k=ch.depth, where=wk, backend=backend,
                           snapshot=snap if records is catalog.memory else None)
        seqs = catalog.record_seqs(r)
        scores = r.scores.astype(np.float32)
        allowed = catalog.allowed_seqs(snap, wk, len(keep))
        for j, i in enumerate(keep):
            ok = seqs[j] >= 0
            hit, hs = seqs[j][ok], scores[j][ok]
            a = allowed[j] if allowed[j] is not None else np.zeros(0, np.int64)
            rest = a[~np.isin(a, hit)]
            rest = rest[np.lexsort((rest, -catalog.time_of_seq[rest].astype(np.float64)))]
            nums[i] = np.concatenate([hit, rest]).astype(np.int64)
            vals[i] = np.concatenate([hs, np.zeros(rest.size, np.float32)])
    return _rows(nums, vals, ch.depth)


def entity_channel(ch: ChannelConfig, catalog: Catalog, snap, queries: list[str], where: Any, graph: Any,
                   applies: np.ndarray) -> SearchResults:
    """The ``entity`` channel: :meth:`EntityGraph.score` of each query it ``applies`` to (bool (B,))."""
    if graph is None:
        raise ValueError("channel entity needs the retriever's entity graph")
    B = len(queries)
    allowed = catalog.allowed_seqs(snap, where, B) if where is not None else [None] * B
    nums = [np.zeros(0, np.int64) for _ in range(B)]
    vals = [np.zeros(0, np.float32) for _ in range(B)]
    for i in np.flatnonzero(applies).tolist():
        if row_where(where, i) is False:
            continue
        hops = 3 if graph.is_multi_hop(queries[i]) else 2
        seqs, sc = graph.score(queries[i], allowed=allowed[i], max_hops=hops, depth=ch.depth)
        seqs = np.asarray(seqs, np.int64)
        sc = np.asarray(sc, np.float32)
        live = (seqs >= 0) & (seqs < catalog.seq_session.size)
        live[live] = catalog.seq_session[seqs[live]] >= 0  # records the catalog still holds
        nums[i], vals[i] = seqs[live], sc[live]
    return _sorted_rows(nums, vals, ch.depth)


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


def run_channel(ch: ChannelConfig, catalog: Catalog, snap, queries: list[str], where: Any, backend: str,
                qvecs: np.ndarray | None = None, embeddings: Any = None, *, windows: list[Any] | None = None,
                graph: Any = None, applies: np.ndarray | None = None) -> tuple[SearchResults, Any]:
    """Run one channel, then drop its candidates below ``ch.min_score`` (see :func:`_run_channel`)."""
    res, extra = _run_channel(ch, catalog, snap, queries, where, backend, qvecs, embeddings, windows=windows,
                              graph=graph, applies=applies)
    return drop_below(res, ch.min_score), extra


def _run_channel(ch: ChannelConfig, catalog: Catalog, snap, queries: list[str], where: Any, backend: str,
                 qvecs: np.ndarray | None = None, embeddings: Any = None, *, windows: list[Any] | None = None,
                 graph: Any = None, applies: np.ndarray | None = None) -> tuple[SearchResults, Any]:
    """Run one channel.

    Parameters
    ----------
    windows : list of B (TimeWindow or None), optional
        ``temporal``: each query's window.
    graph : EntityGraph, optional
        ``entity``: the retriever's graph.
    applies : ndarray, shape (B,), bool, optional
        ``entity``: the queries the channel runs for (default all).

    Returns
    -------
    (SearchResults, extra): ``extra`` is the record-level MemoryResults of
    ``bm25`` / ``bm25_pool`` (for the best records of session hits), else None.
    """
    if ch.kind == "temporal":
        return temporal_channel(ch, catalog, snap, queries, where, backend,
                                windows if windows is not None else [None] * len(queries)), None
    if ch.kind == "entity":
        ap = np.ones(len(queries), bool) if applies is None else np.asarray(applies, bool)
        return entity_channel(ch, catalog, snap, queries, where, graph, ap), None
    if ch.kind in ("bm25", "bm25_pool"):
        records = catalog.records
        r = records.search(queries, k=ch.depth, where=where, backend=backend,
                           snapshot=snap if records is catalog.memory else None)
        seqs = catalog.record_seqs(r)
        if ch.kind == "bm25":
            return SearchResults(seqs, r.scores.astype(np.float32)), r
        sess = np.where(seqs >= 0, catalog.seq_session[np.maximum(seqs, 0)], -1)
        return pool_rows(sess, r.scores, ch.pooling, ch.pool_k, ch.lse_beta, ch.depth), r
    if ch.kind == "bm25_session":
        sw = catalog.session_wheres(snap, where, len(queries))
        seqs, scores, r = _search_memory(catalog.sessions, queries, ch.depth, sw, backend)
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
                nums[i, : len(names)] = [catalog.session_num[s] for s in names]
        return SearchResults(nums, scores.astype(np.float32)), None
    if ch.kind in ("dense", "late"):
        if qvecs is None or embeddings is None:
            raise ValueError(f"channel {ch.kind} needs query vectors and record embeddings")
        allowed = catalog.allowed_seqs(snap, where, len(queries))
        all_seqs = np.array(sorted(catalog.id_of_seq), dtype=np.int64)
        nums, vals = [], []
        for i, a in enumerate(allowed):
            seqs = all_seqs if a is None else a
            if seqs.size == 0:
                nums.append(np.zeros(0, np.int64))
                vals.append(np.zeros(0, np.float32))
                continue
            rows = embeddings.rows([catalog.id_of_seq[int(s)] for s in seqs])
            sims = (embeddings.vecs[rows] @ qvecs[i]).astype(np.float32)
            if ch.kind == "dense":
                nums.append(seqs)
                vals.append(sims)
            else:
                sess = catalog.seq_session[seqs]
                pr = pool_rows(sess[None, :], sims[None, :], ch.pooling, ch.pool_k, ch.lse_beta, ch.depth)
                ok = pr.ids[0] >= 0
                nums.append(pr.ids[0][ok])
                vals.append(pr.scores[0][ok])
        return _sorted_rows(nums, vals, ch.depth), None
    raise ValueError(f"unknown channel kind {ch.kind!r}")  # pragma: no cover - config validates
