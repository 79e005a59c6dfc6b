"""What the memory API of issue 22 costs: adds (times parsed once), filtered searches (the filter language),
listing pages, counts, export and import, and searches when expiry is in use.

Workload: :func:`gpuir.synthetic.generate` records (ISO 8601 times, tenants, roles, metadata). Every
figure is the median of ``--repeats`` runs in this process. Parts that need features older gpuir lacks
(list, count, export, the new operators, expiry) are skipped there, so the same script measures a
checkout before and after (``PYTHONPATH=CHECKOUT python bench/bench_memory_api.py``) on the same
machine, back to back::

    python bench/bench_memory_api.py --records 50000 --out bench/results/memory_api.json

Writes JSON (the machine named: CPU model, Python, NumPy, the gpuir commit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

# Steady-state timings: the compiled engine from the first search, as in a long-running process (a fresh
# process's tiered start, gpuir.memory.warmup, is timed by bench_memory.py's open probe).
os.environ.setdefault("GPUIR_TIERED_START", "0")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit(path: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _median(f, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000, help="synthetic records (default: %(default)s)")
    ap.add_argument("--queries", type=int, default=200, help="queries per search measure (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure, median kept (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=5000, help="records per add call (default: %(default)s)")
    ap.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = ap.parse_args(argv)

    import gpuir
    from gpuir import Memory
    from gpuir.synthetic import generate

    root = Path(gpuir.__file__).resolve().parents[1]
    g = generate(args.records, n_queries=args.queries, seed=7)
    recs = g.records()
    # the same input for every checkout: times as ISO 8601 strings (older generators gave epoch ms)
    ms_times = [round(float(t) * 1000.0) for t in g.times[: len(recs)]]
    for r, t in zip(recs, ms_times):
        r["time"] = datetime.fromtimestamp(t // 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + (
            f".{t % 1000:03d}Z")
    res: dict = {"machine": {"cpu_model": _cpu_model(), "logical_cores": os.cpu_count(),
                             "python": platform.python_version(), "numpy": np.__version__,
                             "platform": platform.platform(),
                             "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
                 "gpuir": {"path": str(root), "commit": _commit(root)},
                 "records": args.records, "queries": args.queries, "repeats": args.repeats, "seconds": {}}
    sec = res["seconds"]

    def build() -> Memory:
        m = Memory()
        for s in range(0, len(recs), args.batch):
            m.add(recs[s: s + args.batch])
        return m

    sec["add_all"] = _median(build, args.repeats)
    m = build()
    if "time_unit" in Memory.add.__code__.co_varnames:  # numbers with their unit: no string parsing

        def build_ms() -> None:
            m2 = Memory()
            for s in range(0, len(recs), args.batch):
                m2.add([{**r, "time": t} for r, t in zip(recs[s: s + args.batch], ms_times[s: s + args.batch])],
                       time_unit="ms")

        sec["add_all_epoch_ms_with_time_unit"] = _median(build_ms, args.repeats)
    qs = g.queries
    sec["search_no_filter"] = _median(lambda: m.search(qs, k=10), args.repeats)
    sec["search_tenant"] = _median(lambda: m.search(qs, k=10, where={"tenant": "tenant1"}), args.repeats)
    w_and = {"tenant": "tenant1", "role": "user", "importance": {"gte": 0.3}}
    sec["search_tenant_and"] = _median(lambda: m.search(qs, k=10, where=w_and), args.repeats)
    has_new = hasattr(m, "list")
    res["new_api"] = has_new
    if has_new:
        w_or = {"tenant": "tenant1", "$or": [{"role": "user"}, {"metadata.turn": {"lt": 2}}],
                "$not": {"importance": {"lt": 0.1}}}
        sec["search_tenant_or_not"] = _median(lambda: m.search(qs, k=10, where=w_or), args.repeats)
        sec["search_newest_ties"] = _median(lambda: m.search(qs, k=10, mode="newest"), args.repeats)
        sec["search_newest_oldest_ties"] = _median(lambda: m.search(qs, k=10, mode="newest", ties="oldest"),
                                                   args.repeats)

        def walk():
            cursor, n = None, 0
            while True:
                page = m.list(where={"tenant": "tenant1"}, order_by="time", limit=1000, cursor=cursor)
                n += len(page.records)
                cursor = page.cursor
                if cursor is None:
                    return n

        res["listed"] = walk()
        sec["list_tenant_by_time_all_pages"] = _median(walk, args.repeats)
        sec["count_or"] = _median(lambda: m.count(w_or), args.repeats)
        tmp = Path(tempfile.mkdtemp())
        sec["export"] = _median(lambda: m.export(tmp / "e.jsonl"), args.repeats)
        res["export_bytes"] = (tmp / "e.jsonl").stat().st_size
        sec["import_from_export"] = _median(lambda: Memory.from_export(tmp / "e.jsonl"), args.repeats)
        m.add([{"id": "expiring", "text": "x", "expires_at": "2999-01-01"}])
        sec["search_no_filter_expiry_in_use"] = _median(lambda: m.search(qs, k=10), args.repeats)
    for k, v in sec.items():
        print(f"{k:36s} {v * 1000:10.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
