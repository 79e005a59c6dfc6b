"""Immutable segments: a CSR inverted index over some records plus their columns.

A memory is a set of segments (log-structured: every ``add`` writes new ones,
merges replace several by one). A :class:`Segment` never changes once built;
deletions live beside it, in the :class:`SegView` of a snapshot (a boolean
``live`` mask, copied on write), and merges purge them.

Document numbers inside a segment follow the records' sequence numbers (``seqs``,
the global add order), so the tie rule "higher score, then lower document
number" of a fresh index over the live records is "higher score, then lower
sequence number" here, segment by segment and across segments.

Terms: each segment's vocabulary is sorted (it is a :class:`CSRIndex` built by
:func:`gpuir.index.build.build_csr` or merged here), so ascending local term ids
are ascending strings, the order in which a fresh index sums a document's
weights. ``l2g`` maps local term ids to the memory's global term codes (an
:class:`~gpuir.memory.columns.Interner`), by which global document frequencies
are kept.

Per term, ``maxtf`` (largest tf) and ``mindl`` (shortest document) bound every
posting weight of the term under any collection statistics (BM25's
term-frequency component grows with tf and shrinks with document length:
:func:`gpuir.backends.weights.weight_bound`); the time partitions use them (see
:mod:`gpuir.memory.partitions`).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Mapping
from dataclasses import replace
from itertools import islice
from typing import Any

import numpy as np

from ..analysis import Analyzer
from ..backends import contract
from ..index.build import build_csr
from ..index.csr import CSRIndex
from . import warmup
from .columns import Interner, StrArray, TermStrings
from .records import MISSING_TIME, STRING_FIELDS, RecordBatch, make_record
from .termorder import sort_codes

_UNREAD = object()  # an attribute not read from the segment's file yet


class Segment:
    """An immutable CSR segment over n records and their columns.

    A segment is built in memory (:func:`build_segment`, :func:`merge_segments`)
    or opened from its file (:func:`segment_from_file`): then only the small
    columns a memory needs at once (sequence numbers, ids, the vocabulary's
    global codes, the string fields' dictionaries) are read when it opens, and
    every other attribute below is mapped from the file the first time it is
    used (see :mod:`gpuir.memory.segfile`): its bytes are checked then, once,
    and a damaged file raises the error the memory gave (naming the file)
    before any caller sees its data.

    Attributes
    ----------
    uid : int
        Unique within the memory; names the segment's file.
    partition : int or None
        Time partition key (``time // window``), None for records without a time.
    csr : CSRIndex
        Sorted vocabulary; document number = row; ``csr.ids`` is :attr:`ids`.
    seqs : ndarray, shape (n,), int64, host
        Sequence number (global add order) of each row, ascending.
    ids, texts, meta : StrArray, length n
        Record ids, texts and compact-JSON metadata (``""`` when absent).
    codes : dict field -> ndarray, shape (n,), int32, host
        Dictionary codes of each :data:`~gpuir.memory.records.STRING_FIELDS`
        field in the memory's interner for it (-1 = absent).
    time : ndarray, shape (n,), int64, host
        Epoch milliseconds (:data:`~gpuir.memory.records.MISSING_TIME` = absent).
    importance : ndarray, shape (n,), float64, host
        NaN = absent.
    l2g : ndarray, shape (V,), int64, host
        Global term code of each local term.
    maxtf, mindl : ndarray, shape (V,), int32, host
        Largest term frequency and shortest document length among each term's postings.
    vector_names : tuple of str
        The named embeddings this segment carries a column of (:meth:`vectors`).
    """

    __slots__ = (
        "_codes",
        "_csr",
        "_g_lookup",
        "_importance",
        "_layout",
        "_loader",
        "_lock",
        "_maxtf",
        "_meta",
        "_mindl",
        "_texts",
        "_time",
        "_vectors",
        "cache",
        "df",
        "ids",
        "l2g",
        "length",
        "n_docs",
        "partition",
        "seqs",
        "time_max",
        "time_min",
        "uid",
        "vector_names",
    )

    def __init__(self, uid: int, partition: int | None, csr: CSRIndex | None, seqs: np.ndarray, texts: StrArray | None,
                 meta: StrArray | None, codes: dict[str, np.ndarray] | None, time: np.ndarray | None,
                 importance: np.ndarray | None, l2g: np.ndarray, *, ids: StrArray | None = None,
                 n_docs: int | None = None, time_range: tuple[int | None, int | None] | None = None,
                 maxtf: np.ndarray | None = None, mindl: np.ndarray | None = None, loader: Any = None,
                 df: np.ndarray | None = None, length: int | None = None,
                 vectors: Mapping[str, np.ndarray] | None = None, vector_names: tuple[str, ...] | None = None):
        self.uid = int(uid)
        self._vectors: dict[str, np.ndarray] = dict(vectors or {})
        self.vector_names: tuple[str, ...] = tuple(sorted(vector_names if vector_names is not None
                                                          else self._vectors))
        self.partition = partition
        self._csr = csr
        self.ids: StrArray = ids if ids is not None else csr.ids  # type: ignore[assignment,union-attr]
        self.n_docs = int(n_docs if n_docs is not None else csr.n_docs)  # type: ignore[union-attr]
        self.seqs = seqs
        self._texts, self._meta, self._codes = texts, meta, codes
        self._time, self._importance = time, importance
        self._maxtf, self._mindl = maxtf, mindl
        self._loader = loader  # name -> value, for attributes read from the file on first use
        self._layout: Any = _UNREAD  # the block index its file saved (None: none), read on first use
        self._lock = threading.RLock()
        self.l2g = np.asarray(l2g, dtype=np.int64)
        self._g_lookup: tuple[np.ndarray, np.ndarray] | None = None  # (g_sorted, g_order): on first lookup
        if time_range is None:
            timed = time[time != MISSING_TIME]  # type: ignore[index]
            time_range = (int(timed.min()), int(timed.max())) if timed.size else (None, None)
        self.time_min, self.time_max = time_range
        #: Document frequency of each local term (all rows): ndarray (V,), int64.
        self.df = np.diff(csr.offsets) if df is None else np.asarray(df, dtype=np.int64)  # type: ignore[union-attr]
        #: Sum of every row's document length.
        self.length = int(csr.doc_lens.sum(dtype=np.int64) if length is None else length)  # type: ignore[union-attr]
        #: Derived structures built on first use (filter indexes, metadata columns, and the
        #: segment's scorer of each backend: :func:`gpuir.memory.search.segment_scorer`).
        self.cache: dict[Any, Any] = {}

    # --------------------------------------------------------- attributes read on first use
    def _get(self, slot: str):
        """The value of ``slot``, loading it (once, under a lock) when the segment was opened from a file."""
        with self._lock:
            v = getattr(self, slot)
            if v is None:
                if slot in ("_maxtf", "_mindl"):
                    v = self._loader("maxtf_mindl") if self._loader is not None else None
                    if v is None:
                        v = term_maxima(self.csr)
                    self._maxtf, self._mindl = v
                    return getattr(self, slot)
                if self._loader is None:
                    raise AttributeError(f"segment {self.uid} has no {slot[1:]}")
                v = self._loader(slot[1:])
                setattr(self, slot, v)
            return v

    @property
    def csr(self) -> CSRIndex:
        v = self._csr
        return v if v is not None else self._get("_csr")

    @property
    def texts(self) -> StrArray:
        v = self._texts
        return v if v is not None else self._get("_texts")

    @property
    def meta(self) -> StrArray:
        v = self._meta
        return v if v is not None else self._get("_meta")

    @property
    def codes(self) -> dict[str, np.ndarray]:
        v = self._codes
        return v if v is not None else self._get("_codes")

    @property
    def time(self) -> np.ndarray:
        v = self._time
        return v if v is not None else self._get("_time")

    @property
    def importance(self) -> np.ndarray:
        v = self._importance
        return v if v is not None else self._get("_importance")

    @property
    def maxtf(self) -> np.ndarray:
        v = self._maxtf
        return v if v is not None else self._get("_maxtf")

    @property
    def mindl(self) -> np.ndarray:
        v = self._mindl
        return v if v is not None else self._get("_mindl")

    def saved_layout(self) -> Any:
        """The block index the segment's file saved (:class:`~gpuir.backends.block_layout.BlockLayout`, read
        and checked on first use; for a segment built in memory, the one :meth:`layout_arrays` made for its
        file), or None: none made yet, or a file without one (older files, or saved with another block
        size: the scorer lays the segment out then)."""
        v = self._layout
        if v is _UNREAD:
            with self._lock:
                v = self._layout
                if v is _UNREAD:
                    v = self._loader("block_layout") if self._loader is not None else None
                    if self._loader is not None:
                        self._layout = v
        return v

    def layout_arrays(self) -> dict[str, np.ndarray]:
        """The block index as its file keeps it (:func:`gpuir.backends.contract.segment_file_layout`): the one
        the segment's compiled scorer laid out, else the one its file saved, else laid out now; empty
        without numba (the file is then written without it, as before)."""
        return contract.segment_file_layout(self)

    def keep_layout(self, lay: Any) -> None:
        """Keep the block index laid out for the segment's file (its scorer takes it: not laid out twice)."""
        with self._lock:
            self._layout = lay

    def vectors(self, name: str) -> np.ndarray:
        """The column of embedding ``name``: ndarray, shape (n, dim), float32 or float16, host (read-only,
        mapped from the file when the segment was opened), one L2-normalised row per record."""
        v = self._vectors.get(name)
        if v is not None:
            return v
        if name not in self.vector_names:
            raise KeyError(f"segment {self.uid} has no vectors of embedding {name!r}")
        with self._lock:
            v = self._vectors.get(name)
            if v is None:
                v = self._vectors[name] = self._loader(("vectors", name))
            return v

    def with_vectors(self, uid: int, vectors: Mapping[str, np.ndarray]) -> Segment:
        """A copy of this segment under ``uid`` that also carries ``vectors`` (name -> (n, dim) array).

        Everything else is shared (arrays are immutable; what is still in the
        file is read from it on first use, as here).
        """
        new = Segment.__new__(Segment)
        for slot in Segment.__slots__:
            setattr(new, slot, getattr(self, slot))
        new.uid = int(uid)
        new._lock = threading.RLock()
        new.cache = {}
        mine = {n: self.vectors(n) for n in self.vector_names}
        for n, v in vectors.items():
            if v.shape[0] != self.n_docs:
                raise ValueError(f"vectors {n!r}: {v.shape[0]} rows for {self.n_docs} records")
            mine[n] = v
        new._vectors = mine
        new.vector_names = tuple(sorted(mine))
        return new

    @property
    def n_terms(self) -> int:
        return int(self.l2g.shape[0])

    @property
    def loaded(self) -> list[str]:
        """The lazily read attributes already in use (for tests and benchmarks)."""
        return [s[1:] for s in ("_csr", "_texts", "_meta", "_codes", "_time", "_importance", "_maxtf")
                if getattr(self, s) is not None]

    def __repr__(self) -> str:
        return f"Segment(uid={self.uid}, partition={self.partition}, n_docs={self.n_docs}, n_terms={self.n_terms})"

    def _lookup(self) -> tuple[np.ndarray, np.ndarray]:
        """(g_sorted, g_order), made on first use: a segment merged away before any search never needs them.
        Two threads may both make them; the results are equal, and either is kept."""
        lk = self._g_lookup
        if lk is None:
            order = np.argsort(self.l2g, kind="stable")
            lk = self._g_lookup = (self.l2g[order], order)
        return lk

    @property
    def g_sorted(self) -> np.ndarray:
        """The segment's global term codes, ascending: ndarray (V,), int64, host."""
        return self._lookup()[0]

    @property
    def g_order(self) -> np.ndarray:
        """The local term id of each of :attr:`g_sorted`: ndarray (V,), int64, host."""
        return self._lookup()[1]

    def local_terms(self, gids: np.ndarray) -> np.ndarray:
        """Local term ids of global term codes ``gids`` (ndarray (m,), int64); -1 where absent."""
        g_sorted, g_order = self._lookup()
        if g_sorted.size == 0:
            return np.full(gids.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(g_sorted, gids), g_sorted.size - 1)
        return np.where(g_sorted[pos] == gids, g_order[pos], -1)

    def record(self, row: int, dicts: dict[str, Interner]) -> dict[str, Any]:
        """Row ``row`` as a record dict (absent fields left out)."""
        codes = self.codes
        strings = {f: (None if (c := int(codes[f][row])) < 0 else dicts[f].values[c]) for f in STRING_FIELDS}
        return make_record(self.ids[row], self.texts[row], strings, int(self.time[row]),
                           float(self.importance[row]), self.meta[row])

    def records(self, rows: np.ndarray, dicts: dict[str, Interner]) -> list[dict[str, Any]]:
        """Rows ``rows`` (ndarray (m,), int, host) as record dicts, in that order: :meth:`record` of each, with
        each column read once for all of them (a search's k hits cost a few array reads, not a few per hit)."""
        rows = np.asarray(rows, dtype=np.int64)
        codes = self.codes
        cols = [[None if c < 0 else dicts[f].values[c] for c in codes[f][rows].tolist()] for f in STRING_FIELDS]
        strings = [dict(zip(STRING_FIELDS, got)) for got in zip(*cols)]
        return [make_record(*a) for a in zip(self.ids.get_many(rows), self.texts.get_many(rows), strings,
                                              self.time[rows].tolist(), self.importance[rows].tolist(),
                                              self.meta.get_many(rows))]

    def rows_with_codes(self, field: str, codes: np.ndarray) -> np.ndarray:
        """Rows whose ``field`` code is in ``codes``: ndarray (m,), int64, ascending.

        Uses a per-segment index (rows sorted by code), built once.
        """
        key = ("codes_index", field)
        idx = self.cache.get(key)
        if idx is None:
            col = self.codes[field]
            order = np.argsort(col, kind="stable")
            lim = np.iinfo(col.dtype)
            idx = (order, col[order], int(lim.min), int(lim.max))
            self.cache[key] = idx
        order, sorted_codes, lo_code, hi_code = idx
        codes = np.asarray(codes, dtype=np.int64)
        # keys of the column's own dtype: int64 keys would make searchsorted cast the whole sorted column
        # (a copy of every row) on each call -- 20-40 us a segment of 40k rows, twice per segment of every
        # tenant's search (a 1M-record memory: 56 copies a question)
        if codes.size == 1:  # (a tenant's search: one code, as a scalar of the column's dtype)
            c = int(codes[0])
            if not lo_code <= c <= hi_code:
                return np.zeros(0, np.int64)
            c = sorted_codes.dtype.type(c)
            return order[int(sorted_codes.searchsorted(c, "left")): int(sorted_codes.searchsorted(c, "right"))] \
                .astype(np.int64)
        codes = codes[(codes >= lo_code) & (codes <= hi_code)].astype(sorted_codes.dtype)
        lo = np.searchsorted(sorted_codes, codes, side="left")
        hi = np.searchsorted(sorted_codes, codes, side="right")
        parts = [order[a:b] for a, b in zip(lo.tolist(), hi.tolist()) if b > a]
        return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)


