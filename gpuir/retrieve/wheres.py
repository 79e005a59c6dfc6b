"""Combining ``where`` filters (:mod:`gpuir.memory.where`): row selection and AND of one extra condition.

The temporal channel narrows a query's ``where`` to its time window and the
type filter narrows it to the records of one type (by id); both go through
:func:`and_where`, which keeps every condition of the caller's filter (a tenant
stays a hard boundary: it is never removed or widened).
"""

from __future__ import annotations

from typing import Any

from ..memory.records import RecordError
from ..memory.timeutil import format_time, parse_time
from ..memory.where import WhereError

__all__ = ["and_where", "row_where", "rows_where"]


def row_where(where: Any, i: int) -> Any:
    """The ``where`` of query ``i`` (``where`` is None, a dict, or a list of B)."""
    return where[i] if isinstance(where, list) else where


def rows_where(where: Any, idx: list[int]) -> Any:
    """The ``where`` of the queries ``idx`` (a list when ``where`` is per query)."""
    return [where[i] for i in idx] if isinstance(where, list) else where


_LOWER = ("gt", "gte")
_UPPER = ("lt", "lte")


def _ops(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, dict) else {"eq": v}


def _ms(x: Any) -> int:
    try:
        return parse_time(x, "where time")
    except RecordError as e:
        raise WhereError(str(e)) from None


def _and_time(a: Any, b: Any) -> dict[str, Any]:
    """AND of two time conditions (operators merged; the tighter bound of the same operator kept; bounds
    written as ISO 8601 strings)."""
    out = {k: (_ms(x) if k in _LOWER + _UPPER else x) for k, x in _ops(a).items()}
    for k, x in _ops(b).items():
        if k in _LOWER + _UPPER:
            x = _ms(x)
            if k in out:
                x = max(out[k], x) if k in _LOWER else min(out[k], x)
        elif k in out and out[k] != x:
            raise WhereError(f"cannot combine time conditions {a!r} and {b!r}")
        out[k] = x
    return {k: (format_time(x) if k in _LOWER + _UPPER else x) for k, x in out.items()}


def _ids(v: Any) -> set[str]:
    ops = _ops(v)
    if set(ops) - {"eq", "in"}:
        raise WhereError(f"id takes equality and membership only, got {v!r}")
    got: set[str] | None = None
    if "eq" in ops:
        got = {ops["eq"]}
    if "in" in ops:
        s = set(ops["in"])
        got = s if got is None else got & s
    return got or set()


def and_where(where: Any, extra: dict[str, Any]) -> Any:
    """One query's ``where`` AND ``extra`` (``extra`` holds ``time`` and/or ``id`` conditions).

    Parameters
    ----------
    where : None, False or dict
        False (no candidates) stays False.
    extra : dict

    Returns
    -------
    dict or False
    """
    if where is False:
        return False
    out = dict(where or {})
    for key, cond in extra.items():
        if key not in out:
            out[key] = cond
        elif key == "time":
            out[key] = _and_time(out[key], cond)
        elif key == "id":
            out[key] = {"in": sorted(_ids(out[key]) & _ids(cond))}
        else:
            raise WhereError(f"and_where: cannot combine a second {key!r} condition")
    return out
