"""The generic engine of the segment-set contract: one scorer call per segment (:mod:`gpuir.backends.contract`).

:class:`PerSegmentEngine` serves the contract through any backend's
:class:`~gpuir.backends.base.Scorer`: one scorer per sealed segment and backend
(:func:`segment_scorer`, made on the segment's first search and kept in its
``cache`` for its lifetime: a segment is laid out -- or uploaded -- once), one
call per segment for every query holding a term there, the segments' top k
merged under the tie rule (score descending, then sequence number ascending).
Segments are searched largest first; a scorer that takes ``theta`` gets each
query's k-th best score so far (from its bound and the segments before), below
which nothing is wanted.

It is the NumPy reference (``"numpy"``), the CuPy engine until a one-pass device
engine is registered (``"cupy"``), and the per-segment compiled path the tests
compare with the one-call engine (``"numba-each"``). ``weighted=True`` hands each
scorer the batch already weighed (``search_weighted``: the query's local ids,
idf, w0, C and avgdl); ``weighted=False`` (the ``-stats`` names) gives it term
ids and a :class:`~gpuir.backends.base.CollectionStats` per segment instead:
the same numbers, so the same bits (tested).
"""

from __future__ import annotations

import threading
from itertools import pairwise

import numpy as np

from ..bm25 import BM25Params
from ..topk import topk_rows_by_id
from .base import CollectionStats, OwnWeighted, Scorer, WeightedQueries
from .contract import QueryBatch, SegmentEngine, SegmentHits, SegmentSet, SegmentSource
from .scorers import make_scorer

_build_lock = threading.Lock()


