"""The NumPy backend: the correctness reference for every other backend.

Per query (a Python loop over queries and query terms, never over postings):

1. **Accumulate, most selective terms first.** Distinct query terms (repeats
   grouped, their weight multiplied by the count) are visited, when pruning
   (the default), in decreasing order of their upper bound ``ub(t) = mult * max posting weight of t``. Each
   adds its posting weights into a reusable dense float32 accumulator with
   ``np.add.at(acc, doc_ids[t], w[t])`` (NumPy >= 1.25's fast ``ufunc.at``
   path: about 3x faster here than ``acc[d] += w``, and the same float32 adds).
2. **Prune (MaxScore).** After a term, if the k-th best partial score already
   exceeds the sum of the remaining terms' upper bounds, no document outside
   the current candidates can reach the top k, and the remaining (low-idf,
   long) posting lists are never scanned -- provided rescoring the surviving
   candidates by binary search costs less than scanning those lists. Weights
   are non-negative for every variant, so partial scores only grow and the test
   is safe; a relative slack of 1e-5 covers float32 rounding. The test runs
   only when more postings are left than were seen, and when the postings seen
   have doubled since the last test (each test gathers them all).
3. **Survivors without de-duplication.** The touched entries (a document
   appears once per posting list it is in, so at most L times for L lists) are
   read from the accumulator, which is then reset where it was touched. The
   (k·L)-th largest entry is a lower bound of the k-th best distinct score, so
   only entries at least that good (plus the remaining bounds, when pruned) can
   be in the top k; a strided sample finds that threshold without partitioning
   every entry. Only the few survivors are de-duplicated (``np.unique``).
4. **Exact scores.** Without pruning, terms were added in ascending term-id
   order: the sums are exact as they stand. With pruning (bound order), the
   survivors are rescored by binary search in every query term's posting list,
   adding in ascending term-id order -- the same float32 operations, in the
   same order. Pruned and exhaustive searches return identical ids and scores
   (tested).
5. **Top-k** by (score desc, document asc) with a partition then a lexsort over
   the survivors.

A query costs O(P_q') for the P_q' postings actually scanned (reported as
``meta["postings_scanned"]``), never O(N). ``prune=False`` (and
:meth:`score_matrix`) scan every posting list.

**Statistics per search.** The scorer lays its index out once (raw tf,
document lengths, per-term tf/length summaries: :mod:`gpuir.backends.batch_plan`)
and applies each search's :class:`~gpuir.backends.base.CollectionStats`:
posting weights ``w = idf(t) * tfc(tf, |d|)`` (minus the absent-term weight for
bm25l/bm25+) are computed in float32 from the raw term frequencies of the lists
a query reads (:func:`~gpuir.backends.weights.weights_of`, once per term and
batch), and the MaxScore bound of a term comes from its summaries
(:func:`~gpuir.backends.weights.weight_bound`). A search with the scorer's own
default statistics (a static index) uses every posting's weight computed once
and cached (:class:`~gpuir.backends.batch_plan.StaticWeights`): the same float32
values, so the same results. ``live`` (tombstones) and allow-lists restrict the
candidates; ``consts`` overrides the bm25l/bm25+ row constant.

**Threads.** A scorer is safe to use from many threads at once: everything it
shares is read-only after construction, and the scratch arrays (the dense
accumulator, the filter mask) belong to one thread each (``threading.local``,
allocated on a thread's first search and reset after every query). A search
interrupted by an exception drops its thread's scratch arrays, so no partial
sum survives into a later search.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults, padded_arrays
from ..topk import kth_largest, topk_pairs
from .base import CollectionStats, Scorer, WeightedQueries, own_weighing
from .batch_plan import BatchPlan, StaticWeights, TermSummaries, check_live, plan_batch, plan_weighted
from .weights import weights_of

__all__ = ["NumpyScorer", "kth_largest"]  # kth_largest: re-exported from its home, gpuir.topk


class _Scratch:
    """One thread's work arrays, all N long and all-zero between queries.

    Attributes
    ----------
    acc : ndarray (N,), float32, host -- the score accumulator
    mask : ndarray (N,), bool, host -- the query's allow-list as a mask
    owner : ndarray (N,), int64, host -- de-duplication slots (allocated on first use)
    """

    __slots__ = ("_owner", "acc", "mask")

    def __init__(self, n_docs: int):
        self.acc = np.zeros(n_docs, dtype=np.float32)
        self.mask = np.zeros(n_docs, dtype=bool)
        self._owner: np.ndarray | None = None

    @property
    def owner(self) -> np.ndarray:
        if self._owner is None:
            self._owner = np.zeros(self.acc.size, dtype=np.int64)
        return self._owner


class _Weights:
    """The posting weights one search reads: the static cache's, or computed per term on demand.

    A term's weights depend only on the search's statistics, so each list is
    weighted at most once per batch (memoised by term id).
    """

    __slots__ = ("_dls", "_memo", "_params", "_static", "_tfs", "avgdl", "doc_ids")

    def __init__(self, index: CSRIndex, params: BM25Params, plan: BatchPlan):
        self._static = None if plan.static is None else plan.static.pw.weights
        self.doc_ids = index.doc_ids
        self._tfs, self._dls = index.tfs, index.doc_lens
        self._params = params
        self.avgdl = plan.wq.avgdl
        self._memo: dict[int, np.ndarray] = {}

    def span(self, t: int, s: int, e: int, idf: np.float32, w0: np.float32) -> np.ndarray:
        """Weights of postings ``s:e`` (all of term t's): ndarray (e - s,), float32."""
        if self._static is not None:
            return self._static[s:e]
        w = self._memo.get(t)
        if w is None:
            w = self._memo[t] = weights_of(self._tfs[s:e], self._dls[self.doc_ids[s:e]], idf, w0, self.avgdl,
                                           self._params)
        return w

    def at(self, t: int, s: int, e: int, pos: np.ndarray, idf: np.float32, w0: np.float32) -> np.ndarray:
        """Weights of term t's postings ``s + pos``: ndarray (m,), float32."""
        if self._static is not None:
            return self._static[s + pos]
        w = self._memo.get(t)
        if w is not None:
            return w[pos]
        p = s + pos
        return weights_of(self._tfs[p], self._dls[self.doc_ids[p]], idf, w0, self.avgdl, self._params)


class NumpyScorer(Scorer):
    """BM25 on the CPU with NumPy (see the module docstring for the algorithm).

    Parameters
    ----------
    index : CSRIndex
    params : BM25Params
    prune : bool
        Skip posting lists that cannot change the top k (MaxScore); exact either way.
    stats : CollectionStats, optional
        Default statistics of a search (default: the index's own).
    """

    name = "numpy"

    def __init__(
        self, index: CSRIndex, params: BM25Params, prune: bool = True, stats: CollectionStats | None = None
    ):
        super().__init__(index, params, stats)
        #: Skip posting lists that cannot change the top k (MaxScore); exact either way.
        self.prune = prune
        #: Per-term tf / length summaries (the statistics-independent part of the bounds).
        self.summaries = TermSummaries.of(index)
        self._static: StaticWeights | None = None
        self._static_lock = threading.Lock()
        self._local = threading.local()  # per-thread _Scratch

    # -- the default statistics' cache ------------------------------------------
    def static_weights(self) -> StaticWeights:
        """Every posting's weight under the default statistics (computed once, on first use)."""
        st = self._static
        if st is None:
            with self._static_lock:
                if self._static is None:
                    self._static = StaticWeights.of(self.index, self.params, self.stats)
                st = self._static
        return st

    @property
    def weights(self) -> np.ndarray:
        """float32 (P,): each posting's weight under the default statistics."""
        return self.static_weights().pw.weights

    @property
    def idf(self) -> np.ndarray:
        """float32 (V,): each term's idf under the default statistics."""
        return self.static_weights().pw.idf

    @property
    def w0(self) -> np.ndarray:
        """float32 (V,): weight of an absent query term under the default statistics (bm25l/bm25+ only)."""
        return self.static_weights().pw.w0

    @property
    def ub(self) -> np.ndarray:
        """float64 (V,): the largest posting weight of each term under the default statistics."""
        return self.static_weights().pw.ub

    @property
    def _has_w0(self) -> bool:
        from .weights import has_absent_weight

        return has_absent_weight(self.params)

    def _plan(self, queries: Sequence[np.ndarray], stats: CollectionStats | None,
              consts: np.ndarray | None) -> BatchPlan:
        st = self.search_stats(stats)
        static = self.static_weights() if st is self.stats else None
        wq = None if static is None else own_weighing(queries, self, consts)
        if wq is not None:  # (a static index's batch, weighed once for the contract)
            return plan_weighted(wq, self.params, self.summaries, static)
        return plan_batch(queries, st, self.params, self.summaries, static, consts)

    def _scratch(self) -> _Scratch:
        """This thread's work arrays (made on its first search)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = _Scratch(self.index.n_docs)
        return buf

    def _drop_scratch(self) -> None:
        """Forget this thread's work arrays (after an exception they may hold partial sums)."""
        self._local.buf = None

    @staticmethod
    def _row_allow(allow: Sequence[np.ndarray | None] | None, i: int, live: np.ndarray | None) -> np.ndarray | None:
        """Query i's allow-list restricted to live documents (None: no list)."""
        if allow is None or allow[i] is None:
            return None
        a = np.asarray(allow[i], dtype=np.int64)
        return a if live is None else a[live[a]]

    # -- one query -------------------------------------------------------------
    def _candidates(
        self, plan: BatchPlan, q: int, W: _Weights, allow: np.ndarray | None, live: np.ndarray | None, buf: _Scratch
    ) -> tuple[np.ndarray, np.ndarray]:
        """Candidate documents of query row ``q`` and their scores (unsorted), every list scanned.

        Returns
        -------
        docs : ndarray (m,), int32, host
        scores : ndarray (m,), float32, host
        """
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32))
        wq = plan.wq
        sl = wq.row(q)
        if sl.stop == sl.start:
            return empty
        idx = self.index
        offsets, doc_ids, acc = idx.offsets, idx.doc_ids, buf.acc
        slices = []
        for t, c, f, z in zip(wq.terms[sl].tolist(), wq.mult[sl].tolist(), wq.idf[sl], wq.w0[sl]):
            s, e = int(offsets[t]), int(offsets[t + 1])
            if s == e:
                continue
            d = doc_ids[s:e]
            w = W.span(t, s, e, f, z)
            np.add.at(acc, d, w if c == 1 else w * np.float32(c))
            slices.append(d)
        if not slices:
            return empty
        cand = self._dedupe(slices, buf)
        scores = acc[cand]
        acc[cand] = 0.0
        keep = None
        if allow is not None:
            mask = buf.mask
            mask[allow] = True
            keep = mask[cand]
            mask[allow] = False
        elif live is not None:
            keep = live[cand]
        if keep is not None:
            cand, scores = cand[keep], scores[keep]
        if wq.has_w0:
            scores = scores + wq.const[q]
        return cand, scores

    #: Relative slack on pruning decisions, far above float32 rounding of a sum.
    _SLACK = 1e-5
    #: A pruning test runs only when the postings left are at least this many
    #: times those seen, and the postings seen have grown this many times since
    #: the last test (each test gathers every posting seen so far).
    _CHECK_GAIN = 1.0
    _CHECK_GROWTH = 2.0

    @staticmethod
    def _dedupe(slices: list[np.ndarray], buf: _Scratch) -> np.ndarray:
        """Distinct documents of posting slices, ndarray (m,), int32 (order unspecified)."""
        if len(slices) == 1:
            return np.asarray(slices[0])
        cat = np.concatenate(slices)
        pos = np.arange(cat.size, dtype=np.int64)
        owner = buf.owner
        owner[cat] = pos  # any one position per document wins; exactly one matches below
        return cat[owner[cat] == pos]

    def _exact_scores(self, docs: np.ndarray, plan: BatchPlan, q: int, W: _Weights) -> np.ndarray:
        """Scores of ``docs`` summed in ascending term order, as the exhaustive path sums them.

        Parameters
        ----------
        docs : ndarray (m,), int, sorted ascending
        plan, q : the batch and the query's row

        Returns
        -------
        ndarray (m,), float32
        """
        idx = self.index
        wq = plan.wq
        sl = wq.row(q)
        out = np.zeros(docs.size, dtype=np.float32)
        for t, c, f, z in zip(wq.terms[sl].tolist(), wq.mult[sl].tolist(), wq.idf[sl], wq.w0[sl]):
            s, e = int(idx.offsets[t]), int(idx.offsets[t + 1])
            if s == e:
                continue
            plist = idx.doc_ids[s:e]
            pos = np.minimum(np.searchsorted(plist, docs), e - s - 1)
            found = plist[pos] == docs
            w = W.at(t, s, e, pos[found], f, z)
            out[found] += w if c == 1 else w * np.float32(c)
        return out

    def exact_scores(self, query: np.ndarray, docs: np.ndarray, *, stats: CollectionStats | None = None,
                     consts: float | None = None) -> np.ndarray:
        """The reference's float32 score of each document ``docs`` for one query (for checks).

        Weights added in ascending term id from 0.0f, ``w * float32(c)`` for a repeated term, then the
        row constant ``C`` for bm25l / bm25+ (a document holding no query term scores ``C``, or 0).

        Parameters
        ----------
        query : ndarray (n,), int, host -- term ids, repeats kept
        docs : ndarray (m,), int, host -- any document numbers, any order
        stats, consts : as :meth:`search` (``consts`` the query's C)

        Returns
        -------
        ndarray (m,), float32, host
        """
        plan = self._plan([np.asarray(query)], stats, None if consts is None else np.float32([consts]))
        W = _Weights(self.index, self.params, plan)
        docs = np.asarray(docs, dtype=np.int64)
        order = np.argsort(docs, kind="stable")
        out = np.empty(docs.size, np.float32)
        out[order] = self._exact_scores(docs[order], plan, 0, W)
        if plan.wq.has_w0:
            out = out + plan.wq.const[0]
        return out

    def _search_one(
        self, plan: BatchPlan, q: int, W: _Weights, k: int, allow: np.ndarray | None, live: np.ndarray | None,
        buf: _Scratch,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Top-k (docs, scores) of query row ``q`` (see the module docstring), and the postings read."""
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32), 0)
        wq = plan.wq
        sl = wq.row(q)
        if sl.stop == sl.start:
            return empty
        terms, mult, idfs, w0s = wq.terms[sl], wq.mult[sl], wq.idf[sl], wq.w0[sl]
        idx = self.index
        offsets, doc_ids, acc = idx.offsets, idx.doc_ids, buf.acc
        prune = self.prune and terms.size > 1 and not plan.exhaustive[q]
        if prune:
            ub = plan.ub[sl] * mult
            order = np.argsort(-ub, kind="stable")
            rest = np.append(np.cumsum(ub[order][::-1])[::-1], 0.0)  # rest[i] = sum of ub[order[i:]]
            to = terms[order]
            post_rest = np.append(np.cumsum((offsets[to + 1] - offsets[to])[::-1])[::-1], 0)
        else:
            order = np.arange(terms.size)  # ascending term ids: the exact summation order
        mask = None
        if allow is not None:
            mask = buf.mask
            mask[allow] = True
        elif live is not None:
            mask = live
        slack = self._SLACK + (terms.size + 2) * 2.0**-23  # covers the float32 rounding of T additions
        hi1, lo1 = 1.0 + slack, 1.0 - slack
        # bm25l / bm25+ add C after the sum: partial sums that differ may tie once C is added (and a
        # tie goes to the lower document), so every comparison bounds the final score, C included
        c0 = float(wq.const[q]) if wq.has_w0 else 0.0
        slices: list[np.ndarray] = []
        n_seen = last_check = 0
        remaining = 0.0
        try:
            for i, j in enumerate(order.tolist()):
                t, c = int(terms[j]), int(mult[j])
                s, e = int(offsets[t]), int(offsets[t + 1])
                d, w = doc_ids[s:e], W.span(t, s, e, idfs[j], w0s[j])
                if mask is not None:
                    keep = np.take(mask, d)
                    d, w = d[keep], w[keep]
                np.add.at(acc, d, w if c == 1 else w * np.float32(c))
                slices.append(d)
                n_seen += d.size
                if not prune:
                    continue
                remaining = float(rest[i + 1])
                if remaining == 0.0 or n_seen < k * len(slices):
                    continue
                # cheap pre-checks: a stop needs rest < the best partial (<= sum of seen bounds),
                # and scanning what is left must cost more than the check itself
                if (
                    remaining * hi1 >= float(rest[0] - remaining)
                    or post_rest[i + 1] < self._CHECK_GAIN * n_seen
                    or n_seen < self._CHECK_GROWTH * last_check
                ):
                    continue
                last_check = n_seen
                # the (k x lists)-th largest over the multiset of partials (a document occurs
                # once per list) is a lower bound of the k-th largest distinct partial score
                vals = np.take(acc, np.concatenate(slices) if len(slices) > 1 else d)
                theta = (kth_largest(vals, k * len(slices)) * lo1 + c0) * lo1  # <= the k-th final score
                if (remaining * hi1 + c0) * hi1 < theta:
                    # worth stopping only if rescoring the survivors by binary search
                    # (|S| x T lookups) costs less than scanning the remaining postings
                    survivors = int(np.count_nonzero(((vals + remaining * hi1) * hi1 + c0) * hi1 >= theta))
                    if survivors * terms.size * 16 < post_rest[i + 1]:
                        break
            else:
                remaining = 0.0
        finally:
            if allow is not None:
                buf.mask[allow] = False
        cat = slices[0] if len(slices) == 1 else np.concatenate(slices)
        vals = np.take(acc, cat)
        acc[cat] = 0.0  # reset every touched entry (duplicates are harmless)
        if cat.size == 0:
            return empty[0], empty[1], n_seen
        m = k * len(slices)
        if cat.size > m:  # keep the entries that can still reach (or tie) the k-th best final score
            theta = (kth_largest(vals, m) * lo1 + c0) * lo1
            keep = ((vals + remaining * hi1) * hi1 + c0) * hi1 >= theta
            cat, vals = cat[keep], vals[keep]
        if prune:  # partial sums in bound order: rescore in the exact (term id) order
            cand = np.unique(cat)
            scores = self._exact_scores(cand, plan, q, W)
        else:  # sums already in term-id order: exact
            cand, first = np.unique(cat, return_index=True)
            scores = vals[first]
        if wq.has_w0:
            scores = scores + wq.const[q]
        return (*self._select(cand, scores, k), n_seen)

    @staticmethod
    def _select(cand: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of (cand, scores) by score desc, then doc asc (:func:`gpuir.topk.topk_pairs`)."""
        return topk_pairs(cand, scores, k)

    # -- the Scorer contract ----------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> SearchResults:
        self._check_k(k)
        t0 = time.perf_counter()
        return self._search(self._plan(queries, stats, consts), int(k), allow, live, t0)

    def search_weighted(
        self,
        wq: WeightedQueries,
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        live: np.ndarray | None = None,
    ) -> SearchResults:
        """:meth:`search` of a batch whose statistics the caller applied already (see
        :meth:`gpuir.backends.numba_backend.NumbaScorer.search_weighted`)."""
        self._check_k(k)
        t0 = time.perf_counter()
        return self._search(plan_weighted(wq, self.params, self.summaries), int(k), allow, live, t0)

    @staticmethod
    def _check_k(k) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")

    def _search(self, plan: BatchPlan, k: int, allow, live, t0: float) -> SearchResults:
        B = plan.wq.n_rows
        if allow is not None and len(allow) != B:
            raise ValueError(f"allow has {len(allow)} entries for {B} queries: give one (or None) per query")
        ids, out = padded_arrays(B, k)
        live = check_live(live, self.index.n_docs)
        W = _Weights(self.index, self.params, plan)
        per_row = np.zeros(B, dtype=np.int64)
        buf = self._scratch()
        try:
            for i in range(B):
                d, s, n = self._search_one(plan, i, W, k, self._row_allow(allow, i, live), live, buf)
                ids[i, : d.size] = d
                out[i, : s.size] = s
                per_row[i] = n
        except BaseException:
            self._drop_scratch()
            raise
        dt = time.perf_counter() - t0
        return SearchResults(ids, out, {"backend": "numpy", "timings": {"total_s": dt},
                                        "postings_scanned": int(per_row.sum()), "postings_rows": per_row})

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> np.ndarray:
        N = self.index.n_docs
        B = len(queries)
        if allow is not None and len(allow) != B:
            raise ValueError(f"allow has {len(allow)} entries for {B} queries: give one (or None) per query")
        rows = np.full((B, N), -np.inf, dtype=np.float32)
        plan = self._plan(queries, stats, consts)
        live = check_live(live, N)
        W = _Weights(self.index, self.params, plan)
        buf = self._scratch()
        try:
            for i in range(B):
                cand, scores = self._candidates(plan, i, W, self._row_allow(allow, i, live), live, buf)
                rows[i, cand] = scores
        except BaseException:
            self._drop_scratch()
            raise
        return rows
