#!/usr/bin/env python
"""Memory benchmark: grow an agent memory while a reader searches it, then compare the
time-partition scan modes; and (``--corpus longmemeval``) grow it from real turns on one core
against the static index built over the same texts.

Workload ``synthetic`` (default): :func:`gpuir.synthetic.generate` (records in time order,
queries 80/20 recency-biased, gold known).

1. **Growth.** The main thread adds the records in batches of ``--batch``
   (1,000) to an empty :class:`gpuir.Memory` (7-day partitions), while a reader
   thread searches without pause (one random query at a time, top-10,
   ``--reader-mode``, exact). Recorded: adds/s per size bucket, the latency of
   each ``add`` call (merges included: the longest ones are the merge pauses),
   every merge (records, seconds), search latency p50/p99 per size bucket,
   resident memory.
2. **Checkpoints** (``--checkpoints``): growth and reader pause; the memory's
   results for ``--check-queries`` queries (exhaustive and newest-first modes)
   are compared with a fresh :class:`gpuir.BM25Index` built over the same
   records: ids and float32 scores must be identical.
3. **Modes** (at ``--compare-at`` sizes, growth paused): every query, one at a
   time, in the ``exhaustive``, ``newest`` (exact) and ``budgeted`` modes
   (``--budgets`` K partitions, and K(eps) with the decay fitted on the other half of the
   queries' answer ages, 2-fold): queries/s, p50/p99 latency, postings read,
   partitions scanned; whether newest-first results are identical to
   exhaustive ones; the budgeted modes' recall@10 against exhaustive search and
   everyone's recall_any@10 against the generator's gold.

4. **Open** (``--open-probe``, on by default): the grown memory is saved (after its background
   merges finish) and opened in a fresh process: ``Memory.open`` time, the first search, and the
   resident memory after open (current and peak, and above the process's baseline after imports).

The harness freezes its own data (``gc.freeze()`` after generating or loading the texts), so the
garbage collector's full passes -- whose cost grows with every reference a Python container holds --
time only what the memory holds. The LongMemEval comparison also freezes every engine once all are
built, before the timed searches: one engine's garbage then never makes a full pass walk another's.

Workload ``longmemeval`` (``--corpus longmemeval``; the data from ``GPUIR_DATA``, see
``gpuir.datapath``): every haystack turn of LongMemEval-S, de-duplicated by text (189,256),
with ids ``t<i>``, no time (one partition), added to an empty :class:`gpuir.Memory` in batches
of ``--batch`` (1,000), and, in the same process, :meth:`gpuir.BM25Index.build` over the same
texts (same analyzer and BM25 parameters), ``--reps`` times each, alternating: growth records/s
against the build's (wall clock and CPU time of the process, merges included: the growth ends
when the background merges are done), every ``add`` call's duration (the longest is the writer's
longest pause); then the 499 questions, top-10, through both (one at a time: p50/p99; as one
batch: queries/s; bm25s-numba beside them when installed), whether their top-10 (ids and float32
scores) are identical for every question; and the open probe (step 4). ``--one-core`` pins the
process (and the probe) to the first CPU it may run on (CPU 0 unless started under ``taskset``) and
every thread pool to one thread (set before NumPy loads).

Usage::

    python bench/bench_memory.py --corpus longmemeval --one-core   # LongMemEval-S turns, one core (minutes)
    python bench/bench_memory.py                                   # 1M records (about 10-15 min on 2 cores)
    python bench/bench_memory.py --records 5000000 --checkpoints 10000,100000,1000000,5000000 \\
        --compare-at 1000000,5000000                                # the full issue-9 run (elsewhere)
    python bench/bench_memory.py --quick                           # a smoke run, seconds

Writes ``bench/results/bench_memory_<host>.json`` (``--out``) and renders the
``bench_memory`` section of ``docs/benchmarks.md`` and ``docs/img/bench_memory.png``
(``--no-docs`` to skip).
"""

from __future__ import annotations

import os
import sys

if "--one-core" in sys.argv:  # every thread pool at one thread: must happen before NumPy / numba load
    for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[_v] = "1"

import argparse
import datetime as _dt
import gc
import json
import platform
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import itertools

from gpuir import BM25Index, Memory, __version__
from gpuir.memory import budget_partitions, fit_decay, warmup
from gpuir.memory.store import warm_compiled_engine
from gpuir.synthetic import generate

# Steady-state timings: the compiled engine from the first search, as in a long-running process (a fresh
# process's tiered start, gpuir.memory.warmup, is timed by bench_memory.py's open probe).
os.environ.setdefault("GPUIR_TIERED_START", "0")


def marks(section: str) -> tuple[str, str]:
    """The markers around this run's section of docs/benchmarks.md."""
    name = "bench_memory" if section == "main" else f"bench_memory_{section}"
    return (f"<!-- BEGIN {name} (generated by bench/bench_memory.py; do not edit by hand) -->",
            f"<!-- END {name} -->")
WEEK_MS = 7 * 86_400_000


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


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
    return {"host": socket.gethostname(), "cpu_model": cpu, "logical_cores": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "gpuir": __version__,
            "loadavg_start": os.getloadavg(),
            "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "thread_env": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS",
                                                          "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
            "note": "a shared 2-core VM: other jobs ran at the same time (see the load averages); timings are "
                    "noisy, CPU times less so"}


# --------------------------------------------------------------------------- open probe


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (VmHWM; ru_maxrss can carry the parent's from before exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def probe_open(path: str, query: str, warm_imports: bool = False) -> dict[str, Any]:
    """In this (fresh) process: Memory.open, then the first search with its hits; times and memory.

    ``warm_imports``: first do the search engine's once-per-process work -- resolve the backend (imports:
    numba, the CUDA probe) and search a tiny in-memory ``Memory`` (the compiled kernels loaded from numba's
    cache) -- as a long-running process has already done, so that only this memory's work is timed: the
    open, then the first search (which lays out each segment's scorer, once per segment and process).
    """
    import psutil

    from gpuir.backends import resolve_backend

    resolve_s = None
    if warm_imports:
        t = time.perf_counter()
        resolve_backend("auto")
        tiny = Memory(partition_days=None)
        tiny.add([{"id": "a", "text": "warm up the engine"}, {"id": "b", "text": "the kernels load once"}])
        tiny.search(["warm kernels", "engine"], k=2).hits(0)
        tiny.close()
        warmup.wait(warm_compiled_engine)  # (an "auto" search of a fresh process only starts it)
        resolve_s = time.perf_counter() - t
    proc = psutil.Process()
    base = proc.memory_info().rss
    t0, c0 = time.perf_counter(), time.process_time()
    m = Memory.open(path, writer=False)
    t1, c1 = time.perf_counter(), time.process_time()
    rss_open = proc.memory_info().rss
    peak_open = _peak_rss_bytes()
    res = m.search(query, k=10)
    hits = res.hits(0)
    t2, c2 = time.perf_counter(), time.process_time()
    rss_search = proc.memory_info().rss
    # a cold process answers its first "auto" searches on the NumPy reference while the compiled engine
    # starts (gpuir.memory.warmup): when is it ready, and what does the next search cost then
    warmup.wait(warm_compiled_engine)
    t3 = time.perf_counter()
    nxt = m.search(query, k=10)
    t4 = time.perf_counter()
    snap = m.snapshot()
    loaded = sum(1 for v in snap.views if "csr" in v.seg.loaded)
    return {"warm_imports": warm_imports, "resolve_backend_s": resolve_s,
            "open_s": t1 - t0, "first_search_s": t2 - t1, "open_and_first_search_s": t2 - t0,
            "open_cpu_s": c1 - c0, "first_search_cpu_s": c2 - c1, "open_and_first_search_cpu_s": c2 - c0,
            "compiled_engine_ready_s": t3 - t0, "next_search_s": t4 - t3, "next_search_backend": nxt.meta["backend"],
            "first_search_backend_reason": res.meta.get("backend_reason"),
            "hits": len(hits), "records": len(m), "segments": len(snap.views),
            "segments_whose_postings_were_read": loaded,
            "rss_baseline_mb": base / 2**20, "rss_after_open_mb": rss_open / 2**20,
            "rss_after_open_above_baseline_mb": (rss_open - base) / 2**20,
            "peak_rss_through_open_mb": peak_open / 2**20, "rss_after_first_search_mb": rss_search / 2**20,
            "backend": res.meta.get("backend")}


def run_probe(path: Path, query: str, repeats: int, log) -> dict[str, Any]:
    """:func:`probe_open` in fresh processes, ``repeats`` times each with and without the backend's one-time
    imports done first (the page cache is warm: the files were just written)."""
    files = [p for p in path.iterdir() if p.is_file()]
    out: dict[str, Any] = {"directory_bytes": sum(p.stat().st_size for p in files),
                           "page_cache": "warm (the files were just written; not dropped)"}
    for warm in (False, True):
        runs = []
        for _ in range(repeats):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--probe-open", str(path), "--probe-query", query]
            env = {**os.environ, "GPUIR_TIERED_START": "1"}  # (a fresh process as users start one)
            if warm:
                cmd.append("--probe-warm-imports")
            if "--one-core" in sys.argv:
                cmd.append("--one-core")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"open probe failed: {proc.stderr[-2000:]}")
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        d: dict[str, Any] = {"repeats": runs}
        for key in ("open_s", "first_search_s", "open_and_first_search_s", "open_cpu_s", "first_search_cpu_s",
                    "open_and_first_search_cpu_s", "compiled_engine_ready_s", "next_search_s", "rss_after_open_mb",
                    "rss_after_open_above_baseline_mb", "peak_rss_through_open_mb", "rss_after_first_search_mb"):
            d[key + "_median"] = float(np.median([r[key] for r in runs]))
        if warm:
            d["resolve_backend_s_median"] = float(np.median([r["resolve_backend_s"] for r in runs]))
        out["warm_imports" if warm else "cold_imports"] = d
        log(f"  open probe ({repeats} fresh processes, the engine's once-per-process work "
            f"{'done first' if warm else 'included'}): "
            f"open {d['open_s_median']:.3f} s, + first search {d['open_and_first_search_s_median']:.3f} s; RSS after "
            f"open {d['rss_after_open_mb_median']:.0f} MB ({d['rss_after_open_above_baseline_mb_median']:.0f} MB above "
            f"the baseline), peak {d['peak_rss_through_open_mb_median']:.0f} MB; directory "
            f"{out['directory_bytes'] / 2**20:.0f} MB")
    return out


