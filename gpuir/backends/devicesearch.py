"""Which engine serves the cupy backend's segment searches: the one-pass device engine.

The contract's "cupy" route (:func:`gpuir.backends.engine_for`) is
:class:`gpuir.backends.cupy_segments.CupySegmentsEngine`, one per process (:func:`engine`): every
searched segment scored in one device pass, the top k merged on the device. :data:`ONE_PASS` False
routes "cupy" to "cupy-each" instead (one scorer call per segment: the path before; the tests and
``bench/bench_memory_device.py`` compare both). :func:`batch_of` makes the contract's query batch of a
list of analysed plans (tests).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .contract import QueryBatch

#: Serve the cupy backend's memory searches with the one-pass engine (False: one scorer call per segment).
ONE_PASS = True

_engine: Any = None
_lock = threading.Lock()


def engine() -> Any:
    """The process's :class:`~gpuir.backends.cupy_segments.CupySegmentsEngine` (made on first use)."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                from .cupy_segments import CupySegmentsEngine

                _engine = CupySegmentsEngine()
    return _engine


def batch_of(plans: list, allow: list | None = None, theta: np.ndarray | None = None) -> QueryBatch:
    """The query batch of analysed plans (:class:`gpuir.memory.search.QueryPlan`)."""
    B = len(plans)
    lens = np.fromiter((len(p.terms) for p in plans), np.int64, B)
    off = np.zeros(B + 1, np.int64)
    np.cumsum(lens, out=off[1:])

    def cat(get, dt):
        parts = [np.asarray(get(p)) for p in plans if len(p.terms)]
        return np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt)

    return QueryBatch(off, cat(lambda p: p.gids, np.int64), cat(lambda p: p.mult, np.int64),
                  cat(lambda p: p.idf, np.float32), cat(lambda p: p.w0, np.float32),
                  np.array([p.const for p in plans], np.float32), bool(plans[0].has_w0) if plans else False,
                  np.full(B, -np.inf) if theta is None else theta, allow)
