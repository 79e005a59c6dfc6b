"""``at=``: the time each question is asked, as epoch milliseconds (UTC).

The temporal channel anchors relative expressions ("last Tuesday", "two weeks
ago") at it, and "since we last talked" looks at the sessions that started
before it.
"""

from __future__ import annotations

import time
from datetime import date, datetime
from typing import Any

import numpy as np

from ..memory.records import RecordError, to_epoch_ms

__all__ = ["resolve_at"]


def _one(x: Any, what: str) -> int:
    if not isinstance(x, (int, float, np.integer, np.floating, str, datetime, date)) or isinstance(x, bool):
        raise TypeError(f"{what} must be epoch milliseconds (int), an ISO-8601 string or a datetime, "
                         f"got {type(x).__name__} {x!r}")
    try:
        return to_epoch_ms(x, what)
    except RecordError as e:
        raise ValueError(str(e)) from None


def resolve_at(at: Any, n_queries: int, now_ms: int | None = None) -> np.ndarray:
    """Each query's anchor time.

    Parameters
    ----------
    at : None, int (epoch ms), str (ISO 8601), datetime, or a list of ``n_queries`` of them
        None: now (the same instant for the whole batch). A naive time is UTC.
    n_queries : int
    now_ms : int, optional
        "Now" for ``at=None`` (tests); default the wall clock.

    Returns
    -------
    ndarray, shape (n_queries,), int64, host: epoch milliseconds.
    """
    if at is None:
        now = int(time.time() * 1000) if now_ms is None else int(now_ms)
        return np.full(n_queries, now, dtype=np.int64)
    if isinstance(at, (list, tuple, np.ndarray)):
        if len(at) != n_queries:
            raise ValueError(f"at has {len(at)} entries for {n_queries} queries: give one time, or one per query")
        return np.array([_one(x, f"at[{i}]") for i, x in enumerate(at)], dtype=np.int64)
    return np.full(n_queries, _one(at, "at"), dtype=np.int64)
