#!/usr/bin/env python
"""The memory on the device, through the public API: ``Memory.search(backend="cupy")`` beside the
compiled CPU engine and the static index, in one process.

A :class:`gpuir.Memory` is grown from :func:`gpuir.synthetic.generate` records (``--records``, in
batches of ``--batch``, 7-day partitions as in ``bench/bench_memory.py``), its background merges
awaited, and a static :class:`gpuir.BM25Index` built over the same texts. Then, for each engine
(memory on cupy, memory on numba, static index on cupy, static index on numba):

* one question at a time, ``--one`` questions, interleaved engine by engine (p50 / p99 latency);
* one batch of ``--queries`` questions (queries/s, median of ``--repeats``), and batches of each
  size in ``--sweep`` (where the device starts to pay);
* ``memory_cupy_per_query``: the memory on cupy by its general path (one scorer call per query and
  segment, what an unfiltered batch took before one engine call per batch, and before the one device
  pass of ``gpuir.backends.devicesearch``), batches only;
* whether the memory's batch results on the device equal its results on the CPU and the static
  index's (ids and float32 scores).

Each part is written to the JSON file as soon as it is done (``--out``; default ``$OUT`` when set,
else ``bench/results/``), so a run killed at a device call's limit still returns what it measured.

    python bench/bench_memory_device.py                          # on a GPU machine, 1M records (minutes)
    python bench/bench_memory_device.py --records 20000 --model  # no GPU: the kernel model, a smoke run
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=10_000, help="records per add call")
    p.add_argument("--queries", type=int, default=1024, help="questions in the timed batch")
    p.add_argument("--one", type=int, default=300, help="questions asked one at a time")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--partition-days", type=float, default=7.0, help="0: one partition")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", default="16,64,256", help="comma-separated batch sizes also timed ('' for none)")
    p.add_argument("--model", action="store_true", help="no GPU: cupy is the kernel model (not a GPU figure)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    if min(a.records, a.batch, a.queries, a.one, a.k, a.repeats) < 1:
        p.error("--records, --batch, --queries, --one, -k and --repeats must be positive")
    try:
        a.sweep = [int(x) for x in a.sweep.split(",") if x.strip()]
    except ValueError:
        p.error(f"--sweep takes comma-separated batch sizes, got {a.sweep!r}")
    if any(n < 1 for n in a.sweep):
        p.error("--sweep sizes must be positive")
    if a.out is None:
        a.out = Path(os.environ.get("OUT") or ROOT / "bench" / "results") / (
            f"bench_memory_device_{'model' if a.model else platform.node()}_{a.partition_days:g}d.json")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.model:
        from gpuir.backends import model_device_plugin  # noqa: F401 - fake cupy on the kernel model
    import numpy as np
    from bench_memory import _search_times_together, machine

    from gpuir import BM25Index, Memory
    from gpuir.backends import devicesearch
    from gpuir.gpu_info import gpu_report
    from gpuir.memory import searcher as memory_searcher
    from gpuir.synthetic import generate

    res: dict[str, Any] = {"benchmark": "bench_memory_device", "command": " ".join(sys.argv),
                           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "machine": machine(), "gpu": gpu_report(), "model": a.model,
                           "config": {k: getattr(a, k) for k in ("records", "batch", "queries", "one", "k",
                                                                 "repeats", "partition_days", "seed", "sweep")}}
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def save(part: str) -> None:
        a.out.write_text(json.dumps(res, indent=1, default=str))
        print(f"[bench_memory_device] {part}: {json.dumps(res.get(part), default=str)[:600]}", flush=True)

    t = time.perf_counter()
    g = generate(a.records, n_queries=max(a.queries, a.one, *a.sweep), seed=a.seed)
    mem = Memory(partition_days=a.partition_days or None)
    for i in range(0, a.records, a.batch):
        mem.add(g.records(i, min(i + a.batch, a.records)))
    grow_s = time.perf_counter() - t
    mem.wait_merges()
    texts = [r["text"] for r in g.records(0, a.records)]
    t2 = time.perf_counter()
    static = BM25Index.build(texts, ids=[r["id"] for r in g.records(0, a.records)], progress=False)
    res["build"] = {"records": a.records, "grow_s": round(grow_s, 2), "static_build_s": round(time.perf_counter() - t2, 2),
                    "segments": len(mem.snapshot().views), "partitions": len(mem.snapshot().partitions)}
    save("build")

    qs = list(g.queries)
    fns = {"memory_cupy": lambda q: mem.search(q, k=a.k, backend="cupy"),
           "memory_numba": lambda q: mem.search(q, k=a.k, backend="numba"),
           "static_cupy": lambda q: static.search(q, k=a.k, backend="cupy"),
           "static_numba": lambda q: static.search(q, k=a.k, backend="numba")}
    t = time.perf_counter()
    for f in fns.values():  # compile, upload each segment once, allocate
        f(qs[:3])
        f(qs[: a.queries])
    res["warm_s"] = round(time.perf_counter() - t, 2)
    res["one_at_a_time"] = _search_times_together(fns, qs[: a.one])
    save("one_at_a_time")

    def per_query(q):  # the general path: the engine per query (partitions.scan) and per segment (one pass off)
        real = memory_searcher.scan_unfiltered
        memory_searcher.scan_unfiltered = lambda *args: None
        devicesearch.ONE_PASS = False
        try:
            return mem.search(q, k=a.k, backend="cupy")
        finally:
            memory_searcher.scan_unfiltered = real
            devicesearch.ONE_PASS = True

    batch_fns = {**fns, "memory_cupy_per_query": per_query}
    last: dict[str, Any] = {}

    def time_batches(batch: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, f in batch_fns.items():
            f(batch)  # (a new batch size: CUDA graphs and workspaces sized once)
            times = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                last[name] = f(batch)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            out[name] = {"batch": len(batch), "median_s": med, "qps": len(batch) / med, "times_s": times,
                         "backend": last[name].meta.get("backend")}
        return out

    batch = qs[: a.queries]
    res["batch"] = time_batches(batch)
    save("batch")

    def same(x, y) -> dict[str, Any]:
        ids = sum(x.ids(i) != y.ids(i) for i in range(len(batch)))
        sx, sy = np.asarray(x.scores), np.asarray(y.scores)
        w = min(sx.shape[1], sy.shape[1])
        return {"rows": len(batch), "rows_with_other_ids": int(ids),
                "scores_bit_equal": bool(np.array_equal(sx[:, :w], sy[:, :w]))}

    res["identical"] = {"memory_cupy_vs_memory_numba": same(last["memory_cupy"], last["memory_numba"]),
                        "memory_cupy_vs_static_cupy": same(last["memory_cupy"], last["static_cupy"]),
                        "static_cupy_vs_static_numba": same(last["static_cupy"], last["static_numba"]),
                        "memory_cupy_vs_per_query": same(last["memory_cupy"], last["memory_cupy_per_query"])}
    save("identical")
    res["sweep"] = {}
    for n in a.sweep:
        res["sweep"][str(n)] = {name: {"qps": r["qps"], "median_s": r["median_s"]}
                                for name, r in time_batches(qs[:n]).items()}
        save("sweep")
    ok = all(v["rows_with_other_ids"] == 0 and v["scores_bit_equal"] for v in res["identical"].values())
    mem.close()
    print(f"wrote {a.out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
