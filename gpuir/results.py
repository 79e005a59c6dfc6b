"""`SearchResults`: what every search returns; its padding; the fields of a TREC run line."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DocNumbers(np.ndarray):
    """The ``(B, k)`` int64 document numbers of a static-index search, callable per row.

    It is the ``ids`` array (index it, slice it, compare it as before); called
    as ``ids(i)`` it gives the user's ids of row ``i``'s hits, best first -- what
    ``ids(i)`` gives on every other result of the package (``MemoryResults``,
    ``RetrieverResults``, the service client's).
    """

    doc_ids: Sequence[str] | None

    def __new__(cls, numbers: np.ndarray, doc_ids: Sequence[str] | None):
        out = np.asarray(numbers).view(cls)
        out.doc_ids = doc_ids
        return out

    def __array_finalize__(self, obj) -> None:
        self.doc_ids = getattr(obj, "doc_ids", None)

    def __call__(self, i: int) -> list[Any]:
        row = np.asarray(self)[i]
        nums = row[row >= 0].tolist()
        return [self.doc_ids[d] for d in nums] if self.doc_ids is not None else nums

    def __reduce__(self):  # pickles as the plain array
        return np.asarray(self).__reduce__()


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
    doc_ids : sequence of str, optional
        The user's id of each document number (``BM25Index.search`` sets it to
        ``index.ids``): :meth:`hits` then returns these ids, and ``ids(i)`` (the
        array called with a row, :class:`DocNumbers`) row ``i``'s ids. None: hits
        carry document numbers.

    Unpacks as ``ids, scores = results``. ``hits(i)`` returns the dicts every search
    of the package returns (``{"id", "score"}``).
    """

    ids: np.ndarray
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    doc_ids: Sequence[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.doc_ids is not None and not isinstance(self.ids, DocNumbers):
            self.ids = DocNumbers(self.ids, self.doc_ids)
        if self.ids.shape != self.scores.shape or self.ids.ndim != 2:
            raise ValueError(
                f"ids and scores must be 2-D arrays of one shape, got {self.ids.shape} "
                f"and {self.scores.shape}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return self.ids.shape  # type: ignore[return-value]

    def __len__(self) -> int:
        """The number of queries (rows)."""
        return self.ids.shape[0]

    def __iter__(self):
        """``ids, scores = results``: unpacks into the two arrays (``meta`` stays on the object).

        Iterating yields exactly ``ids`` then ``scores``, not the query rows
        (``len(results)`` still counts queries).
        """
        yield self.ids
        yield self.scores

    def set_doc_ids(self, doc_ids: Sequence[str] | None) -> None:
        """Name the document numbers: :meth:`hits` and ``ids(i)`` then give the user's ids."""
        self.doc_ids = doc_ids
        self.ids = DocNumbers(self.ids, doc_ids)

    def hits(self, i: int, doc_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The real (non-padding) hits of query ``i``, best first: ``{"id": ..., "score": float}`` dicts.

        The shape of every search's hits in gpuir (``MemoryResults.hits`` and
        ``RetrieverResults.hits`` add the record's ``text`` and fields).

        Parameters
        ----------
        i : int
            Query row.
        doc_ids : sequence of str, optional, deprecated
            The user's document ids, indexed by document number. Default: the
            results' own ``doc_ids`` (set by ``BM25Index.search``); without
            either, hits carry document numbers.
        """
        if doc_ids is None:
            doc_ids = self.doc_ids
        else:
            warnings.warn("SearchResults.hits(i, doc_ids) is deprecated: BM25Index.search's results already "
                          "carry the index's ids (hits(i))", DeprecationWarning, stacklevel=2)
        row_ids, row_scores = np.asarray(self.ids)[i], self.scores[i]
        keep = row_ids >= 0
        out = []
        for d, s in zip(row_ids[keep].tolist(), row_scores[keep].tolist()):
            out.append({"id": doc_ids[d] if doc_ids is not None else d, "score": float(s)})
        return out


class HitLists(list):
    """The hits of B queries as B lists of dicts (a list), with the accessors of every gpuir result.

    What the service client and the adapters' backends return: ``res[i]`` and
    ``res.hits(i)`` are query ``i``'s hits (``{"id", "score", "text", ...fields}``,
    best first), ``res.ids(i)`` their ids.
    """

    def hits(self, i: int) -> list[dict[str, Any]]:
        """Query ``i``'s hits, best first."""
        return list(self[i])

    def ids(self, i: int) -> list[Any]:
        """Query ``i``'s hit ids, best first."""
        return [h["id"] for h in self[i]]


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


#: Characters a TREC run field cannot hold: whitespace (it separates the fields;
#: a newline would start a forged line), control characters, and lone surrogates
#: (not encodable, so not writable as text).
_TREC_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def trec_field(value: str, what: str) -> str:
    """``value`` if it can be one field of a TREC run line; ValueError saying why not.

    TREC runs (``qid Q0 docid rank score tag``) are split on whitespace, and
    there is no escape: an id holding a space, a tab, a newline or a control
    character would shift the columns or forge another line, so it is refused.

    Parameters
    ----------
    value : str
        A query id, document id or run tag.
    what : str
        What it is, for the message (e.g. "document id").
    """
    if not isinstance(value, str) or not value or _TREC_UNSAFE.search(value):
        raise ValueError(
            f"{what} {value!r} cannot be written in TREC format: TREC fields must be non-empty and hold no "
            "whitespace or control characters. Use --format jsonl (any id), or change the id"
        )
    return value
