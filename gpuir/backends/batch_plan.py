"""One search's statistics applied to a batch of queries: what the CPU engines share.

A scorer lays its segment out once (:class:`TermSummaries`: per-term numbers
that do not depend on the collection statistics) and, per search, turns the
batch and that search's :class:`~gpuir.backends.base.CollectionStats` into a
:class:`BatchPlan` (:func:`plan_batch`): each query's distinct terms with their
idf, absent-term weight and multiplicity (:func:`~gpuir.backends.base.weigh_queries`),
an upper bound of each term's posting weights (its MaxScore bound), and
whether a term may weigh 0 or less (then a zero accumulator does not mean
"untouched", and for bm25l the query is scored without pruning).

A static index searches with its own statistics again and again: a scorer may
then use :class:`StaticWeights`, every posting's weight computed once under its
default statistics (:func:`~gpuir.backends.weights.posting_weights`), with exact
per-term maxima. The plan says which applies (``static``); the weights are the
same float32 values either way, so the results are too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from .base import CollectionStats, WeightedQueries, check_queries, weigh_queries
from .weights import PostingWeights, has_absent_weight, posting_weights, row_consts, weight_bound, weight_floor

__all__ = ["BatchPlan", "StaticWeights", "TermSummaries", "check_live", "plan_batch", "plan_weighted", "weigh_static",
           "weigh_with_table"]


@dataclass(frozen=True)
class TermSummaries:
    """Per-term numbers of a segment's postings that no collection statistic changes.

    Attributes
    ----------
    maxtf, mindl : ndarray (V,), int32, host
        Largest tf and smallest document length among each term's postings (0 for a term
        without postings): with the current idf they bound its weights from above
        (:func:`~gpuir.backends.weights.weight_bound`).
    mintf, maxdl : ndarray (V,), int32, host
        Smallest tf and largest document length: a bound from below
        (:func:`~gpuir.backends.weights.weight_floor`).
    """

    maxtf: np.ndarray
    mindl: np.ndarray
    mintf: np.ndarray
    maxdl: np.ndarray

    @classmethod
    def of(cls, index: CSRIndex) -> TermSummaries:
        """The summaries of ``index`` (one pass over its postings)."""
        V = index.n_terms
        out = [np.zeros(V, np.int32) for _ in range(4)]
        offsets = np.asarray(index.offsets, np.int64)
        nz = np.flatnonzero(np.diff(offsets) > 0)
        if nz.size:
            tfs = np.asarray(index.tfs)
            dl = np.asarray(index.doc_lens)[np.asarray(index.doc_ids)]
            starts = offsets[nz]
            out[0][nz] = np.maximum.reduceat(tfs, starts)
            out[1][nz] = np.minimum.reduceat(dl, starts)
            out[2][nz] = np.minimum.reduceat(tfs, starts)
            out[3][nz] = np.maximum.reduceat(dl, starts)
        return cls(*out)


@dataclass(frozen=True)
class StaticWeights:
    """Every posting's weight under one set of statistics (a static index's cache).

    Attributes
    ----------
    stats : CollectionStats
        The statistics they were computed under (the cache's key, by identity).
    pw : PostingWeights
        weights (P,) float32, idf and w0 (V,) float32, ub (V,) float64 (exact per-term maxima).
    zero_w : ndarray (V,), bool, host
        Terms with a posting of weight <= 0.
    negative : bool
        Whether any weight is < 0 (bounds assume weights >= 0: no pruning then).
    """

    stats: CollectionStats
    pw: PostingWeights
    zero_w: np.ndarray
    negative: bool

    @classmethod
    def of(cls, index: CSRIndex, params: BM25Params, stats: CollectionStats) -> StaticWeights:
        pw = posting_weights(index, params, stats)
        offsets = np.asarray(index.offsets, np.int64)
        zero_w = np.zeros(index.n_terms, dtype=bool)
        nz = np.flatnonzero(np.diff(offsets) > 0)
        if nz.size:
            zero_w[nz] = np.minimum.reduceat(pw.weights, offsets[nz]) <= 0
        negative = bool(pw.weights.size and float(pw.weights.min()) < 0)
        return cls(stats, pw, zero_w, negative)


@dataclass
class BatchPlan:
    """A batch of queries under one search's statistics (:func:`plan_batch`).

    Attributes
    ----------
    wq : WeightedQueries
        Row q's distinct terms ``wq.terms[wq.row(q)]`` (ascending, df > 0), their
        multiplicities, idf, w0, and the row constants ``wq.const``.
    ub : ndarray (T,), float64, host
        An upper bound of each (row, term)'s posting weights, >= 0.
    zero : ndarray (T,), bool, host
        Whether the term may have a posting of weight <= 0.
    exhaustive : ndarray (B,), bool, host
        Rows that must be scored without pruning (a weight may be < 0).
    static : StaticWeights or None
        The precomputed weights, when the search's statistics are theirs.
    """

    wq: WeightedQueries
    ub: np.ndarray
    zero: np.ndarray
    exhaustive: np.ndarray
    static: StaticWeights | None


def plan_batch(queries: Sequence[object], stats: CollectionStats, params: BM25Params, summaries: TermSummaries,
               static: StaticWeights | None = None, consts: np.ndarray | None = None) -> BatchPlan:
    """Apply ``stats`` to a batch (see the module docstring).

    Parameters
    ----------
    queries : sequence of B ndarrays (n_i,), integer, host
        Term ids, repeats kept (validated: :func:`~gpuir.backends.base.check_queries`).
    stats : CollectionStats
    params : BM25Params
    summaries : TermSummaries
        Of the scorer's index.
    static : StaticWeights, optional
        Used (exact bounds and zero flags) when ``static.stats is stats``.
    consts : ndarray (B,), float32, optional
        The rows' ``C`` (default: computed from the rows' terms).

    Returns
    -------
    BatchPlan
    """
    if static is not None and static.stats is stats:
        return plan_weighted(weigh_static(queries, static, params, consts), params, summaries, static)
    return plan_weighted(weigh_queries(queries, stats, params, consts), params, summaries)


def plan_weighted(wq: WeightedQueries, params: BM25Params, summaries: TermSummaries,
                  static: StaticWeights | None = None) -> BatchPlan:
    """The :class:`BatchPlan` of an already weighted batch (``static``: its statistics are ``wq``'s)."""
    t = wq.terms
    B = wq.n_rows
    if static is not None:
        return BatchPlan(wq, static.pw.ub[t], static.zero_w[t], np.full(B, static.negative), static)
    s = summaries
    ub = weight_bound(s.maxtf[t], s.mindl[t], wq.idf, wq.w0, wq.avgdl, params).astype(np.float64)
    zero = weight_floor(s.mintf[t], s.maxdl[t], wq.idf, wq.w0, wq.avgdl, params) <= 0
    exhaustive = np.zeros(B, dtype=bool)
    if params.method == "bm25l" and zero.any():  # only bm25l can round a weight below 0
        row = np.repeat(np.arange(B), np.diff(wq.off))
        exhaustive[row[zero]] = True
    return BatchPlan(wq, ub, zero, exhaustive, None)


def _one_query(queries: Sequence[object], V: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(distinct terms ascending, counts) of a batch of one valid query; None otherwise (the caller then
    goes through :func:`~gpuir.backends.base.check_queries`, which names any problem)."""
    if len(queries) != 1:
        return None
    a = np.asarray(queries[0])
    if a.ndim != 1 or a.dtype.kind not in "iu":
        return None
    s = np.sort(a).astype(np.int64, copy=False)
    if s.size == 0:
        return s, np.zeros(0, np.int64)
    if s[0] < 0 or s[-1] >= V:
        return None
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    starts = new.nonzero()[0]
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = s.size
    return s[starts], ends - starts


def weigh_static(queries: Sequence[object], static: StaticWeights, params: BM25Params,
                 consts: np.ndarray | None = None) -> WeightedQueries:
    """:func:`~gpuir.backends.base.weigh_queries` under the statistics of a static cache, faster.

    The terms' idf and w0 are read from the cache (the values ``term_weights``
    gives for the same df and N), and a single query skips the batch machinery:
    a static index answers one question at a time in a fraction of a millisecond,
    so the host work around the kernel counts. The result equals
    ``weigh_queries(queries, static.stats, params, consts)`` field for field.
    """
    return weigh_with_table(queries, np.asarray(static.stats.df), static.pw.idf, static.pw.w0,
                            float(static.stats.avgdl), params, consts)


def weigh_with_table(queries: Sequence[object], df_all: np.ndarray, idf_all: np.ndarray, w0_all: np.ndarray,
                     avgdl: float, params: BM25Params, consts: np.ndarray | None = None) -> WeightedQueries:
    """:func:`weigh_static` with the terms' weights read from tables of the whole vocabulary.

    Parameters
    ----------
    queries : sequence of B ndarrays (n_i,), integer, host
        Term ids, repeats kept.
    df_all : ndarray (V,), int64, host
        Each term's df under the statistics (terms with df 0 are dropped).
    idf_all, w0_all : ndarray (V,), float32, host
        :func:`~gpuir.backends.weights.term_weights` of ``df_all`` (the whole vocabulary at once).
    avgdl : float
    params : BM25Params
    consts : ndarray (B,), float32, optional

    Returns
    -------
    WeightedQueries
        Equal, field for field, to ``weigh_queries`` under the same statistics.
    """
    V = df_all.size
    one = _one_query(queries, V)
    if one is not None:  # the common case, without the batch machinery's fixed costs
        B = 1
        terms, mult = one
        keep = df_all[terms] > 0
        if not keep.all():
            terms, mult = terms[keep], mult[keep]
        off = np.array([0, terms.size], dtype=np.int64)
    else:
        flat, lens = check_queries(queries, V)
        B = lens.size
        row = np.repeat(np.arange(B, dtype=np.int64), lens)
        key, mult = np.unique(row * max(V, 1) + flat, return_counts=True)
        prow, terms = key // max(V, 1), key % max(V, 1)
        keep = df_all[terms] > 0
        prow, terms, mult = prow[keep], terms[keep], mult[keep]
        off = np.zeros(B + 1, np.int64)
        np.cumsum(np.bincount(prow, minlength=B), out=off[1:])
    terms = terms.astype(np.int64, copy=False)
    mult = mult.astype(np.int64, copy=False)
    idf, w0 = idf_all[terms], w0_all[terms]
    has_w0 = has_absent_weight(params)
    if consts is not None:
        const = np.asarray(consts, dtype=np.float32).reshape(-1)
        if const.shape != (B,):
            raise ValueError(f"consts must hold one float32 per query ({B}), got shape {const.shape}")
    elif not has_w0:
        const = np.zeros(B, np.float32)
    elif B == 1:
        const = np.array([(w0 * mult).sum(dtype=np.float32)], dtype=np.float32)
    else:
        const = row_consts(w0, mult, off)
    return WeightedQueries(off, terms, mult, idf, w0, const, has_w0, avgdl)


def check_live(live: np.ndarray | None, n_docs: int) -> np.ndarray | None:
    """``live`` as a read-only C-contiguous bool view (None stays None).

    Raises
    ------
    ValueError
        Not a bool array of shape (N,).
    """
    if live is None:
        return None
    a = np.asarray(live)
    if a.dtype != np.bool_ or a.shape != (n_docs,):
        raise ValueError(f"live must be a bool array of shape ({n_docs},) (False: a deleted document), "
                         f"got {a.dtype} {a.shape}")
    out = np.ascontiguousarray(a).view()
    out.flags.writeable = False
    return out
