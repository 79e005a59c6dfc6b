"""BM25 weights with one search's statistics applied: the float32 arithmetic every engine repeats.

A sealed segment stores raw term frequencies and document lengths only; the
statistics (N, df, avgdl) are applied per search, as Lucene does, so a segment
is laid out once for its lifetime (compiled layout, device upload) and never
re-weighted when the collection changes. Every engine (the NumPy reference, the
compiled CPU engine, the CUDA kernels) computes a posting's weight with exactly
these float32 operations, in this order, and adds a document's weights in
ascending term id from 0.0, so the engines agree bit for bit.

The weight of a posting (tf, dl) of query term t (:func:`weights_of`,
:func:`gpuir.bm25.tfc` for the component):

======  =====================================================================
step    float32 operation (round to nearest, no fused multiply-add)
======  =====================================================================
norm    ``n1 = 1 - b``; ``r = dl / avgdl``; ``n2 = b * r``; ``norm = n1 + n2``
tfc     lucene, robertson: ``tf / (k1 * norm + tf)``;
        atire: ``(tf * (k1 + 1)) / (tf + k1 * norm)``;
        bm25l: ``c = tf / norm``; ``((k1 + 1) * (c + delta)) / (k1 + c + delta)``;
        bm25+: ``((k1 + 1) * tf) / (k1 * norm + tf) + delta``
weight  ``w = idf_t * tfc``; for bm25l/bm25+ (``has_w0``): ``w = w - w0_t``
query   ``w`` if the term occurs once in the query, else ``w * float32(m)``
score   ``s = 0``; ``s = s + w`` for each present term, ascending term id;
        for bm25l/bm25+: ``s = s + C``
======  =====================================================================

``idf_t`` and ``w0_t = idf_t * tfc(0)`` come from the search's N and df
(:func:`term_weights`: float64, rounded to float32 once) and ``C`` is the
float32 sum of ``w0_t * m`` over the query's terms in NumPy's order
(:func:`row_consts`). ``k1 + 1`` and ``1 - b`` are float32 operations too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .. import bm25
from ..bm25 import BM25Params
from ..index.csr import CSRIndex

__all__ = [
    "CollectionStats", "PostingWeights", "has_absent_weight", "numpy_row_sums", "posting_weights", "row_consts", "term_weights",
    "weight_bound", "weight_floor", "weights_of",
]


@dataclass(frozen=True)
class CollectionStats:
    """The collection statistics one search applies (N, df, avgdl).

    A scorer lays its segment out once, from raw term frequencies and document
    lengths; the statistics are applied per search (:mod:`gpuir.backends.weights`).
    By default a scorer uses its own index's statistics. A store made of several
    segments (``gpuir.memory``) passes the statistics of the whole live
    collection with every search instead, so that every segment's scores equal
    those of one index built over all live records, bit for bit.

    Attributes
    ----------
    n_docs : int
        N, the number of live documents in the collection.
    df : ndarray, shape (V,), int64, host
        Document frequency over the whole collection of each term of *this
        index's* vocabulary (term id = position). A term with df 0 is ignored by
        searches (a fresh index over the live records would not hold it).
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
        """Raise ValueError unless these statistics can weight ``index``'s postings.

        A segment with deleted documents may hold more postings of a term than
        the live collection has documents with it, so df is not compared with the
        index's own; it must only be a valid df over N documents.
        """
        df = np.asarray(self.df)
        if df.shape != (index.n_terms,):
            raise ValueError(
                f"collection df has shape {df.shape} but the index has {index.n_terms} terms: give one df per "
                "term of the index's vocabulary"
            )
        if df.size and (df.min() < 0 or df.max() > self.n_docs):
            raise ValueError(f"collection df must lie in [0, N={self.n_docs}]")
        if not np.isfinite(self.avgdl) or self.avgdl <= 0:
            raise ValueError(f"avgdl must be a positive number, got {self.avgdl!r}")


@functools.lru_cache(maxsize=256)
def has_absent_weight(params: BM25Params) -> bool:
    """Whether an absent query term weighs anything (``tfc(0) != 0``: bm25l and bm25+ with delta > 0).

    Cached per parameters (every search asks).
    """
    return float(bm25.tfc(np.zeros(1), np.ones(1), 1.0, params)[0]) != 0.0


