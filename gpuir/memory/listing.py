"""Listing what a memory holds: pages of records in a stable order, with cursors; counts.

:meth:`Memory.list <gpuir.memory.Memory.list>` returns a :class:`Page`:
``page.records`` (record dicts, times in ISO 8601) and ``page.cursor`` (an
opaque string for the next page, ``None`` on the last one). Orders:

``"seq"``
    the add order (an update moves a record to the end, as it does for ties);
``"time"``
    by ``time`` (then add order); records without a time come after the timed
    ones in either direction.
``"created_at"``, ``"updated_at"``
    by the times a memory with ``record_times`` keeps (:mod:`gpuir.memory.stamps`;
    then add order), records without one last. ``"created_at"`` keeps each
    record's place through its updates (among records added in other
    milliseconds: equal times rank by add order) (an update moves it to the end of the
    add order: see :mod:`gpuir.memory.updates` for why).

``descending=True`` reverses the order (newest first). **Cursors are stable**:
a cursor holds the sort key of the last record returned (not a position), so
records added or deleted while paging never shift a page, nothing is returned
twice because of them, and a record added after the cursor's position appears
on a later page (keyset pagination). A cursor is bound to its filter and order:
passing it with another ``where``, ``order_by`` or ``descending`` is an error.
Expired records are never listed or counted.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .records import MISSING_TIME
from .snapshot import Snapshot
from .stamps import STAMP_FIELDS, stamp_column
from .timeutil import public_record
from .where import Where

__all__ = ["ORDERS", "Page", "check_list_args", "count", "fingerprint", "ids_matching", "list_page", "merge_pages"]

#: Orders of :meth:`Memory.list`.
ORDERS = ("seq", "time", "created_at", "updated_at")


@dataclass
class Page:
    """One page of a listing.

    Attributes
    ----------
    records : list of dict
        Record dicts (``time``, ``expires_at`` in ISO 8601), in the listing's order.
    cursor : str or None
        Pass as ``cursor=`` for the next page; None on the last page.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    cursor: str | None = None
    #: The sort key of each record (``list_page(with_keys=True)``, for :func:`merge_pages`); None otherwise.
    keys: list[list[int]] | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)


def fingerprint(where: Any, order_by: str, descending: bool, time_unit: str | None) -> str:
    """What a cursor is bound to: the filter (canonical JSON), order and direction."""
    raw = json.dumps([where, order_by, bool(descending), time_unit], sort_keys=True, default=repr)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


