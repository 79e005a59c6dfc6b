"""Times, done once: what a memory accepts as a time, and the one form it gives back.

Accepted (records' ``time`` and ``expires_at``, and time values in ``where`` filters):

* an **ISO 8601 string** (``"2024-05-08"``, ``"2024-05-08T13:56:00Z"``,
  ``"2024-05-08T15:56:00.250+02:00"``); one without an offset is UTC;
* a **timezone-aware** :class:`~datetime.datetime` (a naive one is refused: it
  is usually local time, and reading it as UTC would shift it silently);
* a :class:`~datetime.date` (midnight UTC of that day);
* a **number with its unit**: ``time_unit="s"`` (seconds, int or float),
  ``"ms"``, ``"us"`` or ``"ns"`` since the Unix epoch. A bare number without a
  unit is an error that asks for one: 1715176560 (seconds) read as milliseconds
  is a date in January 1970, with no error.

Stored as int64 epoch **milliseconds** (UTC); a finer time is floored to the
millisecond (a float of seconds is rounded to the nearest millisecond). Given
back (``get``, hits, ``list``, export) as an ISO 8601 UTC string by
:func:`format_time` (``2024-05-08T13:56:00+00:00``, with milliseconds when they
are not zero), which reads back to the same millisecond. Times lie in years 1
to 9999 (what ISO 8601 strings can say).
"""

from __future__ import annotations

import math
from datetime import date, datetime
from typing import Any

import numpy as np

from .records import RecordError, format_time

__all__ = ["MAX_MS", "MIN_MS", "TIME_UNITS", "check_time_unit", "format_time", "parse_time", "public_record"]

#: Units a bare number may be given in, and milliseconds per unit.
TIME_UNITS: dict[str, float] = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
_INT_DIV = {"us": 1000, "ns": 1_000_000}

#: First and last millisecond an ISO 8601 string can say (0001-01-01 .. 9999-12-31T23:59:59.999, UTC).
MIN_MS = -62_135_596_800_000
MAX_MS = 253_402_300_799_999

_EPOCH_DAY = date(1970, 1, 1).toordinal()


def check_time_unit(time_unit: Any) -> str | None:
    """``time_unit`` itself checked: None or one of :data:`TIME_UNITS` (else ValueError)."""
    if time_unit is None or (isinstance(time_unit, str) and time_unit in TIME_UNITS):
        return time_unit
    raise ValueError(f"time_unit must be one of {', '.join(repr(u) for u in TIME_UNITS)} or None, got {time_unit!r}")


def _bare_number(value: Any, what: str) -> RecordError:
    return RecordError(
        f"{what} is the bare number {value!r}: give its unit (time_unit='s' for seconds, 'ms' for milliseconds, "
        "'us' or 'ns'; `--time-unit` in the CLI, \"time_unit\" in a service request), or an ISO 8601 string "
        "(e.g. '2024-05-08T13:56:00Z') or a timezone-aware datetime")


def _datetime_ms(dt: datetime) -> int:
    """Epoch ms of an aware (or UTC-naive) datetime, floored, in integer arithmetic only."""
    off = dt.utcoffset()
    secs = (dt.toordinal() - _EPOCH_DAY) * 86400 + dt.hour * 3600 + dt.minute * 60 + dt.second
    us = dt.microsecond
    if off:
        us -= (off.days * 86400 + off.seconds) * 1_000_000 + off.microseconds
    return secs * 1000 + us // 1000


def parse_time(value: Any, what: str = "time", time_unit: str | None = None) -> int:
    """One time as int epoch milliseconds (UTC); see the module docstring for what is accepted.

    Parameters
    ----------
    value : str, datetime (aware), date, or a number with ``time_unit``
    what : str
        Names the value in error messages (e.g. ``"record 3 (id 'x'): 'time'"``).
    time_unit : {"s", "ms", "us", "ns"} or None
        The unit of a bare number; None: a bare number is an error.

    Raises
    ------
    RecordError
        A bare number without a unit, a naive datetime, an unparseable string,
        a bool, NaN/infinity, or a time outside years 1..9999.
    """
    if isinstance(value, str):
        s = value.strip()
        if s[-1:] in ("Z", "z"):
            s = s[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            raise RecordError(f"{what} {value!r} is not an ISO 8601 date or time "
                              "(e.g. 2024-05-08 or 2024-05-08T13:56:00Z)") from None
        try:
            v = _datetime_ms(dt)
        except (OverflowError, ValueError):  # an offset pushing year 1 or 9999 out of range
            raise RecordError(f"{what} {value!r} lies outside years 1..9999") from None
    elif isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise RecordError(f"{what} is a naive datetime ({value.isoformat()}): give it a timezone, e.g. "
                              "datetime(..., tzinfo=timezone.utc) or datetime.now(timezone.utc) (a naive "
                              "datetime is often local time, and reading it as UTC would shift it)")
        v = _datetime_ms(value)
    elif isinstance(value, date):
        v = (value.toordinal() - _EPOCH_DAY) * 86_400_000
    elif isinstance(value, bool) or value is None:
        raise RecordError(f"{what} must be an ISO 8601 string, a timezone-aware datetime or a number with "
                          f"time_unit, got {value!r}")
    elif isinstance(value, (int, float, np.integer, np.floating)):
        if time_unit is None:
            raise _bare_number(value, what)
        check_time_unit(time_unit)
        if isinstance(value, (float, np.floating)):
            x = float(value)
            if not math.isfinite(x):
                raise RecordError(f"{what} must be a finite number, got {value!r}")
            v = round(x * TIME_UNITS[time_unit]) if abs(x) < 1e300 else MAX_MS + 1
        else:
            x = int(value)
            v = x * 1000 if time_unit == "s" else x if time_unit == "ms" else x // _INT_DIV[time_unit]
    else:
        raise RecordError(f"{what} must be an ISO 8601 string, a timezone-aware datetime or a number with "
                          f"time_unit, got {type(value).__name__}")
    if not MIN_MS <= v <= MAX_MS:
        raise RecordError(f"{what} {value!r} lies outside years 1..9999"
                          + (f" as {time_unit}: is the unit right?" if time_unit else ""))
    return v


def public_record(rec: dict) -> dict:
    """A record as callers get it: its times (``time``, ``expires_at``, ``created_at``, ``updated_at``) as ISO 8601
    strings (changed in place; returned)."""
    for f in ("time", "expires_at", "created_at", "updated_at"):
        v = rec.get(f)
        if v is not None and not isinstance(v, str):
            rec[f] = format_time(v)
    return rec
