"""Reading JSON-lines input with errors that name the file and line.

Line numbers count physical lines -- pieces of the file ended by ``\\n`` --
whatever else a line holds (``\\r``, ``\\u2028``, bytes that are not UTF-8),
so an error points at the line an editor shows. A UTF-8 byte-order mark at
the start of the file is skipped.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The file argument that means standard input (or, for an output, standard output).
STDIN = "-"
#: How messages name standard input.
STDIN_NAME = "<stdin>"


class InputError(ValueError):
    """Bad user input; the message says what to fix (the CLI exits with status 2)."""


def read_jsonl(path: str | Path, fields: dict[str, type | tuple[type, ...]]) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    Parameters
    ----------
    path : JSONL file, one JSON object per line, UTF-8; ``"-"`` reads standard input (named ``<stdin>``)
    fields : mapping field name -> accepted type(s)
        Every object must have these fields with these types.

    Raises
    ------
    InputError
        ``"<path>, line <n>: ..."`` for unreadable files, bytes that are not
        UTF-8, invalid or too deeply nested JSON, non-objects, missing fields and
        wrongly typed fields.
    """
    if str(path) == STDIN:  # the command line's '-': standard input, named so in messages
        yield from _read_lines(sys.stdin.buffer, STDIN_NAME, fields)
        return
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a directory; expected a JSONL file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed by the with below; opening errors get their own message
    except OSError as e:
        raise InputError(f"{p}: cannot be read ({e.strerror})") from None
    with f:
        yield from _read_lines(f, str(p), fields)


def _read_lines(f: Any, p: str, fields: dict[str, type | tuple[type, ...]]) -> Iterator[tuple[int, dict]]:
    """:func:`read_jsonl` over the open binary file ``f``, named ``p`` in messages."""
    lineno = 0
    while True:
        try:
            raw = f.readline()  # binary: splits at b"\n" only, the physical lines
        except OSError as e:
            raise InputError(f"{p}, line {lineno + 1}: cannot be read ({e.strerror})") from None
        if not raw:
            break
        lineno += 1
        if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"{p}, line {lineno}: not valid UTF-8 ({e.reason} at byte {e.start + 1} of the line)"
            ) from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}, line {lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise InputError(f"{p}, line {lineno}: JSON nested too deeply") from None
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
