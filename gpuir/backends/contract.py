"""The segment-set search contract: the one operation every scoring engine implements.

A *segment set* is an immutable state of a collection made of sealed segments
(a :class:`~gpuir.memory.snapshot.Snapshot` of a memory; a static index is a set
of one segment). Every engine -- the NumPy reference, the compiled CPU engine
(numba), the device engine (CuPy) -- answers one request:

    **search some of a segment set's sealed segments, under the statistics it is
    given, for a batch of queries, and return each query's merged top k.**

:meth:`SegmentEngine.search` is that operation; an engine is chosen by name
(:func:`gpuir.backends.segment_engine`, :func:`gpuir.backends.engine_for`), never by flags. Callers (the memory, and through it the
Retriever's lexical channels, the service and the shards) reach scoring only
through it.

**What the engine is given** (:class:`SegmentSet`, :class:`QueryBatch`):

* the segment set: its views (each a sealed segment with its tombstones), its
  BM25 parameters, and its statistics (N, avgdl, the df of every global term
  code); the positions ``view_ids`` of the views to search;
* per query: its distinct terms as global term codes (ascending term strings,
  hence ascending local ids in every segment, whose vocabularies are sorted),
  each term's occurrences ``mult`` and its weights under the set's statistics
  (``idf``, ``w0``; ``C`` = ``const``, the float32 sum of ``w0 * mult`` over
  the query's terms, absent ones included); a score bound ``theta`` (nothing
  scoring below it is wanted; -inf: no bound); an allow-list per segment or
  None; and ``k``.

Engines that weigh postings themselves use ``params`` and ``avgdl`` with the
given ``idf``/``w0``; engines that take statistics instead (a
:class:`~gpuir.backends.base.CollectionStats` per segment) derive them from
``n_docs``, ``df[seg.l2g]`` and ``avgdl``: the same numbers.

**What it returns** (:class:`SegmentHits`): for each query the best ``k`` live,
allowed records that hold at least one query term, ordered by score descending,
then **sequence number ascending** (the tie rule of a fresh index over the live
records, whose document numbers follow the add order), with each hit's view
position and row, and the postings read. Scores are the float32 sums of the
NumPy reference (:mod:`gpuir.backends.numpy_backend`) bit for bit: a record's
posting weights summed in ascending term order, minus ``w0`` per present term,
then ``+ C``, with the set's N, df and avgdl -- whatever engine, whatever the
segments' number or sizes. Hits scoring below the query's ``theta`` may be
left out (only those).

**Devices.** Everything the caller passes and everything returned is on the
host (NumPy). A device engine keeps its own copies (per segment, for the
segment's lifetime, in :attr:`SegmentSource.cache`) and copies results back
once per call.

**State an engine may keep.** Per segment, for the segment's lifetime:
``seg.cache`` (a dict; keys are tuples starting with the engine's name). Per
segment set, while it lives: ``segset.cached(key, make)``. Across segment sets
(a new snapshot after every write shares most segments with the previous
one): anything keyed by the segments themselves, never by the set. Engines
are stateless otherwise, and any number of threads may call ``search`` at once.

Engines by name (:data:`gpuir.backends.ENGINES`; :func:`register_engine` adds one or replaces a
built-in; :data:`gpuir.backends.ROUTES` says which serves each backend, :func:`gpuir.backends.use_engine`
changes it inside a ``with`` block):

``"numpy"``
    The reference: one :class:`~gpuir.backends.numpy_backend.NumpyScorer` call per segment.
``"numba"``
    The compiled CPU engine: every query over all the segments in one compiled call
    (:mod:`gpuir.backends.numba_segments`), a snapshot's layout reused by the next one for the
    segments they share, small segments scored without a block layout.
``"cupy"``
    The device engine (until its one-pass engine is registered: one scorer call per segment).
``"numba-each"``, ``"numpy-stats"``, ``"numba-stats"``
    Test engines: one scorer call per segment with the batch weighed once (``-each``), or with
    :class:`~gpuir.backends.base.CollectionStats` per segment (``-stats``). Same results.

This module and :mod:`gpuir.backends` (backend selection) are the only parts of
:mod:`gpuir.backends` the memory imports (``tests/test_import_graph.py``); the
few helpers it needs from the engines (term weights and bounds, segment-file
block indexes, dense vector scoring) are re-exported at the end of this module.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..bm25 import BM25Params
from ..index.csr import CSRIndex

# What the memory needs of the engines, re-exported here (it imports nothing else of gpuir.backends but
# backend selection): BM25 term weights and the per-term bounds of its time partitions, and the dense
# kernels of its named embeddings (more at the end of this module).
from .dense import VECTOR_DTYPES, dense_scores, dense_topk, normalize_rows
from .weights import BOUND_SLACK, has_absent_weight, term_weights, weight_bound


class SegmentSource(Protocol):
    """What an engine reads of one sealed segment (:class:`gpuir.memory.segments.Segment`). Immutable.

    Attributes
    ----------
    csr : CSRIndex
        ``offsets`` (V+1,) int64, ``doc_ids`` (P,) int32 (rows ascending within a term), ``tfs`` (P,) int32,
        ``doc_lens`` (n,) int32; host. Sorted vocabulary: local term ids ascend with the term strings.
    seqs : ndarray (n,), int64, host
        Sequence number of each row, ascending (the tie rule's order).
    n_docs : int
        Rows (n), tombstoned ones included.
    l2g : ndarray (V,), int64, host
        Global term code of each local term.
    cache : dict
        Structures an engine derives from the segment (scorers, block layouts, device copies), kept for
        the segment's lifetime; keys are tuples that start with the engine's name.
    """

    csr: CSRIndex
    seqs: np.ndarray
    n_docs: int
    l2g: np.ndarray
    cache: dict

    def local_terms(self, gids: np.ndarray) -> np.ndarray:
        """Local ids of global codes ``gids`` ((m,) int64): (m,) int64, -1 where absent."""

    @property
    def g_sorted(self) -> np.ndarray:
        """The global codes ascending: (V,) int64, host."""

    @property
    def g_order(self) -> np.ndarray:
        """The local id of each of :attr:`g_sorted`: (V,) int64, host."""

    def saved_layout(self) -> Any:
        """The compiled engine's block index saved with the segment's file, or None."""


class SegmentViewLike(Protocol):
    """A segment in a set: the segment and its tombstones.

    Attributes
    ----------
    seg : SegmentSource
    live : ndarray (n,), bool, host, or None
        False marks a deleted row; None: every row is live.
    n_live : int
    """

    seg: SegmentSource
    live: np.ndarray | None
    n_live: int


class SegmentSet(Protocol):
    """An immutable set of sealed segments with its statistics (:class:`gpuir.memory.snapshot.Snapshot`).

    Attributes
    ----------
    views : sequence of SegmentViewLike
    params : BM25Params
    n_docs : int
        N of the statistics (live records).
    avgdl : float
        Mean live document length of the statistics.
    df : (G,) int64 array-like, host
        Document frequency of each global term code under the statistics (indexable by an int64 array).
    own_stats : bool, optional (absent: False)
        True for a static index's set (:class:`gpuir.backends.onesegment.IndexSegmentSet`): one segment,
        no tombstones, under the segment's own statistics. The built-in engines then serve it through the
        segment scorer's static path (:func:`gpuir.backends.segment_engines.search_own`: the posting
        weights computed once under those statistics); any engine may search it as any other set.
    """

    views: Sequence[SegmentViewLike]
    params: BM25Params
    n_docs: int
    df: Any

    @property
    def avgdl(self) -> float:
        """The statistics' mean document length."""

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """Per-set state: ``make()`` on first use of ``key``, kept while the set lives (thread-safe)."""


