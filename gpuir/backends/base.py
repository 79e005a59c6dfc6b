"""The contract every backend fulfils.

A backend turns (index, BM25 parameters) into a :class:`Scorer`. A scorer answers
batches of analysed queries, each given as its term ids (repeats kept: a repeated
query term counts once per occurrence), with optional per-query allow-lists
(see :mod:`gpuir.filters`). Fusion, evaluation and the CLI only ever see
:class:`~gpuir.results.SearchResults`; they never ask which device ran.

Candidates are the documents that contain at least one query term and pass the
query's filter; rows are padded with id -1 and score -inf past the candidates.
Ties: higher score first, then lower document number -- in every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults, padded_arrays


class Scorer(ABC):
    """BM25 over one index with fixed parameters, on one device."""

    #: Backend name: "numpy" or "cupy".
    name: str = ""

    def __init__(self, index: CSRIndex, params: BM25Params):
        self.index = index
        self.params = params

    @abstractmethod
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> SearchResults:
        """Top-k documents of each query.

        Parameters
        ----------
        queries : sequence of B ndarrays, each shape (n_i,), int64, host
            Term ids of each query, repeats kept.
        k : int
            Results per query (>= 1); may exceed the number of documents.
        allow : None or sequence of B (None | ndarray (m,), int64 sorted unique)
            Per-query allow-lists of document numbers.

        Returns
        -------
        SearchResults with ids (B, k) int64 and scores (B, k) float32 on the host.
        """

    @abstractmethod
    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        """Dense scores of every document for each query (for parity checks).

        Returns
        -------
        ndarray, shape (B, N), float32, host
            -inf for documents that are not candidates (no query term, or filtered out).
        """


def topk_from_dense(scores: np.ndarray, k: int) -> SearchResults:
    """Reference top-k of dense rows under the tie rule (score desc, doc asc).

    Parameters
    ----------
    scores : ndarray, shape (B, N), float32, host
        -inf marks non-candidates, which never appear in the result.
    k : int

    Returns
    -------
    SearchResults, shape (B, k)
    """
    B, N = scores.shape
    ids, out = padded_arrays(B, k)
    for i in range(B):
        row = scores[i]
        cand = np.flatnonzero(row > -np.inf)
        order = np.lexsort((cand, -row[cand].astype(np.float64)))[:k]
        sel = cand[order]
        ids[i, : sel.size] = sel
        out[i, : sel.size] = row[sel]
    return SearchResults(ids, out)
