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

from dataclasses import replace
from typing import Any

import numpy as np

from ..analysis import Analyzer
from ..index.build import build_csr
from ..index.csr import CSRIndex
from .columns import Interner, StrArray
from .records import MISSING_TIME, STRING_FIELDS, RecordBatch, make_record


class Segment:
    """An immutable CSR segment over n records and their columns.

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
    """

    __slots__ = (
        "cache",
        "codes",
        "csr",
        "g_order",
        "g_sorted",
        "ids",
        "importance",
        "l2g",
        "maxtf",
        "meta",
        "mindl",
        "partition",
        "seqs",
        "texts",
        "time",
        "time_max",
        "time_min",
        "uid",
    )

    def __init__(self, uid: int, partition: int | None, csr: CSRIndex, seqs: np.ndarray, texts: StrArray,
                 meta: StrArray, codes: dict[str, np.ndarray], time: np.ndarray, importance: np.ndarray,
                 l2g: np.ndarray):
        self.uid = int(uid)
        self.partition = partition
        self.csr = csr
        self.ids: StrArray = csr.ids  # type: ignore[assignment]
        self.seqs = seqs
        self.texts = texts
        self.meta = meta
        self.codes = codes
        self.time = time
        self.importance = importance
        self.l2g = np.asarray(l2g, dtype=np.int64)
        self.g_order = np.argsort(self.l2g, kind="stable")
        self.g_sorted = self.l2g[self.g_order]
        V = csr.n_terms
        if V and csr.n_postings:
            starts = csr.offsets[:-1]
            if np.any(np.diff(csr.offsets) == 0):
                raise ValueError(f"segment {uid}: a term without postings")
            self.maxtf = np.maximum.reduceat(csr.tfs, starts).astype(np.int32)
            self.mindl = np.minimum.reduceat(csr.doc_lens[csr.doc_ids], starts).astype(np.int32)
        else:
            self.maxtf = np.zeros(V, np.int32)
            self.mindl = np.zeros(V, np.int32)
        timed = time[time != MISSING_TIME]
        self.time_min = int(timed.min()) if timed.size else None
        self.time_max = int(timed.max()) if timed.size else None
        #: Derived structures built on first use (filter indexes, metadata columns, and the
        #: segment's scorer of each backend: :func:`gpuir.memory.search.segment_scorer`).
        self.cache: dict[Any, Any] = {}

    @property
    def n_docs(self) -> int:
        return self.csr.n_docs

    def __repr__(self) -> str:
        return (f"Segment(uid={self.uid}, partition={self.partition}, n_docs={self.n_docs}, "
                f"n_terms={self.csr.n_terms}, n_postings={self.csr.n_postings})")

    def local_terms(self, gids: np.ndarray) -> np.ndarray:
        """Local term ids of global term codes ``gids`` (ndarray (m,), int64); -1 where absent."""
        if self.g_sorted.size == 0:
            return np.full(gids.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.g_sorted, gids), self.g_sorted.size - 1)
        return np.where(self.g_sorted[pos] == gids, self.g_order[pos], -1)

    def record(self, row: int, dicts: dict[str, Interner]) -> dict[str, Any]:
        """Row ``row`` as a record dict (absent fields left out)."""
        strings = {f: (None if (c := int(self.codes[f][row])) < 0 else dicts[f].values[c]) for f in STRING_FIELDS}
        return make_record(self.ids[row], self.texts[row], strings, int(self.time[row]),
                           float(self.importance[row]), self.meta[row])

    def rows_with_codes(self, field: str, codes: np.ndarray) -> np.ndarray:
        """Rows whose ``field`` code is in ``codes``: ndarray (m,), int64, ascending.

        Uses a per-segment index (rows sorted by code), built once.
        """
        key = ("codes_index", field)
        idx = self.cache.get(key)
        if idx is None:
            col = self.codes[field]
            order = np.argsort(col, kind="stable")
            idx = (order, col[order])
            self.cache[key] = idx
        order, sorted_codes = idx
        codes = np.asarray(codes, dtype=np.int64)
        lo = np.searchsorted(sorted_codes, codes, side="left")
        hi = np.searchsorted(sorted_codes, codes, side="right")
        if codes.size == 1:
            return order[int(lo[0]): int(hi[0])].astype(np.int64)
        parts = [order[a:b] for a, b in zip(lo.tolist(), hi.tolist()) if b > a]
        return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)


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
        csr = self.seg.csr
        if self.live is None:
            return np.diff(csr.offsets)
        alive = self.live[csr.doc_ids]
        term_of = np.repeat(np.arange(csr.n_terms, dtype=np.int64), np.diff(csr.offsets))
        return np.bincount(term_of[alive], minlength=csr.n_terms).astype(np.int64)

    def live_length(self) -> int:
        """Sum of the live rows' document lengths."""
        dl = self.seg.csr.doc_lens
        return int(dl.sum(dtype=np.int64) if self.live is None else dl[self.live].sum(dtype=np.int64))