class LazyColumns(Mapping):
    """A read-only mapping name -> array whose arrays are made on first access (once, thread-safe)."""

    __slots__ = ("_done", "_lock", "_make", "_names")

    def __init__(self, names: tuple[str, ...], make):
        self._names, self._make = tuple(names), make
        self._done: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> np.ndarray:
        a = self._done.get(name)
        if a is not None:
            return a
        if name not in self._names:
            raise KeyError(name)
        with self._lock:
            a = self._done.get(name)
            if a is None:
                a = self._done[name] = self._make(name)
            return a

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def term_maxima(csr: CSRIndex) -> tuple[np.ndarray, np.ndarray]:
    """``maxtf`` and ``mindl`` of every term of ``csr``: ndarrays (V,), int32 (zeros for a term without postings)."""
    V = csr.n_terms
    if not (V and csr.n_postings):
        return np.zeros(V, np.int32), np.zeros(V, np.int32)
    starts = np.asarray(csr.offsets[:-1])
    if np.any(np.diff(csr.offsets) == 0):
        raise ValueError("a term without postings")
    maxtf = np.maximum.reduceat(csr.tfs, starts).astype(np.int32)
    mindl = np.minimum.reduceat(csr.doc_lens[csr.doc_ids], starts).astype(np.int32)
    return maxtf, mindl


