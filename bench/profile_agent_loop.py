"""Where an agent's question goes: the loop of ``bench_memory.py --agent-loop`` (the memory grown over the
LongMemEval-S turns, then add one turn, ask one question), each stage of the question timed.

Each stage is a function of the search path wrapped with a wall-clock timer for the searching thread's calls
(inclusive: a stage's time holds its callees'); the medians over the questions (the first 20 left out) go to
``--out``, beside those of the static index's own search (analysis, weighing, the compiled call). The
wrappers add about a microsecond each: read the stages as shares, the totals in ``bench_memory.py``.

Usage::

    taskset -c 0 python bench/profile_agent_loop.py --out bench/results/profile_agent_loop_vm.json
"""

from __future__ import annotations

import argparse
import collections
import datetime as _dt
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_memory as bm

from gpuir import BM25Index
from gpuir.backends import cpu_maxscore, cpu_segments, numba_segments
from gpuir.memory import docfreq, search, searcher

_main = threading.main_thread()
_cur: dict[str, float] = {}


def _wrap(owner, name: str, label: str | None = None) -> None:
    """Time ``owner.name`` (a module function or a class's method) when the main thread calls it."""
    f = getattr(owner, name)
    label = label or name

    def timed(*a, **k):
        if threading.current_thread() is not _main:
            return f(*a, **k)
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            _cur[label] = _cur.get(label, 0.0) + time.perf_counter() - t

    setattr(owner, name, timed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "profile_agent_loop_vm.json")
    p.add_argument("--rounds", type=int, default=499)
    a = p.parse_args(argv)
    stages = [(searcher, "plan_queries"), (search, "_weigh_terms"), (docfreq.DfTable, "__getitem__", "df lookup"),
              (numba_segments, "search_compiled"), (numba_segments.SnapshotWeights, "params", "weights' parameters"),
              (numba_segments.SnapshotLayout, "slots", "term slots"), (numba_segments, "_small_table"),
              (cpu_segments, "search_segments", "compiled scan (large segments)"),
              (cpu_segments, "search_small", "compiled scan (small segments)")]
    for st in stages:
        _wrap(*st)
    corpus = bm._lme_corpus()
    texts, qs = corpus.texts, corpus.queries[:a.rounds]
    recs = bm._records(texts)
    idx = BM25Index.build(texts, progress=False)
    warm, _ = bm._grow(recs[:3000], 1000)
    for r in recs[3000:3020]:
        warm.add([r])
        warm.search(qs[0], k=10)
    warm.close()
    mem, _ = bm._grow(recs[:-len(qs)], 1000)
    gc.collect()
    gc.freeze()
    acc: dict[str, list[float]] = collections.defaultdict(list)
    merges0 = len(mem.merge_log)
    for i, (rec, q) in enumerate(zip(recs[-len(qs):], qs)):
        mem.add([rec])
        _cur.clear()
        t = time.perf_counter()
        mem.search(q, k=10)
        total = time.perf_counter() - t
        if i >= 20:
            for k, v in _cur.items():
                acc[k].append(v)
            acc["question (Memory.search)"].append(total)
    mem.wait_merges()
    during = [dt for _, dt in mem.merge_log[merges0:]]  # (seconds of each merge the loop's adds started, wall)
    merges = {"count": len(during), "total_s": float(np.sum(during)), "median_ms": float(np.median(during) * 1e3)
              if during else None, "rounds": len(qs)}
    mem.close()
    _cur.clear()
    _wrap(cpu_maxscore, "search_pruned", "static: compiled call")
    _wrap(idx, "query_terms", "static: analysis")
    sacc: dict[str, list[float]] = collections.defaultdict(list)
    idx.search(qs[:5], k=10)
    for q in qs:
        _cur.clear()
        t = time.perf_counter()
        idx.search(q, k=10)
        total = time.perf_counter() - t
        for k, v in _cur.items():
            sacc[k].append(v)
        sacc["static: question (BM25Index.search)"].append(total)
    med = {k: float(np.median(v) * 1e6) for k, v in sorted(acc.items(), key=lambda kv: -np.median(kv[1]))}
    smed = {k: float(np.median(v) * 1e6) for k, v in sorted(sacc.items(), key=lambda kv: -np.median(kv[1]))}
    res = {"benchmark": "profile_agent_loop", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "machine": bm.machine(), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "what": "median wall-clock microseconds per question of each stage (inclusive), the memory's loop "
                   "(add one turn, ask one question; merges in the background) and the static index alone",
           "memory_loop_us": med, "static_us": smed, "questions": len(qs) - 20, "merges_in_loop": merges,
           "loadavg_end": os.getloadavg()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    for k, v in {**med, **smed}.items():
        print(f"  {k:40s} {v:8.1f} us")
    print(f"  merges the loop's adds started: {json.dumps(merges)}")
    print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