def build_segment(uid: int, partition: int | None, batch: RecordBatch, seqs: np.ndarray, analyzer: Analyzer,
                  terms: Interner, dicts: dict[str, Interner]) -> Segment:
    """A segment over the records of ``batch`` (all of one partition), in batch order.

    Parameters
    ----------
    seqs : ndarray, shape (len(batch),), int64, ascending
        Their sequence numbers.
    terms, dicts : the memory's interners (new terms and values are added).
    """
    ids = StrArray.from_list(batch.ids)
    csr = build_csr(batch.texts, analyzer, ids=batch.ids, progress=False)
    csr = replace(csr, ids=ids)
    l2g = terms.codes(csr.vocab, dtype=np.int64)
    codes = {f: dicts[f].codes(batch.strings[f]) for f in STRING_FIELDS}
    return Segment(uid, partition, csr, np.asarray(seqs, dtype=np.int64), StrArray.from_list(batch.texts),
                   StrArray.from_list(batch.metadata), codes, batch.time.copy(), batch.importance.copy(), l2g)


def merge_segments(views: list[SegView], uid: int, partition: int | None, terms: Interner) -> Segment:
    """One segment holding the live rows of ``views``, in sequence order; tombstones are purged.

    The result equals a segment built from those records (same vocabulary,
    postings, lengths, columns), without analysing any text again.
    """
    rows = [v.live_rows() for v in views]
    segs = [v.seg for v in views]
    seqs_cat = np.concatenate([s.seqs[r] for s, r in zip(segs, rows)]) if segs else np.zeros(0, np.int64)
    order = np.argsort(seqs_cat, kind="stable")
    n = int(order.size)
    newpos = np.empty(n, dtype=np.int64)
    newpos[order] = np.arange(n, dtype=np.int64)
    t_parts, d_parts, f_parts = [], [], []
    base = 0
    for s, r in zip(segs, rows):
        csr = s.csr
        rowmap = np.full(s.n_docs, -1, dtype=np.int64)
        rowmap[r] = newpos[base: base + r.size]
        base += r.size
        d_new = rowmap[csr.doc_ids]
        keep = d_new >= 0
        term_of = np.repeat(np.arange(csr.n_terms, dtype=np.int64), np.diff(csr.offsets))
        t_parts.append(s.l2g[term_of[keep]])
        d_parts.append(d_new[keep])
        f_parts.append(np.asarray(csr.tfs)[keep])
    gid = np.concatenate(t_parts) if t_parts else np.zeros(0, np.int64)
    doc = np.concatenate(d_parts) if d_parts else np.zeros(0, np.int64)
    tf = np.concatenate(f_parts) if f_parts else np.zeros(0, np.int32)
    u = np.unique(gid)  # global codes with a live posting, by code
    vals = terms.values
    by_string = sorted(range(u.size), key=lambda i: vals[int(u[i])])
    rank = np.empty(u.size, dtype=np.int64)
    rank[np.asarray(by_string, dtype=np.int64)] = np.arange(u.size, dtype=np.int64)
    local = rank[np.searchsorted(u, gid)]
    perm = np.argsort(local * max(n, 1) + doc)
    counts = np.bincount(local, minlength=u.size)
    offsets = np.zeros(u.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    l2g = u[np.asarray(by_string, dtype=np.int64)] if u.size else np.zeros(0, np.int64)

    def cat(get):
        return np.concatenate([get(s)[r] for s, r in zip(segs, rows)])[order]

    ids = StrArray.concat([s.ids.take(r) for s, r in zip(segs, rows)]).take(order)
    csr = CSRIndex(
        offsets=offsets,
        doc_ids=doc[perm].astype(np.int32),
        tfs=tf[perm].astype(np.int32),
        doc_lens=cat(lambda s: s.csr.doc_lens).astype(np.int32),
        vocab=[vals[int(g)] for g in l2g],
        ids=ids,  # type: ignore[arg-type]
        analyzer=segs[0].csr.analyzer if segs else {},
    )
    return Segment(
        uid, partition, csr, cat(lambda s: s.seqs),
        StrArray.concat([s.texts.take(r) for s, r in zip(segs, rows)]).take(order),
        StrArray.concat([s.meta.take(r) for s, r in zip(segs, rows)]).take(order),
        {f: cat(lambda s, f=f: s.codes[f]) for f in STRING_FIELDS},
        cat(lambda s: s.time), cat(lambda s: s.importance), l2g,
    )


# --------------------------------------------------------------------------- files

#: Array names of a segment file (``np.savez``); string fields add ``<f>_codes``,
#: ``<f>_dict_off``, ``<f>_dict_data``.
SEGMENT_ARRAYS = ("offsets", "doc_ids", "tfs", "doc_lens", "vocab_off", "vocab_data", "seqs", "ids_off",
                  "ids_data", "text_off", "text_data", "meta_off", "meta_data", "time", "importance")


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
    }
    for f in STRING_FIELDS:
        c = seg.codes[f]
        used = np.unique(c[c >= 0])
        local = np.where(c >= 0, np.searchsorted(used, c), -1).astype(np.int32)
        d = StrArray.from_list(dicts[f].values[int(x)] for x in used)
        out[f"{f}_codes"], out[f"{f}_dict_off"], out[f"{f}_dict_data"] = local, d.offsets, d.data
    return out