class SegView:
    """A segment as one snapshot sees it: which of its rows are live.

    Attributes
    ----------
    seg : Segment
    live : ndarray, shape (n,), bool, host, or None
        None when every row is live. Never modified: a deletion makes a new view.
    n_live : int
    cache : dict
        Per-view derived structures.
    """

    __slots__ = ("cache", "live", "n_live", "seg")

    def __init__(self, seg: Segment, live: np.ndarray | None = None):
        self.seg = seg
        if live is not None and bool(live.all()):
            live = None
        self.live = live
        self.n_live = seg.n_docs if live is None else int(np.count_nonzero(live))
        self.cache: dict[Any, Any] = {}

    def live_rows(self) -> np.ndarray:
        """ndarray (n_live,), int64: the live rows, ascending."""
        if self.live is None:
            return np.arange(self.seg.n_docs, dtype=np.int64)
        return np.flatnonzero(self.live).astype(np.int64)

    def live_df(self) -> np.ndarray:
        """Document frequency of each local term over the live rows: ndarray (V,), int64."""
        if self.live is None:
            return self.seg.df
        csr = self.seg.csr
        alive = self.live[csr.doc_ids]
        term_of = np.repeat(np.arange(csr.n_terms, dtype=np.int64), np.diff(csr.offsets))
        return np.bincount(term_of[alive], minlength=csr.n_terms).astype(np.int64)

    def live_length(self) -> int:
        """Sum of the live rows' document lengths."""
        if self.live is None:
            return self.seg.length
        dead = np.flatnonzero(~self.live)  # usually the few: gathers only their lengths
        return self.seg.length - int(self.seg.csr.doc_lens[dead].sum(dtype=np.int64))


