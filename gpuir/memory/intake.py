"""From the records a caller gives to the columns a memory stores: times parsed once, expiry folded, validated.

Three steps, each once per record:

1. :func:`canonical_records`: ``time``, ``expires_at``, ``created_at`` and
   ``updated_at`` become int epoch milliseconds by :func:`gpuir.memory.timeutil.parse_time` (ISO 8601 strings,
   timezone-aware datetimes, dates, or numbers with an explicit ``time_unit``;
   a bare number is an error asking for the unit). This *canonical* form (plain
   dicts, times as int ms) is what the service's write-ahead log, a record's
   history and the memory's internal reads hold; read back with
   ``time_unit="ms"``.
   With ``stamp`` it also fills in what the memory decides itself: a
   generated id and the created/updated times of an add, the updated time of
   an update (:mod:`gpuir.memory.stamps`), so the canonical dict carries them
   and applying it again gives the same record.
2. :func:`fold_expiry`: ``expires_at`` goes into the stored metadata under the
   reserved key (see :mod:`gpuir.memory.expiry`); ``created_at`` and
   ``updated_at`` go there in step 3.
3. :func:`gpuir.memory.records.normalize_records`: every field checked, the
   batch turned into columns.

:func:`to_batch` runs all three. Every problem is a
:class:`~gpuir.memory.records.RecordError` naming the record (position and id,
or the caller's label such as file and line) and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .expiry import now_ms
from .records import EXPIRES_KEY, RECORD_FIELDS, RecordBatch, RecordError, normalize_records
from .stamps import STAMP_FIELDS, stamp_records
from .timeutil import MAX_MS, MIN_MS, check_time_unit, parse_time

__all__ = ["canonical_records", "fold_expiry", "to_batch"]

_KNOWN = frozenset(RECORD_FIELDS)
_TIMES = ("time", "expires_at", "created_at", "updated_at")
_RESERVED = (EXPIRES_KEY, *STAMP_FIELDS.values())


def _who(rec: Any, j: int, start: int, labels: list[str] | None) -> str:
    where = labels[j] if labels is not None else f"record {start + j}"
    rid = rec.get("id") if isinstance(rec, Mapping) else None
    return where + (f" (id {rid!r})" if isinstance(rid, str) and rid else "")


def canonical_records(records: Iterable[Mapping[str, Any]], time_unit: str | None = None, start: int = 0,
                      labels: list[str] | None = None, stamp: str | None = None,
                      now: int | None = None) -> list[dict[str, Any]]:
    """The records with their times (``time``, ``expires_at``, ``created_at``, ``updated_at``) as int epoch ms
    (copies where anything changed).

    Parameters
    ----------
    records : iterable of dict
    time_unit : {"s", "ms", "us", "ns"} or None
        The unit of bare numbers; None refuses them.
    start, labels : how messages name the records (see :func:`~gpuir.memory.records.normalize_records`).
    stamp : {"add", "update"} or None
        Fill in what the memory decides (:func:`gpuir.memory.stamps.stamp_records`): for an add, a
        generated ``id`` and ``created_at``/``updated_at``; for an update, ``updated_at``. None: nothing.
    now : int, optional
        The epoch ms the stamps use (default: the clock, read once for the whole batch).

    A ``None`` time stays ``None`` (absent; in a partial update, a field to remove).

    Raises
    ------
    RecordError
        Not a list of dicts, an unknown field, a time that cannot be read, a
        metadata key that is reserved.
    """
    check_time_unit(time_unit)
    if isinstance(records, (Mapping, str, bytes)):
        raise RecordError("records must be an iterable of dicts (a list of records), not a single "
                          f"{type(records).__name__}")
    out: list[dict[str, Any]] = []
    for j, rec in enumerate(records):
        if rec.__class__ is not dict and not isinstance(rec, Mapping):  # (a plain dict skips the ABC's check)
            raise RecordError(f"{_who(rec, j, start, labels)} is a {type(rec).__name__}; each record must be a "
                              "dict (a JSON object)")
        if not _KNOWN.issuperset(rec.keys()):
            unknown = [k for k in rec if k not in _KNOWN]
            raise RecordError(f"{_who(rec, j, start, labels)}: unknown field {unknown[0]!r}; the fields are "
                              f"{', '.join(RECORD_FIELDS)} (put anything else in 'metadata')")
        new = None
        for f in _TIMES:
            v = rec.get(f)
            if v is None or (v.__class__ is int and time_unit == "ms" and MIN_MS <= v <= MAX_MS):
                continue  # absent, or already canonical
            try:
                ms = parse_time(v, f"{_who(rec, j, start, labels)}: {f!r}", time_unit)
            except RecordError as e:
                e.loc = (start + j, f)  # the record's field, for the service's 422 (loc)
                raise
            if new is None:
                new = dict(rec)
            new[f] = ms
        meta = rec.get("metadata")
        if meta is not None and isinstance(meta, Mapping) and any(k in meta for k in _RESERVED):
            key = next(k for k in _RESERVED if k in meta)
            field = "expires_at" if key == EXPIRES_KEY else key[1:]
            raise RecordError(f"{_who(rec, j, start, labels)}: the metadata key {key!r} is reserved (it "
                              f"holds {field}): give the record's {field} field instead")
        out.append(new if new is not None else rec if isinstance(rec, dict) else dict(rec))
    if stamp is not None:
        out = stamp_records(out, stamp, now_ms() if now is None else now)
    return out


def fold_expiry(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical records with ``expires_at`` moved into the stored metadata (reserved key); others as they are.

    (``created_at`` and ``updated_at`` stay fields: :func:`~gpuir.memory.records.normalize_records` stores
    them in the metadata text itself, without a dict per record.)"""
    out = records
    for j, rec in enumerate(records):
        if "expires_at" not in rec:
            continue
        if out is records:
            out = list(records)
        r = dict(rec)
        exp = r.pop("expires_at")
        meta = r.get("metadata")
        if exp is not None and (meta is None or isinstance(meta, Mapping)):
            r["metadata"] = {**(meta or {}), EXPIRES_KEY: exp}
        out[j] = r
    return out


def to_batch(records: Iterable[Mapping[str, Any]], time_unit: str | None = None, start: int = 0,
             labels: list[str] | None = None, stamp: str | None = "id") -> RecordBatch:
    """Records to add as the columns a memory stores (see the module docstring); ``stamp="id"`` (default)
    fills in a generated id where absent, ``"add"`` the created/updated times too (a memory with
    ``record_times``: :attr:`Memory.stamp <gpuir.memory.Memory.stamp>`), None nothing
    (:mod:`gpuir.memory.stamps`).

    Raises
    ------
    RecordError
        The first malformed record, named; nothing of the batch is kept.
    """
    recs = canonical_records(records, time_unit, start, labels, stamp=stamp)
    return normalize_records(fold_expiry(recs), start=start, labels=labels)
