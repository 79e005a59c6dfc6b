"""The compiled engine's once-per-process start, kept off the first searches' path (a tiered start).

A fresh process pays about half a second before its first compiled search: importing numba (0.2 s on the
development VM), numba's CPU target loading its registries (0.26 s), then each compiled function the search
calls loaded from numba's cache (20-30 ms each). A memory whose ``backend`` is "auto" does not make its
first searches wait for that. While the compiled engine is not ready in this process, an "auto" search runs
on the NumPy reference -- the same ids and float32 scores, bit for bit, since every engine is tested
against it -- and the first such search, once answered, starts the warm-up in a daemon thread. Once the
warm-up has run, "auto" is the compiled engine. An explicit ``backend="numba"`` (argument or ``GPUIR_BACKEND``) waits for
numba as before, and ``GPUIR_TIERED_START=0`` turns the tiering off (every "auto" search then waits).

:func:`freeze_startup_heap` is for the start of a process gpuir owns (``gpuir serve``, a shard actor): what
the process loaded to start -- the modules of the web stack or of Ray, NumPy, the compiled engine warmed
on a scratch memory, about 80,000-160,000 containers -- is never garbage, yet every full pass of the cyclic
collector walked it, holding the GIL (about 70-110 ms a pass on the development VM). It is moved to the
collector's permanent generation (:func:`gc.freeze`); objects made after it stay collectable, and an
object frozen with it is still freed when its last reference goes. Measured with
``bench/bench_service.py`` (session 38, ``docs/service.md``): a full pass of the server fell from about
108 to 27 ms. A library call never freezes its host's heap: only those processes' entry points call it.

This module holds only the state; the warm-up's body (searches of a tiny memory through the compiled
engine, then the first question again on the snapshot it searched, which lays that snapshot's segments out
for the compiled engine) is handed in by the memory's searcher
(:func:`gpuir.memory.searcher.warm_compiled_engine`), so nothing here imports the memory.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_ready = threading.Event()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def compiled_ready() -> bool:
    """Whether the compiled engine's once-per-process start is done (or was tried and failed)."""
    return _ready.is_set()


def mark_ready() -> None:
    """The compiled engine has run in this process (a search asked for it by name): nothing left to warm,
    unless the warm-up is running (its own searches ask for it by name): it marks ready when it is done."""
    if _thread is None and not _ready.is_set():  # (every search calls this: setting an Event takes its lock)
        _ready.set()


def tiering_enabled() -> bool:
    """False when ``GPUIR_TIERED_START`` is "0" (or "false", "no", "off"): "auto" then waits for numba."""
    return os.environ.get("GPUIR_TIERED_START", "1").strip().lower() not in ("0", "false", "no", "off")


def start(body: Callable[[], None]) -> None:
    """Run ``body`` (which loads the compiled engine) once per process in a daemon thread; then mark ready.

    A failing ``body`` is logged and still marks the engine ready: the next "auto" search then calls
    the compiled engine itself, and meets (and reports) the failure there.
    """
    global _thread
    with _lock:
        if _thread is not None or _ready.is_set():
            return

        def run() -> None:
            t = time.perf_counter()
            try:
                body()
                log.debug("compiled engine ready after %.3f s (warmed in the background)", time.perf_counter() - t)
            except Exception:
                log.warning("warming the compiled engine in the background failed", exc_info=True)
            finally:
                _ready.set()

        _thread = threading.Thread(target=run, name="gpuir-compiled-warmup", daemon=True)
        _thread.start()


def wait(body: Callable[[], None], timeout: float | None = None) -> bool:
    """:func:`start` if needed, then wait until the compiled engine is ready; whether it is."""
    start(body)
    return _ready.wait(timeout)


def tiered(requested: str | None) -> bool:
    """Whether a search asking for backend ``requested`` runs on the NumPy reference now, the compiled engine
    not being ready in this process: only an "auto" search (None or "auto", without ``GPUIR_BACKEND``), with
    tiering on, where numba is installed (looked up, not imported: the import is part of what is spared).
    The caller then starts the warm-up (:func:`start`) once its search is done: started before, it would
    share the core with the very search it spares.
    """
    if _ready.is_set() or not tiering_enabled():
        return False
    if (requested is not None and str(requested).lower() != "auto") or os.environ.get("GPUIR_BACKEND"):
        return False
    return _numba_installed()


@functools.cache
def _numba_installed() -> bool:
    """Whether numba is installed (looked up once per process, never imported here)."""
    return importlib.util.find_spec("numba") is not None


#: The reason a search gives when :func:`tiered` sent it to NumPy.
REASON = ("auto: the compiled engine is starting in the background (this process's first searches); the NumPy "
          "reference returns the same ids and scores meanwhile")


def freeze_startup_heap(warm_up: Callable[[], None] | None = None) -> int:
    """Move every object alive now out of the collector's passes, after ``warm_up()`` (see the module
    docstring); for the start of a process gpuir owns.

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