def save_for_probe(mem: Memory, log) -> Path:
    t0 = time.perf_counter()
    mem.wait_merges()
    t1 = time.perf_counter()
    d = Path(tempfile.mkdtemp(prefix="bench_memory_")) / "mem"
    mem.save(d)
    mem.close()
    log(f"  waited {t1 - t0:.2f} s for the background merges, saved in {time.perf_counter() - t1:.2f} s -> {d}")
    return d


# --------------------------------------------------------------------------- LongMemEval-S, one core


def _lme_corpus():
    sys.path.insert(0, str(REPO / "bench"))
    import bench_cpu  # the one loader of the LongMemEval-S turns (de-duplicated by text)

    return bench_cpu.load_longmemeval()


def _records(texts: list[str]) -> list[dict[str, str]]:
    return [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]


def _grow(recs: list[dict[str, str]], batch: int, merge_factor: int = 8, **kw) -> tuple[Memory, dict[str, Any]]:
    mem = Memory(partition_days=7.0, merge_factor=merge_factor, **kw)
    lat, segs, cpu_lat = [], [], []
    c0, w0 = time.process_time(), time.perf_counter()
    for a in range(0, len(recs), batch):
        t, tc = time.perf_counter(), time.thread_time()
        mem.add(recs[a: a + batch])
        lat.append(time.perf_counter() - t)
        cpu_lat.append(time.thread_time() - tc)
        segs.append(len(mem.snapshot().views))
    w_adds = time.perf_counter() - w0
    mem.wait_merges()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    n = len(recs)
    return mem, {"records": n, "wall_s": wall, "cpu_s": cpu, "adds_wall_s": w_adds,
                 "records_per_s_wall": n / wall, "records_per_s_cpu": n / cpu,
                 "add_call_max_s": max(lat), "add_call_p99_s": pct(lat, 99), "add_call_p50_s": pct(lat, 50),
                 "add_call_writer_cpu_max_s": max(cpu_lat), "add_call_writer_cpu_p50_s": pct(cpu_lat, 50),
                 "slowest_add_call": int(np.argmax(lat)), "slowest_add_call_writer_cpu_s": cpu_lat[int(np.argmax(lat))],
                 "add_calls": len(lat), "segments_max": max(segs), "segments_end": len(mem.snapshot().views),
                 "merges": len(mem.merge_log), "merge_s_total": float(sum(x for _, x in mem.merge_log)),
                 "merge_s_max": float(max((x for _, x in mem.merge_log), default=0.0)),
                 "merge_status": mem.merge_status()}


