"""A picture of what a memory holds, for people: records over time, per session, and its segments.

:func:`overview` reads one snapshot of a :class:`~gpuir.memory.Memory` (no
copy of any text) and counts, with NumPy over the live rows of each segment:

* ``over_time``: live records with a time, in up to ``bins`` equal spans
  between the oldest and the newest time (records without a time are counted
  apart, in ``untimed``);
* ``sessions``: the ``top_sessions`` sessions with the most live records
  (``no_session``: records without one);
* ``segments``: each segment's records (stored, live) and its time partition.

Expired records (hidden, not yet purged) are not counted, as in ``Memory.list`` and ``Memory.count``.

It is what the service's memory inspector page draws (``GET
/v1/tenants/{tenant}/overview``); its cost is a pass over the live rows'
time and session codes, so a page that polls it does not touch the texts or
the postings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .expiry import cutoff as expiry_cutoff
from .expiry import expired_rows
from .records import MISSING_TIME
from .timeutil import format_time

__all__ = ["overview"]


def overview(memory: Any, tenant: str | None = None, bins: int = 40, top_sessions: int = 30) -> dict[str, Any]:
    """Counts of a memory's live records over time, per session, and per segment.

    Parameters
    ----------
    memory : Memory
        Read at one snapshot (writes after the call starts are not seen).
    tenant : str, optional
        Count only this tenant's records (a memory shared by tenants); None: every record.
    bins : int
        Most spans of ``over_time`` (1..1000).
    top_sessions : int
        Most sessions listed (1..1000), the largest first (ties: by name).

    Returns
    -------
    dict
        ``records`` (int), ``untimed`` (int), ``time_span`` (``{"min", "max"}`` ISO 8601, or None),
        ``over_time`` (list of ``{"start", "end", "records"}``, ISO 8601 times, oldest first),
        ``sessions`` (list of ``{"session", "records"}``), ``session_count`` (int), ``no_session`` (int),
        ``segments`` (list of ``{"uid", "partition", "stored", "live", "records"}``: ``records`` counts the
        tenant's live records when ``tenant`` is given), ``partition_window_ms`` (int or None).

    Raises
    ------
    ValueError
        ``bins`` or ``top_sessions`` out of range.
    """
    for name, v in (("bins", bins), ("top_sessions", top_sessions)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 1000:
            raise ValueError(f"{name} must be an integer in 1..1000, got {v!r}")
    snap = memory.snapshot()  # one immutable state: every count below is of the same records
    want = None
    if tenant is not None:
        want = snap.dicts["tenant"].index.get(tenant, -2)  # -2: a tenant never stored matches no row
    cutoff = expiry_cutoff(snap)  # None: nothing in this memory ever expires
    times, sess, segments = [], [], []
    for v in snap.views:
        rows = v.live_rows()
        if cutoff is not None:  # expired (hidden, not yet purged) records are not counted, as list and count do
            rows = np.setdiff1d(rows, expired_rows(v, cutoff), assume_unique=True)
        if want is not None:
            rows = rows[v.seg.codes["tenant"][rows] == want]
        segments.append({"uid": int(v.seg.uid), "partition": v.seg.partition, "stored": int(v.seg.n_docs),
                         "live": int(v.n_live), "records": int(rows.size)})
        if rows.size:
            times.append(v.seg.time[rows])
            sess.append(v.seg.codes["session"][rows])
    t = np.concatenate(times) if times else np.zeros(0, np.int64)
    s = np.concatenate(sess) if sess else np.zeros(0, np.int32)
    timed = t[t != MISSING_TIME]
    over: list[dict[str, Any]] = []
    span = None
    if timed.size:
        lo, hi = int(timed.min()), int(timed.max())
        span = {"min": format_time(lo), "max": format_time(hi)}
        n = 1 if hi == lo else int(bins)
        width = max(1, -(-(hi - lo + 1) // n))  # ceil: the newest record falls in the last span
        counts = np.bincount(((timed - lo) // width).astype(np.int64), minlength=n)[:n]
        over = [{"start": format_time(lo + i * width), "end": format_time(lo + (i + 1) * width),
                 "records": int(c)} for i, c in enumerate(counts.tolist())]
    codes, cnt = np.unique(s[s >= 0], return_counts=True)
    names = snap.dicts["session"].values
    ranked = sorted(zip(cnt.tolist(), codes.tolist()), key=lambda x: (-x[0], names[x[1]]))
    return {
        "records": int(t.size),
        "untimed": int(t.size - timed.size),
        "time_span": span,
        "over_time": over,
        "sessions": [{"session": names[c], "records": n} for n, c in ranked[:top_sessions]],
        "session_count": len(ranked),
        "no_session": int(np.count_nonzero(s < 0)),
        "segments": segments,
        "partition_window_ms": snap.window_ms,
    }
