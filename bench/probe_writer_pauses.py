#!/usr/bin/env python
"""Where a ``Memory``'s slow adds go at millions of records (issue 38's writer pauses).

Grows one ``Memory(partition_days=7)`` over ``gpuir.synthetic``'s records in ``--batch``-record adds (as
``bench/bench_sharded.py`` feeds its memories) and times every add, while recording what ran meanwhile:
the garbage collector's passes (``gc.callbacks``, per generation), the id map's folds
(``IdMap._fold``), and the writer's steps (``_append``: the segment's build, ``_publish``: the new
snapshot, ``_merge_policy``, ``_log_write``) and its waits for the writer lock (a merge's commit holds it).
For each add slower than ``--slow`` seconds it writes how much of its time overlapped each of those
(``@bg``: in another thread), and the add's writer-thread CPU time (time.thread_time: a wait for a core
is wall time only).

Usage::

    python bench/probe_writer_pauses.py --records 5000000 --out bench/results/writer_pauses_vm_5m.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_sharded import synthetic

from gpuir import Memory
from gpuir.eval.runner import machine_info
from gpuir.memory import idmap, writer


class Probe:
    """Events (label, in the adding thread?, start, end) from wrapped methods, the collector and the lock."""

    def __init__(self):
        self.events: list[tuple[str, bool, float, float]] = []
        self.main = threading.get_ident()
        self._gc_t0 = 0.0

    def wrap(self, cls, name: str, label: str) -> None:
        f = getattr(cls, name)
        ev, main = self.events, self.main

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                ev.append((label, threading.get_ident() == main, t0, time.perf_counter()))

        setattr(cls, name, timed)

    def gc_callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.events.append((f"gc{info['generation']}", threading.get_ident() == self.main, self._gc_t0,
                                time.perf_counter()))

    def timed_lock(self, lock):
        probe = self

        class TimedLock:
            def acquire(self, *a, **k):
                t0 = time.perf_counter()
                got = lock.acquire(*a, **k)
                if threading.get_ident() == probe.main:
                    probe.events.append(("lock_wait", True, t0, time.perf_counter()))
                return got

            def release(self):
                lock.release()

            def __enter__(self):
                self.acquire()
                return self

            def __exit__(self, *exc):
                self.release()

            def __getattr__(self, name):
                return getattr(lock, name)

        return TimedLock()

    def longest(self, label: str) -> float:
        return max((e1 - e0 for (lab, _, e0, e1) in self.events if lab == label), default=0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--slow", type=float, default=0.25, help="adds slower than this (s) are taken apart")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    probe = Probe()
    probe.wrap(idmap.IdMap, "_fold", "idmap_fold")
    for name in ("_publish", "_append", "_merge_policy", "_log_write"):
        probe.wrap(writer.IndexWriter, name, name)
    gc.callbacks.append(probe.gc_callback)
    corpus = synthetic(args.records, 10)
    mem = Memory(partition_days=7.0)
    w = mem._writer
    w._write_lock = mem._write_lock = probe.timed_lock(w._write_lock)
    adds = []
    t_start, n = time.perf_counter(), 0
    for b in corpus["batches"](args.batch):
        t0, c0 = time.perf_counter(), time.thread_time()
        mem.add(b)
        t1, c1 = time.perf_counter(), time.thread_time()
        n += len(b)
        adds.append((n, t0, t1, c1 - c0, len(mem.snapshot().views)))
        if n % 500_000 == 0:
            print(f"{n:,} records, {t1 - t_start:.0f} s", file=sys.stderr, flush=True)
    gc.callbacks.remove(probe.gc_callback)
    lat = np.array([t1 - t0 for (_, t0, t1, _, _) in adds])
    slow = []
    for (n, t0, t1, cpu, segs) in adds:
        if t1 - t0 < args.slow:
            continue
        parts: dict[str, float] = {}
        for (lab, mine, e0, e1) in probe.events:
            ov = min(t1, e1) - max(t0, e0)
            if ov > 0.001:
                key = lab if mine else lab + "@bg"
                parts[key] = round(parts.get(key, 0.0) + ov, 3)
        slow.append({"records": n, "wall_s": round(t1 - t0, 3), "writer_cpu_s": round(cpu, 3), "segments": segs,
                     "overlaps_s": parts})
    out = {"benchmark": "probe_writer_pauses", "label": args.label,
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "command": "python bench/probe_writer_pauses.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_info(), "records": args.records, "batch": args.batch,
           "add_p50_ms": float(np.median(lat) * 1e3), "add_p99_ms": float(np.percentile(lat, 99) * 1e3),
           "add_max_s": float(lat.max()), "slowest_add_at_records": adds[int(lat.argmax())][0],
           "adds_over_slow": len(slow), "adds_over_slow_after_the_first": sum(s["records"] > args.batch for s in slow),
           "gc_longest_s": {g: probe.longest(g) for g in ("gc0", "gc1", "gc2")},
           "gc2_passes": sum(1 for e in probe.events if e[0] == "gc2"),
           "idmap_fold_longest_s": probe.longest("idmap_fold"), "merges": len(mem.merge_log),
           "merge_longest_s": max((s for _, s in mem.merge_log), default=0.0),
           "slow": sorted(slow, key=lambda s: -s["wall_s"])}
    mem.close()
    print(json.dumps({k: v for k, v in out.items() if k not in ("slow", "machine")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
