"""Segment.rows_with_codes before and after session 36's change (int32 keys for the int32 code column),
swapped in turn question by question in one process: one Memory, each question confined to its tenant.

Usage::

    taskset -c 1 python bench/ab_rows_with_codes.py 1000000 [out.json]
"""

import os
import sys
import time

import _shard_diag as sd  # (first: the environment and sys.path, before NumPy and gpuir are imported)
import numpy as np
from bench_sharded import synthetic

from gpuir import Memory
from gpuir.memory import segments

new = segments.Segment.rows_with_codes


def old(self, field, codes):
    key = ("codes_index_old", field)
    idx = self.cache.get(key)
    if idx is None:
        col = self.codes[field]
        order = np.argsort(col, kind="stable")
        idx = (order, col[order])
        self.cache[key] = idx
    order, sorted_codes = idx
    codes = np.asarray(codes, dtype=np.int64)
    lo = np.searchsorted(sorted_codes, codes, side="left")
    hi = np.searchsorted(sorted_codes, codes, side="right")
    if codes.size == 1:
        return order[int(lo[0]) : int(hi[0])].astype(np.int64)
    parts = [order[a:b] for a, b in zip(lo.tolist(), hi.tolist()) if b > a]
    return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)


N = int(sys.argv[1])
c = synthetic(N, 500)
mem = Memory()
sd.fill(c, 10000, mem)
qs, ws = c["queries"], c["wheres"]
for i in range(10):
    for f in (old, new):
        segments.Segment.rows_with_codes = f
        mem.search(qs[i], k=10, where=ws[i])
T = {"before": [], "after": [], "before_cpu": [], "after_cpu": []}
same = True
for j in range(2 * len(qs)):
    i = j % len(qs)
    ref = None
    for name, f in (("before", old), ("after", new)) if j % 2 == 0 else (("after", new), ("before", old)):
        segments.Segment.rows_with_codes = f
        c0, t0 = time.thread_time(), time.perf_counter()
        r = mem.search(qs[i], k=10, where=ws[i])
        T[name].append((time.perf_counter() - t0) * 1e3)
        T[name + "_cpu"].append((time.thread_time() - c0) * 1e3)
        if ref is None:
            ref = r
        else:
            same &= bool(np.array_equal(ref.seqs, r.seqs) and np.array_equal(ref.scores, r.scores))
out = {
    "benchmark": "rows_with_codes before/after (Memory.search, a tenant's where)",
    "records": N,
    "questions": len(T["after"]),
    "command": f"taskset -c 1 python bench/ab_rows_with_codes.py {N} (one Memory; the old and new Segment.rows_with_codes swapped in turn, question by question)",
    "identical": same,
    "loadavg": os.getloadavg(),
    "p50_ms": {k: sd.pct(v) for k, v in T.items()},
    "mean_ms": {k: round(float(np.mean(v)), 3) for k, v in T.items()},
}
sd.emit(out, sys.argv[2] if len(sys.argv) > 2 else None)
