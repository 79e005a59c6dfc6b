"""Streaming, chunked construction of a :class:`~gpuir.index.csr.CSRIndex`.

Documents are analysed one chunk at a time. Each chunk becomes compact
``(term, doc, tf)`` triples (three int32 arrays, sorted by term then document)
and nothing else is kept per document but its length: no per-document term maps
survive a chunk, so memory is bounded by the postings themselves plus the
vocabulary. At the end the provisional term numbers are renumbered in sorted
vocabulary order and the triples are sorted once by (term, document).

The result depends only on the documents, never on the chunk size: chunked and
one-shot builds are identical bit for bit (tested).

When numba imports and the analyzer's tokens are runs of word characters (every
named analyzer), the chunks go through compiled code instead
(:mod:`gpuir.index.compiled_build`: tokens, vocabulary and term frequencies in
a few passes over the code points, then a counting sort by term). It yields the
same index as the Python path, bit for bit (tested), several times faster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain

import numpy as np

from .._compat import numba_available
from ..analysis import Analyzer
from ..progress import progress_bar
from .csr import CSRIndex

DEFAULT_CHUNK_SIZE = 20_000


def _progress(total: int | None, progress: bool | None, desc: str):
    # progress=None: show on a terminal only
    return progress_bar(total=total, desc=desc, unit="doc", enabled=progress, dynamic_ncols=False)


def _chunk_triples(
    token_lists: list[list[str]], vocab: dict[str, int], doc_base: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(term, doc, tf) triples of one chunk, sorted by (term, doc), and doc lengths."""
    n = len(token_lists)
    lens = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=n)
    setdefault = vocab.setdefault
    # provisional term ids: order of first appearance over the whole stream
    flat = np.fromiter(
        (setdefault(t, len(vocab)) for t in chain.from_iterable(token_lists)),
        dtype=np.int64,
        count=int(lens.sum()),
    )
    local = np.repeat(np.arange(n, dtype=np.int64), lens)
    keys, tf = np.unique(flat * n + local, return_counts=True)
    term = (keys // n).astype(np.int32)
    doc = (keys % n + doc_base).astype(np.int32)
    return term, doc, tf.astype(np.int32), lens.astype(np.int32)


def compiled_build_applies(an: Analyzer, compiled: bool | None) -> bool:
    """Whether to build with :mod:`gpuir.index.compiled_build` (see :func:`build_csr`)."""
    if compiled is False:
        return False
    if an.run_min_len is None:
        if compiled:
            raise ValueError(f"compiled=True needs a word-run token pattern, not {an.cfg.pattern!r}")
        return False
    ok, why = numba_available()
    if compiled and not ok:
        raise ValueError(f"compiled=True but {why}: pip install 'gpuir[cpu]', or leave compiled=None")
    return ok


def _scatter_by_term(rank: np.ndarray, terms: list, docs: list, tfs: list) -> tuple[np.ndarray, ...]:
    """CSR arrays of postings given per chunk in document order (compiled counting sort).

    Returns
    -------
    offsets : ndarray (V+1,), int64; doc_ids, tfs : ndarray (P,), int32
    """
    from .compiled_build import csr_scatter

    term = np.concatenate(terms) if terms else np.zeros(0, np.int32)
    doc = np.concatenate(docs) if docs else np.zeros(0, np.int32)
    tf = np.concatenate(tfs) if tfs else np.zeros(0, np.int32)
    terms.clear(), docs.clear(), tfs.clear()
    offsets = np.zeros(rank.size + 1, dtype=np.int64)
    doc_ids = np.empty(term.size, dtype=np.int32)
    tf_sorted = np.empty(term.size, dtype=np.int32)
    csr_scatter(rank, term, doc, tf, offsets, doc_ids, tf_sorted)
    return offsets, doc_ids, tf_sorted


def build_csr(
    texts: Iterable[str],
    analyzer: Analyzer | str | dict = "default",
    ids: Sequence[str] | Iterable[str] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    progress: bool | None = None,
    compiled: bool | None = None,
) -> CSRIndex:
    """Build a CSR inverted index from a stream of documents.

    Parameters
    ----------
    texts : iterable of str
        Document texts; consumed once, in chunks of ``chunk_size``.
    analyzer : Analyzer, name or config dict
    ids : sequence or iterable of str, optional
        The user's id of each document (unique); default ``"0", "1", ...``.
    chunk_size : int
        Documents analysed per chunk (bounds the per-chunk working memory).
    progress : bool or None
        Show a progress bar; None shows one on a terminal only.
    compiled : bool or None
        Build in compiled code (numba); None: whenever numba imports and the
        analyzer's pattern allows (the result is the same either way).

    Returns
    -------
    CSRIndex
        Arrays on the host: offsets int64 (V+1,), doc_ids int32 (P,), tfs int32 (P,),
        doc_lens int32 (N,).

    Raises
    ------
    ValueError
        Empty corpus, duplicate or missing ids, more ids than documents.
    TypeError
        A text that is not a string (the message gives its position).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    an = analyzer if isinstance(analyzer, Analyzer) else Analyzer(analyzer)
    use_compiled = compiled_build_applies(an, compiled)
    total = len(texts) if hasattr(texts, "__len__") else None  # type: ignore[arg-type]
    id_iter: Iterator[str] | None = iter(ids) if ids is not None else None
    user_ids: list[str] = []
    vocab: dict[str, int] = {}
    terms, docs, tfs, lens = [], [], [], []
    n_docs = 0
    if use_compiled:
        from .compiled_build import ChunkTokenizer

        chunker = ChunkTokenizer(an, vocab)
    bar = _progress(total, progress, "indexing")
    it = iter(texts)
    try:
        while True:
            chunk: list = []
            for text in it:
                if not isinstance(text, str):
                    raise TypeError(
                        f"document {n_docs + len(chunk)} has text of type {type(text).__name__}; "
                        "every document's text must be a str"
                    )
                chunk.append(text if use_compiled else an(text))
                if len(chunk) == chunk_size:
                    break
            if not chunk:
                break
            if use_compiled:
                t, d, f, ln = chunker.chunk(chunk, n_docs)
            else:
                t, d, f, ln = _chunk_triples(chunk, vocab, n_docs)
            terms.append(t), docs.append(d), tfs.append(f), lens.append(ln)
            if id_iter is not None:
                for j in range(len(chunk)):
                    try:
                        user_ids.append(str(next(id_iter)))
                    except StopIteration:
                        raise ValueError(
                            f"ids ran out at document {n_docs + j}: give one id per document"
                        ) from None
            n_docs += len(chunk)
            bar.update(len(chunk))
    finally:
        bar.close()
    if n_docs == 0:
        raise ValueError("the corpus is empty: an index needs at least one document")
    if id_iter is None:
        user_ids = [str(i) for i in range(n_docs)]
    else:
        extra = next(id_iter, None)
        if extra is not None:
            raise ValueError(f"more ids than documents ({n_docs} documents): give one id per document")
        if len(set(user_ids)) != n_docs:
            seen: set[str] = set()
            dup = next(x for x in user_ids if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise ValueError(f"document ids must be unique; {dup!r} occurs more than once")

    # renumber terms in sorted vocabulary order, then sort postings by (term, doc)
    prov_terms = list(vocab)  # provisional id -> term
    order = sorted(range(len(prov_terms)), key=prov_terms.__getitem__)
    rank = np.empty(len(order), dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
    vocab_sorted = [prov_terms[i] for i in order]
    if use_compiled:
        offsets, doc_ids, tf_sorted = _scatter_by_term(rank, terms, docs, tfs)
    else:
        term = rank[np.concatenate(terms)] if terms else np.zeros(0, np.int64)
        doc = np.concatenate(docs)
        tf = np.concatenate(tfs)
        del terms, docs, tfs
        perm = np.argsort(term * n_docs + doc)
        term_sorted = term[perm]
        doc_ids = doc[perm]
        tf_sorted = tf[perm]
        del term, doc, tf, perm
        counts = np.bincount(term_sorted, minlength=len(vocab_sorted))
        offsets = np.zeros(len(vocab_sorted) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
    return CSRIndex(
        offsets=offsets,
        doc_ids=doc_ids.astype(np.int32, copy=False),
        tfs=tf_sorted.astype(np.int32, copy=False),
        doc_lens=np.concatenate(lens).astype(np.int32, copy=False),
        vocab=vocab_sorted,
        ids=user_ids,
        analyzer=an.config,
    )
