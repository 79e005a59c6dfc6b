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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dense.late_interaction import segment_reduce_numpy
from ..results import SearchResults, padded_arrays
from .catalog import Catalog
from .config import ChannelConfig

__all__ = ["pool_rows", "run_channel"]


def _sorted_rows(nums: list[np.ndarray], scores: list[np.ndarray], depth: int) -> SearchResults:
    """Rows of (number, score) pairs, each sorted by score desc then number asc, cut at ``depth``."""
    width = max([min(depth, n.size) for n in nums] + [1])
    ids, sc = padded_arrays(len(nums), width)
    for i, (n, s) in enumerate(zip(nums, scores)):
        if n.size == 0:
            continue
        order = np.lexsort((n, -s.astype(np.float64)))[:width]
        ids[i, : order.size] = n[order]
        sc[i, : order.size] = s[order]
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
        pooled = segment_reduce_numpy(v[None, :].astype(np.float64), offsets, op, k=pool_k, beta=beta)[0]
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
            seqs[keep], scores[keep] = r.seqs, r.scores
            return seqs, scores, r
        return seqs, scores, None
    r = memory.search(queries, k=depth, where=where, backend=backend)
    return r.seqs, r.scores, r


def run_channel(ch: ChannelConfig, catalog: Catalog, snap, queries: list[str], where: Any, backend: str,
                qvecs: np.ndarray | None = None, embeddings: Any = None) -> tuple[SearchResults, Any]:
    """Run one channel.

    Returns
    -------
    (SearchResults, extra): ``extra`` is the record-level MemoryResults of
    ``bm25`` / ``bm25_pool`` (for the best records of session hits), else None.
    """
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
