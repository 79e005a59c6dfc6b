"""`CSRIndex`: the inverted index arrays, the one layout every backend reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CSRIndex:
    """A CSR inverted index over N documents and V terms with P postings.

    Postings of term ``t`` are ``doc_ids[offsets[t]:offsets[t+1]]`` (ascending
    document numbers) with raw integer frequencies ``tfs[...]`` at the same positions.

    Attributes
    ----------
    offsets : ndarray, shape (V + 1,), int64, host
        Start of each term's postings; ``offsets[0] == 0`` and ``offsets[V] == P``.
    doc_ids : ndarray, shape (P,), int32, host
        Document number of each posting, ascending within a term.
    tfs : ndarray, shape (P,), int32, host
        Raw term frequency of each posting (>= 1).
    doc_lens : ndarray, shape (N,), int32, host
        Number of tokens of each document after analysis.
    vocab : list of str, length V
        Terms in ascending (code point) order; term id = position.
    ids : list of str, length N
        The user's id of each document.
    analyzer : dict
        Configuration of the analyzer that made the tokens (see ``Analyzer.config``).
    """

    offsets: np.ndarray
    doc_ids: np.ndarray
    tfs: np.ndarray
    doc_lens: np.ndarray
    vocab: list[str]
    ids: list[str]
    analyzer: dict[str, Any] = field(default_factory=dict)
    _term_to_id: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @property
    def n_docs(self) -> int:
        return int(self.doc_lens.shape[0])

    @property
    def n_terms(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_postings(self) -> int:
        return int(self.doc_ids.shape[0])

    @property
    def avgdl(self) -> float:
        """Mean document length (1.0 for an empty or all-empty collection)."""
        if self.n_docs == 0:
            return 1.0
        m = float(self.doc_lens.mean(dtype=np.float64))
        return m if m > 0 else 1.0

    @property
    def df(self) -> np.ndarray:
        """Document frequency of each term: ndarray, shape (V,), int64, host."""
        return np.diff(self.offsets)

    @property
    def term_to_id(self) -> dict[str, int]:
        if self._term_to_id is None:
            self._term_to_id = {t: i for i, t in enumerate(self.vocab)}
        return self._term_to_id

    def term_ids(self, tokens: list[str]) -> np.ndarray:
        """Term ids of ``tokens``, repeats kept, unknown tokens dropped.

        Returns
        -------
        ndarray, shape (n,), int64, host
        """
        t2i = self.term_to_id
        return np.fromiter((t2i[t] for t in tokens if t in t2i), dtype=np.int64)

    def validate(self) -> None:
        """Check the invariants of the layout; raise ValueError naming the first broken one."""
        V, P, N = self.n_terms, self.n_postings, self.n_docs
        if self.offsets.dtype != np.int64 or self.doc_ids.dtype != np.int32:
            raise ValueError("offsets must be int64 and doc_ids int32")
        if self.offsets[0] != 0 or self.offsets[-1] != P:
            raise ValueError(f"offsets must start at 0 and end at P={P}")
        if np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing")
        if self.tfs.shape != (P,):
            raise ValueError("tfs must have one entry per posting")
        if len(self.vocab) != V:
            raise ValueError(f"vocab has {len(self.vocab)} terms but offsets describe {V}")
        if len(self.ids) != N:
            raise ValueError(f"ids has {len(self.ids)} entries but doc_lens describes {N}")
        if P and (self.doc_ids.min() < 0 or self.doc_ids.max() >= N):
            raise ValueError("doc_ids out of range [0, N)")
        check_postings_sorted(self.offsets, self.doc_ids)


def check_postings_sorted(offsets: np.ndarray, doc_ids: np.ndarray) -> None:
    """Raise ValueError unless every term's document numbers are strictly increasing.

    The GPU kernels accumulate a tile one term per round without atomics: that
    is race-free only because a term's list holds each document at most once, in
    ascending order (``kernels/bm25_score.cu``). Checked before every upload.

    Parameters
    ----------
    offsets : ndarray (V+1,), int64, host
    doc_ids : ndarray (P,), int32, host

    Raises
    ------
    ValueError
        Naming the first term whose list repeats a document or goes down.
    """
    offsets = np.asarray(offsets, np.int64)
    doc_ids = np.asarray(doc_ids)
    if doc_ids.size < 2:
        return
    bad = np.diff(doc_ids.astype(np.int64)) <= 0  # pairs (p, p+1)
    starts = offsets[1:-1]  # a new term begins at these positions: the pair ending there is not a violation
    starts = starts[(starts > 0) & (starts < doc_ids.size)]
    bad[starts - 1] = False
    if bad.any():
        p = int(np.flatnonzero(bad)[0])
        t = int(np.searchsorted(offsets, p, side="right") - 1)
        raise ValueError(
            f"term {t}'s postings are not strictly increasing document numbers (positions {p} and {p + 1}: "
            f"{int(doc_ids[p])} then {int(doc_ids[p + 1])}): each term must list each document once, ascending; "
            "rebuild the index with gpuir's builder (the GPU kernels rely on it)")

