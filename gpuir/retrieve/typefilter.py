"""Type filter with widening.

A query whose rule-based type hint (:func:`gpuir.retrieve.query_types.type_hint`:
``"preference"``, ``"event"``, ``"fact"`` or None) is not None searches only the
records of that type: a record's type is its ``type`` field, or
:func:`~gpuir.retrieve.query_types.record_type` of its text when it has none
(computed once per record, when the catalog reads it, and kept as a small code by
sequence number: the ids are read from the memory's snapshot when a query needs them). The filter is AND-ed with
the caller's ``where`` (so a tenant stays a hard boundary), as an ``id``
membership condition, and applies to every channel.

**Widening.** The filtered search runs at depth ``max(k, min_results)``; a query
for which fewer than ``min_results`` results survive is searched again without
the filter, and that search is its answer (``meta["widened"][i]`` is True). A
query without a hint is searched unfiltered from the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .query_types import type_hint
from .results import RetrieverResults
from .wheres import and_where, row_where

__all__ = ["search_with_widening", "type_hints", "typed_wheres"]


def type_hints(queries: list[str]) -> list[str | None]:
    """Each query's type hint (:func:`gpuir.retrieve.query_types.type_hint`)."""
    return [type_hint(q) for q in queries]


def typed_wheres(ids_of_type: Callable[[str], list[str]], where: Any, hints: list[str | None]) -> list[Any]:
    """Each query's ``where`` AND "the record's type is its hint" (unchanged where the hint is None).

    ``ids_of_type(t)`` lists the live records of type ``t`` (the catalog's :meth:`ids_of_type`);
    it is asked once per distinct hint.
    """
    by_type: dict[str, list[str]] = {}
    out = []
    for i, h in enumerate(hints):
        w = row_where(where, i)
        if h is not None and h not in by_type:
            by_type[h] = sorted(ids_of_type(h))
        out.append(w if h is None else and_where(w, {"id": {"in": by_type[h]}}))
    return out


def _truncate(res, k: int):
    base = res
    return RetrieverResults(res.unit, [row[:k] for row in res.keys], res.scores[:, :k], res.numbers[:, :k],
                            lambda i: base.hits(i)[:k], res.meta)


def _replace_rows(res, other, rows: np.ndarray):
    """``res`` with rows ``rows`` taken from ``other`` (``other`` row j is ``res`` row rows[j])."""
    at = {int(i): j for j, i in enumerate(rows.tolist())}
    keys = [other.keys[at[i]] if i in at else kk for i, kk in enumerate(res.keys)]
    scores, numbers = res.scores.copy(), res.numbers.copy()
    scores[rows], numbers[rows] = other.scores, other.numbers

    def hits(i: int):
        return other.hits(at[i]) if i in at else res.hits(i)

    return RetrieverResults(res.unit, keys, scores, numbers, hits, res.meta)


def search_with_widening(search: Callable[..., RetrieverResults], sync: Callable[[], Any],
                         ids_of_type: Callable[[str], list[str]],
                         min_results: int, queries: list[str], k: int, where: Any, unit: str, backend: str,
                         anchors: np.ndarray) -> RetrieverResults:
    """A search under the type filter, widened per query (module docstring).

    Parameters
    ----------
    search : callable ``(queries, k, where, unit, backend, anchors) -> RetrieverResults``
        The search it wraps (:meth:`Retriever.search_fused`).
    sync : callable
        Brings the catalog's record types up to date (:meth:`Retriever.sync`).
    ids_of_type : callable ``(type) -> list of str``
        The ids of the live records of a type (:meth:`Catalog.ids_of_type`, after ``sync``).
    min_results : int
        Fewer surviving results than this widen a query.

    Returns
    -------
    RetrieverResults, (B, k); ``meta["widened"]`` ndarray (B,) bool, ``meta["type_hints"]``
    list of B (str or None), ``meta["timings"]["widen"]`` when a query was widened.
    """
    sync()
    hints = type_hints(queries)
    hinted = np.array([h is not None for h in hints], bool)
    if not hinted.any():
        res = search(queries, k, where, unit, backend, anchors)
        res.meta["type_hints"] = hints
        return res
    wheres = typed_wheres(ids_of_type, where, hints)
    first = search(queries, max(k, min_results), wheres, unit, backend, anchors)
    counts = (first.numbers >= 0).sum(axis=1)
    widen = hinted & (counts < min_results)
    res = _truncate(first, k)
    if widen.any():
        t0 = time.perf_counter()
        rows = np.flatnonzero(widen)
        again = search([queries[i] for i in rows], k,
                       [row_where(where, i) for i in rows.tolist()] if where is not None else None,
                       unit, backend, anchors[rows])
        res = _replace_rows(res, again, rows)
        res.meta["timings"]["widen"] = time.perf_counter() - t0
        esc = np.asarray(res.meta["escalated"]).copy()
        esc[rows] = again.meta["escalated"]
        res.meta["escalated"] = esc
        for j, i in enumerate(rows.tolist()):
            res.meta["windows"][i] = again.meta["windows"][j]
    res.meta["widened"] = widen
    res.meta["type_hints"] = hints
    return res
