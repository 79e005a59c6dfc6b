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
from .weights import CollectionStats, has_absent_weight, row_consts, term_weights


@dataclass
class WeightedQueries:
    """A batch of queries with one search's statistics applied (:func:`weigh_queries`).

    Attributes
    ----------
    off : ndarray (B+1,), int64, host
        Row q's terms are ``terms[off[q]:off[q+1]]``.
    terms : ndarray (T,), int64, host
        Distinct term ids of each row, ascending; only terms with df > 0 under the statistics.
    mult : ndarray (T,), int64, host
        Occurrences of each term in its query.
    idf, w0 : ndarray (T,), float32, host
        :func:`gpuir.backends.weights.term_weights` of each term.
    const : ndarray (B,), float32, host
        ``C`` of each row: added to every candidate's score when ``has_w0``.
    has_w0 : bool
        bm25l / bm25+ (absent terms weigh ``w0``).
    avgdl : float
        The search's mean document length.
    """

    off: np.ndarray
    terms: np.ndarray
    mult: np.ndarray
    idf: np.ndarray
    w0: np.ndarray
    const: np.ndarray
    has_w0: bool
    avgdl: float

    @property
    def n_rows(self) -> int:
        return int(self.off.size - 1)

    def row(self, q: int) -> slice:
        return slice(int(self.off[q]), int(self.off[q + 1]))


