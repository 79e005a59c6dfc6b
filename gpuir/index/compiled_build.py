"""The index build's hot loops in compiled code (Numba): tokens, vocabulary, postings.

Used by :func:`gpuir.index.build.build_csr` when numba imports and the
analyzer's tokens are maximal runs of word characters (``\\w+`` or bm25s's
``\\b\\w\\w+\\b``: :data:`gpuir.analysis.RUN_PATTERNS`). Per chunk of documents:

1. Python prepares each text as the analyzer does (:meth:`Analyzer.prepare`:
   normalisation, lowercasing), joins them and encodes the result as UTF-32:
   one code point per array element.
2. :func:`tokenize_chunk` finds the runs of word characters (the ``re``
   module's own ``\\w`` table, :func:`gpuir.analysis.word_chars`) at least
   ``min_len`` long and looks each up in a hash table of the distinct *surface*
   tokens seen so far (FNV-1a over the code points, open addressing), adding
   the new ones.
3. Python turns each new surface token into its term once
   (:meth:`Analyzer.terms_of`: stopword or stem) and the tokens into term ids.
4. :func:`count_postings` counts term frequencies document by document.

At the end :func:`csr_scatter` lays the postings out by term (a counting sort,
stable, so documents stay ascending). The result equals the Python path's --
the same tokens, the same canonical layout -- bit for bit (tested), and does
not depend on the chunk size.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = {"nogil": True, "cache": True}
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(**_JIT)
def tokenize_chunk(codes, doc_off, first, is_word, min_len, table, hashes, pool, pool_off, state, out_surf, doc_ntok):
    """Find the tokens of documents ``first..`` of a chunk and their surface ids.

    Parameters
    ----------
    codes : (C,) uint32 -- the chunk's prepared texts, concatenated (code points)
    doc_off : (n+1,) int64 -- document i is codes[doc_off[i]:doc_off[i+1]]
    first : int -- the document to start at (a call resumes where the last stopped)
    is_word : (W,) bool -- whether a code point is a word character (W > every code point)
    min_len : int -- the least token length
    table : (H,) int64 -- hash table (H a power of two): surface id + 1, or 0 when empty
    hashes : (S,) uint64; pool : (Q,) uint32; pool_off : (S+1,) int64
        Surface token j has hash hashes[j] and code points pool[pool_off[j]:pool_off[j+1]].
    state : (3,) int64 -- surface tokens, pool entries used, tokens written to out_surf
    out_surf : (C,) int32 -- receives the surface id of each token, in order
    doc_ntok : (n,) int64 -- receives each document's number of tokens

    Returns
    -------
    int -- the first document not done: n when all are, else the tables must grow
        (a document may add as many surface tokens as it has code points) and the
        call be repeated from there.
    """
    mask = table.size - 1
    n_surf, used, nt = state[0], state[1], state[2]
    n = doc_off.size - 1
    for i in range(first, n):
        s0, e = doc_off[i], doc_off[i + 1]
        room = e - s0
        if 2 * (n_surf + room) > table.size or n_surf + room >= hashes.size or used + room > pool.size:
            break
        p = s0
        cnt = 0
        while p < e:
            while p < e and not is_word[codes[p]]:
                p += 1
            s = p
            h = _FNV_OFFSET
            while p < e and is_word[codes[p]]:
                h = (h ^ np.uint64(codes[p])) * _FNV_PRIME
                p += 1
            ln = p - s
            if ln < min_len:
                continue
            slot = h & mask
            while True:
                sid = table[slot] - 1
                if sid < 0:  # a new surface token
                    sid = n_surf
                    hashes[sid] = h
                    for j in range(ln):
                        pool[used + j] = codes[s + j]
                    pool_off[sid] = used
                    used += ln
                    pool_off[sid + 1] = used
                    table[slot] = sid + 1
                    n_surf += 1
                    break
                if hashes[sid] == h and pool_off[sid + 1] - pool_off[sid] == ln:
                    q = pool_off[sid]
                    same = True
                    for j in range(ln):
                        if pool[q + j] != codes[s + j]:
                            same = False
                            break
                    if same:
                        break
                slot = (slot + 1) & mask
            out_surf[nt] = sid
            nt += 1
            cnt += 1
        doc_ntok[i] = cnt
        state[0], state[1], state[2] = n_surf, used, nt
    else:
        return n
    return i


@njit(**_JIT)
def rehash(table, hashes, n_surf):
    """Insert surface tokens 0..n_surf-1 into the empty ``table`` by their hashes."""
    mask = table.size - 1
    for sid in range(n_surf):
        slot = hashes[sid] & mask
        while table[slot] != 0:
            slot = (slot + 1) & mask
        table[slot] = sid + 1


@njit(**_JIT)
def count_postings(terms, doc_ntok, doc_base, last_doc, slot, out_term, out_doc, out_tf):
    """(term, document, tf) of a chunk's tokens, in document order; returns how many.

    Parameters
    ----------
    terms : (T,) int32 -- the chunk's tokens as provisional term ids, stopwords dropped
    doc_ntok : (n,) int64 -- tokens per document; doc_base : int -- the first document's number
    last_doc, slot : (V,) int64 -- per term: the last document seen (-1 none) and its posting;
        kept across chunks (documents only grow)
    out_term, out_doc, out_tf : (T,) int32 -- receive the postings
    """
    n_post = 0
    p = 0
    for i in range(doc_ntok.size):
        d = doc_base + i
        for _ in range(doc_ntok[i]):
            t = terms[p]
            p += 1
            if last_doc[t] != d:
                last_doc[t] = d
                slot[t] = n_post
                out_term[n_post] = t
                out_doc[n_post] = d
                out_tf[n_post] = 1
                n_post += 1
            else:
                out_tf[slot[t]] += 1
    return n_post


@njit(**_JIT)
def csr_scatter(rank, term, doc, tf, offsets, doc_ids, tfs):
    """Lay postings out by term: ``offsets`` (V+1,) int64 receives the starts, doc_ids and
    tfs (P,) int32 the postings -- a stable counting sort on rank[term] (the term's place in
    the sorted vocabulary), so each term's documents stay ascending."""
    for j in range(term.size):
        offsets[rank[term[j]] + 1] += 1
    for t in range(offsets.size - 1):
        offsets[t + 1] += offsets[t]
    fill = offsets[:-1].copy()
    for j in range(term.size):
        r = rank[term[j]]
        q = fill[r]
        doc_ids[q] = doc[j]
        tfs[q] = tf[j]
        fill[r] = q + 1


