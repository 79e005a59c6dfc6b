"""Fan-out: a search's channels run concurrently, one thread each, with wall-clock timings.

The BM25 scorers and the NumPy matrix products release the GIL for most of
their work, so the channels of one search overlap. Each job is independent (it
reads the retriever's catalog, snapshot and embeddings, never writes them), so
the results are exactly the serial ones, in the same order (tested).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["run_jobs", "stage_names"]


def stage_names(kinds: Sequence[str]) -> list[str]:
    """Timing keys of channels: the kind, ``kind#2``, ``kind#3``... when a kind repeats."""
    seen: dict[str, int] = {}
    out = []
    for k in kinds:
        seen[k] = seen.get(k, 0) + 1
        out.append(k if seen[k] == 1 else f"{k}#{seen[k]}")
    return out


def _timed(job: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = job()
    return out, time.perf_counter() - t0


def run_jobs(jobs: Sequence[Callable[[], Any]], parallel: bool = True) -> tuple[list[Any], list[float]]:
    """Run ``jobs`` (threads when ``parallel`` and more than one), results in job order.

    Returns
    -------
    (results, seconds): each job's return value and its wall-clock seconds.
    An exception of any job is raised here (after every job finished).
    """
    if not parallel or len(jobs) < 2:
        outs = [_timed(j) for j in jobs]
    else:
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="gpuir-channel") as ex:
            futs = [ex.submit(_timed, j) for j in jobs]
            outs = [f.result() for f in futs]
    return [o for o, _ in outs], [s for _, s in outs]