def term_weights(df: np.ndarray, n_docs: int, params: BM25Params) -> tuple[np.ndarray, np.ndarray]:
    """idf and absent-term weight of some terms under one search's statistics.

    Parameters
    ----------
    df : ndarray (T,), integer, host
        Document frequency of each term in the collection the search sees.
    n_docs : int
        N of that collection.

    Returns
    -------
    idf : ndarray (T,), float32, host
        ``float32(idf)``, computed in float64 (:func:`gpuir.bm25.idf`) and rounded once.
    w0 : ndarray (T,), float32, host
        ``idf * tfc(0)`` (:func:`gpuir.bm25.absent_weight`): zero unless bm25l / bm25+.
    """
    idf64 = bm25.idf(np.asarray(df, dtype=np.int64), n_docs, params.method)
    return idf64.astype(np.float32), bm25.absent_weight(idf64, params)


def weights_of(tfs: np.ndarray, dls: np.ndarray, idf: np.ndarray | np.float32, w0: np.ndarray | np.float32,
               avgdl: float, params: BM25Params) -> np.ndarray:
    """The float32 weight of each posting (the module docstring's steps norm, tfc and weight).

    Parameters
    ----------
    tfs : ndarray (m,), integer, host
        Raw term frequencies.
    dls : ndarray (m,), integer, host
        Length of each posting's document.
    idf, w0 : float32 scalars, or ndarray (m,) float32, host
        The posting's term's weights (:func:`term_weights`).
    avgdl : float
        The search's mean document length (used as ``float32(avgdl)``).

    Returns
    -------
    ndarray (m,), float32, host
    """
    w = np.float32(idf) * bm25.tfc(tfs, dls, avgdl, params) if np.ndim(idf) == 0 else \
        np.asarray(idf, np.float32) * bm25.tfc(tfs, dls, avgdl, params)
    if has_absent_weight(params):
        w = w - (np.float32(w0) if np.ndim(w0) == 0 else np.asarray(w0, np.float32))
    return w.astype(np.float32, copy=False)


#: Relative slack of :func:`weight_bound`, far above the float32 rounding of a weight
#: (at most ~8 rounded operations, each within 2^-24 relative).
BOUND_SLACK = 1e-5


def weight_bound(max_tf: np.ndarray, min_dl: np.ndarray, idf: np.ndarray, w0: np.ndarray, avgdl: float,
                 params: BM25Params) -> np.ndarray:
    """An upper bound, valid for every avgdl-independent block summary, of the float32 weights in a block.

    A block (a term's postings in a range of documents) is summarised once, when
    the segment is laid out, by two numbers that do not depend on the collection
    statistics: its largest tf and its smallest document length. Every BM25
    variant's ``tfc`` increases with tf and decreases with the document length,
    so ``tfc(max_tf, min_dl)`` bounds the block in exact arithmetic; the bound
    is evaluated in float64 and widened by :data:`BOUND_SLACK` (relative) plus
    an absolute margin of ``BOUND_SLACK * idf * (k1 + 1 + delta)`` (covering the
    cancellation in ``w - w0``), then rounded up to float32. So it is >= the
    float32 weight :func:`weights_of` computes for any posting of the block,
    and >= 0 (a term absent from a document adds nothing, which 0 covers).

    Parameters
    ----------
    max_tf : ndarray (m,), integer, host
        Largest tf of each block; 0 for an empty block (bound 0). A value
        >= 2^31 - 1 stands for "unbounded" (the tfc limit as tf grows is used).
    min_dl : ndarray (m,), integer, host
        Smallest document length of each block (a value capped below is safe).
    idf, w0 : ndarray (m,) or scalar, float32, host
        The block's term's weights under the search's statistics.
    avgdl : float

    Returns
    -------
    ndarray (m,), float32, host: the bounds, >= 0.
    """
    max_tf = np.asarray(max_tf, dtype=np.float64)
    min_dl = np.asarray(min_dl, dtype=np.float64)
    k1, b, delta = float(params.k1), float(params.b), float(params.delta)
    norm = (1.0 - b) + b * (min_dl / float(np.float32(avgdl)))
    inf = max_tf >= 2**31 - 1
    tf = np.where(inf, 1.0, max_tf)
    m = params.method
    if m in ("lucene", "robertson"):
        t = np.where(inf, 1.0, tf / (k1 * norm + tf))
    elif m == "atire":
        t = np.where(inf, k1 + 1.0, tf * (k1 + 1.0) / (tf + k1 * norm))
    elif m == "bm25l":
        c = tf / np.maximum(norm, 1e-300)
        t = np.where(inf, k1 + 1.0, (k1 + 1.0) * (c + delta) / (k1 + c + delta))
    elif m == "bm25+":
        t = np.where(inf, k1 + 1.0 + delta, (k1 + 1.0) * tf / (k1 * norm + tf) + delta)
    else:
        raise ValueError(f"unknown BM25 method {m!r}")
    idf64 = np.asarray(idf, dtype=np.float64)
    w = idf64 * t - (np.asarray(w0, dtype=np.float64) if has_absent_weight(params) else 0.0)
    w = w * (1.0 + BOUND_SLACK) + BOUND_SLACK * np.abs(idf64) * (k1 + 1.0 + delta)
    w = np.where(max_tf > 0, np.maximum(w, 0.0), 0.0)
    out = w.astype(np.float32)
    return np.where(out.astype(np.float64) < w, np.nextafter(out, np.float32(np.inf)), out).astype(np.float32)


