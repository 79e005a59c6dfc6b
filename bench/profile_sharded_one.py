#!/usr/bin/env python
"""Where a one-question sharded search spends its time (issue 38): one ``Memory`` beside a 1-shard
``ShardedMemory`` on the same records (the synthetic agent corpus, ``route="tenant"``, each question
confined to its tenant), interleaved question by question.

Timed per question (p50 over ``--one`` questions, k=10, in one process, interleaved so that load on a
shared machine falls on every part alike):

* ``memory``: ``Memory.search`` in this process (the baseline);
* ``shard_inprocess``: :meth:`ShardServer.search <gpuir.cluster.shard.ShardServer.search>` with the
  request the coordinator sends (its statistics versioned by the coordinator's state, as
  ``ShardedMemory.search`` sends them: the shard reuses one restated snapshot; before session 36 this tool
  sent them unversioned, which restated the snapshot and emptied its caches on every question, +0.7 ms at
  1M records), on a shard built here on the same records (no Ray): the shard's work;
* ``sharded``: ``ShardedMemory.search`` end to end, and its parts (``meta["timings"]``): the
  coordinator's planning, the shard call (round trip + the shard's work), the merge; the shard
  reached over its direct channel (:mod:`gpuir.cluster.fastpath`, the default on one node);
* ``sharded_ray``: the same search with every shard call over a Ray actor call (``fast_path=False``);
* ``ray_ping``: an empty actor call's round trip;
* ``coordinator_cpu``: the driver's CPU time per sharded search (``time.process_time``; Ray's own
  threads in the driver included).

Usage::

    python bench/profile_sharded_one.py --records 50000 --one 300 --out bench/results/profile_sharded_one_vm.json

Runs a local Ray runtime on loopback.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import _shard_diag as sd  # (first: the environment and sys.path, before Ray, NumPy and gpuir are imported)
import numpy as np

from gpuir.memory.termstats import TermStats


def untimed(hits: list[dict]) -> list[dict]:
    """Hits without the record times each memory stamped on its own copy of a record (a millisecond apart
    when the two adds straddle one)."""
    return [{f: v for f, v in h.items() if f not in ("created_at", "updated_at")} for h in hits]


def main(argv=None) -> int:
    args = sd.parse(sd.parser(__doc__, records=50_000, queries=200, batch=5000), argv)
    from bench_sharded import machine, synthetic

    mach = machine()  # (its load average: at the start)
    corpus = synthetic(args.records, args.queries)
    with sd.rig(corpus, args.batch, "gpuir-prof-", shard="inproc") as rig:
        mem, sm, shard = rig.mem, rig.sm, rig.shard
        queries, wheres, k = corpus["queries"], corpus["wheres"], args.k
        rig.warm_up(corpus, k, 8)
        rng = np.random.default_rng(1)
        pick = rng.choice(len(queries), size=args.one, replace=True).tolist()
        import ray

        actor = sm._actors[0]
        t = {key: [] for key in ("memory", "shard_inprocess", "sharded", "plan", "shard_call", "merge", "ray_ping",
                                 "coordinator_cpu", "sharded_ray", "shard_call_ray")}
        same = True
        for i in pick:
            q, w = queries[i], wheres[i]
            t0 = time.perf_counter()
            a = mem.search(q, k=k, where=w)
            t["memory"].append((time.perf_counter() - t0) * 1e3)
            ts = sm.stats([q])  # versioned as the coordinator sends them: the shard reuses its restated snapshot
            ts = TermStats(ts.n_docs, ts.total_len, dict(ts.df), version=sm._next_wid)
            t0 = time.perf_counter()
            shard.search([q], k, [w], "exhaustive", [None], ts, "auto", "oldest", None, None, [True])
            t["shard_inprocess"].append((time.perf_counter() - t0) * 1e3)
            c0, t0 = time.process_time(), time.perf_counter()
            b = sm.search(q, k=k, where=w)
            t["sharded"].append((time.perf_counter() - t0) * 1e3)
            t["coordinator_cpu"].append((time.process_time() - c0) * 1e3)
            tm = b.meta["timings"]
            t["plan"].append(tm["plan_s"] * 1e3)
            t["shard_call"].append(tm["shards_s"] * 1e3)
            t["merge"].append(tm["merge_s"] * 1e3)
            sm.fast_path = False
            t0 = time.perf_counter()
            c = sm.search(q, k=k, where=w)
            t["sharded_ray"].append((time.perf_counter() - t0) * 1e3)
            t["shard_call_ray"].append(c.meta["timings"]["shards_s"] * 1e3)
            sm.fast_path = True
            same &= bool(np.array_equal(a.seqs, c.seqs) and np.array_equal(a.scores, c.scores))
            t0 = time.perf_counter()
            ray.get(actor.ping.remote())
            t["ray_ping"].append((time.perf_counter() - t0) * 1e3)
            same &= bool(np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores)
                         and untimed(a.hits(0)) == untimed(b.hits(0)))
        res = {"benchmark": "profile_sharded_one", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "machine": mach, "label": args.label, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "records": args.records, "questions": len(pick), "k": k, "identical_to_memory": same,
               "p50_ms": {key: sd.pct(v, 50) for key, v in t.items()},
               "p99_ms": {key: sd.pct(v, 99) for key, v in t.items()}}
        res["overhead_p50_ms"] = round(res["p50_ms"]["sharded"] - res["p50_ms"]["memory"], 3)
        res["overhead_ray_p50_ms"] = round(res["p50_ms"]["sharded_ray"] - res["p50_ms"]["memory"], 3)
        res["machine"]["loadavg_end"] = os.getloadavg()
        sd.emit(res, args.out, {k2: res[k2] for k2 in ("p50_ms", "overhead_p50_ms", "overhead_ray_p50_ms",
                                                       "identical_to_memory")})
        if args.out:
            print(f"wrote {args.out} ({socket.gethostname()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
