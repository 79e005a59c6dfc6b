"""Wall-clock latency of a Retriever's searches, measured, not derived from stage timings.

:func:`measure_latency` times :meth:`gpuir.retrieve.Retriever.search` with
``time.perf_counter`` around each call:

* **batch of 1**: each question searched alone; its latency is its call's wall time.
  Split by path when the search reports ``meta["escalated"]`` (the cascade: *skip*
  = cheap channels only, *escalate* = the expensive channel ran too), and by stage
  when it reports ``meta["timings"]`` ({stage: seconds}).
* **batched**: the questions searched in batches of ``batch_size``; every question of a
  batch waits for the whole batch, so its latency is the batch's wall time; the
  **amortised** latency is total wall time / questions.

Figures: p50 and p99 (NumPy's linear-interpolation percentiles) and the mean, in
milliseconds. A warm-up search runs first (lazy initialisation: compiled
kernels, the encoder's model) and is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["latency_stats", "measure_latency"]


def latency_stats(seconds: Sequence[float] | np.ndarray) -> dict[str, float | int | None]:
    """p50, p99 and mean in milliseconds of per-question wall times (seconds), and n; None when empty."""
    s = np.asarray(seconds, dtype=np.float64).ravel()
    if s.size == 0:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    if not np.isfinite(s).all() or (s < 0).any():
        raise ValueError("latencies must be finite and non-negative")
    p50, p99 = np.percentile(s, [50, 99])
    return {"n": int(s.size), "p50_ms": float(p50 * 1e3), "p99_ms": float(p99 * 1e3), "mean_ms": float(s.mean() * 1e3)}


def _row(x: Any, i: int) -> Any:
    return x[i] if isinstance(x, list) else x


def _stage_seconds(timings: dict[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in (timings or {}).items():
        try:
            out[str(k)] = float(np.sum(v))
        except (TypeError, ValueError):
            continue
    return out


def measure_latency(retriever: Any, queries: Sequence[str], *, k: int = 10, where: Any = None, at: Any = None,
                    unit: str = "session", backend: str = "auto", batch_size: int = 64,
                    single: Sequence[int] | None = None, progress: bool = False,
                    paths: bool | None = None) -> dict[str, Any]:
    """Measured wall-clock latency per question, batch of 1 and batched.

    Parameters
    ----------
    retriever : gpuir.retrieve.Retriever (or anything with the same ``search``)
    queries : sequence of B str
    k : int
        Results per question.
    where : None, dict or list of B
        Each question's filter (as ``Retriever.search``).
    at : None or list of B
        When each question is asked (passed as ``at=`` only when not None).
    unit, backend : as ``Retriever.search``
    batch_size : int
        Questions per batched call.
    single : sequence of int, optional
        Rows timed one at a time (default: all).
    progress : bool
    paths : bool, optional
        Split by path (skip / escalate). None: whenever the search reports ``escalated``;
        False: never (a configuration without a cascade reports all False); True: also time the
        batched path split: the questions that escalated in the batched pass searched again in
        batches of their own, and the ones that skipped likewise (``batched["skip"]``,
        ``batched["escalate"]``: per_query, amortised_ms, total_s, n).

    Returns
    -------
    dict with ``batch1`` ({all, skip, escalate: latency_stats; stages: {stage: latency_stats}};
    skip/escalate only when the search reports ``escalated``), ``batched`` ({batch_size, per_query:
    latency_stats of each question's batch wall time, amortised_ms, total_s}), ``skip_rate``
    (batch of 1, or None).
    """
    B = len(queries)
    if B == 0:
        raise ValueError("no questions to time")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    rows = list(range(B)) if single is None else [int(i) for i in single]

    def call(idx: list[int]):
        kw: dict[str, Any] = {}
        if at is not None:
            kw["at"] = [_row(at, i) for i in idx] if isinstance(at, list) else at
        w = [_row(where, i) for i in idx] if isinstance(where, list) else where
        return retriever.search([queries[i] for i in idx], k=k, where=w, unit=unit, backend=backend, **kw)

    call(rows[:1])  # warm-up, not counted
    one = np.empty(len(rows))
    esc: list[bool] = []
    stages: dict[str, list[float]] = {}
    it = rows
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(rows, desc="batch of 1", unit="q")
    for j, i in enumerate(it):
        t0 = time.perf_counter()
        res = call([i])
        one[j] = time.perf_counter() - t0
        meta = getattr(res, "meta", {}) or {}
        if meta.get("escalated") is not None and paths is not False:
            esc.append(bool(np.asarray(meta["escalated"]).reshape(-1)[0]))
        for st, sec in _stage_seconds(meta.get("timings")).items():
            stages.setdefault(st, []).append(sec)
    batch1: dict[str, Any] = {"all": latency_stats(one)}
    skip_rate = None
    if len(esc) == len(rows):
        e = np.array(esc, dtype=bool)
        batch1["skip"], batch1["escalate"] = latency_stats(one[~e]), latency_stats(one[e])
        skip_rate = float((~e).mean())
    batch1["stages"] = {st: latency_stats(v) for st, v in stages.items() if len(v) == len(rows)}
    def batched(order: list[int]) -> tuple[dict[str, Any], np.ndarray]:
        per_q = np.empty(len(order))
        e_all = np.zeros(len(order), dtype=bool)
        t_all = time.perf_counter()
        for s in range(0, len(order), batch_size):
            pos = list(range(s, min(len(order), s + batch_size)))
            t0 = time.perf_counter()
            res = call([order[p] for p in pos])
            per_q[pos] = time.perf_counter() - t0
            meta = getattr(res, "meta", {}) or {}
            if meta.get("escalated") is not None:
                e_all[pos] = np.asarray(meta["escalated"], dtype=bool).reshape(-1)[: len(pos)]
        total = time.perf_counter() - t_all
        return ({"batch_size": int(batch_size), "n": len(order), "per_query": latency_stats(per_q),
                 "amortised_ms": total / len(order) * 1e3, "total_s": total}, e_all)

    out_b, e_all = batched(list(range(B)))
    if paths:
        for name, rows_p in (("skip", np.flatnonzero(~e_all)), ("escalate", np.flatnonzero(e_all))):
            out_b[name] = batched(rows_p.tolist())[0] if rows_p.size else {"n": 0}
        out_b["skip_rate"] = float((~e_all).mean())
    return {"batch1": batch1, "skip_rate": skip_rate, "batched": out_b}
