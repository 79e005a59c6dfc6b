"""Reading JSON-lines input with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator


class InputError(ValueError):
    """Bad user input; the message says what to fix (the CLI exits with status 2)."""


def read_jsonl(path: str | Path, fields: dict[str, type | tuple[type, ...]]) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    Parameters
    ----------
    path : JSONL file, one JSON object per line
    fields : mapping field name -> accepted type(s)
        Every object must have these fields with these types.

    Raises
    ------
    InputError
        ``"<path>:<line>: ..."`` for unreadable files, invalid JSON, non-objects,
        missing fields and wrongly typed fields.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    try:
        f = open(p, encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot be read ({e.strerror})") from None
    with f:
        lineno = 0
        while True:
            try:
                line = f.readline()
            except UnicodeDecodeError as e:
                raise InputError(f"{p}, line {lineno + 1}: not valid UTF-8 ({e.reason})") from None
            if not line:
                break
            lineno += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{p}, line {lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{p}, line {lineno}: expected a JSON object, got {type(obj).__name__}")
            for name, typ in fields.items():
                if name not in obj:
                    raise InputError(f'{p}, line {lineno}: missing field "{name}"')
                val = obj[name]
                if not isinstance(val, typ) or isinstance(val, bool):
                    want = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
                    raise InputError(
                        f'{p}, line {lineno}: field "{name}" must be {want}, got {type(val).__name__}'
                    )
            yield lineno, obj