def build_segment(uid: int, partition: int | None, batch: RecordBatch, seqs: np.ndarray, analyzer: Analyzer,
                  terms: Interner, dicts: dict[str, Interner],
                  vectors: Mapping[str, np.ndarray] | None = None) -> Segment:
    """A segment over the records of ``batch`` (all of one partition), in batch order.

    Parameters
    ----------
    seqs : ndarray, shape (len(batch),), int64, ascending
        Their sequence numbers.
    terms, dicts : the memory's interners (new terms and values are added).
    vectors : dict name -> ndarray (len(batch), dim), float32 or float16, optional
        The records' vectors of each named embedding, normalised.
    """
    ids = StrArray.from_list(batch.ids)
    csr = build_csr(batch.texts, analyzer, ids=batch.ids, progress=False)
    csr = replace(csr, ids=ids)
    l2g = terms.codes(csr.vocab, dtype=np.int64)
    codes = {f: dicts[f].codes(batch.strings[f]) for f in STRING_FIELDS}
    return Segment(uid, partition, csr, np.asarray(seqs, dtype=np.int64), StrArray.from_list(batch.texts),
                   StrArray.from_list(batch.metadata), codes, batch.time.copy(), batch.importance.copy(), l2g,
                   vectors=vectors)


def merge_segments(views: list[SegView], uid: int, partition: int | None, terms: Interner,
                   check: Any = None, keys: np.ndarray | None = None) -> Segment:
    """One segment holding the live rows of ``views``, in sequence order; tombstones are purged.

    The result equals a segment built from those records (same vocabulary,
    postings, lengths, columns), without analysing any text again. It reads
    only the segments and the append-only ``terms`` (never the writer's other
    state), so it may run in a background thread while the writer works.
    ``check``, when given, is called between steps (it may raise to abandon the merge).
    ``keys`` (:attr:`gpuir.memory.termorder.TermOrder.keys`, covering every input's terms), when
    given, orders the merged vocabulary with few string comparisons.
    """
    check = check or (lambda: None)
    if not views:
        raise ValueError("nothing to merge")
    # inputs in the order of their first live record: consecutive adds then need no reordering at all
    rows_of = [v.live_rows() for v in views]
    first = [int(v.seg.seqs[r[0]]) if r.size else -1 for v, r in zip(views, rows_of)]
    perm_in = sorted(range(len(views)), key=first.__getitem__)
    views = [views[i] for i in perm_in]
    rows = [rows_of[i] for i in perm_in]
    segs = [v.seg for v in views]
    seqs_cat = np.concatenate([s.seqs[r] for s, r in zip(segs, rows)])
    n = int(seqs_cat.size)
    order: np.ndarray | None = None  # None: the inputs' rows are already in sequence order
    if n > 1 and not bool(np.all(seqs_cat[1:] > seqs_cat[:-1])):
        order = np.argsort(seqs_cat, kind="stable")
    newpos = np.arange(n, dtype=np.int64)
    if order is not None:
        newpos[order] = np.arange(n, dtype=np.int64)
    # the merged vocabulary: every term with a live posting, in string order (each input's vocabulary is
    # sorted, so sorting their concatenation merges a few sorted runs)
    vals = terms.values
    alive_codes = []
    for v in views:
        g = v.seg.l2g
        alive_codes.append(g if v.live is None else g[v.live_df() > 0])
    if keys is not None:
        mark = np.zeros(keys.size, dtype=bool)  # the union of the inputs' terms, by code
        for g in alive_codes:
            mark[g] = True
        u = np.flatnonzero(mark)
        del mark
        l2g = sort_codes(keys, vals, u)
        vocab = TermStrings(l2g, vals)
        V = len(vocab)
    else:
        strs: list[str] = []
        for g in alive_codes:
            strs.extend(map(vals.__getitem__, g.tolist()))
        check()
        strs.sort()
        vocab = list(dict.fromkeys(strs))
        del strs
        V = len(vocab)
        l2g = np.fromiter(map(terms.index.__getitem__, vocab), dtype=np.int64, count=V)
        vocab = TermStrings(l2g, vals)
    # each input's local terms -> merged local terms, through a dense map over the codes
    top = max((int(v.seg.l2g.max()) + 1 for v in views if v.seg.l2g.size), default=0)
    loc = np.zeros(max(top, 1), dtype=np.int64)
    loc[l2g] = np.arange(V, dtype=np.int64)
    plain = [v.live is None and order is None for v in views]  # rows keep their order: document = base + row
    # pass 1: per-term counts (and, for inputs with tombstones or reordered rows, their live postings)
    counts = np.zeros(V, dtype=np.int64)
    filtered: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    new_locals = []
    base = 0
    for i, (s, r) in enumerate(zip(segs, rows)):
        new_local = loc[s.l2g]  # (meaningless for an input's dead terms: they keep no posting)
        new_locals.append(new_local)
        if plain[i]:
            counts[new_local] += s.df
        else:
            csr = s.csr
            rowmap = np.full(s.n_docs, -1, dtype=np.int64)
            rowmap[r] = newpos[base: base + r.size]
            d_new = rowmap[csr.doc_ids]
            keep = d_new >= 0
            t_new = np.repeat(new_local, s.df)[keep]
            filtered[i] = (t_new, d_new[keep], np.asarray(csr.tfs)[keep])
            counts += np.bincount(t_new, minlength=V)
        base += r.size
    del loc
    check()
    offsets = np.zeros(V + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    P = int(offsets[-1])
    doc_ids = np.empty(P, dtype=np.int32)
    tfs = np.empty(P, dtype=np.int32)
    if order is None:
        # every document of input i precedes every document of input i + 1: a term's postings are the
        # inputs' blocks of that term one after another, each already ascending -- scatter, no sort
        fill = offsets[:-1].copy()
        base = 0
        for i, (s, r) in enumerate(zip(segs, rows)):
            if i in filtered:
                t_new, d_new, tf = filtered.pop(i)
                if t_new.size:
                    starts = np.flatnonzero(np.concatenate(([True], t_new[1:] != t_new[:-1])))
                    within = np.arange(t_new.size, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, t_new.size)))
                    doc_ids[fill[t_new] + within] = d_new
                    tfs[fill[t_new] + within] = tf
                    fill += np.bincount(t_new, minlength=V)
            else:
                csr, nl = s.csr, new_locals[i]
                if nl.size:
                    dest = np.repeat(fill[nl] - csr.offsets[:-1], s.df) + np.arange(csr.n_postings, dtype=np.int64)
                    doc_ids[dest] = csr.doc_ids + np.int32(base)
                    tfs[dest] = csr.tfs
                    fill[nl] += s.df
            base += r.size
    else:
        mult = max(n, 1)
        keys, tf_parts = [], []
        base = 0
        for i, (s, r) in enumerate(zip(segs, rows)):
            if i in filtered:
                t_new, d_new, tf = filtered.pop(i)
            else:
                t_new = np.repeat(new_locals[i], s.df)
                d_new, tf = s.csr.doc_ids.astype(np.int64) + base, np.asarray(s.csr.tfs)
            keys.append(t_new * mult + d_new)  # sorted within each input
            tf_parts.append(tf)
            base += r.size
        key = np.concatenate(keys)
        del keys
        perm = np.argsort(key, kind="stable")  # merges the inputs' sorted runs
        check()
        doc_ids[:] = key[perm] % mult
        del key
        tfs[:] = np.concatenate(tf_parts)[perm]
        del perm, tf_parts
    del new_locals

    def cat(get):
        out = np.concatenate([get(s)[r] for s, r in zip(segs, rows)])
        return out if order is None else out[order]

    def cat_str(get):
        parts = [get(s) if r.size == s.n_docs else get(s).take(r) for s, r in zip(segs, rows)]
        out = parts[0] if len(parts) == 1 else StrArray.concat(parts)
        return out if order is None else out.take(order)

    check()
    ids = cat_str(lambda s: s.ids)
    csr = CSRIndex(offsets=offsets, doc_ids=doc_ids, tfs=tfs, doc_lens=cat(lambda s: s.csr.doc_lens).astype(np.int32),
                   vocab=vocab, ids=ids, analyzer=segs[0].csr.analyzer)  # type: ignore[arg-type]
    names = set(segs[0].vector_names).intersection(*(s.vector_names for s in segs[1:]))
    vecs = {nm: cat(lambda s, nm=nm: s.vectors(nm)) for nm in sorted(names)}
    return Segment(uid, partition, csr, cat(lambda s: s.seqs), cat_str(lambda s: s.texts), cat_str(lambda s: s.meta),
                   {f: cat(lambda s, f=f: s.codes[f]) for f in STRING_FIELDS}, cat(lambda s: s.time),
                   cat(lambda s: s.importance), l2g, df=counts, vectors=vecs)


