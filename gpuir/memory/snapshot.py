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
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..analysis import Analyzer
from ..bm25 import BM25Params
from .columns import Interner
from .docfreq import DfTable
from .records import MISSING_TIME, STRING_FIELDS
from .segments import SegView

#: The string columns :meth:`Snapshot.strings` reads: the stored strings and the dictionary-coded fields.
STRING_COLUMNS: tuple[str, ...] = ("id", "text", "metadata", *STRING_FIELDS)


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

    def records(self, vis: Sequence[int], rows: Sequence[int]) -> list[dict]:
        """The records at (view position, row) pairs, in that order: :meth:`record` of each, fetched segment
        by segment (:meth:`gpuir.memory.segments.Segment.records`)."""
        out: list[dict] = [None] * len(rows)  # type: ignore[list-item]
        by_view: dict[int, list[int]] = {}
        for j, v in enumerate(vis):
            by_view.setdefault(int(v), []).append(j)
        for v, js in by_view.items():
            got = self.views[v].seg.records(np.fromiter((rows[j] for j in js), np.int64, len(js)), self.dicts)
            for j, rec in zip(js, got):
                out[j] = rec
        return out

    # ------------------------------------------------------------------ columns by sequence number
    def locate(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the live records with sequence numbers ``seqs`` are: one binary search per segment.

        Parameters
        ----------
        seqs : ndarray, shape (m,), int, host, any order

        Returns
        -------
        views, rows : ndarrays, shape (m,), int64, host
            The position in :attr:`views` and the row of each record; -1 and -1 where
            ``seqs[i]`` is no live record of this snapshot.
        """
        seqs = np.asarray(seqs, dtype=np.int64).reshape(-1)
        vi = np.full(seqs.size, -1, dtype=np.int64)
        rows = np.full(seqs.size, -1, dtype=np.int64)
        if not seqs.size:
            return vi, rows
        lo, hi = int(seqs.min()), int(seqs.max())
        for i, v in enumerate(self.views):
            s = v.seg.seqs
            if not s.size or hi < s[0] or lo > s[-1]:
                continue
            pos = np.minimum(np.searchsorted(s, seqs), s.size - 1)
            hit = s[pos] == seqs
            if v.live is not None:
                hit &= v.live[pos]
            vi[hit] = i
            rows[hit] = pos[hit]
        return vi, rows

    def _gather(self, seqs: np.ndarray, read) -> list:
        """``read(segment, rows)`` (a list per row) of each live record of ``seqs``, None for the others."""
        vi, rows = self.locate(seqs)
        out: list = [None] * vi.size
        for i in np.unique(vi[vi >= 0]).tolist():
            at = np.flatnonzero(vi == i)
            for j, x in zip(at.tolist(), read(self.views[i].seg, rows[at])):
                out[j] = x
        return out

    def strings(self, field: str, seqs: np.ndarray) -> list[str | None]:
        """One string column of the records with sequence numbers ``seqs`` (vectorised per segment).

        Parameters
        ----------
        field : one of :data:`STRING_COLUMNS`
            ``"id"``, ``"text"``, ``"metadata"`` (the compact JSON as stored, ``""`` when
            absent; it may hold ``expires_at``: :func:`~gpuir.memory.records.make_record`
            reads it), or a dictionary-coded field (``"session"``, ``"tenant"``, ...:
            None when the record has none).
        seqs : ndarray, shape (m,), int, host

        Returns
        -------
        list of m (str or None): None also where ``seqs[i]`` is no live record.
        """
        if field in ("id", "text", "metadata"):
            col = {"id": "ids", "text": "texts", "metadata": "meta"}[field]
            return self._gather(seqs, lambda seg, rows: getattr(seg, col).take(rows).tolist())
        if field not in STRING_FIELDS:
            raise ValueError(f"no string column {field!r}: choose one of {', '.join(STRING_COLUMNS)}")
        values = self.dicts[field].values

        def read(seg, rows):
            return [None if c < 0 else values[c] for c in seg.codes[field][rows].tolist()]

        return self._gather(seqs, read)

    def times(self, seqs: np.ndarray) -> np.ndarray:
        """The time column of the records with sequence numbers ``seqs``.

        Returns
        -------
        ndarray, shape (m,), int64, host: epoch ms; :data:`~gpuir.memory.records.MISSING_TIME`
        where a record has no time or ``seqs[i]`` is no live record.
        """
        vi, rows = self.locate(seqs)
        out = np.full(vi.size, MISSING_TIME, dtype=np.int64)
        for i in np.unique(vi[vi >= 0]).tolist():
            at = np.flatnonzero(vi == i)
            out[at] = self.views[i].seg.time[rows[at]]
        return out


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
