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

Posting weights ``w = idf(t) * tfc(tf, |d|)`` (minus the absent-term weight for
bm25l/bm25+) are computed once per (index, parameters) in float32 from the raw
term frequencies, and cached on the scorer.

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
from .base import CollectionStats, Scorer
from .weights import posting_weights

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


class NumpyScorer(Scorer):
    """BM25 on the CPU with NumPy (see the module docstring for the algorithm)."""

    name = "numpy"

    def __init__(
        self, index: CSRIndex, params: BM25Params, prune: bool = True, stats: CollectionStats | None = None
    ):
        super().__init__(index, params, stats)
        #: Skip posting lists that cannot change the top k (MaxScore); exact either way.
        self.prune = prune
        pw = posting_weights(index, params, self.stats)
        #: float32 (V,): idf of each term.
        self.idf = pw.idf
        #: float32 (V,): weight of an absent query term (non-zero for bm25l/bm25+ only).
        self.w0 = pw.w0
        self._has_w0 = pw.has_w0
        #: float32 (P,): the weight of each posting.
        self.weights = pw.weights
        #: float64 (V,): the largest posting weight of each term (its MaxScore bound).
        self.ub = pw.ub
        self._local = threading.local()  # per-thread _Scratch

    def _scratch(self) -> _Scratch:
        """This thread's work arrays (made on its first search)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = _Scratch(self.index.n_docs)
        return buf

    def _drop_scratch(self) -> None:
        """Forget this thread's work arrays (after an exception they may hold partial sums)."""
        self._local.buf = None

    # -- one query -------------------------------------------------------------
    def _candidates(
        self, q: np.ndarray, allow: np.ndarray | None, buf: _Scratch
    ) -> tuple[np.ndarray, np.ndarray]:
        """Candidate documents of one query and their scores (unsorted).

        Returns
        -------
        docs : ndarray (m,), int32, host
        scores : ndarray (m,), float32, host
        """
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32))
        if q.size == 0:
            return empty
        idx = self.index
        offsets, doc_ids, weights, acc = idx.offsets, idx.doc_ids, self.weights, buf.acc
        terms, mult = np.unique(q, return_counts=True)
        slices = []
        for t, c in zip(terms.tolist(), mult.tolist()):
            s, e = int(offsets[t]), int(offsets[t + 1])
            if s == e:
                continue
            d = doc_ids[s:e]
            np.add.at(acc, d, weights[s:e] if c == 1 else weights[s:e] * np.float32(c))
            slices.append(d)
        if not slices:
            return empty
        cand = self._dedupe(slices, buf)
        scores = acc[cand]
        acc[cand] = 0.0
        if allow is not None:
            mask = buf.mask
            mask[allow] = True
            keep = mask[cand]
            mask[allow] = False
            cand, scores = cand[keep], scores[keep]
        if self._has_w0:
            scores = scores + np.float32((self.w0[terms] * mult).sum(dtype=np.float32))
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

    def _exact_scores(self, docs: np.ndarray, terms: np.ndarray, mult: np.ndarray) -> np.ndarray:
        """Scores of ``docs`` summed in ascending term order, as the exhaustive path sums them.

        Parameters
        ----------
        docs : ndarray (m,), int, sorted ascending
        terms, mult : ndarray (T,), int64: distinct query terms (ascending) and counts

        Returns
        -------
        ndarray (m,), float32
        """
        idx = self.index
        out = np.zeros(docs.size, dtype=np.float32)
        for t, c in zip(terms.tolist(), mult.tolist()):
            s, e = int(idx.offsets[t]), int(idx.offsets[t + 1])
            if s == e:
                continue
            plist = idx.doc_ids[s:e]
            pos = np.minimum(np.searchsorted(plist, docs), e - s - 1)
            found = plist[pos] == docs
            w = self.weights[s + pos[found]]
            out[found] += w if c == 1 else w * np.float32(c)
        return out


    def _search_one(
        self, q: np.ndarray, k: int, allow: np.ndarray | None, buf: _Scratch
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Top-k (docs, scores) of one query (see the module docstring), and the postings read."""
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32), 0)
        if q.size == 0:
            return empty
        terms, mult = np.unique(q, return_counts=True)
        idx = self.index
        offsets, doc_ids, weights, acc = idx.offsets, idx.doc_ids, self.weights, buf.acc
        prune = self.prune and terms.size > 1
        if prune:
            ub = self.ub[terms] * mult
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
        slack = self._SLACK
        slices: list[np.ndarray] = []
        n_seen = last_check = 0
        remaining = 0.0
        try:
            for i, j in enumerate(order.tolist()):
                t, c = int(terms[j]), int(mult[j])
                s, e = int(offsets[t]), int(offsets[t + 1])
                d, w = doc_ids[s:e], weights[s:e]
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
                    remaining * (1 + slack) >= float(rest[0] - remaining)
                    or post_rest[i + 1] < self._CHECK_GAIN * n_seen
                    or n_seen < self._CHECK_GROWTH * last_check
                ):
                    continue
                last_check = n_seen
                # the (k x lists)-th largest over the multiset of partials (a document occurs
                # once per list) is a lower bound of the k-th largest distinct partial score
                vals = np.take(acc, np.concatenate(slices) if len(slices) > 1 else d)
                theta = kth_largest(vals, k * len(slices))
                if remaining * (1 + slack) < theta * (1 - slack):
                    # worth stopping only if rescoring the survivors by binary search
                    # (|S| x T lookups) costs less than scanning the remaining postings
                    survivors = int(np.count_nonzero(vals + remaining * (1 + slack) >= theta * (1 - slack)))
                    if survivors * terms.size * 16 < post_rest[i + 1]:
                        break
            else:
                remaining = 0.0
        finally:
            if mask is not None:
                mask[allow] = False
        cat = slices[0] if len(slices) == 1 else np.concatenate(slices)
        vals = np.take(acc, cat)
        acc[cat] = 0.0  # reset every touched entry (duplicates are harmless)
        if cat.size == 0:
            return empty[0], empty[1], n_seen
        m = k * len(slices)
        if cat.size > m:  # keep the entries that can still reach the k-th best score
            theta = kth_largest(vals, m)
            keep = vals + remaining * (1 + slack) >= theta * (1 - slack)
            cat, vals = cat[keep], vals[keep]
        if prune:  # partial sums in bound order: rescore in the exact (term id) order
            cand = np.unique(cat)
            scores = self._exact_scores(cand, terms, mult)
        else:  # sums already in term-id order: exact
            cand, first = np.unique(cat, return_index=True)
            scores = vals[first]
        if self._has_w0:
            scores = scores + np.float32((self.w0[terms] * mult).sum(dtype=np.float32))
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
    ) -> SearchResults:
        B = len(queries)
        ids, out = padded_arrays(B, k)
        t0 = time.perf_counter()
        scanned = 0
        buf = self._scratch()
        try:
            for i, q in enumerate(queries):
                d, s, n = self._search_one(np.asarray(q, dtype=np.int64), k, None if allow is None else allow[i], buf)
                ids[i, : d.size] = d
                out[i, : s.size] = s
                scanned += n
        except BaseException:
            self._drop_scratch()
            raise
        dt = time.perf_counter() - t0
        return SearchResults(ids, out, {"backend": "numpy", "timings": {"total_s": dt}, "postings_scanned": scanned})

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        N = self.index.n_docs
        rows = np.full((len(queries), N), -np.inf, dtype=np.float32)
        buf = self._scratch()
        try:
            for i, q in enumerate(queries):
                cand, scores = self._candidates(np.asarray(q, dtype=np.int64), None if allow is None else allow[i], buf)
                rows[i, cand] = scores
        except BaseException:
            self._drop_scratch()
            raise
        return rows
