#!/usr/bin/env python
"""One engine under the static index and the memory: their search speed on one core, side by side.

Workload: every haystack turn of LongMemEval-S, de-duplicated by text (about
189k; ``--docs`` caps it), and its 499 questions; top-10, lucene BM25
(k1=1.2, b=0.75), the "default" analyzer.

* **static**: ``BM25Index.build`` over the turns, searched with ``backend``
  (``--backend``, default numba): the 499 questions one at a time (p50 / p99
  latency, analysis included) and as one batch (queries/s); one warm-up pass.
* **memory**: a :class:`gpuir.Memory` (records without a time) grown in batches of
  ``--batch`` (1,000) to ``--memory-records`` (100,000) turns, then the same
  questions one at a time (p50 / p99) and as one batch, with ``backend="auto"``
  (on a machine without a GPU: numba since issue 18, the NumPy engine before) and
  ``backend="numpy"``; its top-10 (ids and float32 scores) is compared with a
  ``BM25Index`` over the same records.

Method: every thread pool pinned to one thread (``GPUIR_THREADS=1`` and the
BLAS / numba variables, set before any import) and the process to one CPU.
``--src`` picks the gpuir checkout to import (default: this repository), so
one script measures two versions (before / after) on the same machine.

Usage::

    python bench/bench_engine.py --label after
    python bench/bench_engine.py --src ../main --label before --out bench/results/bench_engine_before.json

Writes ``bench/results/bench_engine_<label>_<host>.json`` (``--out``).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "GPUIR_THREADS"):
    os.environ[_v] = "1"

import argparse
import gzip
import json
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu_model": cpu, "logical_cores": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
            "loadavg_start": os.getloadavg()}


def load_turns(max_docs: int | None) -> tuple[list[str], list[str]]:
    from gpuir.datapath import longmemeval_path

    path = longmemeval_path("s")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    seen: dict[str, None] = {}
    for entry in data:
        for session in entry["haystack_sessions"]:
            for turn in session:
                seen.setdefault(turn["content"], None)
    texts = list(seen)
    return (texts[:max_docs] if max_docs else texts), [e["question"] for e in data]


def one_at_a_time(search, queries: list[str]) -> dict[str, float]:
    for q in queries[:50]:  # warm-up (compilation, caches)
        search([q])
    lat = []
    for q in queries:
        t0 = time.perf_counter()
        search([q])
        lat.append(time.perf_counter() - t0)
    a = np.asarray(lat) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean())}


def batch(search, queries: list[str], repeats: int) -> dict[str, float]:
    search(queries)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        search(queries)
        ts.append(time.perf_counter() - t0)
    return {"queries_per_s": len(queries) / float(np.median(ts))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=REPO, help="gpuir checkout to import (default: this repository)")
    p.add_argument("--label", default="run")
    p.add_argument("--docs", type=int, default=None, help="cap the static index's documents")
    p.add_argument("--memory-records", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--backend", default="numba")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: static, memory, memory-numpy")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(args.src.resolve()))
    import gpuir
    from gpuir import BM25Index, Memory

    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    skip = set(filter(None, args.skip.split(",")))
    texts, queries = load_turns(args.docs)
    res: dict[str, Any] = {"label": args.label, "src": str(args.src.resolve()), "gpuir_file": gpuir.__file__,
                           "machine": machine(), "docs": len(texts), "queries": len(queries),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"gpuir from {gpuir.__file__}; {len(texts)} turns, {len(queries)} questions", flush=True)
    if "static" not in skip:
        t0 = time.perf_counter()
        idx = BM25Index.build(texts, progress=False)
        build_s = time.perf_counter() - t0
        idx.search(queries[:5], k=10, backend=args.backend)  # the scorer (and its caches)
        one = one_at_a_time(lambda q: idx.search(q, k=10, backend=args.backend), queries)
        bat = batch(lambda q: idx.search(q, k=10, backend=args.backend), queries, args.repeats)
        res["static"] = {"backend": args.backend, "build_s": build_s, **one, **bat}
        print("static", res["static"], flush=True)
        del idx
    if "memory" not in skip:
        n = min(args.memory_records, len(texts))
        m = Memory()
        t0 = time.perf_counter()
        longest = 0.0
        for s in range(0, n, args.batch):
            t1 = time.perf_counter()
            m.add([{"id": str(i), "text": texts[i]} for i in range(s, min(n, s + args.batch))])
            longest = max(longest, time.perf_counter() - t1)
        grow_s = time.perf_counter() - t0
        info = {"records": n, "segments": len(m.snapshot().views), "grow_records_per_s": n / grow_s,
                "longest_add_s": longest}
        ref = BM25Index.build(texts[:n], ids=[str(i) for i in range(n)], progress=False)
        want = ref.search(queries, k=10, backend="numpy")
        for backend in ("auto", "numpy"):
            if backend == "numpy" and "memory-numpy" in skip:
                continue
            r = m.search(queries[:1], k=10, backend=backend)
            used = r.meta["backend"]
            one = one_at_a_time(lambda q, b=backend: m.search(q, k=10, backend=b), queries)
            bat = batch(lambda q, b=backend: m.search(q, k=10, backend=b), queries, args.repeats)
            got = m.search(queries, k=10, backend=backend)
            same = all(got.ids(i) == [ref.ids[d] for d in want.ids[i] if d >= 0] for i in range(len(queries)))
            same = same and np.array_equal(got.scores, want.scores)
            info[backend] = {"engine": used, **one, **bat, "top10_identical_to_static": bool(same)}
            print("memory", backend, info[backend], flush=True)
        res["memory"] = info
    host = socket.gethostname()
    out = args.out or (REPO / "bench" / "results" / f"bench_engine_{args.label}_{host}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
