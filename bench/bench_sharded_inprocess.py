#!/usr/bin/env python
"""A sharded memory's per-question cost without Ray: ``ShardedMemory`` over in-process ``ShardServer`` objects
behind a fake actor handle (the same coordinator and shard code, no process boundary), beside one ``Memory``.

What is left over one ``Memory``'s time is the coordinator's planning and merge and the shard's own work
(restating its snapshot under the global statistics, the query-phase arrays); Ray's round trip is
``bench/bench_ray_transport.py``'s.

Usage::

    python bench/bench_sharded_inprocess.py --records 50000 --queries 300 [--shards 1]

Prints one JSON line: p50 ms of tenant-confined one-question searches, each configuration measured twice
(interleaved), and the sharded search's own timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GPUIR_TIERED_START", "0")

from gpuir.cluster import runtime
from gpuir.cluster.shard import ShardServer
from gpuir.cluster.sharded import ShardedMemory, memory_kwargs
from gpuir.memory import Memory
from gpuir.synthetic import generate, iter_records


class _Actor:
    def __init__(self, server):
        self.server = server

    def __getattr__(self, name):
        return types.SimpleNamespace(remote=lambda *a: getattr(self.server, name)(*a))


class _Err(Exception):
    pass


_RAY = types.SimpleNamespace(get=lambda ref, timeout=None: ref, kill=lambda *a, **kw: None, shutdown=lambda: None,
                             nodes=list, exceptions=types.SimpleNamespace(
                                 RayActorError=_Err, GetTimeoutError=_Err, ActorUnavailableError=_Err,
                                 ActorDiedError=_Err))


class _NoLock:
    def __exit__(self, *a):
        pass


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--shards", type=int, default=1)
    args = p.parse_args(argv)
    runtime.require_ray = lambda: _RAY  # the coordinator's calls go to the objects themselves
    g = generate(args.records, n_queries=args.queries, seed=0)
    qs, nt = list(g.queries), g.n_tenants
    wh = [{"tenant": f"tenant{int(a) % nt}"} for a in g.query_agents]
    one = Memory(partition_days=7)
    cfg = one.config()
    root = Path(tempfile.mkdtemp(prefix="gpuir-inproc-")) / "sm"
    root.mkdir()
    sm = ShardedMemory(root, {"route": "tenant", "shards": args.shards, "memory": cfg, "options": {}}, _NoLock(),
                       False, 60.0, 60.0)
    sm._attach([_Actor(ShardServer(root / f"shard-{i}", i, create=memory_kwargs(cfg), checkpoint_every=10**9))
                for i in range(args.shards)])
    for chunk in iter_records(args.records, seed=0):
        one.add(chunk)
        sm.add(chunk)
    out = {"records": args.records, "queries": len(qs), "shards": args.shards, "loadavg": os.getloadavg()}
    for m in (one, sm):
        m.search(qs[:8], k=10, where=wh[:8], backend="numba")
    for name, m in (("memory_p50_ms", one), ("sharded_p50_ms", sm), ("memory_p50_ms_again", one),
                    ("sharded_p50_ms_again", sm)):
        lat = []
        for q, w in zip(qs, wh):
            t0 = time.perf_counter()
            m.search(q, k=10, where=w, backend="numba")
            lat.append((time.perf_counter() - t0) * 1e3)
        out[name] = round(float(np.percentile(lat, 50)), 3)
    r = sm.search(qs[0], k=10, where=wh[0], backend="numba")
    out["sharded_timings_ms"] = {k: round(v * 1e3, 3) for k, v in r.meta["timings"].items()}
    print(json.dumps(out))
    sm.close()


if __name__ == "__main__":
    main()
