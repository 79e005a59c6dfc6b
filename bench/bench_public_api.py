"""What a user's question costs through each public entry point, beside bm25s, in one run.

Workload: the LongMemEval-S haystack turns (de-duplicated by text, as ``bench_cpu.load_longmemeval``), each
with its session and one tenant, grown into a :class:`gpuir.Memory` in batches of 1,000, and the 499
questions. Each question goes, in turn, through

* ``Memory.search`` (no filter: the plain question's path),
* ``Memory.search`` with ``where={"tenant": ...}`` (a pooled memory's tenant search: ``gpuir serve
  --statistics pooled``; by default the service searches the tenant's own memory without it),
* ``Retriever(memory).search`` (the default: session BM25 + turn BM25, z-score fusion),
* ``BM25Index.search`` over the same texts, and bm25s-numba (when installed),
* the HTTP service: a real ``gpuir serve`` of the saved memory on loopback (its own process, on the other
  core), through :class:`gpuir.service.client.MemoryClient`,

interleaved question by question (every entry meets the same load), then each as one batch of 499. The
in-process entries run in this process on one core (``--one-core``: pinned to CPU 0, every thread pool at
one thread); top-10 of the service and of ``Memory.search`` are compared. Timings never decide a test.

    python bench/bench_public_api.py --one-core --out bench/results/public_api_vm.json

The same script measures an older checkout the same way (copy it into that checkout's ``bench/`` and run
it there: it imports the gpuir beside it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _one_core(core: int = 0) -> None:
    for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[v] = "1"
    os.sched_setaffinity(0, {core})


def _records(tenant: str, max_records: int | None, max_questions: int | None) -> tuple[list[dict[str, str]], list[str]]:
    import bench_cpu  # the one loader of the LongMemEval-S turns (de-duplicated by text)

    corpus = bench_cpu.load_longmemeval(max_records, max_questions)
    # ids as the service keeps them (TENANT/ID): the saved memory is served as it is
    recs = [{"id": f"{tenant}/t{i}", "text": t, "session": s, "tenant": tenant}
            for i, (t, s) in enumerate(zip(corpus.texts, corpus.sessions))]
    return recs, corpus.queries


def _pct(xs: list[float], q: float) -> float:
    import numpy as np  # (after the thread pools are set)

    return float(np.percentile(np.asarray(xs), q))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "public_api_vm.json")
    ap.add_argument("--one-core", action="store_true", help="pin this process to CPU 0, thread pools at 1")
    ap.add_argument("--core", type=int, default=None,
                    help="with --one-core: pin this process and the service to this CPU instead (CPU 0 and 1 "
                         "by default): a shared machine whose CPU 0 runs another benchmark")
    ap.add_argument("--no-service", action="store_true",
                    help="leave the HTTP service out (a machine too busy to start it within its timeout)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passes", type=int, default=2, help="interleaved passes over the questions")
    ap.add_argument("--records", type=int, default=None, help="only the first N turns (a quick check)")
    ap.add_argument("--questions", type=int, default=None, help="only the first N questions (a quick check)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    if args.one_core:
        _one_core(0 if args.core is None else args.core)
    service_core = 1 if args.core is None else args.core
    os.environ.setdefault("GPUIR_TIERED_START", "0")  # steady state: the compiled engine from the first search
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))

    from gpuir import BM25Index, Memory, Retriever
    from gpuir.service.client import MemoryClient
    from gpuir.service.keys import KeyStore
    from gpuir.service.testing import ServerProcess

    tenant = "lme"
    recs, questions = _records(tenant, args.records, args.questions)
    print(f"LongMemEval-S: {len(recs):,} turns, {len(questions)} questions", flush=True)
    mem = Memory()
    for a in range(0, len(recs), 1000):
        mem.add(recs[a: a + 1000])
    mem.wait_merges()
    tmp = Path(tempfile.mkdtemp(prefix="gpuir-public-api-"))
    root = tmp / "mem"
    mem.save(root)
    mem.close()
    mem = Memory.open(root, writer=False)  # (the server is the directory's writer)
    key = KeyStore(root).add(tenant)
    idx = BM25Index.build([r["text"] for r in recs], ids=[r["id"] for r in recs], progress=False)
    ret = Retriever(mem)
    k = args.k
    fns = {
        "Memory.search": lambda q: mem.search(q, k=k),
        "Memory.search, tenant where": lambda q: mem.search(q, k=k, where={"tenant": tenant}),
        "Retriever (default)": lambda q: ret.search(q, k=k),
        "BM25Index.search": lambda q: idx.search(q, k=k),
    }
    try:
        import bench_cpu

        lib = bench_cpu.Bm25sLib("numba")
        lib.build([r["text"] for r in recs])
        fns["bm25s-numba"] = lambda q: lib.search(q, k)
    except ImportError as e:
        print(f"bm25s-numba skipped: {e}", flush=True)
    server = None if args.no_service else ServerProcess(
        root, env={"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "GPUIR_TIERED_START": "0"},
        launcher=(["taskset", "-c", str(service_core)] if args.one_core else []) + [sys.executable, "-m", "gpuir.service"])
    if server is not None:
        server.start()
        client = MemoryClient(server.url, key, tenant)
        fns["HTTP service"] = lambda q: client.search(q, k=k)
    try:
        for fn in fns.values():  # untimed: weights filled, kernels loaded, the server's first search done
            fn(questions)
            fn(questions[:1])
        def bare(ids):
            return [i.split("/", 1)[-1] for i in ids]

        same = None if server is None else all(bare(client.search([q], k=k).ids(0)) == bare(mem.search([q], k=k).ids(0))
                                               for q in questions[:100])  # (first 100)
        gc.collect()
        gc.freeze()
        lat: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(args.passes):
            for q in questions:
                for n, fn in fns.items():
                    t = time.perf_counter()
                    fn([q])
                    lat[n].append(time.perf_counter() - t)
        out = {}
        for n, fn in fns.items():
            t = time.perf_counter()
            fn(questions)
            tb = time.perf_counter() - t
            out[n] = {"one_p50_ms": _pct(lat[n], 50) * 1e3, "one_p99_ms": _pct(lat[n], 99) * 1e3,
                      "batch_qps": len(questions) / tb}
            print(f"  {n:30s} p50 {out[n]['one_p50_ms']:7.3f} ms  p99 {out[n]['one_p99_ms']:7.3f} ms  "
                  f"batch {out[n]['batch_qps']:8,.0f} q/s", flush=True)
    finally:
        if server is not None:
            server.stop()
    import bench_memory

    res = {"benchmark": "bench_public_api", "machine": bench_memory.machine(),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=False).stdout.strip(),
           "records": len(recs), "questions": len(questions), "k": k, "passes": args.passes,
           "segments": len(mem.snapshot().views), "one_core": args.one_core,
           "loadavg_run_start": load_start, "loadavg_run_end": os.getloadavg(),
           # one core of two is this run's: a load average above 1 means other jobs ran beside it
           "under_load": max(*load_start, *os.getloadavg()) > 1.0,
           "service": "gpuir serve on 127.0.0.1, its own process" + (f" pinned to CPU {service_core}" if args.one_core
                                                                                     else ""),
           "core": (0 if args.core is None else args.core) if args.one_core else None,
           "service_top10_equals_memory_first_100": None if same is None else bool(same), "search": out,
           "ratios_to_bm25s_numba_p50": ({n: v["one_p50_ms"] / out["bm25s-numba"]["one_p50_ms"] for n, v in out.items()}
                                         if "bm25s-numba" in out else None)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