def check_queries(queries: Sequence[object], n_terms: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch of queries and concatenate them.

    Returns
    -------
    flat : ndarray (T,), int64, host
        All term ids, query after query.
    lens : ndarray (B,), int64, host

    Raises
    ------
    TypeError / ValueError
        Naming the first bad query and what to fix.
    """
    B = len(queries)
    try:
        arrs = [np.asarray(q) for q in queries]
    except Exception as e:  # noqa: BLE001 - ragged nested lists and the like
        raise TypeError(f"queries must be 1-D arrays of integer term ids ({e})") from None
    lens = np.fromiter((a.size for a in arrs), np.int64, B)
    for i, a in enumerate(arrs):
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(f"query {i} must be a 1-D array of integer term ids, got {a.dtype} {a.shape}")
    nonempty = [a for a in arrs if a.size]
    flat = np.concatenate(nonempty).astype(np.int64, copy=False) if nonempty else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n_terms):
        bad = int(np.flatnonzero((flat < 0) | (flat >= n_terms))[0])
        i = int(np.searchsorted(np.cumsum(lens), bad, "right"))
        raise ValueError(f"query {i} has term ids outside [0, {n_terms}): analyse queries with the "
                         "index's own vocabulary (BM25Index.query_terms)")
    return flat, lens


def weigh_queries(queries: Sequence[object], stats: CollectionStats, params: BM25Params,
                  consts: np.ndarray | None = None) -> WeightedQueries:
    """Distinct terms, multiplicities, idf, w0 and C of each query under ``stats``, vectorised.

    Parameters
    ----------
    queries : sequence of B ndarrays (n_i,), integer, host
        Term ids of each query (this index's vocabulary), repeats kept.
    stats : CollectionStats
    params : BM25Params
    consts : ndarray (B,), float32, optional
        ``C`` of each row, when the caller knows it better (a store whose query
        terms include terms absent from this segment). Default: the float32 sum
        of ``w0 * m`` over the row's terms with df > 0, as NumPy sums it.

    Returns
    -------
    WeightedQueries
    """
    df_all = np.asarray(stats.df)
    V = df_all.size
    flat, lens = check_queries(queries, V)
    B = lens.size
    row = np.repeat(np.arange(B, dtype=np.int64), lens)
    key, mult = np.unique(row * max(V, 1) + flat, return_counts=True)  # sorted by (row, term)
    prow, pterm = key // max(V, 1), key % max(V, 1)
    df = df_all[pterm] if pterm.size else np.zeros(0, np.int64)
    keep = df > 0
    prow, pterm, mult, df = prow[keep], pterm[keep], mult[keep].astype(np.int64), df[keep]
    off = np.zeros(B + 1, np.int64)
    np.cumsum(np.bincount(prow, minlength=B), out=off[1:])
    idf, w0 = term_weights(df, stats.n_docs, params)
    has_w0 = has_absent_weight(params)
    if consts is not None:
        const = np.asarray(consts, dtype=np.float32).reshape(-1)
        if const.shape != (B,):
            raise ValueError(f"consts must hold one float32 per query ({B}), got shape {const.shape}")
    elif has_w0:
        const = row_consts(w0, mult, off)
    else:
        const = np.zeros(B, np.float32)
    return WeightedQueries(off, pterm.astype(np.int64), mult, idf, w0, const, has_w0, float(stats.avgdl))


class OwnWeighted(list):
    """A batch of queries (B term-id arrays, as :meth:`Scorer.search` takes them) with its weighing under
    the default statistics of ``index`` and ``params`` attached.

    A static index's segment set weighs its batch once, for the contract
    (:meth:`gpuir.backends.onesegment.IndexSegmentSet.batch`), and its engine hands its scorer the batch
    this way (:func:`gpuir.backends.segment_engines.search_own`): a scorer of that index and those
    parameters searching with its default statistics takes ``wq`` (:func:`own_weighing`) instead of
    weighing the terms again. Anything else reads it as the list of term arrays it is.

    Attributes
    ----------
    wq : WeightedQueries
        What :func:`weigh_queries` makes of the batch under the index's own statistics.
    index : CSRIndex
    params : BM25Params
    """

    def __init__(self, queries: Sequence[np.ndarray], wq: WeightedQueries, index: CSRIndex, params: BM25Params):
        super().__init__(queries)
        self.wq, self.index, self.params = wq, index, params


def own_weighing(queries: Sequence[object], scorer: Scorer, consts: np.ndarray | None) -> WeightedQueries | None:
    """The weighing an :class:`OwnWeighted` batch carries, when it is ``scorer``'s under its default
    statistics (the same index and parameters, no ``consts`` given); None otherwise."""
    if type(queries) is not OwnWeighted or consts is not None or queries.index is not scorer.index:
        return None
    if queries.params is not scorer.params and queries.params != scorer.params:
        return None
    return queries.wq


class Scorer(ABC):
    """BM25 over one sealed segment with fixed parameters, on one device; statistics per search.

    The constructor lays the segment out once (raw tf, document lengths, block
    summaries; a device upload); it is never re-weighted. Each search applies a
    :class:`CollectionStats` (default: the one given here, else the index's own).

    Parameters
    ----------
    index : CSRIndex
    params : BM25Params
    stats : CollectionStats, optional
        Default statistics of searches that pass none; default the index's own.
    """

    #: Backend name: "numpy", "numba" or "cupy".
    name: str = ""

    def __init__(self, index: CSRIndex, params: BM25Params, stats: CollectionStats | None = None):
        self.index = index
        self.params = params
        if stats is None:
            stats = CollectionStats.of(index)
        else:
            stats.check(index)
        #: The default statistics of a search.
        self.stats = stats

    def search_stats(self, stats: CollectionStats | None) -> CollectionStats:
        """The statistics a search applies: ``stats`` (checked) or the default."""
        if stats is None:
            return self.stats
        if stats is not self.stats and stats is not getattr(self, "_checked", None):
            stats.check(self.index)
            self._checked = stats  # a store passes one object per snapshot: checked once
        return stats

    @abstractmethod
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
        """Top-k documents of each query.

        Parameters
        ----------
        queries : sequence of B ndarrays, each shape (n_i,), int64, host
            Term ids of each query, repeats kept.
        k : int
            Results per query (>= 1); may exceed the number of documents.
        allow : None or sequence of B (None | ndarray (m,), int64 sorted unique)
            Per-query allow-lists of document numbers.
        stats : CollectionStats, optional
            The statistics to apply (default :attr:`stats`).
        consts : ndarray (B,), float32, optional
            ``C`` of each query for bm25l/bm25+ (see :func:`weigh_queries`).
        live : ndarray (N,), bool, host, optional
            Documents that exist (False: deleted); others are never candidates.
            Engines may cache what they derive from it by the array's identity:
            pass a new array when it changes.

        Returns
        -------
        SearchResults with ids (B, k) int64 and scores (B, k) float32 on the host.
        """

    @abstractmethod
    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> np.ndarray:
        """Dense scores of every document for each query (for parity checks).

        Returns
        -------
        ndarray, shape (B, N), float32, host
            -inf for documents that are not candidates (no query term, filtered out, or not live).
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
