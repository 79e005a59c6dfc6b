"""Per-query document filters, normalised once for every backend.

A filter restricts a query to an allowed set of documents *before* top-k, so a
filtered search returns only allowed documents (never zero-score filler).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: One query's filter after normalisation: None (all documents) or the allowed
#: document numbers, ndarray shape (m,), int64, sorted, unique, host.
AllowList = "np.ndarray | None"


def _one(f: Any, n_docs: int, id_to_num: Mapping[str, int] | None, where: str) -> np.ndarray | None:
    if f is None:
        return None
    arr = np.asarray(f)
    if arr.dtype == bool:
        if arr.shape != (n_docs,):
            raise ValueError(
                f"{where}: a boolean filter mask must have one entry per document "
                f"(shape ({n_docs},)), got shape {arr.shape}"
            )
        return np.flatnonzero(arr).astype(np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{where}: a filter must be a 1-D allow-list or boolean mask, got {arr.ndim}-D")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind in "UO":
        if id_to_num is None:
            raise TypeError(f"{where}: string document ids need the index's id mapping")
        missing = [x for x in arr.tolist() if x not in id_to_num]
        if missing:
            raise ValueError(
                f"{where}: filter names {len(missing)} unknown document id(s), e.g. {missing[0]!r}"
            )
        arr = np.fromiter((id_to_num[x] for x in arr.tolist()), dtype=np.int64, count=arr.size)
    elif arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
        if arr.size == n_docs and n_docs > 2 and arr.min() >= 0 and arr.max() <= 1:
            # one 0 or 1 per document: a mask in an integer dtype, not document numbers 0 and 1
            raise ValueError(
                f"{where}: an integer array of one 0/1 per document looks like a mask, not document numbers: "
                "pass a boolean mask (mask.astype(bool)) or the allowed document numbers "
                "(np.flatnonzero(mask))"
            )
        if arr.min() < 0 or arr.max() >= n_docs:
            raise ValueError(
                f"{where}: filter document numbers must lie in [0, {n_docs}), "
                f"got range [{arr.min()}, {arr.max()}]"
            )
    else:
        raise TypeError(
            f"{where}: a filter must hold document numbers (int), document ids (str) "
            f"or be a boolean mask, got dtype {arr.dtype}"
        )
    return np.unique(arr)


def normalize_filters(
    filters: Any,
    n_queries: int,
    n_docs: int,
    id_to_num: Mapping[str, int] | None = None,
) -> list[np.ndarray | None] | None:
    """Turn user filters into one allow-list (or None) per query.

    Parameters
    ----------
    filters : None, one filter, or a sequence of n_queries filters
        A filter is None, a boolean mask of shape (N,), an allow-list of document
        numbers (int) or of user document ids (str). A single mask or a single
        allow-list given as a NumPy array applies to every query.
    n_queries, n_docs : int
    id_to_num : mapping str -> int, optional
        The index's user-id to document-number map, for string allow-lists.

    Returns
    -------
    None when nothing is filtered, else a list of length n_queries whose items are
    None or ndarray (m,), int64, sorted unique document numbers, host.
    """
    if filters is None:
        return None
    if isinstance(filters, np.ndarray):
        one = _one(filters, n_docs, id_to_num, "filter")
        return [one] * n_queries
    if not isinstance(filters, Sequence) or isinstance(filters, (str, bytes)):
        raise TypeError("filters must be None, a NumPy array, or a list with one filter per query")
    if len(filters) != n_queries:
        raise ValueError(
            f"filters has {len(filters)} entries but there are {n_queries} queries: "
            "give one filter (or None) per query, or a single NumPy array for all"
        )
    out = [_one(f, n_docs, id_to_num, f"filter of query {i}") for i, f in enumerate(filters)]
    return None if all(f is None for f in out) else out


def allow_mask(allow: Sequence[np.ndarray | None], n_docs: int) -> np.ndarray:
    """Boolean allow masks of normalised filters (the one allow-list -> mask conversion).

    Parameters
    ----------
    allow : sequence of B items, each None (every document) or ndarray (m,), int64
        Allowed document numbers, as :func:`normalize_filters` returns them.
    n_docs : int
        N.

    Returns
    -------
    ndarray, shape (B, N), bool, host: ``mask[i, d]`` is True when query i may return document d.
    """
    mask = np.zeros((len(allow), n_docs), dtype=bool)
    for i, a in enumerate(allow):
        if a is None:
            mask[i] = True
        elif a.size:
            mask[i, a] = True
    return mask
