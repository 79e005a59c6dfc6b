"""Posting weights: the float32 numbers every backend adds, computed in one place.

Every backend (the NumPy reference, the compiled CPU scorer, the CUDA kernels)
adds exactly these float32 values, so their sums can agree bit for bit when
they add them in the same order (ascending term id per document).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import bm25
from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from .base import CollectionStats


@dataclass(frozen=True)
class PostingWeights:
    """BM25 weights of one index under one parameter set and collection statistics.

    Attributes
    ----------
    idf : ndarray, shape (V,), float32, host
        idf of each term (computed in float64 from the collection's df and N, rounded once).
    w0 : ndarray, shape (V,), float32, host
        Weight of an absent query term (non-zero for bm25l / bm25+ only).
    weights : ndarray, shape (P,), float32, host
        ``idf(t) * tfc(tf, |d|) [- w0(t)]`` of each posting, float32 arithmetic.
    ub : ndarray, shape (V,), float64, host
        Largest posting weight of each term (0 for a term without postings): its MaxScore bound.
    """

    idf: np.ndarray
    w0: np.ndarray
    weights: np.ndarray
    ub: np.ndarray

    @property
    def has_w0(self) -> bool:
        """Whether absent terms weigh anything (bm25l / bm25+)."""
        return bool(np.any(self.w0 != 0))


def posting_weights(index: CSRIndex, params: BM25Params, stats: CollectionStats | None = None) -> PostingWeights:
    """The :class:`PostingWeights` of ``index`` (statistics: ``stats``, default the index's own)."""
    stats = CollectionStats.of(index) if stats is None else stats
    V = index.n_terms
    idf64 = bm25.idf(stats.df, stats.n_docs, params.method)
    idf = idf64.astype(np.float32)
    w0 = bm25.absent_weight(idf64, params)
    term_of = np.repeat(np.arange(V, dtype=np.int32), np.diff(index.offsets))
    dl = np.asarray(index.doc_lens)[np.asarray(index.doc_ids)]
    w = idf[term_of] * bm25.tfc(np.asarray(index.tfs), dl, stats.avgdl, params)
    if np.any(w0 != 0):
        w = w - w0[term_of]
    w = w.astype(np.float32, copy=False)
    ub = np.zeros(V, dtype=np.float64)
    if index.n_postings:
        nz = np.flatnonzero(np.diff(index.offsets) > 0)
        ub[nz] = np.maximum.reduceat(w, index.offsets[nz])
    return PostingWeights(idf=idf, w0=w0, weights=w, ub=ub)