def segment_scorer(seg: SegmentSource, backend: str, params: BM25Params) -> Scorer:
    """The scorer of ``seg`` for a concrete backend: made once, on first use, and kept in ``seg.cache``.

    The scorer lays the segment out (raw tf, lengths, block summaries; a device
    upload for "cupy") for the segment's lifetime; every search passes the
    statistics of its segment set. Two threads asking at once get the same
    scorer. The compiled CPU scorer takes the block index the segment's file
    saved, when it saved one (``seg.saved_layout()``).
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


def segment_stats(segset: SegmentSet, vi: int) -> CollectionStats:
    """The set's statistics over view ``vi``'s vocabulary (made once per set and view)."""

    def make() -> CollectionStats:
        seg = segset.views[vi].seg
        return CollectionStats(segset.n_docs, segset.df[seg.l2g], segset.avgdl)

    return segset.cached(("stats", vi), make)


def search_own(backend: str, segset: SegmentSet, view_ids: tuple[int, ...], batch: QueryBatch,
               k: int) -> SegmentHits:
    """A set of one segment under the segment's own statistics (``segset.own_stats``: a static index,
    :class:`gpuir.backends.onesegment.IndexSegmentSet`) through its scorer's static path.

    The segment's scorer of the concrete ``backend`` (:func:`segment_scorer`) searches with its default
    statistics -- the set's -- so it reads what it computed once under them: every posting's weight and
    the exact per-term and per-block bounds (NumPy's pruned search, numba's MaxScore and block-max
    kernels), the device scorer's tiles and graphs (CuPy). The batch reaches it as an
    :class:`~gpuir.backends.base.OwnWeighted` list (each query's terms, with the batch's weighing
    attached: nothing is weighed twice). The engines ``"numpy"``, ``"numba"`` and ``"cupy"`` (and the
    ``-each`` ones) call it for such a set; the result is the bits of the generic path (tested), with the
    scorer's ``meta`` (timings, counters) in :attr:`SegmentHits.meta`.

    Parameters
    ----------
    backend : {"numpy", "numba", "cupy"}
    segset : SegmentSet
        One view, no tombstones, ``own_stats`` True; ``batch.gids`` are the segment's term ids.
    view_ids : () or (0,)
    batch : QueryBatch
    k : int

    Returns
    -------
    SegmentHits
        (B, k) host arrays; ``seqs`` and ``rows`` are the document numbers (one array).
    """
    B = batch.size
    if not view_ids:
        return SegmentHits.empty(B, k)
    seg = segset.views[0].seg
    scorer = segment_scorer(seg, backend, segset.params)
    allow = None if batch.allow is None else [None if a is None else a[0] for a in batch.allow]
    wq = WeightedQueries(batch.off, batch.gids, batch.mult, batch.idf, batch.w0, batch.const, batch.has_w0,
                         float(segset.avgdl))
    queries = OwnWeighted(_term_lists(batch), wq, seg.csr, segset.params)
    theta = batch.theta
    if getattr(scorer, "supports_theta", False) and (theta[0] > -np.inf if B == 1 else bool((theta > -np.inf).any())):
        res = scorer.search(queries, k, allow, theta=theta)
    else:
        res = scorer.search(queries, k, allow)
    ids = np.asarray(res.ids)
    postings = res.meta.get("postings_rows")
    if postings is None:
        offsets = seg.csr.offsets
        g = batch.gids
        per_term = offsets[g + 1] - offsets[g] if g.size else np.zeros(0, np.int64)
        postings = np.bincount(np.repeat(np.arange(B), np.diff(batch.off)), weights=per_term, minlength=B)
    # (ids >> 63: 0 for a hit, -1 for a pad -- the view position of each hit: the set's one view)
    return SegmentHits(ids, res.scores, ids >> 63, ids, np.asarray(postings, np.int64), res.meta)


def _term_lists(batch: QueryBatch) -> list[np.ndarray]:
    """Each query's term ids with repeats, ascending: ``repeat(gids, mult)`` cut at the queries."""
    gids, mult = batch.gids, batch.mult
    if batch.off.size == 2:  # one query (an agent's question): a few terms, compared in Python
        m = mult.tolist()
        return [gids if not m or max(m) == 1 else np.repeat(gids, mult)]
    off = batch.off.tolist()
    if bool((mult == 1).all()):
        return [gids[a:b] for a, b in pairwise(off)]
    flat = np.repeat(gids, mult)
    at = [0, *np.cumsum(mult).tolist()]
    return [flat[at[a]:at[b]] for a, b in pairwise(off)]


