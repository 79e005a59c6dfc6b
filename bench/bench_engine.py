#!/usr/bin/env python
"""One engine under the static index and the memory: their search speed on one core, against a baseline.

Workload: every haystack turn of LongMemEval-S, de-duplicated by text (about
189k; ``--docs`` caps it), and its 499 questions; top-10, lucene BM25
(k1=1.2, b=0.75), the "default" analyzer.

* **static**: ``BM25Index.build`` over the turns; its numba scorer answers the
  analysed questions one at a time (p50 / p99 latency) and as one batch
  (queries/s, best and median of ``--repeats`` passes).
* **memory**: a :class:`gpuir.Memory` (records without a time) grown in batches of
  ``--batch`` (1,000) to ``--memory-records`` (100,000) turns, then the questions
  one at a time and as one batch through ``Memory.search`` (``backend="auto"``:
  numba on a machine without a GPU since issue 18; the NumPy engine before).

``--baseline PATH`` (a gpuir checkout, e.g. the main branch before a change)
measures both in the same process: its ``gpuir`` package is copied to a cache
folder as ``gpuir_baseline`` and imported beside this one, the same index and
the same records are served by both, and the queries alternate between them
(order swapped every pass), so machine noise hits both alike. Results are
checked identical (ids and float32 scores) before timing.

Method: every thread pool pinned to one thread (``GPUIR_THREADS=1`` and the
BLAS / numba variables, set before any import) and the process to one CPU.

Usage::

    python bench/bench_engine.py --baseline ../main-before            # about 5 minutes on 2 cores

Writes ``bench/results/bench_engine_<host>.json`` (``--out``).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "GPUIR_THREADS"):
    os.environ[_v] = "1"

import argparse
import gzip
import hashlib
import importlib
import json
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# Steady-state timings: the compiled engine from the first search, as in a long-running process (a fresh
# process's tiered start, gpuir.memory.warmup, is timed by bench_memory.py's open probe).
os.environ.setdefault("GPUIR_TIERED_START", "0")


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


def git_rev(path: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def import_baseline(src: Path):
    """The ``gpuir`` package of checkout ``src`` imported as ``gpuir_baseline`` (a cached copy)."""
    pkg = src.resolve() / "gpuir"
    if not (pkg / "__init__.py").exists():
        raise SystemExit(f"--baseline {src}: no gpuir package there")
    key = hashlib.sha256((str(pkg) + str(git_rev(src))).encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuir-bench-baseline" / key
    if not (root / "gpuir_baseline" / "__init__.py").exists():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pkg, root / "gpuir_baseline", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(1, str(root))
    return importlib.import_module("gpuir_baseline")


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


def compare(fns: dict[str, Any], queries: list, batch: Any, repeats: int) -> dict[str, dict[str, float]]:
    """Per name: one-at-a-time latency (alternating between the names) and batch queries/s."""
    names = list(fns)
    for q in queries[:30]:  # warm-up
        for n in names:
            fns[n]([q])
    lat: dict[str, list[float]] = {n: [] for n in names}
    bat: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats):
        order = names if rep % 2 == 0 else names[::-1]
        for q in queries:
            for n in order:
                t0 = time.perf_counter()
                fns[n]([q])
                lat[n].append(time.perf_counter() - t0)
        for n in order:
            t0 = time.perf_counter()
            fns[n](batch)
            bat[n].append(time.perf_counter() - t0)
    out = {}
    for n in names:
        a = np.asarray(lat[n]) * 1e3
        out[n] = {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
                  "mean_ms": float(a.mean()), "batch_qps_best": len(batch) / min(bat[n]),
                  "batch_qps_median": len(batch) / float(np.median(bat[n]))}
    if len(names) == 2:
        r = np.asarray(lat[names[0]]) / np.asarray(lat[names[1]])
        out["ratio_median_per_query"] = {f"{names[0]}/{names[1]}": float(np.median(r))}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, default=None, help="a gpuir checkout measured in the same process")
    p.add_argument("--docs", type=int, default=None, help="cap the static index's documents")
    p.add_argument("--memory-records", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: static, memory")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import gpuir
    from gpuir import BM25Index, Memory
    from gpuir.backends.numba_backend import NumbaScorer

    base = import_baseline(args.baseline) if args.baseline else None
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    skip = set(filter(None, args.skip.split(",")))
    texts, queries = load_turns(args.docs)
    res: dict[str, Any] = {"machine": machine(), "gpuir": {"path": str(REPO), "commit": git_rev(REPO)},
                           "baseline": None if base is None else {"path": str(args.baseline.resolve()),
                                                                   "commit": git_rev(args.baseline)},
                           "docs": len(texts), "queries": len(queries), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "command": " ".join(["python", "bench/bench_engine.py", *(argv or sys.argv[1:])])}
    print(f"gpuir {gpuir.__file__}; baseline {None if base is None else base.__file__}; "
          f"{len(texts)} turns, {len(queries)} questions", flush=True)
    if "static" not in skip:
        idx = BM25Index.build(texts, progress=False)
        terms = idx.query_terms(queries)
        scorers = {"gpuir": NumbaScorer(idx.csr, idx.params, threads=1)}
        if base is not None:
            from gpuir_baseline.backends.numba_backend import NumbaScorer as BaseScorer

            scorers["baseline"] = BaseScorer(idx.csr, idx.params, threads=1)
            a, b = (sc.search(terms, 10) for sc in scorers.values())
            assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores), "static results differ"
        fns = {n: (lambda q, sc=sc: sc.search(q, 10)) for n, sc in scorers.items()}
        res["static"] = {"what": "NumbaScorer.search of analysed questions (threads=1), numba", **compare(
            fns, terms, terms, args.repeats)}
        print("static", json.dumps(res["static"], indent=1), flush=True)
        del idx, scorers
    if "memory" not in skip:
        n = min(args.memory_records, len(texts))
        mems = {"gpuir": Memory()}
        if base is not None:
            mems["baseline"] = base.Memory()
        grow = dict.fromkeys(mems, 0.0)
        for s in range(0, n, args.batch):
            recs = [{"id": str(i), "text": texts[i]} for i in range(s, min(n, s + args.batch))]
            for name, m in mems.items():
                t0 = time.perf_counter()
                m.add(recs)
                grow[name] += time.perf_counter() - t0
        ref = BM25Index.build(texts[:n], ids=[str(i) for i in range(n)], progress=False)
        want = ref.search(queries, k=10, backend="numpy")
        info: dict[str, Any] = {"records": n, "segments": len(mems["gpuir"].snapshot().views)}
        for name, m in mems.items():
            got = m.search(queries, k=10)
            same = all(got.ids(i) == [ref.ids[d] for d in want.ids[i] if d >= 0] for i in range(len(queries)))
            info[name] = {"engine": got.meta["backend"], "grow_records_per_s": n / grow[name],
                          "top10_identical_to_static": bool(same and np.array_equal(got.scores, want.scores))}
        fns = {name: (lambda q, m=m: m.search(q, k=10)) for name, m in mems.items()}
        timing = compare(fns, queries, queries, args.repeats)
        for name in mems:
            info[name].update(timing[name])
        if "ratio_median_per_query" in timing:
            info["ratio_median_per_query"] = timing["ratio_median_per_query"]
        res["memory"] = info
        print("memory", json.dumps(info, indent=1), flush=True)
    out = args.out or (REPO / "bench" / "results" / f"bench_engine_{socket.gethostname()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