#: An allow-list of one query: one (m,) int64 array of ascending rows per searched segment, in
#: ``view_ids`` order. Queries sharing one filter share one list object (engines may evaluate it once).
AllowList = Sequence[np.ndarray]


@dataclass
class QueryBatch:
    """A batch of queries with the segment set's statistics applied.

    Attributes
    ----------
    off : ndarray (B+1,), int64, host
        Query q's terms are ``[off[q], off[q+1])`` of the arrays below.
    gids : ndarray (T,), int64, host
        Each query's distinct terms as global term codes, in ascending term-string order; only
        terms with df > 0 under the statistics.
    mult : ndarray (T,), int64, host
        Occurrences of each term in its query.
    idf, w0 : ndarray (T,), float32, host
        :func:`gpuir.backends.weights.term_weights` of each term under the set's statistics.
    const : ndarray (B,), float32, host
        ``C`` of each query (added to every candidate's score when ``has_w0``).
    has_w0 : bool
        bm25l / bm25+ with delta > 0 (absent terms weigh ``w0``).
    theta : ndarray (B,), float64, host
        Nothing scoring below it is wanted (-inf: no bound).
    allow : list of (AllowList or None), length B, or None
        Each query's allowed rows per searched segment; None: every live row.
    """

    off: np.ndarray
    gids: np.ndarray
    mult: np.ndarray
    idf: np.ndarray
    w0: np.ndarray
    const: np.ndarray
    has_w0: bool
    theta: np.ndarray
    allow: list[AllowList | None] | None = None

    @property
    def size(self) -> int:
        """B, the number of queries."""
        return int(self.off.size - 1)

    def terms_of(self, q: int) -> slice:
        return slice(int(self.off[q]), int(self.off[q + 1]))

    def filtered(self) -> bool:
        """Whether any query has an allow-list."""
        return self.allow is not None and any(a is not None for a in self.allow)