# --------------------------------------------------------------------------- files

#: Array names of a segment file (an ``.npz``, see :mod:`gpuir.memory.segfile`); string fields add
#: ``<f>_codes``, ``<f>_dict_off``, ``<f>_dict_data``. Files written since the arrays became mappable
#: also hold ``maxtf`` and ``mindl`` (per term), read only when a search needs bounds; files written
#: with numba installed, the compiled scorer's block index (``blk_*``, :mod:`gpuir.backends.block_layout`),
#: read when the segment's scorer is made.
SEGMENT_ARRAYS = ("offsets", "doc_ids", "tfs", "doc_lens", "vocab_off", "vocab_data", "seqs", "ids_off",
                  "ids_data", "text_off", "text_data", "meta_off", "meta_data", "time", "importance")
#: Prefix of the array of each named embedding's vectors (``vectors_<name>``: (n, dim), float32 or float16).
VECTORS_PREFIX = "vectors_"
#: Validation works through postings in slices of this many entries (bounded temporaries).
_CHUNK = 1 << 22


def segment_arrays(seg: Segment, dicts: dict[str, Interner]) -> dict[str, np.ndarray]:
    """Everything a segment file holds, as named arrays (string columns with segment-local dictionaries)."""
    csr = seg.csr
    vocab = StrArray.from_list(csr.vocab)
    out = {
        "offsets": np.asarray(csr.offsets, np.int64), "doc_ids": np.asarray(csr.doc_ids, np.int32),
        "tfs": np.asarray(csr.tfs, np.int32), "doc_lens": np.asarray(csr.doc_lens, np.int32),
        "vocab_off": vocab.offsets, "vocab_data": vocab.data, "seqs": seg.seqs,
        "ids_off": seg.ids.offsets, "ids_data": seg.ids.data, "text_off": seg.texts.offsets,
        "text_data": seg.texts.data, "meta_off": seg.meta.offsets, "meta_data": seg.meta.data,
        "time": seg.time, "importance": seg.importance,
        "maxtf": np.asarray(seg.maxtf, np.int32), "mindl": np.asarray(seg.mindl, np.int32),
        **seg.layout_arrays(),
    }
    for name in seg.vector_names:
        out[VECTORS_PREFIX + name] = seg.vectors(name)
    for f in STRING_FIELDS:
        c = seg.codes[f]
        used = np.unique(c[c >= 0])
        local = np.where(c >= 0, np.searchsorted(used, c), -1).astype(np.int32)
        d = StrArray.from_list(dicts[f].values[int(x)] for x in used)
        out[f"{f}_codes"], out[f"{f}_dict_off"], out[f"{f}_dict_data"] = local, d.offsets, d.data
    return out


