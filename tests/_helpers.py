"""Test data builders shared by several test modules (imported, not fixtures).

``tests/`` has no ``__init__.py``; pytest puts it on ``sys.path`` (rootdir-based
"prepend" import mode), so test modules import this as ``from _helpers import ...``.
"""

from __future__ import annotations

import numpy as np

from gpuir.index.csr import CSRIndex


def random_index(n_docs: int, n_terms: int, seed: int, heavy_df: int = 3000) -> CSRIndex:
    """A random CSR index with many exact score ties.

    Parameters
    ----------
    n_docs : int
        Number of documents N.
    n_terms : int
        Vocabulary size V; term ``i`` is named ``t{i:06d}``.
    seed : int
        Seed of the generator.
    heavy_df : int, default 3000
        Document frequency of term 1 (capped at N); term 0 is in N - 1 documents,
        the others follow a Zipf law.

    Returns
    -------
    CSRIndex
        Small term frequencies (1..3) and lengths quantised to ``4 j + 1``, so
        many documents score exactly alike.
    """
    rng = np.random.default_rng(seed)
    dfs = rng.zipf(1.6, n_terms).clip(1, n_docs)
    dfs[0] = n_docs - 1
    dfs[1] = min(heavy_df, n_docs)
    doc_ids, tfs = [], []
    for df in dfs:
        d = np.sort(rng.choice(n_docs, size=int(df), replace=False)).astype(np.int32)
        doc_ids.append(d)
        # Small tfs: many exact ties between documents of equal length.
        tfs.append(rng.integers(1, 4, size=d.size).astype(np.int32))
    offsets = np.zeros(n_terms + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(dfs)
    doc_ids_a, tfs_a = np.concatenate(doc_ids), np.concatenate(tfs)
    doc_lens = np.bincount(doc_ids_a, weights=tfs_a, minlength=n_docs).astype(np.int32)
    # Quantise lengths so that many documents share one: more ties.
    doc_lens = (doc_lens // 4) * 4 + 1
    return CSRIndex(
        offsets=offsets, doc_ids=doc_ids_a, tfs=tfs_a, doc_lens=doc_lens,
        vocab=[f"t{i:06d}" for i in range(n_terms)], ids=[str(i) for i in range(n_docs)],
    )


def random_queries(n_terms: int, n: int, seed: int, max_terms: int = 7) -> list[np.ndarray]:
    """Random queries (term ids) whose first five are the edge cases.

    Parameters
    ----------
    n_terms : int
        Vocabulary size V of the index the queries are for.
    n : int
        Number of queries (>= 5).
    seed : int
        Seed of the generator.
    max_terms : int, default 7
        Longest random query, in terms.

    Returns
    -------
    list of n ndarrays, int64
        Query 0 is empty (all out of vocabulary), 1 repeats the heavy terms
        ``[0, 0, 0, 1]``, 2 is term 1 alone (exact sums), 3 is term 0 alone
        (~N candidates), 4 repeats the last term ``V - 1``.
    """
    rng = np.random.default_rng(seed)
    qs = [rng.integers(0, n_terms, size=rng.integers(1, max_terms + 1)).astype(np.int64)
          for _ in range(n)]
    qs[0] = np.zeros(0, dtype=np.int64)                   # empty / all OOV
    qs[1] = np.array([0, 0, 0, 1], dtype=np.int64)        # repeated heavy terms
    qs[2] = np.array([1], dtype=np.int64)                 # one term: exact sums
    qs[3] = np.array([0], dtype=np.int64)                 # one term, ~N candidates
    qs[4] = np.array([n_terms - 1, n_terms - 1], dtype=np.int64)  # repeated rare term
    return qs


def random_corpus(n_docs: int, vocab: int, seed: int, max_len: int = 30) -> list[str]:
    """Documents of Zipf-distributed words ``w0 .. w{vocab-1}``, 0 to max_len-1 words each."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    return [" ".join(rng.choice(words, size=rng.integers(0, max_len), p=p)) for _ in range(n_docs)]


def without_times(rec, required: bool = True):
    """A record (dict, or None) without the ``created_at`` / ``updated_at`` a memory keeps by default (checked
    present and ISO 8601 first, unless not ``required``: a sharded memory keeps none): for tests of a record's
    other fields."""
    if rec is None:
        return None
    if required:
        assert isinstance(rec.get("created_at"), str) and isinstance(rec.get("updated_at"), str), rec
    return {k: v for k, v in rec.items() if k not in ("created_at", "updated_at")}