def segment_from_arrays(arrs: dict[str, np.ndarray], uid: int, partition: int | None, analyzer: dict,
                        terms: Interner, dicts: dict[str, Interner]) -> Segment:
    """Rebuild a segment from :func:`segment_arrays` output (raises ValueError when inconsistent)."""
    need = list(SEGMENT_ARRAYS) + [f"{f}_{x}" for f in STRING_FIELDS for x in ("codes", "dict_off", "dict_data")]
    missing = [a for a in need if a not in arrs]
    if missing:
        raise ValueError(f"missing array {missing[0]!r}")
    vocab = StrArray(arrs["vocab_off"], arrs["vocab_data"]).tolist()
    ids = StrArray(arrs["ids_off"], arrs["ids_data"])
    csr = CSRIndex(offsets=arrs["offsets"], doc_ids=arrs["doc_ids"], tfs=arrs["tfs"], doc_lens=arrs["doc_lens"],
                   vocab=vocab, ids=ids, analyzer=analyzer)  # type: ignore[arg-type]
    csr.validate()
    n = csr.n_docs
    for a in ("seqs", "time", "importance", "text_off", "meta_off") + tuple(f"{f}_codes" for f in STRING_FIELDS):
        if arrs[a].shape[0] != n + (1 if a.endswith("_off") else 0):
            raise ValueError(f"array {a!r} has {arrs[a].shape[0]} entries for {n} records")
    if vocab != sorted(vocab):
        raise ValueError("vocabulary not sorted")
    codes = {}
    for f in STRING_FIELDS:
        values = StrArray(arrs[f"{f}_dict_off"], arrs[f"{f}_dict_data"]).tolist()
        glob = dicts[f].codes(values).astype(np.int32)
        local = arrs[f"{f}_codes"]
        if local.size and (local.max() >= len(values) or local.min() < -1):
            raise ValueError(f"array {f}_codes out of range")
        codes[f] = np.where(local >= 0, glob[np.maximum(local, 0)] if glob.size else -1, -1).astype(np.int32)
    l2g = terms.codes(vocab, dtype=np.int64)
    return Segment(uid, partition, csr, np.asarray(arrs["seqs"], np.int64),
                   StrArray(arrs["text_off"], arrs["text_data"]), StrArray(arrs["meta_off"], arrs["meta_data"]),
                   codes, np.asarray(arrs["time"], np.int64), np.asarray(arrs["importance"], np.float64), l2g)