def weight_floor(min_tf: np.ndarray, max_dl: np.ndarray, idf: np.ndarray, w0: np.ndarray, avgdl: float,
                 params: BM25Params) -> np.ndarray:
    """A lower bound of the float32 weights of some postings, from their smallest tf and largest length.

    The mirror of :func:`weight_bound`: ``tfc(min_tf, max_dl)`` bounds the
    postings' ``tfc`` from below in exact arithmetic; it is evaluated in float64
    and narrowed by the same relative and absolute slack. A result > 0 proves
    every float32 weight > 0. A result <= 0 proves nothing: the weights may be
    0 (an idf of 0: robertson, atire) or, for bm25l only, a rounding below 0
    (``tfc(c)`` and ``tfc(0)`` rounded apart); the engines then neither use a
    zero accumulator as "untouched" nor, for bm25l, prune the query.

    Parameters
    ----------
    min_tf, max_dl : ndarray (m,), integer, host
        Smallest tf and largest document length of each group of postings.
    idf, w0 : ndarray (m,) or scalar, float32, host
    avgdl : float

    Returns
    -------
    ndarray (m,), float64, host
    """
    tf = np.maximum(np.asarray(min_tf, dtype=np.float64), 0.0)
    dl = np.asarray(max_dl, dtype=np.float64)
    k1, b, delta = float(params.k1), float(params.b), float(params.delta)
    norm = np.maximum((1.0 - b) + b * (dl / float(np.float32(avgdl))), 1e-300)
    m = params.method
    if m in ("lucene", "robertson"):
        t = tf / (k1 * norm + tf)
    elif m == "atire":
        t = tf * (k1 + 1.0) / (tf + k1 * norm)
    elif m == "bm25l":
        c = tf / norm
        t = (k1 + 1.0) * (c + delta) / (k1 + c + delta)
    elif m == "bm25+":
        t = (k1 + 1.0) * tf / (k1 * norm + tf) + delta
    else:
        raise ValueError(f"unknown BM25 method {m!r}")
    idf64 = np.asarray(idf, dtype=np.float64)
    w = idf64 * t - (np.asarray(w0, dtype=np.float64) if has_absent_weight(params) else 0.0)
    return w * (1.0 - BOUND_SLACK) - BOUND_SLACK * np.abs(idf64) * (k1 + 1.0 + delta)


