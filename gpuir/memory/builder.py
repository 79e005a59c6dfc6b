"""Turning a batch of records into a segment at the speed of analysis.

A static build (:func:`gpuir.index.build.build_csr`) turns each distinct
surface token into its term once for the whole corpus. A memory grows by many
small batches; building each batch's segment from scratch would stem every
token of every batch again, and intern the batch's whole vocabulary into the
memory's term codes again. :class:`SegmentBuilder` instead keeps one
:class:`~gpuir.index.compiled_build.ChunkTokenizer` for the memory's lifetime
whose vocabulary *is* the memory's term interner: a token seen in any earlier
batch costs one hash-table probe in compiled code, and the postings come out
with the memory's global term codes directly. Per batch, what is left outside
the analysis is proportional to the batch: its distinct terms are sorted by
string (a segment's vocabulary is sorted) and its postings laid out by term
(the same counting sort as the static build).

The tokenizer enters a new term's code into the interner's index before the
builder appends its value; a reader that finds such a code ignores it, as it
ignores every code at or beyond its snapshot's vocabulary size.

The result equals :func:`gpuir.memory.segments.build_segment`'s (the same
segment: vocabulary, postings, lengths, columns; tested). Without numba, or for
an analyzer whose tokens are not word runs, the builder falls back to it.
"""

from __future__ import annotations

import functools
from itertools import islice

import numpy as np

from ..analysis import Analyzer
from ..index.build import compiled_build_applies
from ..index.csr import CSRIndex
from .columns import Interner, StrArray, TermStrings
from .records import STRING_FIELDS, RecordBatch
from .segments import Segment, build_segment
from .termorder import TermOrder

#: Document numbers given to the tokenizer stay below this; it then starts again at 0.
_DOC_LIMIT = 2**31 - 2**24


@functools.cache
def _distinct_kernel():
    """A compiled ``distinct(t, stamp, mark)``: the distinct values of ``t`` in O(len(t)) (numba imported lazily)."""
    from numba import njit

    @njit(nogil=True, cache=True)
    def distinct(t, stamp, mark):
        out = np.empty(t.size, np.int64)
        m = 0
        for x in t:
            if stamp[x] != mark:
                stamp[x] = mark
                out[m] = x
                m += 1
        return out[:m]

    return distinct


class SegmentBuilder:
    """Builds segments for one memory, keeping the surface-token table between batches.

    Writer only (not thread-safe): the memory calls it under its write lock.

    Parameters
    ----------
    analyzer : Analyzer
    terms : Interner
        The memory's term codes; new terms are appended (value before code is
        published to readers: see :class:`~gpuir.memory.columns.Interner`).
    """

    def __init__(self, analyzer: Analyzer, terms: Interner, order: TermOrder | None = None):
        self.analyzer = analyzer
        self.terms = terms
        self.order = order if order is not None else TermOrder(terms)
        self._chunker = None
        self._tried = False  # the tokenizer (and numba) is set up at the first build, not before: opening a
        #                      memory to search it imports no compiler
        self._doc_base = 0
        self._rank = np.zeros(0, dtype=np.int64)
        self._stamp = np.zeros(0, dtype=np.int64)
        self._mark = 0

    def _setup(self) -> None:
        self._tried = True
        if compiled_build_applies(self.analyzer, None):
            from ..index.compiled_build import ChunkTokenizer

            # the tokenizer assigns new terms ids len(vocab), len(vocab) + 1, ...: the interner's codes
            self._chunker = ChunkTokenizer(self.analyzer, self.terms.index)

    @property
    def compiled(self) -> bool:
        if not self._tried:
            self._setup()
        return self._chunker is not None

    def build(self, uid: int, partition: int | None, batch: RecordBatch, seqs: np.ndarray,
              dicts: dict[str, Interner], vectors: dict[str, np.ndarray] | None = None) -> Segment:
        """A segment over the records of ``batch`` (all of one partition), in batch order.

        Parameters
        ----------
        seqs : ndarray, shape (len(batch),), int64, ascending
        dicts : the memory's string-field interners (new values are added)
        vectors : dict name -> ndarray (len(batch), dim), float32 or float16, optional
            The records' vectors of each named embedding (normalised), in batch order.
        """
        if not self.compiled:
            return build_segment(uid, partition, batch, seqs, self.analyzer, self.terms, dicts, vectors)
        from ..index.compiled_build import csr_scatter

        n = len(batch)
        ch = self._chunker
        if self._doc_base + n >= _DOC_LIMIT:  # document numbers are int32: start again (forget old ones)
            ch.last_doc.fill(-1)
            self._doc_base = 0
        terms = self.terms
        before = len(terms.values)
        t, d, f, lens = ch.chunk(batch.texts, self._doc_base)
        added = len(terms.index) - before
        if added:  # the tokenizer added these terms to the index: their values, in code order
            new = list(islice(reversed(terms.index), added))
            new.reverse()
            terms.values.extend(new)
        d -= np.int32(self._doc_base)
        self._doc_base += n
        # the segment's vocabulary: its distinct terms, sorted by string
        vals = terms.values
        if self._stamp.size < len(vals):
            self._stamp = np.concatenate([self._stamp, np.zeros(max(len(vals), 2 * self._stamp.size)
                                                                - self._stamp.size, np.int64)])
        self._mark += 1
        g = _distinct_kernel()(t, self._stamp, self._mark)
        if self.order.ready:
            self.order.update()  # key the new terms: then sorting by string is sorting keys
            l2g = self.order.sort_codes(g)
        else:  # the keys are being built in the background (a memory just opened): sort the strings
            strs = list(map(vals.__getitem__, g.tolist()))
            idx = sorted(range(len(strs)), key=strs.__getitem__)
            l2g = g[np.asarray(idx, dtype=np.int64)] if idx else np.zeros(0, np.int64)
        vocab = TermStrings(l2g, vals)
        V = l2g.size
        if self._rank.size < len(vals):
            self._rank = np.zeros(max(len(vals), 2 * self._rank.size), dtype=np.int64)  # entries read: set below
        rank = self._rank
        rank[l2g] = np.arange(V, dtype=np.int64)  # only these entries are read below
        offsets = np.zeros(V + 1, dtype=np.int64)
        doc_ids = np.empty(t.size, dtype=np.int32)
        tfs = np.empty(t.size, dtype=np.int32)
        csr_scatter(rank, t, d, f, offsets, doc_ids, tfs)
        ids = StrArray.from_list(batch.ids)
        csr = CSRIndex(offsets=offsets, doc_ids=doc_ids, tfs=tfs, doc_lens=lens, vocab=vocab,
                       ids=ids, analyzer=self.analyzer.config)  # type: ignore[arg-type]
        codes = {fld: dicts[fld].codes(batch.strings[fld]) for fld in STRING_FIELDS}
        return Segment(uid, partition, csr, np.asarray(seqs, dtype=np.int64), StrArray.from_list(batch.texts),
                       StrArray.from_list(batch.metadata), codes, batch.time.copy(), batch.importance.copy(),
                       l2g, vectors=vectors)
