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

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: loopback only
os.environ.setdefault("GPUIR_TIERED_START", "0")

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuir import Memory
from gpuir.cluster import ShardedMemory
from gpuir.cluster.shard import ShardServer, write_payload
from gpuir.cluster.sharded import memory_kwargs
from gpuir.memory.intake import to_batch
from gpuir.memory.termstats import TermStats


def pct(xs, q):
    return round(float(np.percentile(np.asarray(xs), q)), 3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--one", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--label", default="", help="a note saved with the results (e.g. 'under load')")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "bench"))
    from bench_sharded import machine, synthetic

    mach = machine()  # (its load average: at the start)
    corpus = synthetic(args.records, args.queries)
    work = Path(tempfile.mkdtemp(prefix="gpuir-prof-"))
    mem = Memory()
    sm = ShardedMemory.create(work / "sm", shards=1, route="tenant", device="cpu")
    shard = ShardServer(work / "inproc", create=memory_kwargs(sm.config()))
    try:
        seq = 0
        for wid, b in enumerate(corpus["batches"](args.batch), start=1):
            mem.add(b)
            sm.add(b)
            batch = to_batch(b)
            shard.write(write_payload("add", wid, batch=batch, seqs=np.arange(seq, seq + len(b), dtype=np.int64)))
            seq += len(b)
        sm.save()
        queries, wheres, k = corpus["queries"], corpus["wheres"], args.k
        for i in range(8):  # warm-up
            mem.search(queries[i], k=k, where=wheres[i])
            sm.search(queries[i], k=k, where=wheres[i])
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
                         and a.hits(0) == b.hits(0))
        res = {"benchmark": "profile_sharded_one", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "machine": mach, "label": args.label, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "records": args.records, "questions": len(pick), "k": k, "identical_to_memory": same,
               "p50_ms": {key: pct(v, 50) for key, v in t.items()},
               "p99_ms": {key: pct(v, 99) for key, v in t.items()}}
        res["overhead_p50_ms"] = round(res["p50_ms"]["sharded"] - res["p50_ms"]["memory"], 3)
        res["overhead_ray_p50_ms"] = round(res["p50_ms"]["sharded_ray"] - res["p50_ms"]["memory"], 3)
        res["machine"]["loadavg_end"] = os.getloadavg()
        print(json.dumps({k2: res[k2] for k2 in ("p50_ms", "overhead_p50_ms", "overhead_ray_p50_ms",
                                                  "identical_to_memory")}, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
            print(f"wrote {args.out} ({socket.gethostname()})", file=sys.stderr)
    finally:
        shard.close()
        sm.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
