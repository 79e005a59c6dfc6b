"""BM25Index.search through the segment-set contract against the direct scorer call it replaced, in one run.

Until issue 34 (item 1), ``BM25Index.search`` analysed the questions and called its cached
:class:`~gpuir.backends.base.Scorer` directly (``self.scorer(name).search(terms, k, allow)``). It now
hands the engine serving the backend a one-segment segment set (:mod:`gpuir.backends.onesegment`). This
script times both, question by question interleaved (each meets the same load) and as one batch, on
the LongMemEval-S turns and its 499 questions, and checks that they return the same ids and score bits.
The direct path is the removed code, kept here (``direct``): the analysis, the scorer's call and the
meta the search set. Each question runs through both, one after the other, the first of the two
alternating from question to question (the second finds the question's postings in the CPU's caches).
Timings never decide a test.

    taskset -c 1 python bench/bench_index_contract.py --backends numba numpy --out bench/results/index_contract_vm.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "index_contract_vm.json")
    ap.add_argument("--backends", nargs="+", default=["numba", "numpy"])
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passes", type=int, default=3, help="interleaved passes over the questions")
    ap.add_argument("--records", type=int, default=None, help="only the first N turns (a quick check)")
    ap.add_argument("--questions", type=int, default=None, help="only the first N questions (a quick check)")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "GPUIR_THREADS"):
        os.environ[v] = "1"  # one core: the scorer's batch on one thread
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    import bench_cpu
    import bench_memory
    import numpy as np

    from gpuir import BM25Index
    from gpuir.backends import resolve_backend
    from gpuir.filters import normalize_filters

    corpus = bench_cpu.load_longmemeval(args.records, args.questions)
    questions = corpus.queries
    print(f"LongMemEval-S: {len(corpus.texts):,} turns, {len(questions)} questions", flush=True)
    idx = BM25Index.build(corpus.texts, progress=False)
    k = args.k

    def direct(queries, backend):
        """BM25Index.search before the contract (no filter): the scorer called directly."""
        name, reason = resolve_backend(backend)
        allow = normalize_filters(None, len(queries), idx.n_docs, idx.id_to_num)
        t0 = time.perf_counter()
        terms = idx.query_terms(queries)
        t_an = time.perf_counter() - t0
        kk = min(int(k), max(idx.n_docs, 1))
        res = idx.scorer(name).search(terms, kk, allow)
        res.meta.setdefault("timings", {})["analyze_s"] = t_an
        res.meta.update(backend=name, backend_reason=reason)
        res.set_doc_ids(idx.ids)
        return res

    out: dict = {}
    for backend in args.backends:
        fns = {"contract": lambda q, b=backend: idx.search(q, k=k, backend=b),
               "direct": lambda q, b=backend: direct(q, b)}
        a, b = fns["contract"](questions), fns["direct"](questions)  # untimed: weights, kernels
        same = bool(np.array_equal(np.asarray(a.ids), np.asarray(b.ids))
                    and np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32)))
        for fn in fns.values():
            fn(questions[:1])
        gc.collect()
        lat: dict[str, list[float]] = {n: [] for n in fns}
        diff: list[float] = []  # contract - direct, the same question back to back
        names = list(fns)
        for p in range(args.passes):
            for i, q in enumerate(questions):
                # the second search of a question finds its postings in the CPU's caches: who goes first
                # alternates, question by question
                for n in (names if (i + p) % 2 == 0 else names[::-1]):
                    t = time.perf_counter()
                    fns[n]([q])
                    lat[n].append(time.perf_counter() - t)
                diff.append(lat["contract"][-1] - lat["direct"][-1])
        row = {}
        tb: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(4):  # the best of four batches each, alternating (the load drifts)
            for n in (names if r % 2 == 0 else names[::-1]):
                t = time.perf_counter()
                fns[n](questions)
                tb[n].append(time.perf_counter() - t)
        for n in fns:
            xs = np.asarray(lat[n])
            row[n] = {"one_p50_ms": float(np.percentile(xs, 50)) * 1e3, "one_p99_ms": float(np.percentile(xs, 99)) * 1e3,
                      "batch_qps": len(questions) / min(tb[n])}
        row["contract_over_direct"] = {m: row["contract"][m] / row["direct"][m]
                                       for m in ("one_p50_ms", "one_p99_ms", "batch_qps")}
        # the paired difference is steadier than the two p50s on a busy machine
        row["one_median_paired_diff_us"] = float(np.median(diff)) * 1e6
        row["same_ids_and_score_bits"] = same
        out[backend] = row
        for n in ("contract", "direct"):
            r = row[n]
            print(f"  {backend:6s} {n:9s} p50 {r['one_p50_ms']:7.3f} ms  p99 {r['one_p99_ms']:7.3f} ms  "
                  f"batch {r['batch_qps']:8,.0f} q/s", flush=True)
        print(f"  {backend:6s} contract/direct: {row['contract_over_direct']}  median paired diff "
              f"{row['one_median_paired_diff_us']:.1f} us  same bits: {same}", flush=True)
    res = {"benchmark": "bench_index_contract", "machine": bench_memory.machine(),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=False).stdout.strip(),
           "cpu_affinity": sorted(os.sched_getaffinity(0)), "records": len(corpus.texts),
           "questions": len(questions), "k": k, "passes": args.passes,
           "loadavg_run_start": load_start, "loadavg_run_end": os.getloadavg(),
           # one core of the two is this run's: a load average above 1 means other jobs ran beside it
           "under_load": max(*load_start, *os.getloadavg()) > 1.0, "search": out}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
