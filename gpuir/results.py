"""`SearchResults`: what every search returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass
class SearchResults:
    """Top-k results of a batch of queries.

    Attributes
    ----------
    ids : ndarray, shape (n_queries, k), int64, host
        Internal document numbers (0 .. N-1), best first; -1 pads rows with fewer
        than k matching documents.
    scores : ndarray, shape (n_queries, k), float32, host
        Scores matching ``ids``; -inf where ``ids`` is -1. Rows are sorted by
        descending score, ties broken by ascending document number.
    meta : dict
        How the results were made: ``backend`` and the reason it was chosen, timings.
    """

    ids: np.ndarray
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ids.shape != self.scores.shape or self.ids.ndim != 2:
            raise ValueError(
                f"ids and scores must be 2-D arrays of one shape, got {self.ids.shape} "
                f"and {self.scores.shape}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return self.ids.shape  # type: ignore[return-value]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def hits(self, i: int, doc_ids: Sequence[str] | None = None) -> list[tuple[Any, float]]:
        """The real (non-padding) hits of query ``i`` as ``(id, score)`` pairs.

        Parameters
        ----------
        i : int
            Query row.
        doc_ids : sequence of str, optional
            The user's document ids, indexed by document number; when given, hits
            carry these instead of document numbers.
        """
        row_ids, row_scores = self.ids[i], self.scores[i]
        keep = row_ids >= 0
        out = []
        for d, s in zip(row_ids[keep].tolist(), row_scores[keep].tolist()):
            out.append((doc_ids[d] if doc_ids is not None else d, float(s)))
        return out


def padded_arrays(n_queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Fresh all-padding result arrays, to be filled row by row.

    Returns
    -------
    ids : ndarray, shape (n_queries, k), int64, host, all -1
    scores : ndarray, shape (n_queries, k), float32, host, all -inf
    """
    return (
        np.full((n_queries, k), -1, dtype=np.int64),
        np.full((n_queries, k), -np.inf, dtype=np.float32),
    )


def empty_results(n_queries: int, k: int) -> SearchResults:
    """All-padding results: ids -1 and scores -inf, shape (n_queries, k)."""
    return SearchResults(*padded_arrays(n_queries, k))