class PerSegmentEngine(SegmentEngine):
    """The contract through one scorer call per segment (see the module docstring)."""

    def __init__(self, name: str, backend: str, weighted: bool = True):
        if backend not in ("numpy", "numba", "cupy"):
            raise ValueError(f"PerSegmentEngine needs a concrete backend ('numpy', 'numba' or 'cupy'), "
                             f"got {backend!r}")
        self.name = name
        self.backend = backend
        self.weighted = weighted

    def search(self, segset: SegmentSet, view_ids: tuple[int, ...], batch: QueryBatch, k: int) -> SegmentHits:
        if self.weighted and getattr(segset, "own_stats", False):  # a static index (search_own)
            return search_own(self.backend, segset, view_ids, batch, k)
        B = batch.size
        out = SegmentHits.empty(B, k)
        if not view_ids or not batch.gids.size:
            return out
        lens = np.diff(batch.off)
        prow = np.repeat(np.arange(B, dtype=np.int64), lens)
        allow = batch.allow if batch.filtered() else None
        pos = {vi: j for j, vi in enumerate(view_ids)}
        kth = batch.theta.astype(np.float64, copy=True)
        best_i = best_s = best_v = best_r = None
        for vi in sorted(view_ids, key=lambda v: (-segset.views[v].n_live, v)):  # largest first
            view = segset.views[vi]
            seg = view.seg
            lids = seg.local_terms(batch.gids)
            has = np.bincount(prow[lids >= 0], minlength=B) > 0
            rows_allow = None
            if allow is not None:
                rows_allow = [None if a is None else a[pos[vi]] for a in allow]
                has &= np.array([a is None or a.size > 0 for a in rows_allow])
            qs = np.flatnonzero(has)
            if not qs.size:
                continue
            res = self._search_segment(segset, vi, batch, lids, prow, qs, k, kth[qs],
                                       None if rows_allow is None else [rows_allow[q] for q in qs.tolist()])
            per_row = res.meta.get("postings_rows")
            if per_row is None:
                keep = lids >= 0
                sel = keep & np.isin(prow, qs)
                lt = lids[sel]
                per_row = np.bincount(prow[sel], weights=seg.csr.offsets[lt + 1] - seg.csr.offsets[lt],
                                      minlength=B)[qs]
            out.postings[qs] += np.asarray(per_row, np.int64)
            loc = res.ids
            ok = loc >= 0
            m = loc.shape[1]
            seqs = np.full((B, m), -1, np.int64)
            scores = np.full((B, m), -np.inf, np.float32)
            views = np.full((B, m), -1, np.int64)
            rows = np.full((B, m), -1, np.int64)
            seqs[qs] = np.where(ok, seg.seqs[np.where(ok, loc, 0)], -1)
            scores[qs] = np.where(ok, res.scores, -np.inf)
            views[qs] = np.where(ok, vi, -1)
            rows[qs] = np.where(ok, loc, -1)
            if best_i is None:
                best_i, best_s, best_v, best_r = seqs, scores, views, rows
            else:
                best_i, best_s, best_v, best_r = (np.concatenate([a, b], 1) for a, b in
                                                  ((best_i, seqs), (best_s, scores), (best_v, views), (best_r, rows)))
            order = topk_rows_by_id(best_i, best_s, k)
            best_i, best_s, best_v, best_r = (np.take_along_axis(a, order, 1)
                                              for a in (best_i, best_s, best_v, best_r))
            if best_s.shape[1] >= k:
                kth = np.maximum(kth, best_s[:, k - 1].astype(np.float64))
        if best_i is not None:
            w = best_i.shape[1]
            out.seqs[:, :w], out.scores[:, :w], out.views[:, :w], out.rows[:, :w] = best_i, best_s, best_v, best_r
        return out

    def _search_segment(self, segset: SegmentSet, vi: int, batch: QueryBatch, lids: np.ndarray, prow: np.ndarray,
                        qs: np.ndarray, k: int, thetas: np.ndarray, allow):
        """One scorer call on view vi for the queries ``qs`` (those with a term there and rows allowed)."""
        view = segset.views[vi]
        scorer = segment_scorer(view.seg, self.backend, segset.params)
        opts: dict = {"live": view.live}
        if getattr(scorer, "supports_theta", False) and bool((thetas > -np.inf).any()):
            opts["theta"] = np.asarray(thetas, np.float64)
        sel = (lids >= 0) & np.isin(prow, qs)
        qrow = np.searchsorted(qs, prow[sel])  # each kept term's row among qs
        lt = lids[sel]
        n = qs.size
        consts = batch.const[qs].astype(np.float32, copy=False)
        if self.weighted and hasattr(scorer, "search_weighted"):
            off = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(qrow, minlength=n), out=off[1:])
            # each query's terms ascend as strings, so their local ids ascend too (sorted vocabularies)
            wq = WeightedQueries(off, lt, batch.mult[sel], batch.idf[sel], batch.w0[sel], consts, batch.has_w0,
                                 segset.avgdl)
            return scorer.search_weighted(wq, k, allow, **opts)
        mult = batch.mult[sel]
        flat = np.repeat(lt, mult)
        ends = np.cumsum(np.bincount(qrow, weights=mult, minlength=n).astype(np.int64)).tolist()
        queries = [flat[a:b] for a, b in zip([0, *ends[:-1]], ends)]
        return scorer.search(queries, k, allow, stats=segment_stats(segset, vi), consts=consts, **opts)
