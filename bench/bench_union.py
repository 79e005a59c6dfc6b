#!/usr/bin/env python
"""A memory's dense questions all segments at once or segment by segment, in one run, through ``Memory``.

``gpuir.backends.numba_segments.UNION`` chooses how the compiled engine searches a question that is dense in every
segment: over all segments at once, as over one merged segment (``"always"``), segment by segment with
the k-th score carried from one to the next (``"never"``), or all at once only when the segments hold
one time partition (``"auto"``, the default). This script measures the three on two memories of the
same synthetic records (:func:`gpuir.synthetic.generate`), added in chunks of ``--batch`` with
background merges (waited for):

* ``one partition`` (``partition_days=None``): segments are size tiers of one stream, alike;
* ``weekly partitions`` (``partition_days=7``): each partition holds its own weeks' words.

Each question is asked alone, top-k, under each setting in turn (interleaved: the same load for all; the
setting that goes first rotates, as the first warms the caches for the others),
after one untimed batch that fills the snapshot's weights; the settings must return the same ids and
scores (checked). Reported per memory and setting: p50/p99/mean of the calling thread's CPU time, and
the postings read.

Usage::

    python bench/bench_union.py --records 1000000 --one-core     # about 3 minutes here

Writes ``bench/results/bench_union_<host>.json`` (``--out``).
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
from gpuir.backends import numba_segments as segscan
from gpuir.synthetic import generate

SETTINGS = ("auto", "always", "never")


# Steady-state timings: the compiled engine from the first search, as in a long-running process (a fresh
# process's tiered start, gpuir.memory.warmup, is timed by bench_memory.py's open probe).
os.environ.setdefault("GPUIR_TIERED_START", "0")


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean())}


def measure(g, partition_days: float | None, batch: int, k: int) -> dict:
    """Grow a memory of ``g``'s records, then time its questions under each setting, interleaved."""
    mem = Memory(partition_days=partition_days)
    for s in range(0, len(g.ids), batch):
        mem.add(g.records(s, s + batch))
    mem.wait_merges()
    snap = mem.snapshot()
    qs = list(g.queries)
    mem.search(qs, k=k)  # the snapshot's weights filled
    cpu: dict[str, list[float]] = {s: [] for s in SETTINGS}
    read: dict[str, list[int]] = {s: [] for s in SETTINGS}
    same = True
    try:
        for i, q in enumerate(qs):
            got = {}
            for s in SETTINGS[i % 3:] + SETTINGS[:i % 3]:  # each setting first in turn (the first warms the caches)
                segscan.UNION = s
                c = time.thread_time()
                got[s] = mem.search([q], k=k)
                cpu[s].append(time.thread_time() - c)
                read[s].append(int(got[s].meta["postings_read"].sum()))
            ref = got["never"]
            same &= all(np.array_equal(r.seqs, ref.seqs) and np.array_equal(r.scores, ref.scores)
                        for r in got.values())
    finally:
        segscan.UNION = "auto"
    out = {"partition_days": partition_days, "segments": len(snap.views), "partitions": len(snap.partitions),
           "questions": len(qs), "identical": bool(same)}
    for s in SETTINGS:
        out[s] = _stats(cpu[s]) | {"postings_read_mean": float(np.mean(read[s]))}
    mem.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--batch", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--one-core", action="store_true", help="pin to CPU 0, every thread pool at one thread")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.one_core and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    host = socket.gethostname().split(".")[0] or "host"
    out = args.out or REPO / "bench" / "results" / f"bench_union_{host}.json"
    g = generate(args.records, n_queries=args.queries, seed=args.seed)
    runs = {}
    for name, days in (("one partition", None), ("weekly partitions", 7.0)):
        r = runs[name] = measure(g, days, args.batch, args.k)
        print(f"{name}: {r['segments']} segments in {r['partitions']} partitions, identical {r['identical']}")
        for s in SETTINGS:
            print(f"  {s:7s} p50 {r[s]['p50_ms']:.3f} ms, p99 {r[s]['p99_ms']:.3f} ms (CPU), "
                  f"postings read {r[s]['postings_read_mean']:,.0f}", flush=True)
    res = {
        "benchmark": "bench_union", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["bench_union.py"] + (argv if argv is not None else sys.argv[1:])),
        "machine": {"host": host, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__, "gpuir": __version__,
                    "loadavg": os.getloadavg(),
                    "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "config": vars(args) | {"out": str(out)},
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"-> {out}")
    return 0 if all(r["identical"] for r in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
