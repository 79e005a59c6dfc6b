"""A static index as the contract's smallest segment set: one sealed segment under its own statistics.

:class:`~gpuir.engine.BM25Index` searches through the segment-set contract
(:mod:`gpuir.backends.contract`) as a memory does: it hands an engine
(:func:`gpuir.backends.engine_for`) an :class:`IndexSegmentSet` -- its CSR as
the one sealed segment (:class:`IndexSegment`: rows are document numbers, the
sequence number of row ``d`` is ``d``, global term codes are the index's term
ids), no tombstones, and its own statistics (N, df, avgdl of the index) -- and
a :class:`~gpuir.backends.contract.QueryBatch` weighed under them
(:meth:`IndexSegmentSet.batch`).

The set says so (``own_stats``), and the built-in engines serve such a set
through its scorer's static path
(:func:`gpuir.backends.segment_engines.search_own`): every posting's weight
computed once under the index's statistics, with exact per-term and per-block
bounds (numba's MaxScore and block-max kernels, NumPy's pruned search), the
device scorer's graphs on CuPy. An engine that knows nothing of ``own_stats``
searches the set as any other (it is a complete segment set): the same bits,
since the statistics are the same numbers (tested with the ``-stats`` engines
and the compiled segment driver).

The query weights come from tables over the whole vocabulary, made once per set
(:func:`~gpuir.backends.weights.term_weights` of the index's df: the values a
scorer's static cache holds), so weighing a question costs what it cost the
scorer.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from .base import Scorer
from .batch_plan import weigh_with_table
from .contract import QueryBatch
from .segment_engines import segment_scorer
from .weights import term_weights

__all__ = ["IndexSegment", "IndexSegmentSet", "IndexView"]


class IndexSegment:
    """A :class:`~gpuir.index.csr.CSRIndex` as a sealed segment of the contract
    (:class:`~gpuir.backends.contract.SegmentSource`).

    Rows are document numbers; the sequence number of row ``d`` is ``d`` (the tie rule's
    lower document number); the global code of term ``t`` is ``t``. The identity arrays
    (``seqs``, ``l2g``, ``g_sorted``, ``g_order``) are made only when an engine reads them
    (the static path does not).

    Parameters
    ----------
    csr : CSRIndex
        Host arrays, possibly memory-mapped; never copied.
    """

    #: The time partition the segment belongs to (a static index has one).
    partition = 0

    _uids = iter(range(1 << 62))
    _uid_lock = threading.Lock()

    def __init__(self, csr: CSRIndex):
        self.csr = csr
        self.n_docs = int(csr.n_docs)
        #: What engines derive from the segment (scorers, layouts, device copies), for its lifetime.
        self.cache: dict = {}
        with IndexSegment._uid_lock:
            #: A number no other segment of this process has (device engines key copies by it).
            self.uid = next(IndexSegment._uids)
        self._lock = threading.Lock()
        self._arange: dict[str, np.ndarray] = {}

    def _ids(self, name: str, n: int) -> np.ndarray:
        got = self._arange.get(name)
        if got is None:
            with self._lock:
                got = self._arange.get(name)
                if got is None:
                    got = np.arange(n, dtype=np.int64)
                    got.flags.writeable = False
                    self._arange[name] = got
        return got

    @property
    def seqs(self) -> np.ndarray:
        """(n,) int64, host, read-only: ``arange(n)``."""
        return self._ids("rows", self.n_docs)

    @property
    def l2g(self) -> np.ndarray:
        """(V,) int64, host, read-only: ``arange(V)``."""
        return self._ids("terms", int(self.csr.n_terms))

    @property
    def g_sorted(self) -> np.ndarray:
        """(V,) int64, host, read-only: ``arange(V)``."""
        return self.l2g

    @property
    def g_order(self) -> np.ndarray:
        """(V,) int64, host, read-only: ``arange(V)``."""
        return self.l2g

    def local_terms(self, gids: np.ndarray) -> np.ndarray:
        """Local ids of global codes ``gids`` ((m,) int64): themselves, -1 outside the vocabulary."""
        g = np.asarray(gids, np.int64)
        return np.where((g >= 0) & (g < self.csr.n_terms), g, -1)

    def saved_layout(self) -> None:
        """No file saved a block index for it: the compiled scorer lays it out (None)."""

    def keep_layout(self, layout: Any) -> None:
        """(A memory's segment files keep layouts; a static index saves none.)"""


class IndexView:
    """The one view of an :class:`IndexSegmentSet`: the segment, no tombstones."""

    live = None

    def __init__(self, seg: IndexSegment):
        self.seg = seg
        self.n_live = seg.n_docs


class IndexSegmentSet:
    """A static index as a segment set of one segment under its own statistics
    (:class:`~gpuir.backends.contract.SegmentSet`; see the module docstring).

    Parameters
    ----------
    csr : CSRIndex
    params : BM25Params
    """

    #: The statistics are the one segment's own (engines may read its scorers' static caches).
    own_stats = True

    def __init__(self, csr: CSRIndex, params: BM25Params):
        self.params = params
        self.seg = IndexSegment(csr)
        self.views = (IndexView(self.seg),)
        self.n_docs = self.seg.n_docs
        #: (V,) int64, host: each term's document frequency.
        self.df = np.asarray(csr.df, dtype=np.int64)
        self._avgdl = float(csr.avgdl)
        self._state: dict = {}
        self._lock = threading.Lock()
        self._table: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def avgdl(self) -> float:
        """The index's mean document length (:attr:`gpuir.index.csr.CSRIndex.avgdl`)."""
        return self._avgdl

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """Per-set state: ``make()`` on first use of ``key``, kept while the set lives (thread-safe)."""
        got = self._state.get(key)
        if got is None:
            with self._lock:
                got = self._state.get(key)
                if got is None:
                    got = self._state[key] = make()
        return got

    def scorer(self, backend: str) -> Scorer:
        """The segment's scorer of the concrete ``backend``, the one the engines use (made once)."""
        return segment_scorer(self.seg, backend, self.params)

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        """(idf, w0): (V,) float32 each, host: every term's weights under the index's statistics (made once)."""
        got = self._table
        if got is None:
            with self._lock:
                if self._table is None:
                    self._table = term_weights(self.df, self.n_docs, self.params)
                got = self._table
        return got

    def batch(self, terms: Sequence[np.ndarray], allow: Sequence[np.ndarray | None] | None = None) -> QueryBatch:
        """The contract's batch of analysed queries under the index's statistics.

        Parameters
        ----------
        terms : sequence of B ndarrays (n_i,), int64, host
            Each query's term ids (repeats kept; :meth:`gpuir.engine.BM25Index.query_terms`).
        allow : None or sequence of B (None or ndarray (m,), int64, sorted unique document numbers)
            Each query's allow-list (:func:`gpuir.filters.normalize_filters`); queries sharing one
            array share one allow-list object in the batch.

        Returns
        -------
        QueryBatch
            Terms with df 0 dropped, ``theta`` -inf.
        """
        idf, w0 = self.weights()
        wq = weigh_with_table(terms, self.df, idf, w0, self._avgdl, self.params)
        B = wq.n_rows
        lists = None
        if allow is not None:
            seen: dict[int, list[np.ndarray]] = {}
            lists = []
            for a in allow:
                if a is None:
                    lists.append(None)
                    continue
                got = seen.get(id(a))
                if got is None:
                    got = seen[id(a)] = [a]
                lists.append(got)
        return QueryBatch(wq.off, wq.terms, wq.mult, wq.idf, wq.w0, wq.const, wq.has_w0, _no_bound(B), lists)


@functools.lru_cache(maxsize=64)
def _no_bound(B: int) -> np.ndarray:
    """(B,) float64 of -inf, read-only and shared (no query of a static index's batch has a bound)."""
    out = np.full(B, -np.inf)
    out.flags.writeable = False
    return out
