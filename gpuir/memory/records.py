"""Agent-memory records: the one record model, validated and normalised once.

A record is a dict with these fields (only ``id`` and ``text`` are required):

===========  =====================  ==================================================
field        type                   stored as
===========  =====================  ==================================================
id           str, unique            UTF-8 offsets + bytes
text         str                    UTF-8 offsets + bytes (and indexed)
session      str                    dictionary code, int32 (-1 = missing)
role         "user", "assistant",   dictionary code, int32
             "tool" or "system"
agent        str                    dictionary code, int32
tenant       str                    dictionary code, int32
time         ISO-8601 string, aware int64 epoch milliseconds (UTC); missing = int64 min
             datetime, date, or a
             number with time_unit
importance   int or float, finite   float64 (NaN = missing)
type         str (event, fact, ...) dictionary code, int32
metadata     JSON object            compact JSON text, UTF-8 offsets + bytes
expires_at   a time, as ``time``    in the metadata JSON under :data:`EXPIRES_KEY`
created_at   a time (filled in)     in the metadata JSON (:mod:`gpuir.memory.stamps`)
updated_at   a time (filled in)     in the metadata JSON (:mod:`gpuir.memory.stamps`)
===========  =====================  ==================================================

Times enter through :mod:`gpuir.memory.timeutil` and :mod:`gpuir.memory.intake`
(a bare number needs its unit; a naive datetime is refused), which hand this
module the canonical form: ``time`` and ``expires_at`` as int epoch
milliseconds, ``expires_at`` folded into the metadata. :func:`normalize_records`
takes that form (an int time is epoch ms here); :func:`make_record` gives it
back (the memory's internal reads). Callers get records with times as ISO 8601
strings (:func:`~gpuir.memory.timeutil.public_record`, :func:`format_time`).

Metadata holds JSON values: objects nested at most :data:`MAX_METADATA_DEPTH`
levels (the metadata object is level 1), integers of at most 64 bits (a
400-digit number is no number a filter can compare), finite numbers.

Every problem is a :class:`RecordError` naming the record (its position in the
batch and its id) and the field, and nothing of the batch is added.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any

import numpy as np

from .stamps import STAMP_FIELDS

#: Every field a record may have, in output order.
FIELDS: tuple[str, ...] = ("id", "text", "session", "role", "agent", "tenant", "time", "importance", "type",
                           "metadata")
#: Every field a record may carry: :data:`FIELDS`, ``expires_at`` (see :mod:`gpuir.memory.expiry`), and the
#: times the memory keeps, ``created_at`` and ``updated_at`` (:mod:`gpuir.memory.stamps`), in output order.
RECORD_FIELDS: tuple[str, ...] = FIELDS + ("expires_at", "created_at", "updated_at")
#: The metadata key under which a record's ``expires_at`` (int epoch ms) is stored (no user key can be it).
EXPIRES_KEY = "\u0000expires_at"
#: Fields stored as dictionary-encoded strings.
STRING_FIELDS: tuple[str, ...] = ("session", "role", "agent", "tenant", "type")
#: The allowed roles.
ROLES: tuple[str, ...] = ("user", "assistant", "tool", "system")
#: The stored time of a record without one.
MISSING_TIME = int(np.iinfo(np.int64).min)
_INT64_MAX = int(np.iinfo(np.int64).max)
#: Deepest nesting of objects and arrays in a record's metadata (the metadata object is level 1).
MAX_METADATA_DEPTH = 32

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


class RecordError(ValueError):
    """A record is malformed; the message names the record, the field and the fix.

    Attributes
    ----------
    loc : tuple
        Where the problem is, when the raiser knows: ``(position in the batch, field)``, e.g.
        ``(1, "time")`` (what the service reports as ``["body", "records", 1, "time"]``); else ``()``.
    """

    def __init__(self, message: str = "", loc: tuple = ()):
        super().__init__(message)
        self.loc = tuple(loc)


class DuplicateIdError(RecordError):
    """An add names ids that already exist (nothing is added); ``.ids`` holds them."""

    def __init__(self, message: str = "", ids: list[str] | tuple[str, ...] = ()):
        super().__init__(message)
        self.ids = list(ids)


def to_epoch_ms(value: Any, what: str = "time") -> int:
    """One time value as integer epoch milliseconds (UTC).

    Parameters
    ----------
    value : int (epoch ms), str (ISO 8601), datetime or date
        A naive datetime or string is taken as UTC.
    what : str
        Names the value in error messages.

    Raises
    ------
    RecordError
        Wrong type, unparseable string, float, or outside the int64 range.
    """
    if isinstance(value, bool):
        raise RecordError(f"{what} must be epoch milliseconds (int), an ISO-8601 string or a datetime, got bool")
    if isinstance(value, (int, np.integer)):
        v = int(value)
    elif isinstance(value, (float, np.floating)):
        raise RecordError(
            f"{what} is the float {value!r}: give integer epoch milliseconds (if this is seconds, multiply "
            "by 1000 and round), an ISO-8601 string or a datetime"
        )
    elif isinstance(value, str):
        s = value.strip()
        if s.endswith(("Z", "z")):
            s = s[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            raise RecordError(
                f"{what} {value!r} is not an ISO-8601 date or time (e.g. 2024-05-08 or 2024-05-08T13:56:00Z)"
            ) from None
        v = _datetime_ms(dt)
    elif isinstance(value, datetime):
        v = _datetime_ms(value)
    elif isinstance(value, date):
        v = _datetime_ms(datetime(value.year, value.month, value.day))
    else:
        raise RecordError(
            f"{what} must be epoch milliseconds (int), an ISO-8601 string or a datetime, got {type(value).__name__}"
        )
    if not (MISSING_TIME < v <= np.iinfo(np.int64).max):
        raise RecordError(f"{what} {value!r} is outside the int64 millisecond range")
    return v


def _datetime_ms(dt: datetime) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH) // _MS


def format_time(ms: int) -> str:
    """Epoch milliseconds as an ISO-8601 UTC string (``2024-05-08T13:56:00+00:00``)."""
    return (_EPOCH + timedelta(milliseconds=int(ms))).isoformat(timespec="milliseconds" if ms % 1000 else "seconds")


def check_metadata(meta: Mapping[str, Any]) -> str | None:
    """What is wrong with a metadata object (nesting, integers beyond 64 bits), or None; iterative."""
    stack: list[tuple[Any, str, int]] = [(meta, "metadata", 1)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, (Mapping, list, tuple)):
            if depth > MAX_METADATA_DEPTH:
                return f"{where} is nested more than {MAX_METADATA_DEPTH} levels deep: flatten it"
            items = v.items() if isinstance(v, Mapping) else enumerate(v)
            for key, x in items:
                if isinstance(x, (Mapping, list, tuple, int)) and not isinstance(x, bool):
                    stack.append((x, f"{where}.{key}" if isinstance(v, Mapping) else f"{where}[{key}]", depth + 1))
        elif isinstance(v, int) and not MISSING_TIME <= v <= _INT64_MAX:
            return (f"{where} is an integer of {len(str(abs(v)))} digits: integers must fit in 64 bits; "
                    "store larger numbers as strings")
    return None


def metadata_json(meta: Mapping[str, Any]) -> str:
    """The stored form of a metadata object: compact JSON with sorted keys.

    Raises
    ------
    TypeError, ValueError
        Not JSON-serialisable (NaN and infinities are refused).
    """
    return json.dumps(meta, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass
class RecordBatch:
    """A batch of validated records, by column.

    Attributes
    ----------
    ids : list of str, length n
    texts : list of str, length n
    strings : dict field -> list of (str or None), length n each
        One list per :data:`STRING_FIELDS` entry.
    time : ndarray, shape (n,), int64, host
        Epoch milliseconds; :data:`MISSING_TIME` where absent.
    importance : ndarray, shape (n,), float64, host
        NaN where absent.
    metadata : list of str, length n
        Compact JSON of each record's metadata, ``""`` where absent.
    labels : list of str or None
        How error messages name each record (default "record <i> (id ...)").
    """

    ids: list[str]
    texts: list[str]
    strings: dict[str, list[str | None]]
    time: np.ndarray
    importance: np.ndarray
    metadata: list[str]
    labels: list[str] | None = None

    def label(self, i: int) -> str:
        """How messages name record ``i``."""
        if self.labels is not None:
            return f"{self.labels[i]} (id {self.ids[i]!r})"
        return f"record {i} (id {self.ids[i]!r})"

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: np.ndarray | list[int]) -> RecordBatch:
        """The records at ``rows`` (positions in this batch), in that order."""
        r = [int(i) for i in rows]
        return RecordBatch(
            ids=[self.ids[i] for i in r],
            texts=[self.texts[i] for i in r],
            strings={f: [v[i] for i in r] for f, v in self.strings.items()},
            time=self.time[np.asarray(r, dtype=np.int64)],
            importance=self.importance[np.asarray(r, dtype=np.int64)],
            metadata=[self.metadata[i] for i in r],
            labels=None if self.labels is None else [self.labels[i] for i in r],
        )

    def record(self, i: int) -> dict[str, Any]:
        """Record ``i`` as a dict in the output form (absent fields left out)."""
        return make_record(
            self.ids[i], self.texts[i], {f: v[i] for f, v in self.strings.items()},
            int(self.time[i]), float(self.importance[i]), self.metadata[i],
        )


def id_list(ids: Iterable[str], what: str) -> list[str]:
    """Record ids given to ``what`` (a str is one id) as a list; a non-string id is a TypeError naming it."""
    if isinstance(ids, str):
        ids = [ids]
    out = list(ids)
    bad = [x for x in out if not isinstance(x, str)]
    if bad:
        raise TypeError(f"{what}: ids must be strings, got {type(bad[0]).__name__} {bad[0]!r}")
    return out


_CREATED, _UPDATED = STAMP_FIELDS["created_at"], STAMP_FIELDS["updated_at"]
#: The string fields that come before ``time`` in :data:`RECORD_FIELDS` (``type`` comes after
#: ``importance``), and the fields kept beside the metadata, in that order (see :func:`make_record`).
_LEADING_STRINGS = tuple(f for f in STRING_FIELDS if RECORD_FIELDS.index(f) < RECORD_FIELDS.index("time"))
_META_FIELDS = (("expires_at", EXPIRES_KEY), *STAMP_FIELDS.items())
_KNOWN_STORED = frozenset(FIELDS) | frozenset(STAMP_FIELDS)


#: The stored metadata text of a record whose metadata is only its created and updated times (what
#: :func:`metadata_json` writes for them, without building the dict).
_STAMPS_JSON = '{"\\u0000created_at":%d,"\\u0000updated_at":%d}'


def make_record(
    rid: str, text: str, strings: Mapping[str, str | None], time_ms: int, importance: float, meta: str
) -> dict[str, Any]:
    """A record dict in the output form from its stored columns (absent fields left out), its keys in the
    order of :data:`RECORD_FIELDS` (built in that order: a search's every hit is made here)."""
    out: dict[str, Any] = {"id": rid, "text": text}
    get = strings.get
    for f in _LEADING_STRINGS:
        v = get(f)
        if v is not None:
            out[f] = v
    if time_ms != MISSING_TIME:
        out["time"] = int(time_ms)
    if not math.isnan(importance):
        out["importance"] = float(importance)
    v = get("type")
    if v is not None:
        out["type"] = v
    if meta:
        obj = json.loads(meta)
        # expires_at, created_at and updated_at are kept beside the metadata (gpuir.memory.expiry, .stamps)
        tail = [(f, obj.pop(key)) for f, key in _META_FIELDS if key in obj]
        if obj:
            out["metadata"] = obj
        out.update(tail)
    return out


def _name(where: str, rec: Any) -> str:
    rid = rec.get("id") if isinstance(rec, Mapping) else None
    return where + (f" (id {rid!r})" if isinstance(rid, str) and rid else "")


def normalize_records(records: Iterable[Mapping[str, Any]], start: int = 0,
                      labels: list[str] | None = None) -> RecordBatch:
    """Validate records and turn them into columns.

    Parameters
    ----------
    records : iterable of dict
        See the module docstring for the fields.
    start : int
        Position of the first record, for error messages.
    labels : list of str, optional
        How messages name each record instead (e.g. ``"records.jsonl, line 7"``).

    Returns
    -------
    RecordBatch

    Raises
    ------
    RecordError
        The first malformed record: not a dict, a missing ``id`` or ``text``, a
        field of the wrong type, an unknown field, a duplicate id in the batch.
    """
    if isinstance(records, (Mapping, str, bytes)):
        raise RecordError("records must be an iterable of dicts (a list of records), not a single "
                          f"{type(records).__name__}")
    ids: list[str] = []
    texts: list[str] = []
    # optional fields, kept sparse while validating (most records carry few): (position, value)
    opt_strings: dict[str, list[tuple[int, str]]] = {f: [] for f in STRING_FIELDS}
    opt_times: list[tuple[int, int]] = []
    opt_imps: list[tuple[int, float]] = []
    opt_metas: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    known = _KNOWN_STORED
    str_fields = STRING_FIELDS
    roles = frozenset(ROLES)

    def who(j: int, rec: Any) -> str:  # only for an error message
        where = labels[j] if labels is not None else f"record {start + j}"
        return where if not isinstance(rec, Mapping) else _name(where, rec)

    for j, rec in enumerate(records):
        if rec.__class__ is not dict and not isinstance(rec, Mapping):
            raise RecordError(f"{who(j, rec)} is a {type(rec).__name__}; each record must be a dict (a JSON object)")
        if not known.issuperset(rec.keys()):
            unknown = [k for k in rec if k not in known]
            raise RecordError(
                f"{who(j, rec)}: unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)} "
                "(put anything else in 'metadata')"
            )
        rid = rec.get("id")
        if not rid or (rid.__class__ is not str and not isinstance(rid, str)):
            got = "missing" if rid is None else f"{type(rid).__name__} {rid!r}"
            raise RecordError(f"{who(j, rec)}: 'id' must be a non-empty string, got {got}")
        if rid in seen:
            first = labels[seen[rid]] if labels is not None else f"record {seen[rid] + start}"
            raise RecordError(f"{who(j, rec)}: id {rid!r} occurs twice in this batch (also {first})")
        seen[rid] = j
        text = rec.get("text")
        if not isinstance(text, str):
            got = "missing" if text is None else type(text).__name__
            raise RecordError(f"{who(j, rec)}: 'text' must be a string, got {got}")
        if len(rec) > 2 or "id" not in rec or "text" not in rec:  # optional fields present
            for f in str_fields:
                v = rec.get(f)
                if v is not None:
                    if not isinstance(v, str):
                        raise RecordError(f"{who(j, rec)}: {f!r} must be a string, got {type(v).__name__} {v!r}")
                    opt_strings[f].append((j, v))
            role = rec.get("role")
            if role is not None and role not in roles:
                raise RecordError(f"{who(j, rec)}: role {role!r} is not one of {', '.join(ROLES)}")
            t = rec.get("time")
            if t is not None:
                if t.__class__ is int and MISSING_TIME < t <= _INT64_MAX:
                    opt_times.append((j, t))
                else:
                    try:
                        opt_times.append((j, to_epoch_ms(t, "'time'")))
                    except RecordError as e:
                        raise RecordError(f"{who(j, rec)}: {e}") from None
            imp = rec.get("importance")
            if imp is not None:
                if isinstance(imp, bool) or not isinstance(imp, (int, float, np.integer, np.floating)):
                    raise RecordError(f"{who(j, rec)}: 'importance' must be a number, got {type(imp).__name__} {imp!r}")
                if not math.isfinite(float(imp)):
                    raise RecordError(f"{who(j, rec)}: 'importance' must be a finite number, got {imp!r}")
                opt_imps.append((j, float(imp)))
            meta = rec.get("metadata")
            c, u = rec.get("created_at"), rec.get("updated_at")
            stamps = None  # the times' JSON, spliced into the metadata's below (no merged dict checked and dumped)
            if c is not None or u is not None:  # the memory's own times: stored in the metadata text
                for f, v in (("created_at", c), ("updated_at", u)):
                    if v is not None and not (v.__class__ is int and MISSING_TIME < v <= _INT64_MAX):
                        raise RecordError(f"{who(j, rec)}: {f!r} must be epoch milliseconds (int) here, got {v!r}")
                if meta is None and c is not None and u is not None:  # the common case, written directly
                    opt_metas.append((j, _STAMPS_JSON % (c, u)))
                    meta = None
                    ids.append(rid)
                    texts.append(text)
                    continue
                if c is not None and u is not None and meta.__class__ is dict:
                    stamps = _STAMPS_JSON % (c, u)
                elif meta is None or isinstance(meta, Mapping):
                    meta = {**(meta or {}), **{k: v for k, v in ((_CREATED, c), (_UPDATED, u)) if v is not None}}
            if meta is not None:
                if not isinstance(meta, Mapping):
                    raise RecordError(f"{who(j, rec)}: 'metadata' must be a JSON object (dict), got "
                                      f"{type(meta).__name__}")
                bad = check_metadata(meta) if meta else None
                if bad:
                    raise RecordError(f"{who(j, rec)}: {bad}")
                try:
                    mj = metadata_json(meta) if meta else ""
                except (TypeError, ValueError) as e:
                    bad = [k for k in meta if not isinstance(k, str)]
                    if bad:
                        raise RecordError(f"{who(j, rec)}: metadata keys must be strings, got "
                                          f"{type(bad[0]).__name__} {bad[0]!r}") from None
                    raise RecordError(f"{who(j, rec)}: 'metadata' is not JSON-serialisable ({e})") from None
                if not all(isinstance(k, str) for k in meta):
                    bad = [k for k in meta if not isinstance(k, str)]
                    raise RecordError(f"{who(j, rec)}: metadata keys must be strings, got {type(bad[0]).__name__} "
                                      f"{bad[0]!r}")
                if stamps is not None:  # the text of the merged dict: sorted keys put the reserved ones first
                    if not mj:
                        mj = stamps
                    elif mj.startswith('{"\\u0000'):  # (a key of the caller's sorts among them: merge and dump)
                        mj = metadata_json({**meta, _CREATED: c, _UPDATED: u})
                    else:
                        mj = stamps[:-1] + "," + mj[1:]
                if mj:
                    opt_metas.append((j, mj))
        ids.append(rid)
        texts.append(text)
    n = len(ids)
    strings: dict[str, list[str | None]] = {}
    for f in STRING_FIELDS:
        col: list[str | None] = [None] * n
        for i, v in opt_strings[f]:
            col[i] = v
        strings[f] = col
    times = np.full(n, MISSING_TIME, dtype=np.int64)
    if opt_times:
        times[[i for i, _ in opt_times]] = [t for _, t in opt_times]
    imps = np.full(n, math.nan, dtype=np.float64)
    if opt_imps:
        imps[[i for i, _ in opt_imps]] = [x for _, x in opt_imps]
    metas = [""] * n
    for i, mj in opt_metas:
        metas[i] = mj
    return RecordBatch(
        ids=ids, texts=texts, strings=strings, time=times, importance=imps, metadata=metas,
        labels=None if labels is None else list(labels),
    )