@dataclass
class SegmentHits:
    """Each query's merged top k over the searched segments, best first.

    Attributes
    ----------
    seqs : ndarray (B, k), int64, host
        Sequence number of each hit; -1 pads.
    scores : ndarray (B, k), float32, host
        -inf pads. Score descending, then sequence number ascending.
    views : ndarray (B, k), int64, host
        Position of the hit's segment in ``segset.views``; -1 pads.
    rows : ndarray (B, k), int64, host
        Row of the hit in its segment; -1 pads.
    postings : ndarray (B,), int64, host
        Postings read for each query (an engine's own count: a measure of work, not part of the result).
    meta : dict
        What the engine says of its work (timings, counters; a static index's search passes its scorer's
        on to the user's ``SearchResults.meta``); empty by default, never part of the result.
    """

    seqs: np.ndarray
    scores: np.ndarray
    views: np.ndarray
    rows: np.ndarray
    postings: np.ndarray
    meta: dict = field(default_factory=dict)

    @classmethod
    def empty(cls, B: int, k: int) -> SegmentHits:
        return cls(np.full((B, k), -1, np.int64), np.full((B, k), -np.inf, np.float32),
                   np.full((B, k), -1, np.int64), np.full((B, k), -1, np.int64), np.zeros(B, np.int64))


class SegmentEngine(ABC):
    """One scoring engine behind the contract (see the module docstring)."""

    #: The engine's name (:func:`engine`).
    name: str = ""
    #: The concrete backend whose machinery it runs ("numpy", "numba" or "cupy").
    backend: str = ""

    @abstractmethod
    def search(self, segset: SegmentSet, view_ids: tuple[int, ...], batch: QueryBatch, k: int) -> SegmentHits:
        """Each query's top ``k`` over the views ``view_ids`` of ``segset`` (see the module docstring).

        Parameters
        ----------
        segset : SegmentSet
        view_ids : tuple of int
            Positions in ``segset.views``, each once (any order: the result does not depend on it).
        batch : QueryBatch
            B >= 1 queries; ``allow`` lists follow ``view_ids``.
        k : int
            >= 1.

        Returns
        -------
        SegmentHits
            (B, k) arrays on the host, -1 / -inf padded.
        """

    def prepare(self, seg: SegmentSource, params: BM25Params, cheap: bool = False) -> None:
        """Make now what this engine derives from a new sealed segment (a layout, a device copy), so that
        the first search meeting the segment pays nothing for it.

        The memory calls it off the search path, with the engine that served its latest search, before the
        segment is published: for the segments its merges make in the merge's thread, for those its adds
        make in the writer's call, with ``cheap`` (only what costs the writer little: an add's latency
        is a write's). It must not change any result: it only fills ``seg.cache`` earlier than the first
        search would. The default makes nothing.

        Parameters
        ----------
        seg : SegmentSource
            A sealed segment not yet in any published segment set.
        params : BM25Params
            The BM25 parameters of the sets that will hold it.
        cheap : bool
            Make only what is cheap to make (the writer's call): the rest is made by the first search.
        """

    def warm(self, segset: SegmentSet) -> None:
        """Make now what searches of every view of ``segset`` will share across its segments (a layout of
        several segments), off the search path: the memory calls it in a merge's thread once the merge's
        segment set is published (later sets holding the same segments reuse it). It must not change any
        result. The default makes nothing.

        Parameters
        ----------
        segset : SegmentSet
            A published segment set.
        """
        return