def _search_times_together(fns: dict[str, Any], queries: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`_search_times` of several engines, interleaved: each question goes through every engine in
    turn (then each engine's batch, in turn), so that on a shared machine every engine meets the same load."""
    lat: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    for q in queries:
        for n, fn in fns.items():
            t, c = time.perf_counter(), time.thread_time()
            fn([q])
            cpu[n].append(time.thread_time() - c)
            lat[n].append(time.perf_counter() - t)
    out = {}
    for n, fn in fns.items():
        t, c = time.perf_counter(), time.process_time()
        fn(queries)
        tb, cb = time.perf_counter() - t, time.process_time() - c
        out[n] = {"one_p50_ms": pct(lat[n], 50) * 1e3, "one_p99_ms": pct(lat[n], 99) * 1e3,
                  "one_cpu_p50_ms": pct(cpu[n], 50) * 1e3, "one_cpu_p99_ms": pct(cpu[n], 99) * 1e3,
                  "batch_qps": len(queries) / tb, "batch_qps_cpu": len(queries) / max(cb, 1e-9),
                  "queries": len(queries), "interleaved_with": [m for m in fns if m != n]}
    return out


def _search_times(fn, queries: list[str], repeats: int = 1) -> dict[str, Any]:
    """Wall-clock and CPU-time latencies of one question at a time, and the batch rate.

    The CPU time (the calling thread's; the process's for the batch) is what the search itself cost:
    on a shared machine a process waiting for a core adds wall time, not CPU time, so the ratios
    between engines measured in the same run are read from it.
    """
    lat, cpu = [], []
    for _ in range(repeats):
        for q in queries:
            t, c = time.perf_counter(), time.thread_time()
            fn([q])
            cpu.append(time.thread_time() - c)
            lat.append(time.perf_counter() - t)
    t, c = time.perf_counter(), time.process_time()
    fn(queries)
    tb, cb = time.perf_counter() - t, time.process_time() - c
    return {"one_p50_ms": pct(lat, 50) * 1e3, "one_p99_ms": pct(lat, 99) * 1e3,
            "one_cpu_p50_ms": pct(cpu, 50) * 1e3, "one_cpu_p99_ms": pct(cpu, 99) * 1e3,
            "batch_qps": len(queries) / tb, "batch_qps_cpu": len(queries) / max(cb, 1e-9), "queries": len(queries)}


def run_lme(args, log=print) -> dict[str, Any]:
    t_start = time.perf_counter()
    res: dict[str, Any] = {
        "benchmark": "bench_memory", "corpus": "longmemeval",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "out": os.path.relpath(args.out, REPO) if args.out.is_absolute() else str(args.out),
        "config": {"batch": args.batch, "reps": args.reps, "k": args.k, "one_core": args.one_core,
                   "merge_factor": args.merge_factor},
    }
    corpus = _lme_corpus()
    texts, questions = corpus.texts, corpus.queries
    recs = _records(texts)
    gc.collect()
    gc.freeze()  # the harness's texts and record dicts out of the collector's full passes (see run())
    res["corpus_info"] = corpus.info
    log(f"LongMemEval-S: {len(texts):,} turns, {len(questions)} questions")
    # untimed warm-up: imports, numba's cached kernels, the analyzer
    BM25Index.build(texts[:2000], progress=False).search(questions[:5], k=10)
    _grow(recs[:3000], args.batch, args.merge_factor)[0].close()
    builds, grows = [], []
    mem = idx = None
    for rep in range(args.reps):
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        idx = BM25Index.build(texts, progress=False)
        b = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
        b["records_per_s_wall"], b["records_per_s_cpu"] = len(texts) / b["wall_s"], len(texts) / b["cpu_s"]
        builds.append(b)
        if mem is not None:
            mem.close()
        mem = None
        gc.collect()
        mem, g = _grow(recs, args.batch, args.merge_factor)
        grows.append(g)
        log(f"  rep {rep}: static build {b['records_per_s_wall']:,.0f} rec/s (CPU {b['records_per_s_cpu']:,.0f}); "
            f"growth {g['records_per_s_wall']:,.0f} rec/s (CPU {g['records_per_s_cpu']:,.0f}), longest add "
            f"{g['add_call_max_s']:.3f} s, {g['merges']} merges, segments at most {g['segments_max']}")
    best_b = max(b["records_per_s_cpu"] for b in builds)
    best_g = max(g["records_per_s_cpu"] for g in grows)
    res["build"], res["growth"] = builds, grows
    res["growth_vs_build"] = {
        "cpu_best_of_reps": best_g / best_b,
        "wall_best_of_reps": max(g["records_per_s_wall"] for g in grows) / max(b["records_per_s_wall"] for b in builds),
        "per_rep_cpu": [g["records_per_s_cpu"] / b["records_per_s_cpu"] for b, g in zip(builds, grows)],
        "per_rep_wall": [g["records_per_s_wall"] / b["records_per_s_wall"] for b, g in zip(builds, grows)],
    }
    res["add_call_max_s"] = max(g["add_call_max_s"] for g in grows)
    log(f"  growth / build: CPU {res['growth_vs_build']['cpu_best_of_reps']:.2f}, wall "
        f"{res['growth_vs_build']['wall_best_of_reps']:.2f} (best of {args.reps}); longest add {res['add_call_max_s']:.3f} s")
    # the questions through both
    assert mem is not None and idx is not None
    got = mem.search(questions, k=args.k)
    want = idx.search(questions, k=args.k)
    same_ids = all(got.ids(i) == [f"t{idx.ids[d]}" for d in want.ids[i] if d >= 0] for i in range(len(questions)))
    res["top10_identical"] = {"questions": len(questions), "ids": bool(same_ids),
                              "scores": bool(np.array_equal(got.scores, want.scores)),
                              "memory_backend": got.meta["backend"], "static_backend": want.meta.get("backend")}
    log(f"  top-{args.k} identical for all {len(questions)} questions: {res['top10_identical']}")
    fns = {"memory": lambda q: mem.search(q, k=args.k), "static": lambda q: idx.search(q, k=args.k)}
    lib = None
    try:
        sys.path.insert(0, str(REPO / "bench"))
        import bench_cpu

        lib = bench_cpu.Bm25sLib("numba")
        lib.build(texts)
        lib.search(questions[:5], args.k)
        fns["bm25s-numba"] = lambda q: lib.search(q, args.k)
    except ImportError as e:
        skipped = f"{type(e).__name__}: {e}"
        lib = None
    # every engine's long-lived structures out of the collector's full passes as well: with all of them in one
    # process, a full pass triggered by one engine's garbage would otherwise also walk the others' (the static
    # index's id and vocabulary lists: 35 ms, measured landing inside the memory's batch in one run of four)
    gc.collect()
    gc.freeze()
    search = _search_times_together(fns, questions)
    if lib is not None:
        search["bm25s-numba"]["note"] = "bm25s's own tokenizer (stopwords en, Snowball English); same k1, b"
        lib.close()
    else:
        search["bm25s-numba"] = {"skipped": skipped}
    search["memory"]["backend"] = got.meta["backend"]
    search["static"]["backend"] = want.meta.get("backend")
    res["search"] = search
    for name, r in search.items():
        if "one_p50_ms" in r:
            log(f"  {name:12s} one question p50 {r['one_p50_ms']:.2f} ms, p99 {r['one_p99_ms']:.2f} ms; "
                f"{r['queries']} as one batch {r['batch_qps']:,.0f} q/s")
    if args.open_probe:
        d = save_for_probe(mem, log)
        try:
            res["open"] = run_probe(d, questions[0], args.probe_repeats, log)
            # the same memory compacted into one segment per partition: what the number of segments costs
            one = Memory.open(d)
            one.merge()
            one.search(questions, k=args.k)  # as the grown memory: every question's weights filled once, untimed
            gc.collect()
            gc.freeze()
            both = _search_times_together({"memory, merged": lambda q: one.search(q, k=args.k),
                                           "static": lambda q: idx.search(q, k=args.k)}, questions)
            search["memory, merged"] = both["memory, merged"]
            search["memory, merged"]["static_same_loop"] = both["static"]  # its ratios' base
            search["memory, merged"]["backend"] = got.meta["backend"]
            search["memory, merged"]["segments"] = len(one.snapshot().views)
            r = search["memory, merged"]
            log(f"  {'merged':12s} one question p50 {r['one_p50_ms']:.2f} ms, p99 {r['one_p99_ms']:.2f} ms; "
                f"{r['queries']} as one batch {r['batch_qps']:,.0f} q/s ({r['segments']} segment(s))")
            one.close(discard_unsaved=True)
        finally:
            shutil.rmtree(d.parent, ignore_errors=True)
    idx = None
    search["memory"]["segments"] = res["growth"][-1]["segments_end"]
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t_start
    return res


def run_agent_loop(args, log=print) -> dict[str, Any]:
    """The agent's loop (issue 34): a memory grown over the LongMemEval-S turns (merges settled), then
    ``--rounds`` times: add one turn, ask one question (top k, one at a time, timed); each engine also
    alone -- the static index over the same turns (before and after the loop, the better of the two is the
    ratios' base), and the frozen memory after the loop (no warm batch) -- never interleaved; and the static
    index asked right after each of the same adds to a second memory grown alike (``static_after_each_add``:
    what an add and its merges leave in the core's caches costs any engine's next question; not the targets'
    base)."""
    t_start = time.perf_counter()
    res: dict[str, Any] = {
        "benchmark": "bench_memory", "corpus": "longmemeval", "mode": "agent_loop",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "config": {"batch": args.batch, "k": args.k, "one_core": args.one_core, "rounds": args.rounds,
                   "loop_docs": args.loop_docs, "merge_factor": args.merge_factor, "think_ms": args.think_ms,
                   "settle": args.settle},
        "note": args.note,
    }
    corpus = _lme_corpus()
    texts, questions = corpus.texts, corpus.queries
    if args.loop_docs:
        texts = texts[:args.loop_docs]
    R = min(args.rounds, len(questions), len(texts) // 2)
    recs = _records(texts)
    grown, held = recs[:-R], recs[-R:]
    gc.collect()
    gc.freeze()
    res["corpus_info"] = {**corpus.info, "turns_used": len(texts), "grown": len(grown), "added_in_loop": R}
    log(f"agent loop: {len(grown):,} turns grown, then {R} rounds of add one turn + ask one question")
    BM25Index.build(texts[:2000], progress=False).search(questions[:5], k=10)  # untimed warm-up
    warm, _ = _grow(recs[:3000], args.batch, args.merge_factor)
    for r in recs[3000:3020]:
        warm.add([r])
        warm.search(questions[0], k=args.k)
    warm.close()
    idx = BM25Index.build(texts, progress=False)
    mem, g = _grow(grown, args.batch, args.merge_factor)
    res["growth"] = g
    gc.collect()
    gc.freeze()
    qs = questions[:R]

    def one_by_one(fn) -> dict[str, Any]:
        lat, cpu = [], []
        for q in qs:
            if args.think_ms:  # the same pause before each question as in the loop: caches as cold as there
                time.sleep(args.think_ms / 1e3)
            t, c = time.perf_counter(), time.thread_time()
            fn(q)
            cpu.append(time.thread_time() - c)
            lat.append(time.perf_counter() - t)
        return {"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
                "cpu_p50_ms": pct(cpu, 50) * 1e3, "cpu_p99_ms": pct(cpu, 99) * 1e3, "queries": len(qs)}

    static_before = one_by_one(lambda q: idx.search(q, k=args.k))
    lat, cpu, add_lat = [], [], []
    for rec, q in zip(held, qs):
        t = time.perf_counter()
        mem.add([rec])
        add_lat.append(time.perf_counter() - t)
        if args.think_ms:  # the agent's own work between its add and its question (an LLM call)
            time.sleep(args.think_ms / 1e3)
        if args.settle:  # (the merges the add started, done before the question: what they cost it)
            mem.wait_merges()
        t, c = time.perf_counter(), time.thread_time()
        mem.search(q, k=args.k)
        cpu.append(time.thread_time() - c)
        lat.append(time.perf_counter() - t)
    loop = {"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "cpu_p50_ms": pct(cpu, 50) * 1e3,
            "cpu_p99_ms": pct(cpu, 99) * 1e3, "queries": len(lat), "add_p50_ms": pct(add_lat, 50) * 1e3,
            "add_p99_ms": pct(add_lat, 99) * 1e3, "add_max_ms": max(add_lat) * 1e3,
            "segments_end": len(mem.snapshot().views), "backend": mem.search(qs[0], k=args.k).meta["backend"]}
    mem.wait_merges()
    frozen = one_by_one(lambda q: mem.search(q, k=args.k))
    static_after = one_by_one(lambda q: idx.search(q, k=args.k))
    # the static index asked right after the same kind of add (to a second memory grown alike: the adds, their
    # merges and what they leave in the caches, without the memory's own search): what the loop costs any engine
    mem2, _ = _grow(grown, args.batch, args.merge_factor)
    s_lat, s_cpu = [], []
    for rec, q in zip(held, qs):
        mem2.add([rec])
        if args.think_ms:
            time.sleep(args.think_ms / 1e3)
        if args.settle:
            mem2.wait_merges()
        t, c = time.perf_counter(), time.thread_time()
        idx.search(q, k=args.k)
        s_cpu.append(time.thread_time() - c)
        s_lat.append(time.perf_counter() - t)
    mem2.close()
    static_after_adds = {"p50_ms": pct(s_lat, 50) * 1e3, "p99_ms": pct(s_lat, 99) * 1e3,
                         "cpu_p50_ms": pct(s_cpu, 50) * 1e3, "cpu_p99_ms": pct(s_cpu, 99) * 1e3, "queries": len(qs)}
    got, want = mem.search(qs, k=args.k), idx.search(qs, k=args.k)
    same = all(got.ids(i) == [f"t{idx.ids[d]}" for d in want.ids[i] if d >= 0] for i in range(len(qs)))
    res["top10_identical"] = {"ids": bool(same), "scores": bool(np.array_equal(got.scores, want.scores))}
    base50 = min(static_before["p50_ms"], static_after["p50_ms"])
    base99 = min(static_before["p99_ms"], static_after["p99_ms"])
    res["search"] = {"loop": loop, "memory_frozen_alone": frozen, "static_alone_before": static_before,
                     "static_alone_after": static_after, "static_after_each_add": static_after_adds}
    res["ratios"] = {"loop_p50_over_static_p50": loop["p50_ms"] / base50,
                     "loop_p99_over_static_p99": loop["p99_ms"] / base99,
                     "frozen_p50_over_static_p50": frozen["p50_ms"] / base50,
                     "frozen_p99_over_static_p99": frozen["p99_ms"] / base99,
                     "cpu_loop_p50_over_static_p50": loop["cpu_p50_ms"] / min(static_before["cpu_p50_ms"],
                                                                              static_after["cpu_p50_ms"]),
                     "cpu_loop_p99_over_static_p99": loop["cpu_p99_ms"] / min(static_before["cpu_p99_ms"],
                                                                              static_after["cpu_p99_ms"]),
                     "cpu_loop_p50_over_static_after_each_add_p50": loop["cpu_p50_ms"] / static_after_adds["cpu_p50_ms"],
                     "cpu_loop_p99_over_static_after_each_add_p99": loop["cpu_p99_ms"] / static_after_adds["cpu_p99_ms"],
                     "targets": {"p50": 1.25, "p99": 2.0}, "base": "the better of the static runs before/after "
                     "(the *_after_each_add ratios: the static index asked right after the same adds to a second "
                     "memory, not a target's base)",
                     "cpu": "the searching thread's CPU time (time.thread_time): on a shared machine a search "
                            "waiting for its core adds wall time, not CPU time"}
    for name, r in res["search"].items():
        log(f"  {name:22s} p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms (CPU p50 {r['cpu_p50_ms']:.3f}, "
            f"p99 {r['cpu_p99_ms']:.3f})")
    log(f"  ratios: {json.dumps({k: round(v, 2) for k, v in res['ratios'].items() if isinstance(v, float)})}; "
        f"top-{args.k} identical: {res['top10_identical']}")
    mem.close()
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t_start
    return res


def pct(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else None


def bucket_of(n: int) -> int:
    """Size bucket: the power of ten at or below n (1,000 ... )."""
    return int(10 ** max(3, int(np.floor(np.log10(max(n, 1))))))


# --------------------------------------------------------------------------- reader


class Reader(threading.Thread):
    """Searches the memory without pause; records (records in the snapshot, latency)."""

    def __init__(self, mem: Memory, queries: list[str], k: int, mode: str, seed: int):
        super().__init__(daemon=True)
        self.mem, self.queries, self.k, self.mode = mem, queries, k, mode
        self.rng = np.random.default_rng(seed)
        self.samples: list[tuple[int, float]] = []
        self.stop = threading.Event()
        self.pause = threading.Event()
        self.idle = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            if self.pause.is_set():
                self.idle.set()
                time.sleep(0.01)
                continue
            self.idle.clear()
            q = self.queries[int(self.rng.integers(len(self.queries)))]
            snap = self.mem.snapshot()
            if snap.n_docs == 0:
                time.sleep(0.001)
                continue
            t0 = time.perf_counter()
            try:
                self.mem.search(q, k=self.k, mode=self.mode, snapshot=snap)
            except Exception as e:  # noqa: BLE001 - reported in the JSON
                self.errors.append(f"{type(e).__name__}: {e}")
                return
            self.samples.append((snap.n_docs, time.perf_counter() - t0))

    def hold(self) -> None:
        self.pause.set()
        self.idle.wait(timeout=60)

    def release(self) -> None:
        self.pause.clear()


# --------------------------------------------------------------------------- checks


def check_fresh(mem: Memory, g, n: int, queries: list[str], k: int) -> dict[str, Any]:
    """Memory results vs a fresh BM25Index over the first n records (the live ones)."""
    t0 = time.perf_counter()
    fresh = BM25Index.build(g.texts[:n], ids=g.ids[:n], progress=False)
    t_build = time.perf_counter() - t0
    want = fresh.search(queries, k=k, backend="numpy")
    want_ids = [[fresh.ids[d] for d in row if d >= 0] for row in want.ids]
    out = {"records": n, "queries": len(queries), "fresh_build_s": round(t_build, 2)}
    for mode in ("exhaustive", "newest"):
        got = mem.search(queries, k=k, mode=mode, ties="oldest")  # the scan's exactness: the fresh index's tie rule
        same_ids = all(got.ids(i) == want_ids[i] for i in range(len(queries)))
        out[f"identical_{mode}"] = bool(same_ids and np.array_equal(got.scores, want.scores))
    del fresh
    gc.collect()
    return out


def compare_modes(mem: Memory, g, queries_idx: np.ndarray, k: int, budgets: list[int], epsilon: float,
                  log) -> dict[str, Any]:
    """Every query one at a time in each mode: speed, postings, exactness, recall."""
    snap = mem.snapshot()
    qs = [g.queries[i] for i in queries_idx]
    newest_key = snap.partitions[0][0]
    # 2-fold choice of the decay: fit on one half's answer ages, use K(eps) on the other half
    target_t = np.round(g.times[g.query_targets[queries_idx]] * 1000).astype(np.int64)
    ages = newest_key - target_t // WEEK_MS
    half = np.arange(len(qs)) % 2
    fold_K = {}
    for f in (0, 1):
        rho = fit_decay(ages[half != f])
        fold_K[f] = (rho, budget_partitions(epsilon, rho))
    modes: list[tuple[str, dict]] = [("exhaustive", {}), ("newest", {})]
    modes += [(f"budgeted K={K}", {"mode": "budgeted", "max_partitions": K}) for K in budgets]
    modes.append((f"budgeted eps={epsilon:g}", {"mode": "budgeted", "eps": True}))
    gold = [{int(x) for x in gs} for gs in (g.gold[i] for i in queries_idx)]
    rows: dict[str, Any] = {}
    ref_ids: list[list[str]] | None = None
    ref_scores = None
    for name, opt in modes:
        lat, post, parts, ids, scores = [], [], [], [], []
        for i, q in enumerate(qs):
            kw = {"mode": opt.get("mode", name), "ties": "oldest"}  # compared with exhaustive: the same tie rule
            if "max_partitions" in opt:
                kw["max_partitions"] = opt["max_partitions"]
            if opt.get("eps"):
                kw["max_partitions"] = fold_K[int(half[i])][1]
            t0 = time.perf_counter()
            r = mem.search(q, k=k, snapshot=snap, **kw)
            lat.append(time.perf_counter() - t0)
            post.append(int(r.meta["postings_read"][0]))
            parts.append(int(r.meta["partitions_scanned"][0]))
            ids.append(r.ids(0))
            scores.append(r.scores[0].copy())
        tot = float(np.sum(lat))
        row = {"queries": len(qs), "qps": len(qs) / tot, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
               "mean_ms": tot / len(qs) * 1e3, "postings_read_mean": float(np.mean(post)),
               "partitions_scanned_mean": float(np.mean(parts)), "partitions": len(snap.partitions)}
        row["recall_any@10_gold"] = float(np.mean([bool(gold[i] & {int(x[1:]) for x in ids[i]})
                                                   for i in range(len(qs))]))
        if name == "exhaustive":
            ref_ids, ref_scores = ids, np.stack(scores)
        else:
            assert ref_ids is not None
            row["identical_to_exhaustive"] = bool(ids == ref_ids and np.array_equal(np.stack(scores), ref_scores))
            rec = [len(set(a) & set(b)) / len(b) for a, b in zip(ids, ref_ids) if b]
            row["recall@10_vs_exhaustive"] = float(np.mean(rec)) if rec else None
        if opt.get("eps"):
            row["decay_folds"] = {str(f): {"decay": rho, "K": K} for f, (rho, K) in fold_K.items()}
        rows[name] = row
        log(f"    {name:18s} {row['qps']:8.1f} q/s  p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
            f"postings {row['postings_read_mean']:10.0f}  partitions {row['partitions_scanned_mean']:.1f}"
            + (f"  identical {row.get('identical_to_exhaustive')}  recall@10 {row.get('recall@10_vs_exhaustive'):.3f}"
               if name != "exhaustive" else ""))
    ex = rows["exhaustive"]
    for name, row in rows.items():
        row["speedup_vs_exhaustive"] = row["qps"] / ex["qps"]
        row["postings_ratio_vs_exhaustive"] = ex["postings_read_mean"] / max(row["postings_read_mean"], 1e-9)
    return {"records": snap.n_docs, "segments": len(snap.views), "partitions": len(snap.partitions), "k": k,
            "modes": rows}


# --------------------------------------------------------------------------- run


def run(args, log=print) -> dict[str, Any]:
    t_start = time.perf_counter()
    res: dict[str, Any] = {
        "benchmark": "bench_memory", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "out": os.path.relpath(args.out, REPO) if args.out.is_absolute() else str(args.out),
        "config": {k: getattr(args, k) for k in ("records", "batch", "queries", "seed", "k", "reader_mode",
                                                 "checkpoints", "compare_at", "budgets", "epsilon",
                                                 "check_queries", "compare_queries", "partition_days")},
    }
    log(f"generating {args.records:,} records, {args.queries:,} queries ...")
    t0 = time.perf_counter()
    g = generate(args.records, n_queries=args.queries, seed=args.seed)
    res["generate_s"] = time.perf_counter() - t0
    # the harness's own data (millions of texts) out of the garbage collector's full passes: they are
    # not the memory's, and would otherwise add their traversal to every pause measured here
    gc.collect()
    gc.freeze()
    warm = Memory(partition_days=args.partition_days)  # untimed: imports, numba's cached kernels
    warm.add(g.records(0, min(500, args.records)))
    res["backend"] = warm.search(g.queries[:3], k=args.k).meta["backend"]  # what "auto" chose for every search
    warm.close()
    mem = Memory(partition_days=args.partition_days)
    reader = Reader(mem, g.queries, args.k, args.reader_mode, args.seed + 1)
    checkpoints = sorted(set(args.checkpoints) | set(args.compare_at))
    rng = np.random.default_rng(args.seed + 2)
    check_q = [g.queries[i] for i in rng.choice(len(g.queries), size=min(args.check_queries, len(g.queries)),
                                                 replace=False)]
    adds: list[tuple[int, int, float]] = []  # (records before, batch size, seconds)
    rss: list[tuple[int, float]] = [(0, rss_mb())]
    res["checks"], res["compare"] = [], []
    from tqdm.auto import tqdm

    reader.start()
    bar = tqdm(total=args.records, unit="rec", desc="grow", mininterval=2, disable=True if args.no_progress else None)
    n = 0
    seg_max = 0
    paused = 0.0  # seconds spent in checkpoints (not growth)
    w_start = time.perf_counter()
    try:
        while n < args.records:
            b = min(args.batch, args.records - n)
            recs = g.records(n, n + b)
            t0 = time.perf_counter()
            mem.add(recs)
            adds.append((n, b, time.perf_counter() - t0))
            seg_max = max(seg_max, len(mem.snapshot().views))
            n += b
            bar.update(b)
            if n % max(args.batch, args.records // 50) == 0 or n == args.records:
                rss.append((n, rss_mb()))
            if checkpoints and n >= checkpoints[0]:
                t_cp = time.perf_counter()
                cp = checkpoints.pop(0)
                reader.hold()
                bar.clear()
                log(f"  checkpoint {n:,} records ({len(mem.snapshot().views)} segments, rss {rss_mb():.0f} MB)")
                if cp in args.checkpoints:
                    c = check_fresh(mem, g, n, check_q, args.k)
                    log(f"    fresh-build check: {c}")
                    res["checks"].append(c)
                if cp in args.compare_at:
                    idx = rng.choice(len(g.queries), size=min(args.compare_queries, len(g.queries)), replace=False)
                    idx = idx[g.query_targets[idx] < n]  # questions about records already added
                    res["compare"].append(compare_modes(mem, g, np.sort(idx), args.k, args.budgets,
                                                        args.epsilon, log))
                rss.append((n, rss_mb()))
                reader.release()
                paused += time.perf_counter() - t_cp
        grow_wall = time.perf_counter() - w_start - paused
    finally:
        reader.stop.set()
        reader.join(timeout=60)
        bar.close()
    res["reader_errors"] = reader.errors
    # growth summary per size bucket
    by_b: dict[int, dict[str, list]] = {}
    for before, b, dt in adds:
        d = by_b.setdefault(bucket_of(max(before, 1)), {"adds": [], "lat": []})
        d["adds"].append((b, dt))
    for nd, dt in reader.samples:
        by_b.setdefault(bucket_of(nd), {"adds": [], "lat": []})["lat"].append(dt)
    growth = []
    for bk in sorted(by_b):
        d = by_b[bk]
        recs_added = sum(b for b, _ in d["adds"])
        secs = sum(dt for _, dt in d["adds"])
        lat = d["lat"]
        growth.append({"bucket_from": bk, "bucket_to": bk * 10, "records_added": recs_added,
                       "adds_per_s": recs_added / secs if secs else None,
                       "add_call_p50_ms": pct([dt for _, dt in d["adds"]], 50) and pct([dt for _, dt in d["adds"]], 50) * 1e3,
                       "add_call_max_ms": max((dt for _, dt in d["adds"]), default=0) * 1e3,
                       "searches": len(lat), "search_p50_ms": pct(lat, 50) and pct(lat, 50) * 1e3,
                       "search_p99_ms": pct(lat, 99) and pct(lat, 99) * 1e3})
    total_add = sum(dt for _, _, dt in adds)
    res["growth"] = {
        "records": n, "batches": len(adds), "total_add_s": total_add, "adds_per_s": n / total_add,
        "adds_per_s_wall": n / grow_wall, "segments_max": seg_max, "background_merges": True,
        "merge_status": mem.merge_status(),
        "buckets": growth, "merges": len(mem.merge_log),
        "merge_s_total": float(sum(s for _, s in mem.merge_log)),
        "merge_pause_max_s": float(max((s for _, s in mem.merge_log), default=0.0)),
        "merge_pauses_top": sorted(({"records": r, "s": round(s, 3)} for r, s in mem.merge_log),
                                   key=lambda x: -x["s"])[:10],
        "add_call_p99_ms": pct([dt for *_, dt in adds], 99) * 1e3, "add_call_max_ms": max(dt for *_, dt in adds) * 1e3,
        "searches": len(reader.samples),
        "search_p50_ms": pct([dt for _, dt in reader.samples], 50) * 1e3 if reader.samples else None,
        "search_p99_ms": pct([dt for _, dt in reader.samples], 99) * 1e3 if reader.samples else None,
        "rss_mb": rss, "segments_end": len(mem.snapshot().views), "partitions_end": len(mem.snapshot().partitions),
        "reader_curve": _curve(reader.samples),
    }
    if args.open_probe:
        d = save_for_probe(mem, log)
        try:
            res["open"] = run_probe(d, g.queries[0], args.probe_repeats, log)
        finally:
            shutil.rmtree(d.parent, ignore_errors=True)
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t_start
    return res


def _curve(samples: list[tuple[int, float]], bins: int = 24) -> list[dict[str, Any]]:
    """Search latency p50/p99 over log-spaced store sizes, for the plot."""
    if not samples:
        return []
    n = np.array([s[0] for s in samples], dtype=float)
    lat = np.array([s[1] for s in samples]) * 1e3
    edges = np.unique(np.logspace(np.log10(max(n.min(), 1)), np.log10(n.max() + 1), bins).astype(int))
    out = []
    for a, b in itertools.pairwise(edges):
        m = (n >= a) & (n < b)
        if m.sum() >= 5:
            out.append({"records": int(np.sqrt(a * b)), "p50_ms": float(np.percentile(lat[m], 50)),
                        "p99_ms": float(np.percentile(lat[m], 99)), "n": int(m.sum())})
    return out


# --------------------------------------------------------------------------- docs


def _f(x, nd=1):
    return "–" if x is None else f"{x:,.{nd}f}"


def render_markdown(res: dict[str, Any], img_rel: str | None = "img/bench_memory.png", section: str = "main") -> str:
    m, gr = res["machine"], res["growth"]
    title = "Memory: growth, search while growing, time partitions"
    if section != "main":
        title += f" ({section})"
    lines = [marks(section)[0], f"## {title}", ""]
    lines.append(f"Measured {res['date']} on {m['cpu_model']} ({m['logical_cores']} logical cores, "
                 f"{m['memory_gb']} GB; host `{m['host']}`), Python {m['python']}, NumPy {m['numpy']}, gpuir "
                 f"{m['gpuir']}; backend {res.get('backend', 'auto (not recorded)')}. 1-minute load average {m['loadavg_start'][0]:.1f} at the start, "
                 f"{m['loadavg_end'][0]:.1f} at the end (other jobs shared the machine).")
    lines.append("")
    lines.append(f"Command: `python bench/{res['command']}`. Raw figures: `{res.get('out', 'bench/results/')}`.")
    lines.append("")
    c = res["config"]
    lines.append(f"**Growth** 0 → {gr['records']:,} synthetic records in batches of {c['batch']:,} "
                 f"({c['partition_days']:g}-day partitions) while one reader thread searched without pause "
                 f"(top-{c['k']}, mode `{c['reader_mode']}`, random recency-biased queries): "
                 f"**{gr['adds_per_s']:,.0f} adds/s** overall; search p50 **{_f(gr['search_p50_ms'], 2)} ms**, "
                 f"p99 **{_f(gr['search_p99_ms'], 2)} ms** over {gr['searches']:,} searches. "
                 + (f"{gr['merges']} merges ran in background threads ({gr['merge_s_total']:.1f} s of wall "
                    f"time in all, the longest {gr['merge_pause_max_s']:.2f} s); the writer's longest pause, "
                    f"its slowest `add` call, {gr['add_call_max_ms'] / 1e3:.2f} s (p99 {gr['add_call_p99_ms']:.0f} ms); "
                    f"{gr['adds_per_s_wall']:,.0f} records/s in wall-clock time with the merges beside it; "
                    f"at most {gr['segments_max']} segments. "
                    if gr.get("background_merges") else
                    f"{gr['merges']} merges took {gr['merge_s_total']:.1f} s in all; the longest pause "
                    f"{gr['merge_pause_max_s']:.2f} s; slowest `add` call {gr['add_call_max_ms'] / 1e3:.2f} s "
                    f"(p99 {gr['add_call_p99_ms']:.0f} ms). ")
                 + f"Peak RSS {max(r for _, r in gr['rss_mb']):,.0f} MB; "
                 f"{gr['segments_end']} segments in {gr['partitions_end']} partitions at the end.")
    lines.append("")
    if res.get("open"):
        lines.append(_open_line(res["open"]))
        lines.append("")
    lines.append("| store size | records added | adds/s | add call p50 (ms) | slowest add (ms) | searches | "
                 "search p50 (ms) | search p99 (ms) |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for b in gr["buckets"]:
        lines.append(f"| {b['bucket_from']:,} – {b['bucket_to']:,} | {b['records_added']:,} | {_f(b['adds_per_s'], 0)} | "
                     f"{_f(b['add_call_p50_ms'])} | {_f(b['add_call_max_ms'], 0)} | {b['searches']:,} | "
                     f"{_f(b['search_p50_ms'], 2)} | {_f(b['search_p99_ms'], 2)} |")
    lines.append("")
    if res["checks"]:
        lines.append("**Equality with a fresh build** (growth paused; the same queries through a fresh "
                     "`BM25Index` over the records added so far; ids and float32 scores):")
        lines.append("")
        lines.append("| records | queries | exhaustive identical | newest-first identical | fresh build (s) |")
        lines.append("|---:|---:|:---:|:---:|---:|")
        for ck in res["checks"]:
            lines.append(f"| {ck['records']:,} | {ck['queries']} | {ck['identical_exhaustive']} | "
                         f"{ck['identical_newest']} | {ck['fresh_build_s']} |")
        lines.append("")
    for cmp in res["compare"]:
        lines.append(f"**Time partitions at {cmp['records']:,} records** ({cmp['partitions']} partitions, "
                     f"{cmp['segments']} segments; each query alone, top-{cmp['k']}, "
                     f"{next(iter(cmp['modes'].values()))['queries']} recency-biased queries):")
        lines.append("")
        lines.append("| mode | queries/s | speed-up | p50 (ms) | p99 (ms) | postings read | partitions read | "
                     "identical to exhaustive | recall@10 vs exhaustive | recall_any@10 (gold) |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
        for name, r in cmp["modes"].items():
            lines.append(f"| {name} | {r['qps']:,.1f} | {r['speedup_vs_exhaustive']:.2f}× | {r['p50_ms']:.2f} | "
                         f"{r['p99_ms']:.2f} | {r['postings_read_mean']:,.0f} | {r['partitions_scanned_mean']:.1f} | "
                         f"{r.get('identical_to_exhaustive', '–')} | {_f(r.get('recall@10_vs_exhaustive'), 3)} | "
                         f"{r['recall_any@10_gold']:.3f} |")
        eps = next((r for n, r in cmp["modes"].items() if n.startswith("budgeted eps")), None)
        if eps:
            folds = ", ".join(f"decay {v['decay']:.3f} → K = {v['K']}" for v in eps["decay_folds"].values())
            lines.append("")
            lines.append(f"The eps row's K comes from the decay fitted on the other half of the queries' answer "
                         f"ages (2-fold): {folds}.")
        lines.append("")
    if img_rel:
        lines.append(f"![memory benchmark]({img_rel})")
        lines.append("")
    lines.append(marks(section)[1])
    return "\n".join(lines)


def _open_line(o: dict[str, Any]) -> str:
    c, w = o["cold_imports"], o["warm_imports"]
    return (f"**Open** (saved after the merges, opened in {len(c['repeats'])} fresh processes per row, warm page "
            f"cache; medians): `Memory.open` {w['open_s_median']:.3f} s, open + first search (with its hits) "
            f"**{w['open_and_first_search_s_median']:.3f} s** once the search engine's once-per-process work is done "
            f"(resolving the backend and loading its compiled kernels: {w['resolve_backend_s_median']:.3f} s, done "
            f"first on a tiny memory), {c['open_and_first_search_s_median']:.3f} s when the first search does it"
            + (f" (a fresh process's first \"auto\" search runs on the NumPy reference while the compiled engine "
               f"starts in the background: ready {c['compiled_engine_ready_s_median']:.3f} s after the open began, "
               f"the next search {1e3 * c['next_search_s_median']:.1f} ms)"
               if "compiled_engine_ready_s_median" in c else "") + "; "
            f"the first search makes the scorer of every segment it reads (once per segment and process), from "
            f"the block index the segment's file saved (older files: laid out then); "
            f"resident memory after "
            f"open **{w['rss_after_open_mb_median']:,.0f} MB** ({w['rss_after_open_above_baseline_mb_median']:,.0f} MB "
            f"above the process before it; peak through open {w['peak_rss_through_open_mb_median']:,.0f} MB), "
            f"{w['rss_after_first_search_mb_median']:,.0f} MB after the first search; the directory holds "
            f"{o['directory_bytes'] / 2**20:,.0f} MB."
            + (f" In CPU time (the process's): open {w['open_cpu_s_median']:.3f} s, first search "
               f"{w['first_search_cpu_s_median']:.3f} s, together **{w['open_and_first_search_cpu_s_median']:.3f} s**."
               if "open_cpu_s_median" in w else ""))


def render_lme_markdown(res: dict[str, Any], section: str = "lme") -> str:
    m = res["machine"]
    gv = res["growth_vs_build"]
    lines = [marks(section)[0], "## Memory on LongMemEval-S turns: growth, open, search (one core)", ""]
    lines.append(f"Measured {res['date']} on {m['cpu_model']} ({m['logical_cores']} logical cores, "
                 f"{m['memory_gb']} GB; host `{m['host']}`, a shared VM: other jobs ran at the same time), "
                 f"pinned to CPU {m.get('cpu_affinity')} with every thread pool at 1; Python {m['python']}, "
                 f"NumPy {m['numpy']}, gpuir {m['gpuir']}. 1-minute load average {m['loadavg_start'][0]:.1f} at "
                 f"the start, {m['loadavg_end'][0]:.1f} at the end.")
    lines.append("")
    lines.append(f"Command: `python bench/{res['command']}`. Raw figures: `{res.get('out', 'bench/results/')}`.")
    lines.append("")
    n = res["growth"][0]["records"]
    lines.append(f"{n:,} turns (de-duplicated by text) added in batches of {res['config']['batch']:,} to an empty "
                 f"`Memory`, against `BM25Index.build` over the same texts in the same process, {res['config']['reps']} "
                 f"times each, alternating. Growth includes its background merges (it ends when they are done); "
                 f"CPU time is the process's (every thread), wall time the clock's.")
    lines.append("")
    lines.append("| rep | build rec/s (wall) | build rec/s (CPU) | growth rec/s (wall) | growth rec/s (CPU) | "
                 "growth / build (CPU) | longest add (s) | add p99 (ms) | merges | segments (max) |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, (b, g) in enumerate(zip(res["build"], res["growth"])):
        lines.append(f"| {i} | {b['records_per_s_wall']:,.0f} | {b['records_per_s_cpu']:,.0f} | "
                     f"{g['records_per_s_wall']:,.0f} | {g['records_per_s_cpu']:,.0f} | "
                     f"{g['records_per_s_cpu'] / b['records_per_s_cpu']:.2f} | {g['add_call_max_s']:.3f} | "
                     f"{g['add_call_p99_s'] * 1e3:.0f} | {g['merges']} | {g['segments_max']} |")
    lines.append("")
    lines.append(f"Growth / build, best of the reps: **{gv['cpu_best_of_reps']:.2f}** (CPU time), "
                 f"{gv['wall_best_of_reps']:.2f} (wall). Longest `add` call over all reps: "
                 f"**{res['add_call_max_s']:.3f} s**.")
    lines.append("")
    t = res["top10_identical"]
    lines.append(f"Top-{res['config']['k']} of the memory and of the static index identical for all "
                 f"{t['questions']} questions: ids {t['ids']}, float32 scores {t['scores']} (memory backend "
                 f"`{t['memory_backend']}`, static `{t['static_backend']}`).")
    lines.append("")
    st = res["search"].get("static", {})
    cpu = "one_cpu_p50_ms" in st
    if cpu:
        lines.append("Each question alone (p50, p99) and the 499 as one batch, in wall-clock time and in CPU time "
                     "(the thread's; the process's for the batch): on this shared machine a search waiting for "
                     "the core adds wall time, not CPU time; the ratios to the static index are CPU time's. The "
                     "engines take each question in turn (interleaved: the same load for all), after one untimed batch "
                     "(the memory's weights filled) and with every engine's structures frozen out of the garbage "
                     "collector's passes; the merged memory (the same, one segment) is measured later, "
                     "interleaved with the static index again (its ratios are to that run).")
        lines.append("")
        lines.append("| engine | backend | segments | one p50 (ms) | p99 (ms) | one p50 CPU (ms) | / static | "
                     "batch (q/s) | batch CPU (q/s) | / static |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    else:
        lines.append("| engine | backend | segments | one question p50 (ms) | p99 (ms) | 499 as one batch (q/s) |")
        lines.append("|---|---|---:|---:|---:|---:|")
    for name, r in res["search"].items():
        if "one_p50_ms" not in r:
            continue
        if cpu:
            base = r.get("static_same_loop", st)  # the static index measured in the same interleaved loop
            lines.append(f"| {name} | {r.get('backend', 'numba')} | {r.get('segments', 1)} | {r['one_p50_ms']:.2f} | "
                         f"{r['one_p99_ms']:.2f} | {r['one_cpu_p50_ms']:.3f} | "
                         f"{r['one_cpu_p50_ms'] / base['one_cpu_p50_ms']:.2f} | {r['batch_qps']:,.0f} | "
                         f"{r['batch_qps_cpu']:,.0f} | {r['batch_qps_cpu'] / base['batch_qps_cpu']:.2f} |")
        else:
            lines.append(f"| {name} | {r.get('backend', 'numba')} | {r.get('segments', 1)} | {r['one_p50_ms']:.2f} | "
                         f"{r['one_p99_ms']:.2f} | {r['batch_qps']:,.0f} |")
    lines.append("")
    if res.get("open"):
        lines.append(_open_line(res["open"]))
        lines.append("")
    lines.append(marks(section)[1])
    return "\n".join(lines)


def write_markdown(res: dict[str, Any], path: Path, img_rel: str | None, section: str = "main") -> None:
    """Replace (or append) this run's section of ``path``; other sections stay."""
    body = render_lme_markdown(res, section) if res.get("corpus") == "longmemeval" else \
        render_markdown(res, img_rel, section)
    begin, end = marks(section)
    text = path.read_text("utf-8") if path.exists() else "# Benchmarks\n\n"
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        text = pre + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    path.write_text(text, "utf-8")


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gr = res["growth"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    cur = gr["reader_curve"]
    ax = axes[0]
    if cur:
        x = [c["records"] for c in cur]
        ax.plot(x, [c["p50_ms"] for c in cur], "o-", label="search p50")
        ax.plot(x, [c["p99_ms"] for c in cur], "s--", label="search p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records in the memory")
    ax.set_ylabel("latency (ms)")
    ax.set_title("search while growing (reader thread)")
    ax.legend()
    ax = axes[1]
    bk = [b for b in gr["buckets"] if b["adds_per_s"]]
    ax.bar([f"{b['bucket_from']:,}+" for b in bk], [b["adds_per_s"] for b in bk], color="tab:green")
    ax.set_ylabel("adds/s")
    ax.set_title(f"adds/s by store size (batches of {res['config']['batch']:,})")
    ax.tick_params(axis="x", rotation=30)
    ax = axes[2]
    if res["compare"]:
        width = 0.8 / len(res["compare"])
        names = list(res["compare"][0]["modes"])
        for i, cmp in enumerate(res["compare"]):
            ax.bar(np.arange(len(names)) + i * width, [cmp["modes"][n]["qps"] for n in names], width,
                   label=f"{cmp['records']:,} records")
        ax.set_xticks(np.arange(len(names)) + width * (len(res["compare"]) - 1) / 2)
        ax.set_xticklabels(names, rotation=25, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("queries/s (one query at a time)")
        ax.set_title("time-partition scan modes")
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def _ints(s: str) -> list[int]:
    return [int(float(x)) for x in s.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="synthetic", choices=("synthetic", "longmemeval"),
                   help="synthetic growth while searching (default), or the LongMemEval-S turns against the "
                        "static build")
    p.add_argument("--one-core", action="store_true",
                   help="pin the process (and the open probe) to the first CPU it may use (CPU 0 unless "
                        "started under taskset), every thread pool at one thread")
    p.add_argument("--agent-loop", action="store_true",
                   help="longmemeval: grow, then --rounds times add one turn and ask one question; each engine "
                        "also measured alone (issue 34)")
    p.add_argument("--note", default="", help="agent loop: a note kept in the results (e.g. the machine's load)")
    p.add_argument("--rounds", type=int, default=499, help="agent loop: rounds (default 499, every question)")
    p.add_argument("--think-ms", type=float, default=0.0,
                   help="agent loop: pause between each add and its question (an agent's LLM call; default 0: "
                        "the question right after the add, the merges it started sharing the core with it); "
                        "each engine timed alone pauses as long before each of its questions")
    p.add_argument("--settle", action="store_true",
                   help="agent loop: wait for the merges each add started before its question (what the merge "
                        "thread costs a question on one core)")
    p.add_argument("--loop-docs", type=int, default=None,
                   help="agent loop: use the first N turns only (a short run)")
    p.add_argument("--reps", type=int, default=3, help="longmemeval: build/growth repetitions (default 3)")
    p.add_argument("--merge-factor", type=int, default=8,
                   help="longmemeval: the grown memory's merge_factor (default 8, the Memory default)")
    p.add_argument("--no-open-probe", dest="open_probe", action="store_false",
                   help="skip saving the grown memory and opening it in fresh processes")
    p.add_argument("--probe-repeats", type=int, default=3, help="fresh processes for the open probe (default 3)")
    p.add_argument("--probe-open", default=None, help=argparse.SUPPRESS)  # internal: the probe process
    p.add_argument("--probe-query", default="", help=argparse.SUPPRESS)
    p.add_argument("--probe-warm-imports", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--records", type=int, default=1_000_000, help="final size (default 1,000,000)")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--partition-days", type=float, default=7.0)
    p.add_argument("--reader-mode", default="exhaustive", choices=("exhaustive", "newest"))
    p.add_argument("--checkpoints", type=_ints, default=[10_000, 100_000, 1_000_000],
                   help="sizes at which results are compared with a fresh build")
    p.add_argument("--compare-at", type=_ints, default=[1_000_000], help="sizes at which the scan modes are compared")
    p.add_argument("--budgets", type=_ints, default=[2, 4, 8], help="K of the budgeted mode")
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--check-queries", type=int, default=300)
    p.add_argument("--compare-queries", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="a smoke run: 20,000 records, few queries")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--md", type=Path, default=REPO / "docs" / "benchmarks.md")
    p.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "bench_memory.png")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--section", default="main", help="name of this run's section in --md (several runs side by side)")
    p.add_argument("--render-only", type=Path, default=None, metavar="JSON",
                   help="render the docs section and plot of a saved run, run nothing")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.records, a.queries, a.check_queries, a.compare_queries = 20_000, 200, 50, 100
        a.checkpoints, a.compare_at, a.budgets = [5_000, 20_000], [20_000], [2, 4]
    a.checkpoints = [c for c in a.checkpoints if c <= a.records]
    a.compare_at = [c for c in a.compare_at if c <= a.records]
    if a.agent_loop:
        a.corpus = "longmemeval"
    if a.out is None:
        tag = ("_loop" if a.agent_loop else "_lme") if a.corpus == "longmemeval" else ""
        a.out = REPO / "bench" / "results" / f"bench_memory{tag}_{socket.gethostname()}.json"
    if a.corpus == "longmemeval" and a.section == "main":
        a.section = "lme"
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one_core and hasattr(os, "sched_setaffinity"):  # (taskset -c N: stay on N, beside other work)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.probe_open is not None:
        print(json.dumps(probe_open(args.probe_open, args.probe_query, args.probe_warm_imports)))
        return 0
    if args.agent_loop:
        args.corpus = "longmemeval"
        res = run_agent_loop(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"-> {args.out}")
        return 0 if res["top10_identical"]["ids"] and res["top10_identical"]["scores"] else 1
    if args.render_only is not None:
        res = json.loads(args.render_only.read_text())
    else:
        res = run_lme(args) if args.corpus == "longmemeval" else run(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"-> {args.out}")
    lme = res.get("corpus") == "longmemeval"
    if not args.no_docs:
        img_rel = os.path.relpath(args.png, args.md.parent)
        if not lme:
            plot(res, args.png)
        write_markdown(res, args.md, img_rel, args.section)
        print(f"-> {args.md}" + ("" if lme else f", {args.png}"))
    print(render_lme_markdown(res, args.section) if lme else render_markdown(res, None, args.section))
    if lme:
        t = res["top10_identical"]
        return 0 if t["ids"] and t["scores"] else 1
    return 0 if not res["reader_errors"] and all(c["identical_exhaustive"] and c["identical_newest"]
                                                  for c in res["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
