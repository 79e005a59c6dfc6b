"""`Snapshot`: one consistent, immutable state of a memory, as every search sees it.

The writer never changes a published snapshot: it builds the next one (new
segment views, a :class:`~gpuir.memory.docfreq.DfTable` of the document
frequencies that shares everything unchanged with the previous one) and
publishes it with one attribute assignment. A search takes the current snapshot once, at its start,
and reads only that object, so it sees one state from beginning to end while
the writer adds, deletes and merges.

The collection statistics of a snapshot (N, df, avgdl) are those of its live
records, computed exactly as :class:`~gpuir.index.csr.CSRIndex` computes them for
an index built over those records.
"""

from __future__ import annotations

import threading
from typing import Any

from ..analysis import Analyzer
from ..bm25 import BM25Params
from .columns import Interner
from .docfreq import DfTable
from .segments import SegView


class Snapshot:
    """An immutable state of a memory.

    Attributes
    ----------
    version : int
        Increases with every published change.
    views : tuple of SegView
        Every segment with its live rows.
    partitions : list of (key, tuple of int)
        Time partitions, newest first (records without a time last, key None):
        each key with the positions in ``views`` of its segments.
    n_docs : int
        N, the number of live records.
    total_len : int
        Sum of the live records' document lengths (tokens).
    df : DfTable, shape (G,), int64, host
        Live document frequency of each global term code (0 for terms whose
        records were all deleted, and the memory's later terms are beyond G).
        Indexed like an ndarray (``df[gids]``); ``np.asarray(df)`` is the dense array.
    params : BM25Params
    analyzer_config : dict
    window_ms : int or None
        Time-partition width in milliseconds (None: one partition).
    terms : Interner
        Global term codes (shared, append-only).
    dicts : dict field -> Interner
        String-field dictionaries (shared, append-only).
    """

    def __init__(self, version: int, views: tuple[SegView, ...], n_docs: int, total_len: int, df: DfTable,
                 params: BM25Params, analyzer_config: dict, window_ms: int | None, terms: Interner,
                 dicts: dict[str, Interner]):
        self.version = version
        self.views = views
        self.n_docs = int(n_docs)
        self.total_len = int(total_len)
        self.df = df
        self.params = params
        self.analyzer_config = analyzer_config
        self.window_ms = window_ms
        self.terms = terms
        self.dicts = dicts
        groups: dict[Any, list[int]] = {}
        for i, v in enumerate(views):
            groups.setdefault(v.seg.partition, []).append(i)
        timed = sorted((k for k in groups if k is not None), reverse=True)
        self.partitions: list[tuple[int | None, tuple[int, ...]]] = [(k, tuple(groups[k])) for k in timed]
        if None in groups:
            self.partitions.append((None, tuple(groups[None])))
        self._lock = threading.Lock()
        self._cache: dict[Any, Any] = {}

    @property
    def avgdl(self) -> float:
        """Mean live document length, as :attr:`CSRIndex.avgdl <gpuir.index.csr.CSRIndex.avgdl>` computes it."""
        if self.n_docs == 0:
            return 1.0
        m = self.total_len / self.n_docs  # both exact in float64: one correctly rounded division, as np.mean
        return m if m > 0 else 1.0

    def __len__(self) -> int:
        return self.n_docs

    def __repr__(self) -> str:
        return (f"Snapshot(version={self.version}, n_docs={self.n_docs}, segments={len(self.views)}, "
                f"partitions={len(self.partitions)})")

    def cached(self, key: Any, make) -> Any:
        """A per-snapshot derived object (built once, under a lock: e.g. a segment's statistics view)."""
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]

    def live_records(self) -> list[tuple[int, int, int]]:
        """(seq, view position, row) of every live record, in add order."""
        out = []
        for vi, v in enumerate(self.views):
            rows = v.live_rows()
            out.extend(zip(v.seg.seqs[rows].tolist(), [vi] * rows.size, rows.tolist()))
        out.sort()
        return out

    def record(self, vi: int, row: int) -> dict:
        return self.views[vi].seg.record(row, self.dicts)


_local = threading.local()


def thread_analyzer(config: dict) -> Analyzer:
    """An :class:`Analyzer` private to the calling thread (its stem cache is not thread-safe)."""
    last = getattr(_local, "last", None)
    if last is not None and last[0] is config:  # the same config object as the last call: no key to make
        return last[1]
    cache = getattr(_local, "analyzers", None)
    if cache is None:
        cache = _local.analyzers = {}
    key = repr(sorted(config.items()))
    an = cache.get(key)
    if an is None:
        an = cache[key] = Analyzer(config)
    _local.last = (config, an)
    return an
