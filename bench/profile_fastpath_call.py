#!/usr/bin/env python
"""Where a one-question shard call over the direct channel spends its time (issue 38), stage by stage, with
clocks read in both processes (``time.perf_counter`` is ``CLOCK_MONOTONIC``: one clock for every process on
the machine).

One ``Memory`` and a 1-shard ``ShardedMemory`` on the same records (the synthetic agent corpus, a tenant's
``where``), interleaved question by question. The channel's framing functions are wrapped (in the driver,
and in the shard's actor through ``__ray_call__``) to stamp each call:

* ``request_pickle_send``: the coordinator pickles the request and writes it;
* ``shard_wakeup``: from the write to the shard's thread holding the request's bytes (the shard's thread
  woken and given the core, and the GIL);
* ``shard_unpickle``, ``shard_work`` (``ShardServer.search``), ``reply_pickle``;
* ``reply_send_driver_wakeup``: from the shard starting its write to the coordinator holding the answer's
  bytes (the coordinator woken and given the core);
* ``reply_unpickle``; ``coordinator``: the rest of ``ShardedMemory.search`` (planning, merge, records);
* ``memory``: ``Memory.search`` of the same question (the baseline); ``sharded``: end to end.

Usage::

    python bench/profile_fastpath_call.py --records 200000 --one 300
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import _shard_diag as sd  # (first: the environment and sys.path, before Ray, NumPy and gpuir are imported)
import numpy as np


def _install(server=None):
    """Wrap this process's channel framing (and the shard's handler, in the actor) to stamp each call."""
    from gpuir.cluster import fastpath as fp

    if getattr(fp, "_stamped", False):
        return True
    recv, send = fp._recv, fp._send
    stamps = fp._stamps = []  # (on the module: one list per process, whichever copy of these functions runs)

    def _recv_stamped(sock, most=None):
        out = recv(sock, most)
        stamps.append(("recv", time.perf_counter()))
        return out

    def _send_stamped(sock, payload):
        stamps.append(("send0", time.perf_counter()))
        send(sock, payload)
        stamps.append(("send1", time.perf_counter()))

    fp._recv, fp._send = _recv_stamped, _send_stamped
    if server is not None:
        fast = server._fast
        handler = fast._handler

        def handler_stamped(name, args):
            stamps.append(("work0", time.perf_counter()))
            try:
                return handler(name, args)
            finally:
                stamps.append(("work1", time.perf_counter()))

        fast._handler = handler_stamped
    fp._stamped = True
    return True


def _take(server=None):
    from gpuir.cluster import fastpath as fp

    out = list(fp._stamps)
    fp._stamps.clear()
    return out


def main(argv=None) -> int:
    args = sd.parse(sd.parser(__doc__), argv)
    import ray
    from bench_sharded import synthetic

    corpus = synthetic(args.records, args.queries)
    with sd.rig(corpus, args.batch, "gpuir-fpcall-") as rig:
        mem, sm = rig.mem, rig.sm
        queries, wheres, k = corpus["queries"], corpus["wheres"], args.k
        rig.warm_up(corpus, k, 10)  # (and the channel opened)
        actor = sm._actors[0]
        ray.get(actor.__ray_call__.remote(_install))
        _install()
        ray.get(actor.__ray_call__.remote(_take))
        _take()
        rng = np.random.default_rng(1)
        pick = rng.choice(len(queries), size=args.one, replace=True).tolist()
        t: dict[str, list[float]] = {}
        same = True
        for j, i in enumerate(pick):
            q, w = queries[i], wheres[i]
            for kind in (("memory", "sharded") if j % 2 == 0 else ("sharded", "memory")):
                if kind == "memory":
                    t0 = time.perf_counter()
                    a = mem.search(q, k=k, where=w)
                    t.setdefault("memory", []).append((time.perf_counter() - t0) * 1e3)
                    continue
                _take()
                t0 = time.perf_counter()
                b = sm.search(q, k=k, where=w)
                t3 = time.perf_counter()
                d = _take()
                s = ray.get(actor.__ray_call__.remote(_take))
                dd = {name: x for name, x in d}  # driver: send0, send1, recv (one call)
                # shard: recv, work0, work1, send0, then send1 -- which may land after this read (the shard's
                # thread preempted by the woken coordinator as its write completes): read up to send0
                names = [name for name, _ in s]
                if len(d) != 3 or "recv" not in names:
                    continue
                at = len(names) - 1 - names[::-1].index("recv")
                ss = {name: x for name, x in s[at:]}
                if not {"work0", "work1", "send0"} <= set(ss):
                    continue
                parts = {
                    "request_pickle_send": dd["send1"] - dd["send0"],
                    "shard_wakeup": ss["recv"] - dd["send1"],
                    "shard_unpickle": ss["work0"] - ss["recv"],
                    "shard_work": ss["work1"] - ss["work0"],
                    "reply_pickle": ss["send0"] - ss["work1"],
                    "reply_send_driver_wakeup": dd["recv"] - ss["send0"],
                    "coordinator": (t3 - t0) - (dd["recv"] - dd["send0"]),
                    "sharded": t3 - t0,
                }
                for name, x in parts.items():
                    t.setdefault(name, []).append(x * 1e3)
            same &= bool(np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores))
        res = {"benchmark": "profile_fastpath_call", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "label": args.label, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "records": args.records, "questions": len(pick), "k": k, "identical_to_memory": same,
               "loadavg": os.getloadavg(), "calls_decomposed": len(t.get("sharded", [])),
               "p50_ms": {n: sd.pct(v) for n, v in t.items()}, "mean_ms": {n: round(float(np.mean(v)), 3)
                                                                       for n, v in t.items()}}
        res["sharded_minus_memory_p50_ms"] = round(res["p50_ms"]["sharded"] - res["p50_ms"]["memory"], 3)
        sd.emit(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
