"""The server process's garbage-collector passes, timed, for ``/metrics`` (``gpuir_gc_pause_seconds``).

CPython's cyclic collector runs inside whichever thread allocates when a generation's threshold is
crossed, and holds the GIL for the whole pass: every request of the process waits for it. A full
(generation 2) pass walks every tracked container and each reference it holds (the vocabulary of a large
memory is one Python list of strings: about 70 ms per pass for 1.3M terms on the development VM), so
its time is one of the tails an operator reads next to the request latencies. Timed with
:data:`gc.callbacks` (a clock read at each pass's start and stop).

:func:`freeze_startup_heap` shortens those passes in a process gpuir owns (``gpuir serve``): what the
process loaded to start -- the modules of the web stack, NumPy and the compiled engine, warmed on a
scratch memory -- is never garbage, yet every full pass walked it (about 150,000 containers). It is
moved to the collector's permanent generation (:func:`gc.freeze`) before the memory opens; the
memory's own objects, made after, stay collectable. Measured with ``bench/bench_service.py`` (200
agents x 30 steps, session 38): a full pass fell from about 90 to 20 ms. A library call never freezes
its host's heap: only the server's command line calls it.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcPauses", "freeze_startup_heap"]


class GcPauses:
    """Observe each collector pass's seconds into ``histogram`` (labelled by generation) while installed.

    Parameters
    ----------
    histogram : prometheus_client.Histogram
        With one label, ``generation`` ("0", "1" or "2").
    """

    def __init__(self, histogram: Any):
        self.histogram = histogram
        # each generation's series made once: the callback runs at every pass (young passes: thousands a second)
        self._series = {g: histogram.labels(generation=str(g)) for g in (0, 1, 2)}
        self._t0 = 0.0
        self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self._series[info["generation"]].observe(time.perf_counter() - self._t0)

    def install(self) -> None:
        """Start timing (idempotent)."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def remove(self) -> None:
        """Stop timing (idempotent): a closed service leaves no callback behind."""
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False


def freeze_startup_heap(warm_up: Any = None) -> int:
    """Move every object alive now out of the collector's passes, after ``warm_up()`` (see the module
    docstring); for the start of a process gpuir owns, before its memory opens.

    Parameters
    ----------
    warm_up : callable, optional
        Run first (its garbage collected before the freeze): what it loads lazily -- compiled kernels,
        caches -- is frozen too.

    Returns
    -------
    int
        The objects now frozen (:func:`gc.get_freeze_count`).
    """
    if warm_up is not None:
        warm_up()
    gc.collect()  # the warm-up's garbage (its scratch memory) freed, not frozen
    gc.freeze()
    return gc.get_freeze_count()