def _check_str_offsets(off: np.ndarray, n: int, nbytes: int, what: str) -> None:
    if off.shape != (n + 1,) or (n + 1 and (off[0] != 0 or off[-1] != nbytes)):
        raise ValueError(f"array {what}_off does not describe {n} strings over {nbytes} bytes")
    for a in range(0, n, _CHUNK):
        if np.any(np.diff(off[a: a + _CHUNK + 1]) < 0):
            raise ValueError(f"array {what}_off is not non-decreasing")


def check_postings(offsets: np.ndarray, doc_ids: np.ndarray, tfs: np.ndarray, n_docs: int) -> None:
    """Raise ValueError unless every posting names a row in [0, n_docs), with tf >= 1, each term's rows
    strictly increasing (checked in slices: no temporary as large as the postings)."""
    P = doc_ids.shape[0]
    if tfs.shape != (P,):
        raise ValueError("tfs must have one entry per posting")
    first, bad_at = 0, -1
    # one compiled pass finds the first bad posting (if any); the NumPy checks below then name it. Without
    # numba, or while it is still starting in this process (not worth waiting for), the NumPy checks do it all
    got = None
    if warmup.compiled_ready() and (doc_ids.dtype, tfs.dtype, offsets.dtype) == (np.int32, np.int32, np.int64):
        got = contract.first_bad_posting(offsets, doc_ids, tfs, n_docs)
    if got is not None:
        bad_at = got
        if bad_at < 0:
            return
        first = max(0, (bad_at // _CHUNK - 1) * _CHUNK)
    starts = np.asarray(offsets[1:-1])
    for a in range(first, P, _CHUNK):
        d = doc_ids[a: a + _CHUNK + 1]
        if d.size and (int(d.min()) < 0 or int(d.max()) >= n_docs):
            raise ValueError(f"doc_ids out of range [0, {n_docs})")
        if tfs[a: a + _CHUNK].size and int(tfs[a: a + _CHUNK].min()) < 1:
            raise ValueError("a term frequency below 1")
        bad = np.diff(d.astype(np.int64)) <= 0  # pair (p, p+1) for p in [a, a + len - 1)
        lo, hi = np.searchsorted(starts, [a + 1, a + d.size])
        bad[starts[lo:hi] - 1 - a] = False  # a new term starts at p+1: not a violation
        if bad.any():
            raise ValueError("postings not strictly increasing within a term")
    if bad_at >= 0:  # (the checks above name every fault the compiled pass finds)
        raise ValueError(f"posting {bad_at} breaks the segment's rules")


def segment_from_file(src: Any, uid: int, partition: int | None, analyzer: dict, terms: Interner,
                      dicts: dict[str, Interner], *, length: int | None = None,
                      time_range: tuple[int | None, int | None] | None = None,
                      error: Any = None) -> Segment:
    """Open a segment from its file, reading only what a memory needs at once.

    Read now (and checked): the vocabulary (interned into ``terms``), the term
    offsets, the sequence numbers, the ids, the string fields' dictionaries
    (interned into ``dicts``), and -- only when the manifest does not give
    them (older files) -- the document lengths' sum and the time range.
    Everything else (postings, lengths, texts, metadata, field codes, times,
    importance, per-term bounds) is read from ``src`` the first time it is used,
    and checked then.

    Parameters
    ----------
    src : :class:`~gpuir.memory.segfile.MappedNpz`, or a dict of arrays
        Anything with ``array(name)`` (or ``[name]``) and ``in``.
    error : callable exception -> exception, optional
        Makes the error raised when a part read on first use is damaged (the
        memory names the file there). Default: the ValueError itself.

    Raises
    ------
    ValueError
        A missing array or an inconsistency in the parts read now.
    """
    get = src.array if hasattr(src, "array") else src.__getitem__
    shape = src.shape if hasattr(src, "shape") and callable(src.shape) else (lambda a: src[a].shape)
    need = list(SEGMENT_ARRAYS) + [f"{f}_{x}" for f in STRING_FIELDS for x in ("codes", "dict_off", "dict_data")]
    missing = [a for a in need if a not in src]
    if missing:
        raise ValueError(f"missing array {missing[0]!r}")
    seqs = np.asarray(get("seqs"))
    n = int(seqs.shape[0])
    if seqs.dtype != np.int64 or seqs.ndim != 1:
        raise ValueError("array 'seqs' must be 1-d int64")
    if n > 1 and not bool(np.all(seqs[1:] > seqs[:-1])):
        raise ValueError("sequence numbers not ascending")
    for a in ("doc_lens", "time", "importance") + tuple(f"{f}_codes" for f in STRING_FIELDS):
        if tuple(shape(a)) != (n,):
            raise ValueError(f"array {a!r} has shape {tuple(shape(a))} for {n} records")
    for a in ("text_off", "meta_off"):
        if tuple(shape(a)) != (n + 1,):
            raise ValueError(f"array {a!r} has shape {tuple(shape(a))} for {n} records")
    offsets = np.asarray(get("offsets"))
    vocab_off, vocab_data = get("vocab_off"), get("vocab_data")
    V = int(vocab_off.shape[0]) - 1
    if V < 0:
        raise ValueError("array 'vocab_off' is empty")
    _check_str_offsets(vocab_off, V, int(vocab_data.shape[0]), "vocab")
    vocab = StrArray(vocab_off, vocab_data).tolist()
    if any(map(operator.ge, vocab, islice(vocab, 1, None))):  # strictly ascending (one pass in C)
        raise ValueError("vocabulary not sorted (or a term twice)")
    P = int(shape("doc_ids")[0])
    if offsets.dtype != np.int64 or offsets.shape != (V + 1,) or offsets[0] != 0 or offsets[-1] != P:
        raise ValueError(f"array 'offsets' does not describe {V} terms over {P} postings")
    df = np.diff(offsets)
    if np.any(df <= 0):
        raise ValueError("a term without postings (or offsets going down)")
    if tuple(shape("tfs")) != (P,):
        raise ValueError("tfs must have one entry per posting")
    ids_off, ids_data = get("ids_off"), get("ids_data")
    _check_str_offsets(ids_off, n, int(ids_data.shape[0]), "ids")
    ids = StrArray(ids_off, ids_data)
    maps = {}
    for f in STRING_FIELDS:
        d_off, d_data = get(f"{f}_dict_off"), get(f"{f}_dict_data")
        m = int(d_off.shape[0]) - 1
        _check_str_offsets(d_off, m, int(d_data.shape[0]), f"{f}_dict")
        maps[f] = dicts[f].codes(StrArray(d_off, d_data).tolist()).astype(np.int32)
    l2g = terms.codes_distinct(vocab)
    del vocab
    if length is None:
        length = int(np.asarray(get("doc_lens")).sum(dtype=np.int64))
    if time_range is None:
        t = np.asarray(get("time"))
        t = t[t != MISSING_TIME]
        time_range = (int(t.min()), int(t.max())) if t.size else (None, None)

    def load(name: str):
        try:
            if name == "csr":
                doc_ids, tfs, doc_lens = get("doc_ids"), get("tfs"), get("doc_lens")
                if doc_ids.dtype != np.int32 or tfs.dtype != np.int32 or doc_lens.dtype != np.int32:
                    raise ValueError("doc_ids, tfs and doc_lens must be int32")
                check_postings(offsets, doc_ids, tfs, n)
                return CSRIndex(offsets=offsets, doc_ids=doc_ids, tfs=tfs, doc_lens=doc_lens,
                                vocab=TermStrings(l2g, terms.values), ids=ids, analyzer=analyzer)  # type: ignore[arg-type]
            if name in ("texts", "meta"):
                pre = "text" if name == "texts" else "meta"
                off, data = get(f"{pre}_off"), get(f"{pre}_data")
                _check_str_offsets(off, n, int(data.shape[0]), pre)
                return StrArray(off, data)
            if name == "codes":
                return LazyColumns(STRING_FIELDS, lambda f: load(("codes", f)))
            if isinstance(name, tuple) and name[0] == "codes":
                f = name[1]
                local, glob = get(f"{f}_codes"), maps[f]
                if local.size and (int(local.max()) >= glob.size or int(local.min()) < -1):
                    raise ValueError(f"array {f}_codes out of range")
                return np.where(local >= 0, glob[np.maximum(local, 0)] if glob.size else -1, -1).astype(np.int32)
            if name == "time":
                return np.asarray(get("time"), np.int64)
            if name == "importance":
                return np.asarray(get("importance"), np.float64)
            if isinstance(name, tuple) and name[0] == "vectors":
                v = get(VECTORS_PREFIX + name[1])
                if v.ndim != 2 or v.shape[0] != n or v.dtype not in (np.float32, np.float16):
                    raise ValueError(f"array {VECTORS_PREFIX + name[1]} must be ({n}, dim) float32 or float16, "
                                     f"got {v.shape} {v.dtype}")
                return v
            if name == "block_layout":
                return contract.segment_layout_from_file(get, src.__contains__, offsets, n)
            if name == "maxtf_mindl":
                if "maxtf" not in src or "mindl" not in src:
                    return None
                mx, mn = np.asarray(get("maxtf")), np.asarray(get("mindl"))
                if mx.shape != (V,) or mn.shape != (V,):
                    raise ValueError("arrays maxtf/mindl do not have one entry per term")
                return mx, mn
            raise KeyError(name)
        except (ValueError, IndexError, OverflowError) as e:
            if error is None:
                raise
            raise error(e) from None

    names = src.names if hasattr(src, "names") else list(src)
    vnames = tuple(sorted(a[len(VECTORS_PREFIX):] for a in names if a.startswith(VECTORS_PREFIX)))
    return Segment(uid, partition, None, seqs, None, None, None, None, None, l2g, ids=ids, n_docs=n,
                   time_range=time_range, loader=load, df=df, length=length, vector_names=vnames)


def segment_from_arrays(arrs: dict[str, np.ndarray], uid: int, partition: int | None, analyzer: dict,
                        terms: Interner, dicts: dict[str, Interner]) -> Segment:
    """Rebuild a segment from :func:`segment_arrays` output, every part read and checked now
    (raises ValueError when inconsistent)."""
    seg = segment_from_file(arrs, uid, partition, analyzer, terms, dicts)
    for attr in ("csr", "texts", "meta", "codes", "time", "importance", "maxtf"):
        getattr(seg, attr)
    for name in seg.vector_names:
        seg.vectors(name)
    return seg
