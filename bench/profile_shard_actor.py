#!/usr/bin/env python
"""The shard's own search measured inside its Ray actor (issue 38): is the same work slower in the shard's
process than in the driver?

One ``Memory`` (in this process) beside a 1-shard ``ShardedMemory`` on the same records (the synthetic
agent corpus, ``route="tenant"``, each question confined to its tenant), interleaved question by question
(p50 ms over ``--one`` questions, k=10):

* ``memory``: ``Memory.search`` here (the baseline);
* ``actor_search``: :meth:`ShardServer.search` with the coordinator's request (its versioned statistics,
  ``final``), timed *inside* the actor (``__ray_call__``: the clock starts and stops in the shard's process);
* ``actor_memory``: the shard's memory's plain ``Memory.search``, timed inside the actor;
* ``sharded``: ``ShardedMemory.search`` end to end (direct channel); ``shard_call``: its shard call;
* ``*_cpu``: the CPU time of the thread that searched (``time.thread_time``): the work, without the waits
  for a core shared with other processes.

Also the actor's process as it runs: CPU affinity, threads, ``OMP_NUM_THREADS``/``NUMBA_NUM_THREADS``,
numba's threading layer, GC counts and switch interval, segments.

Usage::

    python bench/profile_shard_actor.py --records 200000 --one 300
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import _shard_diag as sd  # (first: the environment and sys.path, before Ray, NumPy and gpuir are imported)
import numpy as np

from gpuir.memory.termstats import TermStats


def _proc_info(server=None):
    import gc
    import threading

    out = {"pid": os.getpid(), "nice": _nices(), "affinity": sorted(os.sched_getaffinity(0)), "threads": threading.active_count(),
           "os_threads": len(os.listdir("/proc/self/task")), "gc_count": gc.get_count(),
           "gc_threshold": gc.get_threshold(), "gc_enabled": gc.isenabled(),
           "switch_interval": sys.getswitchinterval(),
           "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS",
                                                 "OPENBLAS_NUM_THREADS", "GPUIR_TIERED_START", "PYTHONPATH")}}
    try:
        import numba

        out["numba_threads"] = numba.get_num_threads()
        out["numba_cache_dir"] = numba.config.CACHE_DIR
    except Exception as e:  # noqa: BLE001
        out["numba"] = repr(e)
    try:
        from gpuir.memory import warmup

        out["tiered"] = warmup.tiered("auto")
    except Exception as e:  # noqa: BLE001
        out["tiered"] = repr(e)
    if server is not None:
        out["segments"] = len(server.memory.snapshot().views)
        out["backend"] = server.backend
    return out


def _actor_info(server):
    return _proc_info(server)


def _nices():
    """The niceness of each thread of this process (Linux keeps it per thread)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            out.append(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except OSError:
            pass
    return sorted(set(out))


def _set_nice_call(server, n):
    return _set_nice(n)


def _set_nice(n):
    """Every thread of the actor's process at niceness ``n`` (lowering it needs root or CAP_SYS_NICE)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), n)
        except OSError:
            pass
    return _nices()


def _ru():
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return np.array([r.ru_nvcsw, r.ru_nivcsw, r.ru_minflt, r.ru_majflt], np.int64)


def _timed(fn):
    """fn() with its wall time, its thread's CPU time (ms) and its thread's context switches (voluntary: it
    blocked, e.g. on the GIL or a page read; involuntary: it was preempted) and page faults (minor, major)."""
    u0, c0, t0 = _ru(), time.thread_time(), time.perf_counter()
    r = fn()
    t1, c1, u1 = time.perf_counter(), time.thread_time(), _ru()
    return r, (t1 - t0) * 1e3, (c1 - c0) * 1e3, (u1 - u0).tolist()


def _actor_time_search(server, q, w, k, stats):
    r, ms, cpu, ru = _timed(lambda: server.search([q], k, [w], "exhaustive", [None], stats, "auto", "oldest", None,
                                                  None, [True]))
    return ms, cpu, ru, r["seqs"][0]


def _actor_time_memory(server, q, w, k):
    _, ms, cpu, ru = _timed(lambda: server.memory.search(q, k=k, where=w))
    return ms, cpu, ru


def main(argv=None) -> int:
    p = sd.parser(__doc__)
    p.add_argument("--nice", default="",
                   help="niceness of the shard's process, comma-separated (e.g. '15,0': both, interleaved; the "
                        "actor sets it on every one of its threads, lowering needs root); default: as Ray starts it")
    args = sd.parse(p, argv)
    import ray
    from bench_sharded import synthetic

    corpus = synthetic(args.records, args.queries)
    with sd.rig(corpus, args.batch, "gpuir-actor-") as rig:
        mem, sm, load_s = rig.mem, rig.sm, rig.load_s
        actor = sm._actors[0]
        queries, wheres, k = corpus["queries"], corpus["wheres"], args.k
        rig.warm_up(corpus, k, 10)
        version = sm._next_wid

        def stats(q):  # the request's statistics, as the coordinator sends them
            ts = sm.stats([q])
            return TermStats(ts.n_docs, ts.total_len, dict(ts.df), version=version)

        rng = np.random.default_rng(1)
        pick = rng.choice(len(queries), size=args.one, replace=True).tolist()
        nices = [int(x) for x in args.nice.split(",")] if args.nice else [None]
        variants = [("memory", None)] + [(kind, n) for n in nices for kind in ("actor_search", "actor_memory",
                                                                                "sharded")]

        def label(kind, n):
            return kind if n is None else f"{kind}@nice{n}"

        t: dict[str, list] = {}
        ctx: dict[str, list] = {}
        same = True
        now = None
        for j, i in enumerate(pick):
            q, w = queries[i], wheres[i]
            st = stats(q)
            ref = mem.search(q, k=k, where=w)  # (the answer every variant must give)
            r = j % len(variants)
            for kind, n in variants[r:] + variants[:r]:  # each first as often as the others
                lab = label(kind, n)
                if n is not None and n != now:
                    ray.get(actor.__ray_call__.remote(_set_nice_call, n))
                    now = n
                if kind == "memory":
                    _, ms, cpu, ru = _timed(lambda q=q, w=w: mem.search(q, k=k, where=w))
                    t.setdefault(lab, []).append(ms)
                    t.setdefault("memory_cpu", []).append(cpu)
                    ctx.setdefault(lab, []).append(ru)
                elif kind == "actor_search":
                    t0 = time.perf_counter()
                    ms, cpu, ru, seqs = ray.get(actor.__ray_call__.remote(_actor_time_search, q, w, k, st))
                    t.setdefault(label("actor_search_rtt", n), []).append((time.perf_counter() - t0) * 1e3)
                    t.setdefault(lab, []).append(ms)
                    t.setdefault(label("actor_search_cpu", n), []).append(cpu)
                    ctx.setdefault(lab, []).append(ru)
                    same &= bool(np.array_equal(ref.seqs[0], seqs[:ref.seqs.shape[1]]))
                elif kind == "actor_memory":
                    ms, cpu, ru = ray.get(actor.__ray_call__.remote(_actor_time_memory, q, w, k))
                    t.setdefault(lab, []).append(ms)
                    t.setdefault(label("actor_memory_cpu", n), []).append(cpu)
                    ctx.setdefault(lab, []).append(ru)
                else:
                    t0 = time.perf_counter()
                    b = sm.search(q, k=k, where=w)
                    t.setdefault(lab, []).append((time.perf_counter() - t0) * 1e3)
                    t.setdefault(label("shard_call", n), []).append(b.meta["timings"]["shards_s"] * 1e3)
                    same &= bool(np.array_equal(ref.seqs, b.seqs) and np.array_equal(ref.scores, b.scores))
        res = {"benchmark": "profile_shard_actor", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "label": args.label, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
               "records": args.records, "questions": len(pick), "k": k, "load_s": round(load_s, 1),
               "identical_to_memory": same, "loadavg": os.getloadavg(),
               "driver": _proc_info(), "actor": ray.get(actor.__ray_call__.remote(_actor_info)),
               "p50_ms": {n: sd.pct(v) for n, v in t.items()}, "p90_ms": {n: sd.pct(v, 90) for n, v in t.items()},
               "per_search_mean_voluntary_involuntary_switches_minor_major_faults": {
                   n: np.round(np.mean(np.asarray(v), axis=0), 3).tolist() for n, v in ctx.items()}}
        res["minus_memory_p50_ms"] = {lab: round(v - res["p50_ms"]["memory"], 3) for lab, v in res["p50_ms"].items()
                                      if lab.startswith(("actor_search@", "sharded", "actor_search", "actor_memory"))
                                      and "cpu" not in lab and "rtt" not in lab and lab != "memory"}
        sd.emit(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
