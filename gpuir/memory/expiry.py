"""Expiry: a record's ``expires_at`` hides it from search, get and list once past; writes purge it.

A record may carry ``expires_at`` (a time, as :mod:`gpuir.memory.timeutil`
accepts it). From that instant on (``expires_at <= now``) the record is
**hidden**: no search, ``get``, ``list``, ``count`` or export returns it, and a
``where`` cannot bring it back. It is **purged** by the next write of the
memory (any add, update, upsert, delete or merge first deletes every expired
record, so its terms leave the BM25 statistics N and df then) and leaves the
disk with the merge that follows, as any deleted record does. Until that write
an expired record still counts in the statistics (a search cannot change the
memory); :meth:`Memory.purge_expired <gpuir.memory.Memory.purge_expired>`
purges at once.

Storage: ``expires_at`` lives in the record's stored metadata JSON under the
reserved key :data:`~gpuir.memory.records.EXPIRES_KEY` (a key starting with a
NUL character, which no user key may use), as int epoch milliseconds, and
comes back as the record's own ``expires_at`` field. This keeps the segment
layout and files unchanged. The per-segment column is parsed once per segment
(only for segments whose metadata bytes hold the key at all; a byte search
skips the others) and cached on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from .records import EXPIRES_KEY

__all__ = ["EXPIRES_KEY", "NEVER", "cutoff", "expired_rows", "expiry_column", "now_ms"]

#: ``expires_at`` of a record that never expires.
NEVER = int(np.iinfo(np.int64).max)
_KEY_JSON = json.dumps(EXPIRES_KEY)  # how the key appears in the stored JSON text (NUL escaped)
_NEEDLE = _KEY_JSON.encode("utf-8")


def now_ms() -> int:
    """The wall clock as int epoch milliseconds."""
    return time.time_ns() // 1_000_000


def expiry_column(seg: Any) -> np.ndarray | None:
    """Each row's ``expires_at`` (int64 epoch ms; :data:`NEVER` = none), or None when no row of ``seg`` expires.

    Returns
    -------
    ndarray, shape (n,), int64, host, or None. Cached on the segment.
    """
    hit = seg.cache.get("expiry", False)
    if hit is not False:
        return hit
    col = None
    meta = seg.meta
    if bytes(memoryview(meta.data)).find(_NEEDLE) >= 0:
        col = np.full(seg.n_docs, NEVER, dtype=np.int64)
        for i, raw in enumerate(meta.tolist()):
            if raw and _KEY_JSON in raw:
                v = json.loads(raw).get(EXPIRES_KEY)
                if isinstance(v, int) and not isinstance(v, bool):
                    col[i] = v
        if not (col < NEVER).any():
            col = None
    seg.cache["expiry"] = col
    return col


def has_expiry(metadata: Iterable[str]) -> bool:
    """Whether any of these stored metadata texts holds an ``expires_at``."""
    return any(_KEY_JSON in m for m in metadata if m)


def cutoff(snap: Any, now: int | None = None) -> int | None:
    """``now`` (default the wall clock) when some record of the snapshot ``snap`` (or of the segment views
    ``snap``) has an ``expires_at``, else None. A search with a cutoff hides the records with
    ``expires_at <= cutoff``. A snapshot of a memory that was never given an ``expires_at``
    (``snap.expiring`` false) is answered without looking at its segments."""
    if getattr(snap, "expiring", True) is False:
        return None
    views = getattr(snap, "views", snap)
    if any(expiry_column(v.seg) is not None for v in views):
        return now_ms() if now is None else int(now)
    return None


def expired_rows(view: Any, now: int) -> np.ndarray:
    """Live rows of ``view`` whose ``expires_at <= now``: ndarray (m,), int64, ascending."""
    col = expiry_column(view.seg)
    if col is None:
        return np.zeros(0, np.int64)
    dead = col <= now
    if view.live is not None:
        dead &= view.live
    return np.flatnonzero(dead).astype(np.int64)
