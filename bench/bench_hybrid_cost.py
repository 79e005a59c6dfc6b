"""What ``Memory(ranking="hybrid")`` costs beside ``ranking="bm25"``: add throughput and search latency (issue 37).

The figures that decide whether the hybrid ranking can be ``Memory()``'s default:
the same LoCoMo turns added to a lexical and to a hybrid memory (one record per
call, as an agent adds, and in batches of 100), then the same questions searched
one at a time. Both memories run in one process, alternately, on whatever cores
the process is pinned to (``taskset -c 0 python ...``); CPU seconds are reported
beside wall seconds, since the machine is shared.

Run::

    PYTHONPATH=$PWD taskset -c 0 python bench/bench_hybrid_cost.py --turns 300 --out bench/results/hybrid_cost_vm.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from gpuir import Memory
from gpuir.eval.datasets import load_locomo
from gpuir.eval.records import dataset_records


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--out", default="bench/results/hybrid_cost_vm.json")
    args = ap.parse_args(argv)
    ds = load_locomo(unit="turn")
    recs = [r for r in dataset_records(ds) if r.get("tenant") == "conv-26"][: args.turns]
    qs = [q.text for q in ds.queries if q.group == "conv-26"][: args.questions]
    out: dict = {"what": __doc__.split("\n\n")[0], "command": "PYTHONPATH=$PWD taskset -c 0 python "
                 f"bench/bench_hybrid_cost.py --turns {args.turns} --questions {args.questions} --out {args.out}",
                 "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "machine": {"host": "vm", "cpu_count": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
                             "platform": platform.platform(), "load_avg_before": os.getloadavg()},
                 "note": "a shared 2-core machine (under load): compare the two rankings within this run",
                 "turns": len(recs), "questions": len(qs)}
    _, w, c = timed(lambda: Memory(ranking="hybrid").search("warm up the encoder"))
    out["hybrid_first_search_s"] = {"wall": round(w, 3), "cpu": round(c, 3)}
    for ranking in ("bm25", "hybrid"):
        row: dict = {}
        m1 = Memory(ranking=ranking)
        _, w, c = timed(lambda m1=m1: [m1.add([r]) for r in recs])
        row["add_one_per_call"] = {"records_per_s_wall": round(len(recs) / w, 1), "cpu_s": round(c, 3)}
        m2 = Memory(ranking=ranking)
        _, w, c = timed(lambda m2=m2: [m2.add(recs[i: i + 100]) for i in range(0, len(recs), 100)])
        row["add_batches_of_100"] = {"records_per_s_wall": round(len(recs) / w, 1), "cpu_s": round(c, 3)}
        lat = []
        for q in qs:
            _, w, _c = timed(lambda q=q, m1=m1: m1.search(q, k=10))
            lat.append(w * 1000)
        row["search_one_question_ms"] = {"p50": round(float(np.percentile(lat, 50)), 3),
                                         "p99": round(float(np.percentile(lat, 99)), 3)}
        out[ranking] = row
    out["add_one_per_call_slowdown_hybrid_over_bm25"] = round(
        out["bm25"]["add_one_per_call"]["records_per_s_wall"] / out["hybrid"]["add_one_per_call"]["records_per_s_wall"],
        1)
    out["machine"]["load_avg_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
