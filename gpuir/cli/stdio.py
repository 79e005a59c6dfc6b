"""File arguments of ``gpuir memory`` given as ``-``: standard input, or standard output for an output file.

Every file argument of the memory commands takes ``-``: ``add`` and ``update``
(records and patches), ``delete --ids``, ``search --queries`` and
``--config``, ``import`` (read from standard input) and ``export`` (written to
standard output). Messages name standard input ``<stdin>``; JSON lines are
streamed from it (:func:`gpuir.jsonl.read_jsonl`), an export file is spooled
into a private temporary file first (it is read twice).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..jsonl import STDIN, STDIN_NAME, InputError

__all__ = ["STDIN", "STDIN_NAME", "check_one_stdin", "input_file", "output_file", "read_text", "shown"]


def shown(arg: str) -> str:
    """How messages name the file argument ``arg``."""
    return STDIN_NAME if arg == STDIN else str(arg)


def check_one_stdin(**args: str | None) -> None:
    """Refuse two file arguments that both read standard input (``InputError`` naming them)."""
    both = [name for name, v in args.items() if v == STDIN]
    if len(both) > 1:
        raise InputError(f"{' and '.join(both)} both read standard input ('-'); give at most one of them as '-'")


def read_text(arg: str) -> str:
    """The whole input ``arg`` (a file, or ``-``: standard input) as UTF-8 text.

    Raises
    ------
    InputError
        A missing file, or bytes that are not UTF-8 (naming the file).
    """
    if arg == STDIN:
        raw = sys.stdin.buffer.read()
    else:
        p = Path(arg)
        if not p.is_file():
            raise InputError(f"{p}: no such file")
        raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{shown(arg)}: not valid UTF-8 ({e.reason})") from None


@contextlib.contextmanager
def input_file(arg: str) -> Iterator[Path]:
    """A path holding the input ``arg``: the file itself, or (``-``) standard input copied into a private
    temporary file, removed afterwards. A bad-input error naming the temporary file is raised again as an
    :class:`InputError` naming ``<stdin>``."""
    if arg != STDIN:
        yield Path(arg)
        return
    with tempfile.TemporaryDirectory(prefix="gpuir-stdin-") as d:
        p = Path(d) / "stdin.jsonl"
        with open(p, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        try:
            yield p
        except (ValueError, TypeError) as e:
            if str(p) not in str(e):
                raise
            raise InputError(str(e).replace(str(p), STDIN_NAME)) from None


@contextlib.contextmanager
def output_file(arg: str) -> Iterator[Path]:
    """A path to write the output ``arg`` to: the file itself, or (``-``) a private temporary file whose
    bytes go to standard output once the block succeeds."""
    if arg != STDIN:
        yield Path(arg)
        return
    with tempfile.TemporaryDirectory(prefix="gpuir-stdout-") as d:
        p = Path(d) / "stdout.jsonl"
        yield p
        sys.stdout.flush()
        with open(p, "rb") as f:
            out = getattr(sys.stdout, "buffer", None)
            if out is not None:
                shutil.copyfileobj(f, out)
                out.flush()
            else:  # a text stream (a test's StringIO)
                sys.stdout.write(f.read().decode("utf-8"))
