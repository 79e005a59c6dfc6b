"""What the service's write-ahead log can hold: checked per record, at the door, before any group is written.

A write is validated in the request that sent it, before it joins a group
commit, so one tenant's bad record fails only its own request (422) and never
the group it would have shared with other tenants' writes; and a record that
was logged is one that replay reads back to the same record. Beyond
:func:`gpuir.memory.records.normalize_records` (fields, types, times), every
string, key and value of a record must be:

* **valid Unicode text**: no lone surrogate (``"\\ud800"``), which UTF-8 cannot
  encode (the log, and every JSON reply, is UTF-8);
* **an integer of at most 64 bits** (``-2**63`` to ``2**63 - 1``): a
  400-digit number is not a number a filter can compare;
* **a finite number** (no NaN, no infinities: not JSON);
* **nested at most** :data:`MAX_DEPTH` **levels** (a record's ``metadata``
  object is level 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..memory.records import MAX_METADATA_DEPTH, RecordError

#: Deepest nesting of objects and arrays inside a record's metadata (the metadata object is level 1).
MAX_DEPTH = MAX_METADATA_DEPTH
#: Integers stored anywhere in a record: signed 64-bit.
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1


def _text_error(s: str) -> str | None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"holds a lone surrogate (U+{ord(s[e.start]):04X} at character {e.start}), which is not valid "
                "Unicode text: send valid UTF-8")
    return None


def check_value(value: Any, where: str, depth: int = 0) -> None:
    """Raise :class:`RecordError` naming ``where`` (e.g. ``records[3].metadata.a``) if the log cannot hold ``value``."""
    if isinstance(value, str):
        err = _text_error(value)
        if err:
            raise RecordError(f"{where} {err}")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            digits = len(str(abs(value)))
            raise RecordError(f"{where} is an integer of {digits} digits: integers must fit in 64 bits "
                              f"({INT_MIN} to {INT_MAX}); send a string for larger numbers")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise RecordError(f"{where} is {value!r}: numbers must be finite")
    elif isinstance(value, Mapping):
        if depth + 1 > MAX_DEPTH:
            raise RecordError(f"{where} is nested more than {MAX_DEPTH} levels deep: flatten it")
        for k, v in value.items():
            if not isinstance(k, str):
                raise RecordError(f"{where}: keys must be strings, got {type(k).__name__} {k!r}")
            err = _text_error(k)
            if err:
                raise RecordError(f"{where}: the key {k!r} {err}")
            check_value(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, (list, tuple)):
        if depth + 1 > MAX_DEPTH:
            raise RecordError(f"{where} is nested more than {MAX_DEPTH} levels deep: flatten it")
        for i, v in enumerate(value):
            check_value(v, f"{where}[{i}]", depth + 1)
    else:
        raise RecordError(f"{where} is a {type(value).__name__}, which is not a JSON value")


def check_record(rec: Mapping[str, Any], i: int) -> None:
    """Every field of record ``i`` (see the module docstring); raises :class:`RecordError` naming the field."""
    for k, v in rec.items():
        try:
            if k == "metadata" and isinstance(v, Mapping):
                check_value(v, f"records[{i}].metadata", 0)
            else:
                check_value(v, f"records[{i}].{k}", MAX_DEPTH - 1)  # other fields are scalars
        except RecordError as e:
            e.loc = (i, k)
            raise


def check_ids(ids: list[str]) -> None:
    """Ids of a delete: valid Unicode text (raises :class:`RecordError`)."""
    for i, rid in enumerate(ids):
        if not isinstance(rid, str):
            raise RecordError(f"ids[{i}] must be a string, got {type(rid).__name__}")
        err = _text_error(rid)
        if err:
            raise RecordError(f"the id {rid!r} {err}")