def _encode(fp: str, key: list[int]) -> str:
    raw = json.dumps({"v": 1, "f": fp, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: Any, fp: str, width: int) -> list[int]:
    if not isinstance(cursor, str) or not cursor:
        raise ValueError(f"cursor must be the string a previous page gave (page.cursor), got {cursor!r}")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        obj = json.loads(raw)
        key = obj["k"]
        ok = obj.get("v") == 1 and isinstance(key, list) and len(key) == width and all(
            isinstance(x, int) and not isinstance(x, bool) for x in key)
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise ValueError("cursor is not one a page of this memory gave: pass page.cursor as it was returned")
    if obj.get("f") != fp:
        raise ValueError("cursor belongs to a listing with another where, order_by or descending: a cursor "
                         "continues the listing that returned it (start again without a cursor)")
    return key


def _matches(snap: Snapshot, where: Where | None, order_by: str = "time"
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(seqs, times, view positions, rows) of the live records passing ``where``, each ndarray (m,), int64;
    ``times``: the column ``order_by`` names (``time``, ``created_at`` or ``updated_at``; missing: int64 min)."""
    seqs, times, vis, rows = [], [], [], []
    for vi, v in enumerate(snap.views):
        r = v.live_rows() if where is None else where.rows(v, snap.dicts)
        if r.size:
            seqs.append(v.seg.seqs[r])
            if order_by in STAMP_FIELDS:
                col = stamp_column(v.seg, order_by)
                times.append(np.full(r.size, MISSING_TIME, np.int64) if col is None else col[r])
            else:
                times.append(v.seg.time[r])
            vis.append(np.full(r.size, vi, np.int64))
            rows.append(r)
    if not seqs:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    return tuple(np.concatenate(x).astype(np.int64, copy=False) for x in (seqs, times, vis, rows))  # type: ignore


def ids_matching(snap: Snapshot, where: Where | None) -> list[str]:
    """The ids of the live (and unexpired) records of ``snap`` passing ``where``, in add order."""
    seqs, _, vis, rows = _matches(snap, where)
    out = []
    for i in np.argsort(seqs, kind="stable").tolist():
        out.append(snap.views[int(vis[i])].seg.ids[int(rows[i])])
    return out


def _keys(seqs: np.ndarray, times: np.ndarray, order_by: str, descending: bool) -> list[np.ndarray]:
    """Sort-key columns, most significant first (ascending order of the listing)."""
    sgn = -1 if descending else 1
    if order_by == "seq":
        return [sgn * seqs]
    missing = times == MISSING_TIME
    t = np.where(missing, 0, times)
    return [missing.astype(np.int64), sgn * t, sgn * seqs]


def count(snap: Snapshot, where: Where | None) -> int:
    """Live (and unexpired) records passing ``where``."""
    if where is None:
        return snap.n_docs
    return int(sum(int(where.rows(v, snap.dicts).size) for v in snap.views))


def check_list_args(fp: str, order_by: str, limit: Any, cursor: Any) -> list[int] | None:
    """The refusals of a listing's arguments (the same for every memory class); returns the cursor's key.

    Raises
    ------
    ValueError
        An unknown order, a limit that is not a positive integer, a foreign or damaged cursor.
    """
    if order_by not in ORDERS:
        raise ValueError(f"order_by must be one of {', '.join(repr(o) for o in ORDERS)}, got {order_by!r}")
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    width = 1 if order_by == "seq" else 3
    return None if cursor is None else _decode(cursor, fp, width)


def merge_pages(pages: list[Page], fp: str, limit: int) -> Page:
    """One page of a listing from the pages of its parts (each ``list_page(..., with_keys=True)`` of the
    same arguments over disjoint records, as a sharded memory's shards hold them): the first ``limit``
    records by sort key, and the cursor one memory holding every part would give.

    Sort keys are global (sequence numbers are the memory's add order; times are the records' own), so
    each part's page holds every record of the merged page that is in that part.
    """
    items = [(tuple(k), r) for p in pages for k, r in zip(p.keys or [], p.records)]
    items.sort(key=lambda x: x[0])
    take = items[: int(limit)]
    more = len(items) > len(take) or any(p.cursor is not None for p in pages)
    return Page([r for _, r in take], _encode(fp, list(take[-1][0])) if more and take else None)


def list_page(snap: Snapshot, where: Where | None, fp: str, order_by: str = "seq", descending: bool = False,
              limit: int = 100, cursor: str | None = None, with_keys: bool = False) -> Page:
    """One page of the records passing ``where`` (see the module docstring).

    Raises
    ------
    ValueError
        An unknown order, a limit that is not a positive integer, a foreign or damaged cursor.
    RuntimeError
        Defence in depth: a listing confined to a tenant met another tenant's record.
    """
    after = check_list_args(fp, order_by, limit, cursor)
    seqs, times, vis, rows = _matches(snap, where, order_by)
    keys = _keys(seqs, times, order_by, descending)
    if after is not None and seqs.size:
        gt = np.zeros(seqs.size, dtype=bool)
        eq = np.ones(seqs.size, dtype=bool)
        for col, k in zip(keys, after):
            gt |= eq & (col > k)
            eq &= col == k
        keys = [c[gt] for c in keys]
        vis, rows = vis[gt], rows[gt]
    order = np.lexsort(tuple(reversed(keys))) if keys[0].size else np.zeros(0, np.int64)
    take = order[: int(limit)]
    tenant = where.tenant if where is not None else None
    want = snap.dicts["tenant"].lookup(tenant) if tenant is not None else None
    t_vis, t_rows = vis[take].tolist(), rows[take].tolist()
    for vi, r in zip(t_vis, t_rows):
        if want is not None and int(snap.views[vi].seg.codes["tenant"][r]) != want:
            raise RuntimeError(f"internal error: a listing confined to tenant {tenant!r} found another tenant's "
                               "record; refusing to return it")
    recs = [public_record(rec) for rec in snap.records(t_vis, t_rows)]
    nxt = None
    if order.size > take.size:
        last = int(take[-1])
        nxt = _encode(fp, [int(c[last]) for c in keys])
    page = Page(recs, nxt)
    if with_keys:
        page.keys = [[int(c[i]) for c in keys] for i in take.tolist()]
    return page
