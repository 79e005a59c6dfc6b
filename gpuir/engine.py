"""`BM25Index`: the user-facing sparse engine (analyse, index, search, save, load).

A `BM25Index` is a snapshot of one sealed segment searched through the segment-set
contract (:mod:`gpuir.backends.contract`), as a :class:`gpuir.Memory` snapshot of
many is: :meth:`BM25Index.search` hands the engine serving the backend
(:func:`gpuir.backends.engine_for`) the index as an
:class:`~gpuir.backends.onesegment.IndexSegmentSet` -- its CSR as the one segment,
no tombstones, its own statistics -- and the batch weighed under them. The
engines serve such a set through the segment's scorer and its cache of posting
weights computed once (:func:`gpuir.backends.segment_engines.search_own`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .analysis import Analyzer
from .backends import engine_for, make_scorer, resolve_backend
from .backends.base import Scorer
from .backends.onesegment import IndexSegmentSet
from .bm25 import BM25Params
from .filters import is_where, normalize_filters, where_to_filters
from .index.build import DEFAULT_CHUNK_SIZE, build_csr
from .index.csr import CSRIndex
from .index.storage import DEFAULT_LOCK_TIMEOUT, IndexFormatError, load_index, save_index
from .results import SearchResults, empty_results

log = logging.getLogger(__name__)  # gpuir.engine


def _checked_ids(ids: Iterable[str]) -> Iterator[str]:
    """``ids``, refusing any item that is not a str (TypeError naming its position)."""
    for i, d in enumerate(ids):
        if not isinstance(d, str):
            raise TypeError(f"ids[{i}] is a {type(d).__name__} ({d!r}); ids must be str (convert them with str())")
        yield d


class BM25Index:
    """A BM25 index over a document collection, searchable on any backend.

    Build one with :meth:`build`, or load one with :meth:`load`. Searching one
    index from many threads at once is safe and returns what a serial search
    returns (see docs/guarantees.md).

    Parameters
    ----------
    csr : CSRIndex
        The inverted index arrays (host, possibly memory-mapped).
    params : BM25Params
        BM25 variant and parameters.
    """

    def __init__(self, csr: CSRIndex, params: BM25Params | None = None):
        self.csr = csr
        self.params = params or BM25Params()
        self.analyzer = Analyzer(csr.analyzer or "default")
        self._scorers: dict[tuple, Scorer] = {}  # scorers made with options (scorer(backend, **opts))
        self._scorers_lock = threading.Lock()  # one per key (and one segment set), even when threads race
        self._segset: IndexSegmentSet | None = None
        self._id_to_num: dict[str, int] | None = None

    # -- construction ------------------------------------------------------------
    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        ids: Sequence[str] | Iterable[str] | None = None,
        analyzer: str | dict | Analyzer = "default",
        method: str = "lucene",
        k1: float = 1.2,
        b: float = 0.75,
        delta: float = 0.5,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        progress: bool | None = None,
    ) -> BM25Index:
        """Index a stream of documents (see :func:`gpuir.index.build.build_csr`).

        Parameters
        ----------
        texts : iterable of str
            One text per document (a bare str is refused: it is not a corpus).
        ids : sequence of str, optional
            Unique user ids (str), one per document; default "0", "1", ...
        analyzer : analyzer name (see :data:`gpuir.analysis.ANALYZERS`), config or Analyzer
        method, k1, b, delta : BM25 variant and parameters (see :class:`BM25Params`)
        chunk_size : int
            Documents per build chunk.
        progress : bool or None
            Progress bar; None shows one on a terminal only.

        Raises
        ------
        TypeError
            ``texts`` or ``ids`` is a bare str (or bytes), or an id is not a str.
        ValueError
            Parameters out of range (see :class:`BM25Params`), empty corpus, ids not unique.
        """
        for name, val in (("texts", texts), ("ids", ids)):
            if isinstance(val, (str, bytes)):
                raise TypeError(
                    f"{name} must be an iterable of str, one per document, not a single "
                    f"{type(val).__name__}: wrap it in a list ([{name[:-1]}])"
                )
        params = BM25Params(method=method, k1=k1, b=b, delta=delta)
        if ids is not None:
            ids = _checked_ids(ids)
        t0 = time.perf_counter()
        csr = build_csr(texts, analyzer, ids=ids, chunk_size=chunk_size, progress=progress)
        log.info("built an index of %d documents, %d terms, %d postings in %.2f s", csr.n_docs, csr.n_terms,
                 csr.n_postings, time.perf_counter() - t0)
        return cls(csr, params)

    def with_params(self, **changes: Any) -> BM25Index:
        """The same index arrays under other BM25 parameters (no copy)."""
        return BM25Index(self.csr, replace(self.params, **changes))

    # -- properties ----------------------------------------------------------------
    @property
    def ids(self) -> list[str]:
        """The user's id of each document, indexed by document number."""
        return self.csr.ids

    @property
    def n_docs(self) -> int:
        return self.csr.n_docs

    def __len__(self) -> int:
        return self.csr.n_docs

    def __repr__(self) -> str:
        return (
            f"BM25Index(n_docs={self.csr.n_docs}, n_terms={self.csr.n_terms}, "
            f"n_postings={self.csr.n_postings}, {self.params}, analyzer={self.analyzer!r})"
        )

    @property
    def id_to_num(self) -> dict[str, int]:
        """User id -> document number."""
        if self._id_to_num is None:
            self._id_to_num = {d: i for i, d in enumerate(self.csr.ids)}
        return self._id_to_num

    # -- search --------------------------------------------------------------------
    def segment_set(self) -> IndexSegmentSet:
        """The index as the contract's segment set (one segment, its own statistics; made once): what
        :meth:`search` hands the engine."""
        ss = self._segset
        if ss is None:
            with self._scorers_lock:
                if self._segset is None:
                    self._segset = IndexSegmentSet(self.csr, self.params)
                ss = self._segset
        return ss

    def scorer(self, backend: str = "auto", **opts: Any) -> Scorer:
        """The cached :class:`Scorer` for a backend ("auto" resolves first).

        Without ``opts``: the scorer the engines search the index with
        (:meth:`gpuir.backends.onesegment.IndexSegmentSet.scorer`). With ``opts``
        (:func:`gpuir.backends.make_scorer`'s): a scorer of its own, made once per options.
        """
        name, _ = resolve_backend(backend)
        if not opts:
            return self.segment_set().scorer(name)
        try:
            key = (name, self.params, tuple(sorted(opts.items())))
            hash(key)
        except TypeError:  # (an unhashable option: a scorer made for this call)
            return make_scorer(name, self.csr, self.params, **opts)
        sc = self._scorers.get(key)
        if sc is None:
            with self._scorers_lock:
                sc = self._scorers.get(key)
                if sc is None:
                    sc = self._scorers[key] = make_scorer(name, self.csr, self.params, **opts)
        return sc

    def query_terms(self, queries: Sequence[str]) -> list[np.ndarray]:
        """Analyse queries into term ids (repeats kept, unknown terms dropped).

        Returns
        -------
        list of ndarray (n_i,), int64, host
        """
        return [self.csr.term_ids(self.analyzer(q)) for q in queries]

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        where: Any = None,
        backend: str = "auto",
        *,
        filters: Any = None,
    ) -> SearchResults:
        """Top-k documents of each query.

        Parameters
        ----------
        queries : str or sequence of B str
        k : int
            Results per query, >= 1. It may exceed the number of documents N:
            it is clamped to N (at least 1) before anything is allocated, so
            the results then have N columns, not k.
        where : None, dict, or list of B (dict or None)
            Which documents each query may return, applied before top-k, in the
            ``where`` vocabulary of every gpuir search; a static index's one field is
            ``id``: ``{"id": "d1"}``, ``{"id": {"in": [...]}}``, ``{"id": {"nin": [...]}}``
            (unknown ids match nothing). See :func:`gpuir.filters.where_to_filters`.
        backend : {"auto", "numpy", "cupy"}
        filters : optional, keyword only
            The internal allow-list form (what ``where`` becomes): one NumPy bool
            mask (N,) or allow-list for all queries, or a list of B items, each None,
            a bool mask (N,), or an allow-list of document numbers (int) or user ids
            (str); :func:`gpuir.filters.normalize_filters`. Not with ``where``.

        Returns
        -------
        SearchResults
            ids (B, min(k, max(N, 1))) int64 document numbers (map with ``self.ids``; -1 pads a
            row with fewer matches), scores of the same shape, float32, on the host; ``meta["backend"]`` and ``meta["backend_reason"]``
            say what ran and why; ``hits(i)`` gives query ``i``'s hits as ``{"id", "score"}`` dicts and
            ``ids(i)`` its user ids, as every search of the package (``doc_ids`` is ``self.ids``).
        """
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, Sequence):
            raise TypeError(f"queries must be a str or a sequence of str, got {type(queries).__name__}")
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        bad = [i for i, q in enumerate(queries) if not isinstance(q, str)]
        if bad:
            raise TypeError(f"query {bad[0]} is a {type(queries[bad[0]]).__name__}; queries must be str")
        name, reason = resolve_backend(backend)
        if where is not None and not is_where(where):  # an allow-list given where ``filters`` used to be
            if filters is not None:
                raise TypeError("give where= (a dict like {'id': {'in': [...]}}) or filters=, not both")
            warnings.warn("an allow-list or mask as BM25Index.search's third argument is deprecated: pass "
                          "where={'id': {'in': [...]}} (or filters=... by keyword)", DeprecationWarning, stacklevel=2)
            where, filters = None, where
        if where is not None and filters is not None:
            raise TypeError("give where= or filters=, not both")
        if where is not None:
            allow = where_to_filters(where, len(queries), self.n_docs, self.id_to_num)
        else:
            allow = normalize_filters(filters, len(queries), self.n_docs, self.id_to_num)
        t0 = time.perf_counter()
        terms = self.query_terms(queries)
        t_an = time.perf_counter() - t0
        k = min(int(k), max(self.n_docs, 1))  # nothing anywhere is sized by a huge k
        if not queries:
            res = empty_results(0, k)
        else:  # through the contract: a snapshot of one segment under its own statistics
            segset = self.segment_set()
            hits = engine_for(name).search(segset, (0,), segset.batch(terms, allow), k)
            res = SearchResults(hits.rows, hits.scores, hits.meta)
        res.meta.setdefault("timings", {})["analyze_s"] = t_an
        res.meta.update(backend=name, backend_reason=reason)
        res.set_doc_ids(self.ids)
        log.debug("searched %d queries (k=%d) on %s in %.4f s: %s", len(queries), k, name,
                  time.perf_counter() - t0, reason)
        return res

    # -- persistence -----------------------------------------------------------------
    def save(self, path: str | os.PathLike, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        """Save atomically to directory ``path`` (see :mod:`gpuir.index.storage`).

        Parameters
        ----------
        path : directory: new, empty, or a gpuir index (never a folder of other files)
        lock_timeout : float
            Seconds to wait while another writer saves into ``path``.

        Raises
        ------
        StoreError
            (a ValueError) the path cannot hold an index, another writer holds it,
            or the file system refused a write; the previous index is intact.
        """
        save_index(self.csr, path, extra={"bm25": self.params.to_dict()}, lock_timeout=lock_timeout)
        log.info("saved the index (%d documents) to %s", self.n_docs, path)

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = True, verify: bool = True) -> BM25Index:
        """Load an index saved by :meth:`save`.

        Parameters
        ----------
        path : index directory
        mmap : bool
            Memory-map the arrays read-only.
        verify : bool
            Check the files' sha256 checksums (reads every byte once).
        """
        csr, manifest = load_index(path, mmap=mmap, verify=verify)
        try:
            params = BM25Params.from_dict(manifest.get("bm25", {}))
        except (ValueError, TypeError) as e:
            raise IndexFormatError(f"{path}: the manifest's bm25 parameters are invalid ({e}); rebuild the index") from None
        log.info("loaded the index at %s: %d documents (mmap=%s, verify=%s)", path, csr.n_docs, mmap, verify)
        try:
            return cls(csr, params)
        except (ValueError, TypeError) as e:
            raise IndexFormatError(f"{path}: the manifest's analyzer is invalid ({e}); rebuild the index") from None
