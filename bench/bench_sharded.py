#!/usr/bin/env python
"""Sharded-memory benchmark: one ``Memory`` beside ``ShardedMemory`` with 1 and 2 shards, in one run.

Corpora
-------
* ``longmemeval``: every turn of every question's haystack in LongMemEval-S, de-duplicated by text (as
  ``bench_cpu.py``), one shared corpus without tenants: ``route="id"``, queries (the 499 questions) without
  ``where``, so every shard holding a query term is asked.
* ``synthetic``: :func:`gpuir.synthetic.iter_records` (``--records``, default 1M), the agent case:
  ``route="tenant"``, each query confined to its agent's tenant (``where={"tenant": ...}``), so one shard is asked.

Measured for each configuration (the same records in the same order, the same queries):
adds/s (``add`` calls of ``--batch`` records; a sharded add returns once every owning shard has logged
it with ``fsync`` and applied it -- the single Memory writes nothing to disk), one-question latency
p50/p99 (``--one`` queries one at a time, k=10), batch queries/s (all queries in calls of
``--batch-queries``), resident memory of each process, the statistics exchange (bytes per write and per
query batch), the bytes per question per asked shard on the wire (``wire_bytes``: request, query-phase
answer, fetch), and whether every batch result equals the single Memory's (ids and float32 scores).
Ray's own cost: the round trip of an empty actor call, and the 1-shard minus single p50.

Usage::

    python bench/bench_sharded.py                                  # both corpora, 1M synthetic (~25 min on 2 cores)
    python bench/bench_sharded.py --corpora synthetic --records 5000000
    python bench/bench_sharded.py --quick                          # a smoke run

Writes ``bench/results/bench_sharded_<host>.json`` (``--out``). Runs on a local Ray runtime on loopback.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: loopback only

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuir import Memory, __version__
from gpuir.cluster import ShardedMemory, runtime

# Steady-state timings: the compiled engine from the first search, as in a long-running process (a fresh
# process's tiered start, gpuir.memory.warmup, is timed by bench_memory.py's open probe).
os.environ.setdefault("GPUIR_TIERED_START", "0")


def machine() -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import subprocess

    import ray

    try:  # the code measured
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=False).stdout.strip() or None
    except OSError:
        commit = None
    return {"host": socket.gethostname(), "commit": commit, "cpu_model": cpu, "logical_cores": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "ray": ray.__version__,
            "gpuir": __version__, "loadavg_start": os.getloadavg()}


def pct(xs, q):
    return round(float(np.percentile(np.asarray(xs), q)), 3) if len(xs) else None


def rss_mb(pid: int | None = None) -> float:
    import psutil

    return round((psutil.Process(pid) if pid else psutil.Process()).memory_info().rss / 2**20, 1)


# --------------------------------------------------------------------------- corpora


def longmemeval(max_docs: int | None, max_queries: int | None):
    from gpuir.datapath import longmemeval_path

    path = longmemeval_path("s")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    seen: dict[str, None] = {}
    for e in data:
        for session in e["haystack_sessions"]:
            for turn in session:
                seen.setdefault(turn["content"], None)
    texts = list(seen)[:max_docs] if max_docs else list(seen)
    queries = [e["question"] for e in data][:max_queries] if max_queries else [e["question"] for e in data]
    del data, seen
    recs = [{"id": f"t{i:07d}", "text": t} for i, t in enumerate(texts)]

    def batches(size):
        for i in range(0, len(recs), size):
            yield recs[i:i + size]

    return {"name": "longmemeval", "route": "id", "n_records": len(recs), "batches": batches, "queries": queries,
            "wheres": None, "info": {"source": str(path), "unit": "turn, de-duplicated by text"}}


def synthetic(n: int, n_queries: int, seed: int = 0):
    from gpuir.synthetic import generate, iter_records

    g = generate(n, n_queries=n_queries, seed=seed)  # the queries and their agents (texts dropped below)
    nt = g.n_tenants
    wheres = [{"tenant": f"tenant{int(a) % nt}"} for a in g.query_agents]
    queries = list(g.queries)
    del g
    gc.collect()

    def batches(size):
        buf: list[dict] = []
        for chunk in iter_records(n, seed=seed):
            buf.extend(chunk)
            while len(buf) >= size:
                yield buf[:size]
                buf = buf[size:]
        if buf:
            yield buf

    return {"name": "synthetic", "route": "tenant", "n_records": n, "batches": batches, "queries": queries,
            "wheres": wheres, "info": {"generator": "gpuir.synthetic", "tenants": nt, "seed": seed}}


# --------------------------------------------------------------------------- one configuration


def run(corpus: dict, shards: int | None, args, workdir: Path, want=None) -> dict[str, Any]:
    """Load the corpus into one Memory (shards None) or a ShardedMemory, then time the searches."""
    name = "memory" if shards is None else f"sharded-{shards}"
    opts = {"partition_days": args.partition_days}
    if shards is None:
        mem = Memory(**opts)
    else:
        path = workdir / f"{corpus['name']}-{shards}"
        shutil.rmtree(path, ignore_errors=True)
        mem = ShardedMemory.create(path, shards=shards, route=corpus["route"], checkpoint_every=args.checkpoint_every,
                                   **opts)
        mem.fast_path = not args.ray_only
    out: dict[str, Any] = {"config": name, "shards": shards, "loadavg_at_start": [round(x, 1) for x in os.getloadavg()]}
    if shards is not None:  # how the shards' reads travel (gpuir.cluster.fastpath)
        out["transport"] = "ray actor calls" if args.ray_only else "direct channel (Unix socket), Ray for the rest"
    try:
        t_add = 0.0
        n = 0
        calls = []
        for b in corpus["batches"](args.batch):
            t0 = time.perf_counter()
            mem.add(b)
            dt = time.perf_counter() - t0
            t_add += dt
            calls.append(dt)
            n += len(b)
            if args.progress and len(calls) % 10 == 0:
                print(f"  {name}: {n:,} records, {n / t_add:,.0f} adds/s", file=sys.stderr, flush=True)
        out.update(records=n, add_s=round(t_add, 2), adds_per_s=round(n / t_add, 1),
                   add_call_p50_ms=pct([c * 1e3 for c in calls], 50), add_call_max_ms=round(max(calls) * 1e3, 1),
                   add_call_p99_ms=pct([c * 1e3 for c in calls], 99),
                   # the writer pauses (issue 38's 0.25 s bound): how many add calls took longer, the 5 longest
                   # with the records held before each (where in the growth they came)
                   add_calls=len(calls), add_calls_over_250ms=sum(c > 0.25 for c in calls),
                   add_calls_longest=[{"ms": round(calls[i] * 1e3, 1), "records_before": i * args.batch}
                                      for i in sorted(range(len(calls)), key=lambda i: -calls[i])[:5]])
        if shards is not None:
            t0 = time.perf_counter()
            mem.save()
            out["final_checkpoint_s"] = round(time.perf_counter() - t0, 2)
        queries, wheres = corpus["queries"], corpus["wheres"]
        k = args.k
        mem.search(queries[:8], k=k, where=None if wheres is None else wheres[:8])  # warm-up (numba cache)
        rng = np.random.default_rng(1)
        pick = rng.choice(len(queries), size=min(args.one, len(queries)), replace=False)
        lat = []
        for i in pick.tolist():
            t0 = time.perf_counter()
            mem.search(queries[i], k=k, where=None if wheres is None else wheres[i])
            lat.append((time.perf_counter() - t0) * 1e3)
        out.update(one_queries=len(lat), one_p50_ms=pct(lat, 50), one_p99_ms=pct(lat, 99),
                   one_mean_ms=round(float(np.mean(lat)), 3))
        B = args.batch_queries
        seqs, scores = [], []
        t0 = time.perf_counter()
        for i in range(0, len(queries), B):
            r = mem.search(queries[i:i + B], k=k, where=None if wheres is None else wheres[i:i + B])
            seqs.append(r.seqs)
            scores.append(r.scores)
        dt = time.perf_counter() - t0
        seqs, scores = np.concatenate(seqs), np.concatenate(scores)
        out.update(batch_queries=len(queries), batch_size=B, batch_s=round(dt, 3), batch_qps=round(len(queries) / dt, 1))
        if want is not None:
            out["identical_to_memory"] = bool(np.array_equal(seqs, want[0]) and np.array_equal(scores, want[1]))
        out["rss_mb_driver"] = rss_mb()
        if shards is not None:
            info = mem.info()
            out["rss_mb_shards"] = [rss_mb(s["pid"]) for s in info["shard_list"]]
            out["records_per_shard"] = [s["records"] for s in info["shard_list"]]
            out["segments_per_shard"] = [s["segments"] for s in info["shard_list"]]
            ex = info["coordinator"]["exchange"]
            out["coordinator"] = {"vocabulary": info["coordinator"]["vocabulary"],
                                  "stats_bytes": info["coordinator"]["stats_bytes"],
                                  "id_map": info["coordinator"]["id_map"]}
            out["exchange"] = {
                "writes": ex["writes"], "delta_bytes_per_write": round(ex["write_delta_bytes"] / max(1, ex["writes"])),
                "delta_bytes_per_record": round(ex["write_delta_bytes"] / max(1, n), 1),
                "search_calls": ex["search_calls"],
                "stats_bytes_per_shard_call": round(ex["search_stats_bytes"] / max(1, ex["search_calls"]))}
            # Ray's own cost: an empty actor call's round trip, and the coordinator's per-batch work
            import ray

            a = mem._actors[0]
            ray.get(a.ping.remote())
            rtt = []
            for _ in range(200):
                t0 = time.perf_counter()
                ray.get(a.ping.remote())
                rtt.append((time.perf_counter() - t0) * 1e3)
            out["ray_ping_p50_ms"], out["ray_ping_p99_ms"] = pct(rtt, 50), pct(rtt, 99)
            r = mem.search(queries[0], k=k, where=None if wheres is None else wheres[0])
            out["one_query_timings_ms"] = {key: round(v * 1e3, 3) for key, v in r.meta["timings"].items()}
            out["one_query_shards_asked"] = len(r.meta["shards_asked"][0])
            out["one_query_fetch_calls"] = r.meta.get("fetch_calls")  # query-then-fetch: 0 when one shard is asked
            out["wire_bytes"] = wire_bytes(mem, queries, wheres, k)
        return out if want is not None else (out, (seqs, scores))
    finally:
        if shards is not None:
            mem.close()
        del mem
        gc.collect()


def wire_bytes(mem, queries, wheres, k: int, n: int = 50) -> dict[str, Any]:
    """Bytes per question per asked shard, pickled as the shard calls send them (both transports pickle):
    the request (queries, where, the statistics of their terms), the query-phase answer and the fetch.

    ``n`` questions one at a time, as given (a tenant's ``where``: one shard asked, its records in the
    answer) and without ``where`` (every shard holding a term asked: arrays only, then a fetch of the final
    k). The coordinator's reads are wrapped for the probe only (``ShardedMemory._read``).
    """
    import pickle

    sizes: dict[str, list[int]] = {}
    orig = mem._read

    def spy(method, args_of, what=None):
        got = orig(method, args_of, what)
        for s_, a in args_of.items():
            sizes.setdefault(f"{method}_request", []).append(len(pickle.dumps((method, a), protocol=5)))
            sizes.setdefault(f"{method}_answer", []).append(len(pickle.dumps((True, got[s_]), protocol=5)))
        return got

    out: dict[str, Any] = {"questions": n, "k": k}
    mem._read = spy
    try:
        for label, ws in (("as_given", wheres), ("no_where", None)):
            sizes.clear()
            for i in range(min(n, len(queries))):
                mem.search(queries[i], k=k, where=None if ws is None else ws[i])
            out[label] = {key: {"calls": len(v), "mean_bytes": round(float(np.mean(v)), 1)}
                          for key, v in sorted(sizes.items())}
    finally:
        del mem._read  # the instance attribute: the class's method again
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpora", default="longmemeval,synthetic")
    p.add_argument("--records", type=int, default=1_000_000, help="synthetic records (default: %(default)s)")
    p.add_argument("--queries", type=int, default=500, help="synthetic queries (default: %(default)s)")
    p.add_argument("--lme-max-docs", type=int, default=None)
    p.add_argument("--lme-max-queries", type=int, default=None)
    p.add_argument("--shards", default="1,2")
    p.add_argument("--batch", type=int, default=10_000, help="records per add call (default: %(default)s)")
    p.add_argument("--batch-queries", type=int, default=100, help="queries per search call (default: %(default)s)")
    p.add_argument("--one", type=int, default=200, help="queries timed one at a time (default: %(default)s)")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--partition-days", type=float, default=7.0)
    p.add_argument("--checkpoint-every", type=int, default=10_000)
    p.add_argument("--workdir", default=None, help="where the sharded memories are written (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 20k synthetic records, 5k turns")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--ray-only", action="store_true",
                   help="every shard call over Ray (no direct channel for reads: gpuir.cluster.fastpath)")
    p.add_argument("--label", default="", help="a note saved with the results (e.g. \"under load\")")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.lme_max_docs, args.lme_max_queries, args.one, args.queries = 20_000, 5_000, 100, 30, 100
    runtime.connect(None)  # the local runtime, sized to the machine, loopback only
    res: dict[str, Any] = {"benchmark": "bench_sharded", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "machine": machine(), "command": " ".join(["bench_sharded.py", *(argv or sys.argv[1:])]),
        "config": {k: v for k, v in vars(args).items() if k != "progress"}, "corpora": []}
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"bench_sharded_{socket.gethostname()}.json"
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_sharded_"))
    t_all = time.perf_counter()
    try:
        for cname in [c.strip() for c in args.corpora.split(",") if c.strip()]:
            t0 = time.perf_counter()
            corpus = (longmemeval(args.lme_max_docs, args.lme_max_queries) if cname == "longmemeval"
                      else synthetic(args.records, args.queries))
            entry = {"corpus": cname, "route": corpus["route"], "records": corpus["n_records"],
                     "queries": len(corpus["queries"]), "load_s": round(time.perf_counter() - t0, 1),
                     **corpus["info"], "runs": []}
            print(f"{cname}: {corpus['n_records']:,} records, {len(corpus['queries'])} queries", file=sys.stderr)
            base, want = run(corpus, None, args, work)
            entry["runs"].append(base)
            print(f"  memory: {json.dumps(base)}", file=sys.stderr, flush=True)
            for s in [int(x) for x in args.shards.split(",")]:
                r = run(corpus, s, args, work, want)
                entry["runs"].append(r)
                print(f"  sharded-{s}: {json.dumps(r)}", file=sys.stderr, flush=True)
            one = {r["config"]: r for r in entry["runs"]}
            if "sharded-1" in one:
                entry["ray_overhead_one_query_ms"] = round(one["sharded-1"]["one_p50_ms"] - base["one_p50_ms"], 3)
            res["corpora"].append(entry)
            del corpus, want
            gc.collect()
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(res, indent=1) + "\n")  # after each corpus: nothing lost if stopped later
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_s"] = round(time.perf_counter() - t_all, 1)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(r.get("identical_to_memory", True) for c in res["corpora"] for r in c["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