def _pairwise_sum_f32(m: np.ndarray) -> np.ndarray:
    """NumPy's float32 pairwise summation of each row of ``m`` (R, n), vectorised over rows.

    The order of ``numpy.add.reduce`` on a contiguous float32 row
    (``pairwise_sum`` in NumPy's loops): n < 8 sequential from -0.0; n <= 128
    eight interleaved accumulators combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))
    then the remainder in order; larger n split in halves (a multiple of 8).
    """
    R, n = m.shape
    f = np.float32
    if n < 8:
        res = np.full(R, -0.0, f)
        for i in range(n):
            res = (res + m[:, i]).astype(f)
        return res
    if n <= 128:
        r = m[:, :8].astype(f, copy=True)
        i = 8
        stop = n - n % 8
        while i < stop:
            r = (r + m[:, i:i + 8]).astype(f)
            i += 8
        res = (((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))).astype(f)
        for j in range(stop, n):
            res = (res + m[:, j]).astype(f)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return (_pairwise_sum_f32(m[:, :n2]) + _pairwise_sum_f32(m[:, n2:])).astype(f)


def numpy_row_sums(values: np.ndarray, row_off: np.ndarray) -> np.ndarray:
    """Per-row float32 sums, bit for bit as ``values[a:b].sum(dtype=np.float32)`` would give.

    Parameters
    ----------
    values : ndarray (n,), float32, host
    row_off : ndarray (R+1,), int64, host
        Row r owns ``values[row_off[r]:row_off[r+1]]``.

    Returns
    -------
    ndarray (R,), float32, host
        Rows are grouped by length and each group summed in NumPy's order
        (:func:`_pairwise_sum_f32`), so the cost is a few vectorised passes.
    """
    lens = np.diff(row_off)
    out = np.zeros(lens.size, np.float32)
    for L in np.unique(lens[lens > 0]).tolist():
        rows = np.flatnonzero(lens == L)
        idx = row_off[rows][:, None] + np.arange(L)[None, :]
        out[rows] = _pairwise_sum_f32(values[idx])
    return out


def row_consts(w0: np.ndarray, mult: np.ndarray, row_off: np.ndarray) -> np.ndarray:
    """``C`` of each query: ``np.float32((w0[terms] * mult).sum(dtype=np.float32))`` per row, vectorised.

    Parameters
    ----------
    w0 : ndarray (T,), float32, host
        Absent-term weight of each (row, distinct term), rows in order, terms ascending.
    mult : ndarray (T,), integer, host
        Occurrences of each term in its query.
    row_off : ndarray (B+1,), int64, host

    Returns
    -------
    ndarray (B,), float32, host
    """
    return numpy_row_sums((np.asarray(w0, np.float32) * np.asarray(mult)).astype(np.float32),
                          np.asarray(row_off, np.int64))


@dataclass(frozen=True)
class PostingWeights:
    """Every posting's weight of one index under one set of statistics (a static index's cache).

    Attributes
    ----------
    idf : ndarray, shape (V,), float32, host
    w0 : ndarray, shape (V,), float32, host
        Weight of an absent query term (non-zero for bm25l / bm25+ only).
    weights : ndarray, shape (P,), float32, host
        :func:`weights_of` of each posting.
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


def posting_weights(index: CSRIndex, params: BM25Params, stats=None) -> PostingWeights:
    """The :class:`PostingWeights` of ``index`` under ``stats`` (a :class:`CollectionStats`;
    default the index's own): :func:`weights_of` applied to every posting at once."""
    stats = CollectionStats.of(index) if stats is None else stats
    V = index.n_terms
    idf, w0 = term_weights(stats.df, stats.n_docs, params)
    term_of = np.repeat(np.arange(V, dtype=np.int32), np.diff(index.offsets))
    dl = np.asarray(index.doc_lens)[np.asarray(index.doc_ids)]
    w = weights_of(np.asarray(index.tfs), dl, idf[term_of], w0[term_of], stats.avgdl, params)
    ub = np.zeros(V, dtype=np.float64)
    if index.n_postings:
        nz = np.flatnonzero(np.diff(index.offsets) > 0)
        ub[nz] = np.maximum.reduceat(w, index.offsets[nz])
    return PostingWeights(idf=idf, w0=w0, weights=w, ub=ub)