_registry: dict[str, Callable[[], SegmentEngine]] = {}
_instances: dict[str, SegmentEngine] = {}
_lock = threading.RLock()  # (a factory may ask for another engine: one wrapping a built-in)


def register_engine(name: str, factory: Callable[[], SegmentEngine]) -> None:
    """Register (or replace) the engine ``name``: ``factory()`` makes it on first use (one instance per
    name), and :func:`gpuir.backends.segment_engine` returns it -- before a built-in of that name (a
    device engine registers ``"cupy"`` this way)."""
    with _lock:
        _registry[name] = factory
        _instances.pop(name, None)


def registered(name: str, builtin: Callable[[str], SegmentEngine] | None = None) -> SegmentEngine | None:
    """The one instance of engine ``name``: a registered factory's, else ``builtin(name)``'s when given, else
    None (:func:`gpuir.backends.segment_engine` passes the built-ins)."""
    got = _instances.get(name)
    if got is not None:
        return got
    with _lock:
        got = _instances.get(name)
        if got is None:
            factory = _registry.get(name)
            if factory is not None:
                got = factory()
            elif builtin is not None:
                got = builtin(name)
            if got is not None:
                _instances[name] = got
    return got


def registered_names() -> tuple[str, ...]:
    """The names :func:`register_engine` added."""
    return tuple(_registry)


# --------------------------------------------------------------------------- what segment files and vectors need
# The memory's segment files keep the compiled engine's block index beside the postings, and its named
# embeddings are scored by the dense kernels: these are the functions it calls for them (imported lazily:
# numba and CuPy load only when used).


def device_arrays():
    """The CuPy module (dense work on the device); raises where CuPy is missing."""
    from . import dense

    return dense.cupy_module()


def first_bad_posting(offsets: np.ndarray, doc_ids: np.ndarray, tfs: np.ndarray, n_docs: int) -> int | None:
    """The first posting that breaks a segment's rules (rows in [0, n_docs), tf >= 1, rows ascending within a
    term), -1 when none, found by one compiled pass; None where numba does not import (check in NumPy then).

    ``offsets`` (V+1,) int64, ``doc_ids`` (P,) int32, ``tfs`` (P,) int32, host."""
    try:
        from .cpu_segments import first_bad_posting as fbp
    except ImportError:
        return None
    return int(fbp(offsets, doc_ids, tfs, n_docs))


def segment_file_layout(seg: SegmentSource) -> dict[str, np.ndarray]:
    """The compiled engine's block index of ``seg`` as a segment file keeps it
    (:func:`gpuir.backends.block_layout.saved_arrays`): the one its numba scorer laid out, else the one its
    file saved, else laid out now; empty without numba (the file is then written without one)."""
    from .block_layout import saved_arrays

    lay = None
    for key, sc in list(seg.cache.items()):
        if isinstance(key, tuple) and key[:2] == ("scorer", "numba") and getattr(sc, "layout", None) is not None:
            lay = sc.layout
            break
    if lay is None:
        lay = seg.saved_layout()
    if lay is None:
        from .._compat import numba_available

        if not numba_available()[0]:
            return {}
        from .block_layout import lay_out_segment

        csr = seg.csr
        lay = lay_out_segment(csr.offsets, csr.doc_ids, csr.tfs, csr.doc_lens, seg.n_docs)
        seg.keep_layout(lay)  # type: ignore[attr-defined]
    return saved_arrays(lay)


def segment_layout_from_file(get: Callable[[str], np.ndarray], contains: Callable[[str], bool],
                             offsets: np.ndarray, n_docs: int) -> Any:
    """The block index a segment file saved (:func:`gpuir.backends.block_layout.from_saved`), or None."""
    from .block_layout import from_saved

    return from_saved(get, contains, offsets, n_docs)


__all__ = [
    "BOUND_SLACK", "VECTOR_DTYPES", "AllowList", "QueryBatch", "SegmentEngine", "SegmentHits", "SegmentSet",
    "SegmentSource", "SegmentViewLike", "dense_scores", "dense_topk", "device_arrays", "first_bad_posting",
    "has_absent_weight", "normalize_rows", "register_engine", "registered", "registered_names",
    "segment_file_layout", "segment_layout_from_file", "term_weights", "weight_bound",
]
