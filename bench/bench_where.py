#!/usr/bin/env python
"""Tenant-confined search through ``Memory``: the compiled path against the per-segment path, in one run.

The agent case: a shared memory of many agents' records, each question confined to its agent's tenant
(``where={"tenant": ...}``). The records and questions are :func:`gpuir.synthetic.generate`'s (agents
grouped into tenants), added in its chunks to one ``Memory`` (7-day partitions, background merges, which
are waited for). Each question is then asked, one at a time, top-10, through

* ``compiled``: the default -- every segment in one compiled call, the ``where`` as an allow-list per
  segment (:meth:`gpuir.memory.where.Where.rows`: the tenant's rows from each segment's index by code);
* ``per-segment``: the ``numba-each`` engine (``use_engine``) -- one scorer call per segment with a mask over
  every row (what every search with a ``where`` did before),

interleaved question by question (the same load for both); the two must return the same ids and scores
(checked). Reported: p50/p99/mean of the calling thread's CPU time and of wall time, per path.

Usage::

    python bench/bench_where.py --records 500000 --one-core     # about 2 minutes here

Writes ``bench/results/bench_where_<host>.json`` (``--out``).
"""

from __future__ import annotations

import os
import sys

if "--one-core" in sys.argv:  # every thread pool at one thread: before NumPy / numba load
    for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[_v] = "1"

import argparse
import datetime as _dt
import json
import platform
import socket
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuir import Memory, __version__
from gpuir.backends import use_engine
from gpuir.synthetic import generate, iter_records

# Steady-state timings: the compiled engine from the first search, as in a long-running process (a fresh
# process's tiered start, gpuir.memory.warmup, is timed by bench_memory.py's open probe).
os.environ.setdefault("GPUIR_TIERED_START", "0")


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--one-core", action="store_true", help="pin to CPU 0, every thread pool at one thread")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.one_core and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    host = socket.gethostname().split(".")[0] or "host"
    out = args.out or REPO / "bench" / "results" / f"bench_where_{host}.json"
    t0 = time.perf_counter()
    g = generate(args.records, n_queries=args.queries, seed=args.seed)
    nt = g.n_tenants
    wheres = [{"tenant": f"tenant{int(a) % nt}"} for a in g.query_agents]
    mem = Memory(partition_days=7.0)
    for chunk in iter_records(args.records, seed=args.seed):
        mem.add(chunk)
    mem.wait_merges()
    built_s = time.perf_counter() - t0
    qs = list(g.queries)
    print(f"{args.records:,} records, {nt} tenants, {len(mem.snapshot().views)} segments; {len(qs)} questions",
          flush=True)
    for q, w in zip(qs[:20], wheres[:20]):  # warm: kernels, each segment's layout and index by code
        mem.search(q, k=args.k, where=w)
    cpu: dict[str, list[float]] = {"compiled": [], "per-segment": []}
    wall: dict[str, list[float]] = {"compiled": [], "per-segment": []}
    same = True
    for q, w in zip(qs, wheres):
        got = {}
        for name in ("compiled", "per-segment"):
            with use_engine("numba", "numba" if name == "compiled" else "numba-each"):
                t, c = time.perf_counter(), time.thread_time()
                got[name] = mem.search(q, k=args.k, where=w)
                cpu[name].append(time.thread_time() - c)
                wall[name].append(time.perf_counter() - t)
        a, b = got["compiled"], got["per-segment"]
        same &= bool(np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores))
    res = {
        "benchmark": "bench_where", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["bench_where.py"] + (argv if argv is not None else sys.argv[1:])),
        "machine": {"host": host, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__, "gpuir": __version__,
                    "loadavg": os.getloadavg()},
        "config": vars(args) | {"out": str(out)},
        "records": args.records, "tenants": nt, "segments": len(mem.snapshot().views), "questions": len(qs),
        "build_s": built_s, "backend": mem.search(qs[0], k=args.k, where=wheres[0]).meta["backend"],
        "identical": same,
        "cpu": {n: _stats(v) for n, v in cpu.items()}, "wall": {n: _stats(v) for n, v in wall.items()},
    }
    res["speedup_p50_cpu"] = res["cpu"]["per-segment"]["p50_ms"] / res["cpu"]["compiled"]["p50_ms"]
    for n in cpu:
        print(f"  {n:12s} p50 {res['cpu'][n]['p50_ms']:.2f} ms, p99 {res['cpu'][n]['p99_ms']:.2f} ms (CPU time)")
    print(f"  identical: {same}; compiled is {res['speedup_p50_cpu']:.2f}x faster at p50")
    mem.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"-> {out}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
