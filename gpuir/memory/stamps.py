"""What a memory records about each record itself: a generated id, and its created and updated times.

* **Ids.** A record added without an ``id`` gets a new one: a UUIDv7
  (RFC 9562) as its 36-character string, time-ordered (the first 48 bits are
  the epoch milliseconds; ids made later in this process sort after those made
  before, also within one millisecond: :func:`uuid7`).
* **created_at / updated_at** (unless the memory was made with ``record_times=False``;
  the setting is saved with it, and a directory saved before times were the default
  opens without them: :func:`gpuir.memory.load.load_commit`). Every record added gets ``created_at`` (when it
  was added) and ``updated_at`` (when its current version was written; equal
  to ``created_at`` until an update changes it). An update that changes the
  record sets ``updated_at`` and keeps ``created_at``; an update that changes
  nothing leaves both as they were. Both come back with the record (``get``,
  hits, ``list``, ``export``; ISO 8601), are filters of ``where``
  (``{"updated_at": {"gte": "2024-05-01"}}``) and orders of ``list``
  (``order_by="created_at"`` or ``"updated_at"``).

**Decided before the record is applied.** The id and the times are filled in
when the records are brought to their canonical form
(:func:`gpuir.memory.intake.canonical_records` with ``stamp="add"`` for adds,
``stamp="update"`` for changes), and only where the caller gave none: the
canonical record dict carries them, so applying the same canonical dicts again
(a log replay, an import, a copy) gives the same ids and times. Given values
are kept (an export imported keeps its records' times).

Storage: like ``expires_at`` (:mod:`gpuir.memory.expiry`), both times live in
the record's stored metadata JSON under reserved keys (:data:`CREATED_KEY`,
:data:`UPDATED_KEY`; no user key can be them), so the segment format is
unchanged; the columns ``where`` and ``list`` read are parsed once per
segment (:func:`stamp_column`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

__all__ = ["CREATED_KEY", "STAMP_FIELDS", "UPDATED_KEY", "stamp_column", "stamp_records", "uuid7"]

#: The metadata key holding a record's ``created_at`` (int epoch ms).
CREATED_KEY = "\u0000created_at"
#: The metadata key holding a record's ``updated_at`` (int epoch ms).
UPDATED_KEY = "\u0000updated_at"
#: The record fields kept by the memory itself, and their storage keys.
STAMP_FIELDS = {"created_at": CREATED_KEY, "updated_at": UPDATED_KEY}

_lock = threading.Lock()
_last = [0, 0]  # (ms, counter) of the last uuid7 made in this process


def uuid7(ms: int | None = None) -> str:
    """A new UUIDv7 (RFC 9562) as a 36-character string, e.g. ``0190b6a4-...``.

    48 bits of epoch milliseconds, the version, 12 bits of a counter that
    orders the ids made within one millisecond in this process (method 1 of
    RFC 9562 section 6.2; a clock that steps back keeps the last millisecond),
    the variant, and 62 random bits.

    Parameters
    ----------
    ms : int, optional
        The timestamp (default: now).
    """
    now = time.time_ns() // 1_000_000 if ms is None else int(ms)
    with _lock:
        last_ms, counter = _last
        if now <= last_ms:
            now, counter = last_ms, counter + 1
            if counter > 0xFFF:  # 4096 ids in one millisecond: borrow the next millisecond
                now, counter = last_ms + 1, 0
        else:
            counter = 0
        _last[0], _last[1] = now, counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = ((now & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def stamp_records(records: list[dict[str, Any]], how: str, now: int) -> list[dict[str, Any]]:
    """Canonical records with what the memory decides filled in where absent (copies where anything changed).

    ``how="add"``: ``id`` (a :func:`uuid7` of ``now``), ``created_at`` (``now``) and
    ``updated_at`` (the ``created_at``); ``how="id"``: the ``id`` only (a memory without
    ``record_times``); ``how="update"``: ``updated_at`` (``now``; a change that turns out
    to change nothing is dropped later, with its stamp).
    """
    out = records
    if how == "id":
        for j, rec in enumerate(records):
            if rec.get("id") is None:
                if out is records:
                    out = list(records)
                out[j] = {**rec, "id": uuid7(now)}
        return out
    for j, rec in enumerate(records):
        if how == "add":
            need = rec.get("id") is None or rec.get("created_at") is None or rec.get("updated_at") is None
        else:
            need = rec.get("updated_at") is None
        if not need:
            continue
        if out is records:
            out = list(records)
        r = dict(rec)
        if how == "add":
            if r.get("id") is None:
                r["id"] = uuid7(now)
            if r.get("created_at") is None:
                r["created_at"] = now
            if r.get("updated_at") is None:
                r["updated_at"] = r["created_at"]
        else:
            r["updated_at"] = now
        out[j] = r
    return out


def stamp_column(seg: Any, field: str) -> np.ndarray | None:
    """Each row's ``created_at`` or ``updated_at`` (int64 epoch ms; int64 min = none), or None when no row
    of ``seg`` has one. Parsed from the stored metadata once per segment (cached).

    Returns
    -------
    ndarray, shape (n,), int64, host, or None.
    """
    key = STAMP_FIELDS[field]
    hit = seg.cache.get(("stamp", field), False)
    if hit is not False:
        return hit
    needle = json.dumps(key)
    col = None
    meta = seg.meta
    if bytes(memoryview(meta.data)).find(needle.encode()) >= 0:
        col = np.full(seg.n_docs, np.iinfo(np.int64).min, dtype=np.int64)
        for i, raw in enumerate(meta.tolist()):
            if raw and needle in raw:
                v = json.loads(raw).get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    col[i] = v
    seg.cache[("stamp", field)] = col
    return col
