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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from ..results import SearchResults
from ..topk import topk_rows


@dataclass(frozen=True)
class CollectionStats:
    """The collection statistics BM25 weights are computed from.

    By default a scorer takes them from its own index. A store made of several
    segments (``gpuir.memory``) passes the statistics of the whole live
    collection instead, so that every segment's posting weights equal those of
    one index built over all live records, bit for bit.

    Attributes
    ----------
    n_docs : int
        N, the number of live documents in the collection.
    df : ndarray, shape (V,), int64, host
        Document frequency over the whole collection of each term of *this
        index's* vocabulary (term id = position), >= the index's own df.
    avgdl : float
        Mean document length over the collection, computed as
        :attr:`CSRIndex.avgdl` computes it (float64 mean; 1.0 when N = 0 or all
        documents are empty).
    """

    n_docs: int
    df: np.ndarray
    avgdl: float

    @classmethod
    def of(cls, index: CSRIndex) -> CollectionStats:
        """The statistics of ``index`` alone."""
        return cls(index.n_docs, np.asarray(index.df, dtype=np.int64), index.avgdl)

    def check(self, index: CSRIndex) -> None:
        """Raise ValueError unless these statistics can weight ``index``'s postings."""
        if self.df.shape != (index.n_terms,):
            raise ValueError(
                f"collection df has shape {self.df.shape} but the index has {index.n_terms} terms"
            )
        if self.n_docs < index.n_docs or (index.n_terms and np.any(self.df < index.df)):
            raise ValueError("collection statistics must cover the index: N and every df at least the index's")
        if not np.isfinite(self.avgdl) or self.avgdl <= 0:
            raise ValueError(f"avgdl must be a positive number, got {self.avgdl!r}")


class Scorer(ABC):
    """BM25 over one index with fixed parameters, on one device.

    Parameters
    ----------
    index : CSRIndex
    params : BM25Params
    stats : CollectionStats, optional
        Statistics the weights are computed from; default the index's own.
    """

    #: Backend name: "numpy" or "cupy".
    name: str = ""

    def __init__(self, index: CSRIndex, params: BM25Params, stats: CollectionStats | None = None):
        self.index = index
        self.params = params
        if stats is None:
            stats = CollectionStats.of(index)
        else:
            stats.check(index)
        #: The statistics every weight of this scorer is computed from.
        self.stats = stats

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
    SearchResults, shape (B, k) (:func:`gpuir.topk.topk_rows`)
    """
    return SearchResults(*topk_rows(np.asarray(scores), k))
