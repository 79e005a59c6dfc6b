"""Progress bars of long operations: shown on a terminal, silent otherwise.

Every long operation of gpuir (building an index, ``gpuir memory add`` of many
records, ``gpuir eval``, the benchmarks) reports progress through
:func:`progress_bar`, a tqdm bar on standard error. ``enabled=None`` (the
default) shows it only when standard error is a terminal, so logs, pipes, CI
and tests stay clean; ``True`` / ``False`` force it (``--progress`` /
``--no-progress``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["progress_bar", "show_progress"]


def show_progress(enabled: bool | None = None) -> bool:
    """Whether a bar would be shown: ``enabled``, or (None) whether standard error is a terminal."""
    if enabled is not None:
        return bool(enabled)
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def progress_bar(iterable: Iterable[Any] | None = None, *, total: float | None = None, desc: str | None = None,
                 unit: str = "it", enabled: bool | None = None, **kwargs: Any):
    """A tqdm progress bar on standard error, disabled unless :func:`show_progress` says otherwise.

    Parameters
    ----------
    iterable : optional
        Wrapped and yielded from, as ``tqdm(iterable)`` does; or None and
        ``bar.update(n)`` by hand.
    total : number, optional
        Steps in all (default ``len(iterable)`` when it has one).
    desc, unit : the bar's label and step name.
    enabled : bool or None
        None: only on a terminal.
    **kwargs
        More tqdm options (``unit_scale``, ``leave``, ...).

    Returns
    -------
    tqdm
        Also a context manager; when disabled it yields the iterable's items and
        prints nothing.
    """
    from tqdm.auto import tqdm

    kwargs.setdefault("mininterval", 0.5)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=not show_progress(enabled), **kwargs)
