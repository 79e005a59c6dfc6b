"""The server process's garbage-collector passes, timed, for ``/metrics`` (``gpuir_gc_pause_seconds``).

CPython's cyclic collector runs inside whichever thread allocates when a generation's threshold is
crossed, and holds the GIL for the whole pass: every request of the process waits for it. A full
(generation 2) pass walks every tracked container and each reference it holds (on the development VM, in a
process holding a memory of 3M synthetic records: 139 ms for 181,000 containers, 110 ms once the memory
was closed), so its time is one of the tails an operator reads next to the request latencies. Timed
with :data:`gc.callbacks` (a clock read at each pass's start and stop).

:func:`gpuir.memory.warmup.freeze_startup_heap` shortens those passes in the processes gpuir owns
(``gpuir serve``, a shard actor): what the process loaded to start is moved out of them. A library call
never freezes its host's heap.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcPauses"]


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
