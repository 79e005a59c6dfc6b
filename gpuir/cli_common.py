"""What every gpuir command line shares: its argument parser class and its logging set-up.

* :class:`ArgumentParser`: a bad option of a sub-command (``gpuir memory search
  --k 3``) prints *that* sub-command's usage and exits 2 (argparse's own
  parsers leave unknown options of a sub-command to the top-level parser, which
  printed ``gpuir``'s usage); every parser takes ``-v`` / ``--verbose``.
* :func:`cli_logging`: the library logs through ``logging.getLogger("gpuir")``
  and its children (``gpuir.memory``, ``gpuir.wal``, ...) and adds no
  handler of its own, so a program that uses gpuir sees warnings only (Python's
  last-resort handler) unless it configures logging. The command line is such a
  program: it prints gpuir's log records on standard error, warnings by
  default, INFO with ``-v``, DEBUG with ``-vv``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator

from .jsonl import InputError

#: The logger every gpuir module logs under (``logging.getLogger("gpuir.<module>")``).
LOGGER = "gpuir"

_VERBOSE_HELP = "say what gpuir does on stderr: -v info, -vv debug (default: warnings only)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with sub-command usage on a bad option and ``-v/--verbose`` on every parser.

    Sub-parsers made by ``add_subparsers().add_parser`` are of this class too
    (argparse uses the parent's class). Only the top-level parser (``top=True``)
    leaves unrecognised arguments to :meth:`parse_args`; any other reports them
    itself, with its own usage, and exits 2.
    """

    def __init__(self, *args, top: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._top = top
        # SUPPRESS: a -v given to the top level is not reset by a sub-command's default
        self.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=_VERBOSE_HELP)

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras and not self._top:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def verbosity(args: argparse.Namespace) -> int:
    """How many ``-v`` were given (0 without)."""
    return int(getattr(args, "verbose", 0) or 0)


def level_of(verbose: int) -> int:
    """The log level of ``verbose`` ``-v`` flags: WARNING, INFO, DEBUG."""
    return logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (tests and callers may replace it)."""

    #: Marks the command line's handler (``gpuir serve --log-level`` lowers its level).
    gpuir_cli = True

    def __init__(self, level: int):
        super().__init__(sys.stderr)
        self.setLevel(level)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


@contextlib.contextmanager
def cli_logging(verbose: int = 0, prog: str = "gpuir") -> Iterator[logging.Handler]:
    """gpuir's log records on standard error while a command runs; removed afterwards.

    Parameters
    ----------
    verbose : int
        0: warnings and errors; 1: also INFO; 2 or more: also DEBUG.
    prog : str
        Each line starts with it (``gpuir: INFO: gpuir.memory: saved ...``).
    """
    logger = logging.getLogger(LOGGER)
    level = level_of(verbose)
    h = _StderrHandler(level)
    fmt = "%(levelname)s: %(name)s: %(message)s" if verbose else "%(levelname)s: %(message)s"
    h.setFormatter(logging.Formatter(f"{prog}: {fmt}"))
    old_level = logger.level
    logger.addHandler(h)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    try:
        yield h
    finally:
        logger.removeHandler(h)
        logger.setLevel(old_level)


def lower_cli_log_level(level: int) -> None:
    """Show records down to ``level`` too (``gpuir serve --log-level info``); never raises the level."""
    logger = logging.getLogger(LOGGER)
    for h in logger.handlers:
        if getattr(h, "gpuir_cli", False) and h.level > level:
            h.setLevel(level)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)


def where_option(text: str | None) -> dict | None:
    """A command's ``--where`` (a JSON object of conditions, :mod:`gpuir.memory.where`), parsed; None when not given.

    Raises
    ------
    InputError
        Not JSON, or not an object (the CLI exits 2 with the message).
    """
    if text is None:
        return None
    from .memory.where import where_from_json

    try:
        return where_from_json(text, "--where")
    except ValueError as e:
        raise InputError(f"{e}: {text!r}") from None
