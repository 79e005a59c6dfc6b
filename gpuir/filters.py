"""Per-query document filters, normalised once for every backend.

A filter restricts a query to an allowed set of documents *before* top-k, so a
filtered search returns only allowed documents (never zero-score filler).

The public vocabulary is ``where`` (as :mod:`gpuir.memory.where`, on every search
of the package); a static index has one field, ``id``, so its ``where`` is
``{"id": "d1"}`` or ``{"id": {"in" | "nin": [...], "eq" | "ne": "d1"}}``, one for
all queries or a list of one per query (:func:`where_to_filters`). Allow-lists
(document numbers, user ids, boolean masks: :func:`normalize_filters`) are the
internal form every backend receives.
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


#: The conditions a static index's ``where`` may put on ``id``.
ID_OPS: tuple[str, ...] = ("eq", "ne", "in", "nin")


def _id_where(w: Any, n_docs: int, id_to_num: Mapping[str, int], where: str) -> np.ndarray | None:
    """One query's ``where`` as allowed document numbers (None: every document)."""
    if w is None:
        return None
    if not isinstance(w, Mapping):
        raise TypeError(f"{where} must be a dict like {{\"id\": {{\"in\": [...]}}}} or None, got {type(w).__name__}")
    extra = sorted(set(w) - {"id"})
    if extra:
        raise ValueError(f"{where}: a static index has no field {extra[0]!r}; its only field is id "
                         "(use gpuir.Memory for records with fields)")
    if not w:
        return None
    cond = w["id"]
    if not isinstance(cond, Mapping):
        cond = {"eq": cond}
    bad = sorted(set(cond) - set(ID_OPS))
    if bad:
        raise ValueError(f"{where}.id: unknown condition {bad[0]!r}; use one of {', '.join(ID_OPS)}")
    allowed = np.ones(n_docs, dtype=bool)
    for op, val in cond.items():
        many = op in ("in", "nin")
        vals = val if many else [val]
        if many and (isinstance(val, (str, bytes)) or not isinstance(val, Sequence)):
            raise TypeError(f"{where}.id.{op} takes a list of ids, got {type(val).__name__}")
        if any(not isinstance(v, str) for v in vals):
            raise TypeError(f"{where}.id.{op}: ids are str")
        nums = np.fromiter((id_to_num[v] for v in vals if v in id_to_num), dtype=np.int64)  # unknown ids match none
        hit = np.zeros(n_docs, dtype=bool)
        hit[nums] = True
        allowed &= hit if op in ("eq", "in") else ~hit
    return np.flatnonzero(allowed).astype(np.int64)


def where_to_filters(where: Any, n_queries: int, n_docs: int,
                     id_to_num: Mapping[str, int]) -> list[np.ndarray | None] | None:
    """A static index's ``where`` (module docstring) as allow-lists, one per query.

    Parameters
    ----------
    where : None, dict, or a list of n_queries (dict or None)
    n_queries, n_docs : int
    id_to_num : mapping str -> int
        The index's user-id to document-number map.

    Returns
    -------
    None when nothing is filtered, else a list of n_queries items, each None or
    ndarray (m,), int64, sorted unique document numbers, host (as :func:`normalize_filters`).
    """
    if where is None:
        return None
    if isinstance(where, Mapping):
        one = _id_where(where, n_docs, id_to_num, "where")
        return None if one is None else [one] * n_queries
    if isinstance(where, (str, bytes)) or not isinstance(where, Sequence):
        raise TypeError(f"where must be None, a dict, or a list of one dict (or None) per query, "
                        f"got {type(where).__name__}")
    if len(where) != n_queries:
        raise ValueError(f"where has {len(where)} entries but there are {n_queries} queries: "
                         "give one (or None) per query, or a single dict for all")
    out = [_id_where(w, n_docs, id_to_num, f"where[{i}]") for i, w in enumerate(where)]
    return None if all(f is None for f in out) else out


def is_where(where: Any) -> bool:
    """Whether ``where`` is written in the ``where`` vocabulary (None, a dict, or a list of dicts / None)."""
    if where is None or isinstance(where, Mapping):
        return True
    return (isinstance(where, Sequence) and not isinstance(where, (str, bytes)) and len(where) > 0
            and all(w is None or isinstance(w, Mapping) for w in where))
