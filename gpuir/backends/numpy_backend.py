"""The NumPy backend: the correctness reference for every other backend.

Per query (a Python loop over queries and query terms, never over postings):

1. For each distinct query term ``t`` (repeated terms are grouped and their
   weight multiplied by the count), add its posting weights into a reusable
   dense float32 accumulator: ``acc[doc_ids[t]] += mult * w[t]``. Within one
   term every document occurs once, so plain fancy-index addition is exact and
   no ``np.add.at`` is needed.
2. The candidates are the documents touched; they are de-duplicated in O(P_q)
   by an "owner" array (each touched document keeps one of its positions), then
   filtered by the query's allow-list through a reusable boolean mask.
3. Top-k over the candidates only: a partition finds the k-th best score, every
   candidate at least that good is kept (so ties at the boundary are all seen),
   and a lexicographic sort orders them by (score desc, document asc).
4. The accumulator entries that were touched are reset to zero, so a query
   costs O(P_q + m log m) for m kept candidates, never O(N).

Posting weights ``w = idf(t) * tfc(tf, |d|)`` (minus the absent-term weight for
bm25l/bm25+) are computed once per (index, parameters) in float32 from the raw
term frequencies, and cached on the scorer.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .. import bm25
from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults
from .base import Scorer


class NumpyScorer(Scorer):
    """BM25 on the CPU with NumPy (see the module docstring for the algorithm)."""

    name = "numpy"

    def __init__(self, index: CSRIndex, params: BM25Params):
        super().__init__(index, params)
        N, V = index.n_docs, index.n_terms
        idf = bm25.idf(index.df, N, params.method)
        #: float32 (V,): idf of each term.
        self.idf = idf.astype(np.float32)
        #: float32 (V,): weight of an absent query term (non-zero for bm25l/bm25+ only).
        self.w0 = bm25.absent_weight(idf, params)
        self._has_w0 = bool(np.any(self.w0 != 0))
        term_of = np.repeat(np.arange(V, dtype=np.int32), np.diff(index.offsets))
        dl = np.asarray(index.doc_lens)[np.asarray(index.doc_ids)]
        w = self.idf[term_of] * bm25.tfc(np.asarray(index.tfs), dl, index.avgdl, params)
        if self._has_w0:
            w = w - self.w0[term_of]
        #: float32 (P,): the weight of each posting.
        self.weights = w.astype(np.float32, copy=False)
        self._acc = np.zeros(N, dtype=np.float32)
        self._owner = np.zeros(N, dtype=np.int64)
        self._mask = np.zeros(N, dtype=bool)

    # -- one query -------------------------------------------------------------
    def _candidates(self, q: np.ndarray, allow: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
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
        offsets, doc_ids, weights, acc = idx.offsets, idx.doc_ids, self.weights, self._acc
        terms, mult = np.unique(q, return_counts=True)
        slices = []
        for t, c in zip(terms.tolist(), mult.tolist()):
            s, e = int(offsets[t]), int(offsets[t + 1])
            if s == e:
                continue
            d = doc_ids[s:e]
            acc[d] += weights[s:e] if c == 1 else weights[s:e] * np.float32(c)
            slices.append(d)
        if not slices:
            return empty
        if len(slices) == 1:
            cand = np.asarray(slices[0])
        else:
            cat = np.concatenate(slices)
            pos = np.arange(cat.size, dtype=np.int64)
            owner = self._owner
            owner[cat] = pos
            cand = cat[owner[cat] == pos]
        scores = acc[cand]
        acc[cand] = 0.0
        if allow is not None:
            mask = self._mask
            mask[allow] = True
            keep = mask[cand]
            mask[allow] = False
            cand, scores = cand[keep], scores[keep]
        if self._has_w0:
            scores = scores + np.float32((self.w0[terms] * mult).sum(dtype=np.float32))
        return cand, scores

    @staticmethod
    def _select(cand: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k of (cand, scores) by score desc, then doc asc."""
        neg = -scores
        if cand.size > k:
            th = np.partition(neg, k - 1)[k - 1]
            sel = np.flatnonzero(neg <= th)
            cand, neg = cand[sel], neg[sel]
        order = np.lexsort((cand, neg))[:k]
        return cand[order], -neg[order]

    # -- the Scorer contract ----------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> SearchResults:
        B = len(queries)
        ids = np.full((B, k), -1, dtype=np.int64)
        out = np.full((B, k), -np.inf, dtype=np.float32)
        t0 = time.perf_counter()
        for i, q in enumerate(queries):
            cand, scores = self._candidates(np.asarray(q, dtype=np.int64), None if allow is None else allow[i])
            if cand.size:
                d, s = self._select(cand, scores, k)
                ids[i, : d.size] = d
                out[i, : s.size] = s
        dt = time.perf_counter() - t0
        return SearchResults(ids, out, {"backend": "numpy", "timings": {"total_s": dt}})

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        N = self.index.n_docs
        rows = np.full((len(queries), N), -np.inf, dtype=np.float32)
        for i, q in enumerate(queries):
            cand, scores = self._candidates(np.asarray(q, dtype=np.int64), None if allow is None else allow[i])
            rows[i, cand] = scores
        return rows