class ChunkTokenizer:
    """Turns chunks of texts into postings with the kernels above (see the module docstring).

    Parameters
    ----------
    analyzer : Analyzer
        Its ``run_min_len`` must not be None.
    vocab : dict
        Term -> provisional term id, shared with the caller (ids in order of first appearance).
    """

    def __init__(self, analyzer, vocab: dict[str, int]):
        if analyzer.run_min_len is None:
            raise ValueError(f"the compiled build needs a word-run token pattern, not {analyzer.cfg.pattern!r}")
        self.an, self.vocab, self.min_len = analyzer, vocab, analyzer.run_min_len
        self.table = np.zeros(1 << 16, np.int64)
        self.hashes = np.zeros(1 << 14, np.uint64)
        self.pool_off = np.zeros((1 << 14) + 1, np.int64)
        self.pool = np.zeros(1 << 18, np.uint32)
        self.state = np.zeros(3, np.int64)  # surface tokens, pool used, tokens of the chunk
        self.surf_term = np.zeros(0, np.int32)  # provisional term id of each surface token, -1: stopword
        self.last_doc = np.zeros(0, np.int64)
        self.slot = np.zeros(0, np.int64)

    def _grow(self, room: int) -> None:
        """Room for ``room`` more surface tokens of as many code points."""
        n_surf, used = int(self.state[0]), int(self.state[1])
        if n_surf + room >= self.hashes.size:
            cap = max(2 * self.hashes.size, n_surf + room + 1)
            self.hashes = np.concatenate([self.hashes, np.zeros(cap - self.hashes.size, np.uint64)])
            self.pool_off = np.concatenate([self.pool_off, np.zeros(cap + 1 - self.pool_off.size, np.int64)])
        if used + room > self.pool.size:
            cap = max(2 * self.pool.size, used + room)
            self.pool = np.concatenate([self.pool, np.zeros(cap - self.pool.size, np.uint32)])
        if 2 * (n_surf + room) > self.table.size:
            size = self.table.size
            while 2 * (n_surf + room) > size:
                size *= 2
            self.table = np.zeros(size, np.int64)
            rehash(self.table, self.hashes, n_surf)

    def _new_terms(self, start: int, stop: int) -> None:
        """Terms of the surface tokens start..stop-1 (first seen in this chunk)."""
        a, b = int(self.pool_off[start]), int(self.pool_off[stop])
        text = self.pool[a:b].tobytes().decode("utf-32-le", "surrogatepass")
        offs = (self.pool_off[start : stop + 1] - a).tolist()
        surface = [text[offs[j] : offs[j + 1]] for j in range(stop - start)]
        setdefault, vocab = self.vocab.setdefault, self.vocab
        ids = [-1 if t is None else setdefault(t, len(vocab)) for t in self.an.terms_of(surface)]
        if self.surf_term.size < stop:
            self.surf_term = np.concatenate([self.surf_term, np.zeros(max(stop, 2 * self.surf_term.size)
                                                                       - self.surf_term.size, np.int32)])
        self.surf_term[start:stop] = ids

    def chunk(self, texts: list[str], doc_base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Postings of documents ``doc_base..`` (their texts).

        Returns
        -------
        term, doc, tf : ndarray (p,), int32 -- postings in document order, provisional term ids
        lens : ndarray (n,), int32 -- tokens per document (stopwords dropped)
        """
        from ..analysis import word_chars

        n = len(texts)
        prepared = self.an.prepare_many(texts)
        joined = "".join(prepared)
        codes = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        doc_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, prepared), dtype=np.int64, count=n), out=doc_off[1:])
        is_word = word_chars(ascii_only=joined.isascii())  # the small table when every code point < 128
        del prepared, joined
        out_surf = np.empty(codes.size, dtype=np.int32)
        doc_ntok = np.zeros(n, dtype=np.int64)
        n_old = int(self.state[0])
        self.state[2] = 0
        i = 0
        while True:
            i = tokenize_chunk(codes, doc_off, i, is_word, self.min_len, self.table, self.hashes, self.pool,
                               self.pool_off, self.state, out_surf, doc_ntok)
            if i == n:
                break
            self._grow(int(doc_off[i + 1] - doc_off[i]))
        n_surf, nt = int(self.state[0]), int(self.state[2])
        if n_surf > n_old:
            self._new_terms(n_old, n_surf)
        tt = self.surf_term[out_surf[:nt]]
        keep = tt >= 0
        lens = np.bincount(np.repeat(np.arange(n), doc_ntok)[keep], minlength=n)
        tt = np.ascontiguousarray(tt[keep])
        V = len(self.vocab)
        if self.last_doc.size < V:
            grow = max(V, 2 * self.last_doc.size) - self.last_doc.size
            self.last_doc = np.concatenate([self.last_doc, np.full(grow, -1, np.int64)])
            self.slot = np.concatenate([self.slot, np.zeros(grow, np.int64)])
        term = np.empty(tt.size, np.int32)
        doc = np.empty(tt.size, np.int32)
        tf = np.empty(tt.size, np.int32)
        m = count_postings(tt, lens, doc_base, self.last_doc, self.slot, term, doc, tf)
        return term[:m], doc[:m], tf[:m], lens.astype(np.int32)
