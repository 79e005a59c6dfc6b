"""What durability costs a writer: single adds and batched adds at each level of ``Memory(durability=...)``.

For each level ("fsync", the default; "flush"; "none") on a fresh memory directory:

* **single adds**: ``--singles`` calls of ``Memory.add`` with one record each (an agent's loop adds one
  turn at a time): writes per second and the p50 / p99 latency of one call;
* **batched adds**: the synthetic records in batches of ``--batch`` (an import, a backfill): records
  per second, and the ratio to "none" (the issue-36 budget: the default loses at most 10%) -- by the
  wall clock and by the process's CPU time (which a busy machine does not distort); then the
  same through a final ``save()`` (``batched_then_saved``): "none" keeps nothing before it, while the
  logged levels' background checkpoints (every ``CHECKPOINT_EVERY`` records) already wrote part of it.

* **frame encoding**: CPU milliseconds per 1,000 records to encode the log frame of a batched add, the
  binary frame written now and the JSON frame of the version before.

The levels run interleaved round by round (``--rounds``; each round starts with another level, after
one untimed warm-up round), each on a new directory, and the median round is reported, so neither a
slow phase of the machine nor the order lands on one level. The disk under
``--dir`` (default: a temporary directory) is what the fsyncs pay for; it is named in the output.

    python bench/bench_durability.py --out bench/results/bench_durability_vm.json

Writes JSON (the machine named: CPU model, Python, NumPy, the gpuir commit, the file system).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu import cpu_model

from gpuir import Memory
from gpuir.synthetic import iter_records

LEVELS = ("fsync", "flush", "none")


def _fs(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=True).stdout
        return " ".join(out.splitlines()[-1].split()[:2])
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def one_round(level: str, base: Path, singles: list[dict], batches: list[list[dict]]) -> dict:
    d = base / f"{level}-{time.monotonic_ns()}"
    m = Memory(durability=level)
    m.save(d)
    lat = []
    for r in singles:
        t0 = time.perf_counter()
        m.add([r])
        lat.append(time.perf_counter() - t0)
    m.close(discard_unsaved=True)  # ("none": the writes are measured, not kept)
    shutil.rmtree(d)
    d = base / f"{level}-b-{time.monotonic_ns()}"
    m = Memory(durability=level)
    m.save(d)
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches:
        n += m.add(b)
    batch_s, batch_cpu = time.perf_counter() - t0, time.process_time() - c0
    m.wait_merges()
    m.save()  # on disk in segments at every level: what "none" must do to keep anything
    saved_s, saved_cpu = time.perf_counter() - t0, time.process_time() - c0
    m.close()
    shutil.rmtree(d)
    lat_ms = np.asarray(lat) * 1e3
    return {"single_adds_per_s": len(lat) / float(np.sum(lat)), "single_p50_ms": float(np.percentile(lat_ms, 50)),
            "single_p99_ms": float(np.percentile(lat_ms, 99)), "batched_records_per_s": n / batch_s,
            "batched_then_saved_records_per_s": n / saved_s,
            # CPU time of the process (every thread: merges, checkpoints): what the log costs whatever waits
            "batched_cpu_records_per_s": n / batch_cpu, "batched_then_saved_cpu_records_per_s": n / saved_cpu}


def frame_encoding(batches: list[list[dict]], repeats: int = 3) -> dict:
    """CPU milliseconds per 1,000 records to encode the memory log's frame of a batched add: the binary frame
    written now (``gpuir.memory.durable.encode_op``) and the JSON frame of the version before (``_json_form``)."""
    from gpuir.memory import durable
    from gpuir.memory.intake import to_batch
    from gpuir.wal import encode_payload

    ops = []
    seq = 0
    for b in batches:
        rb = to_batch(b, None)
        ops.append({"op": "add", "batch": rb, "seqs": np.arange(seq, seq + len(b)), "vectors": None})
        seq += len(b)
    n = sum(len(b) for b in batches)
    out = {}
    for name, enc in (("binary", durable.encode_op), ("json", lambda op: encode_payload(durable._json_form(op)))):
        best = float("inf")
        for _ in range(repeats):
            c0 = time.process_time()
            size = sum(len(enc(op)) for op in ops)
            best = min(best, time.process_time() - c0)
        out[name] = {"cpu_ms_per_1000_records": best / n * 1e6, "bytes_per_record": size / n}
    out["json_over_binary"] = out["json"]["cpu_ms_per_1000_records"] / out["binary"]["cpu_ms_per_1000_records"]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--singles", type=int, default=500, help="single-record adds per level and round")
    ap.add_argument("--records", type=int, default=50_000, help="records added in batches per level and round")
    ap.add_argument("--batch", type=int, default=1_000, help="records per batched add")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where the memories are written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--note", default="", help="a label kept in the output (e.g. 'under load: ...')")
    args = ap.parse_args(argv)
    if min(args.singles, args.records, args.batch, args.rounds) < 1:
        ap.error("--singles, --records, --batch and --rounds must be positive")
    recs = [r for chunk in iter_records(args.records + args.singles, seed=0) for r in chunk]
    singles = recs[args.records:]
    batches = [recs[i:i + args.batch] for i in range(0, args.records, args.batch)]
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="gpuir-durability-"))
    load_before = os.getloadavg()
    rounds: dict[str, list[dict]] = {lv: [] for lv in LEVELS}
    try:
        encoding = frame_encoding(batches)
        print(f"frame encoding: {encoding}", file=sys.stderr, flush=True)
        for lv in LEVELS:  # an untimed round first: imports, numba's compiled functions, the page cache
            one_round(lv, base, singles[:20], batches[:2])
        for r in range(args.rounds):
            for lv in LEVELS[r % 3:] + LEVELS[:r % 3]:  # each level first in some round: no order effect
                rounds[lv].append(one_round(lv, base, singles, batches))
                print(f"round {r + 1}/{args.rounds} {lv}: {rounds[lv][-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    med = {lv: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for lv, rs in rounds.items()}
    for lv in LEVELS:
        med[lv]["batched_vs_none"] = med[lv]["batched_records_per_s"] / med["none"]["batched_records_per_s"]
        med[lv]["batched_then_saved_vs_none"] = (med[lv]["batched_then_saved_records_per_s"]
                                                 / med["none"]["batched_then_saved_records_per_s"])
        for key in ("batched_cpu", "batched_then_saved_cpu"):
            med[lv][f"{key}_vs_none"] = med[lv][f"{key}_records_per_s"] / med["none"][f"{key}_records_per_s"]
    out = {"bench": "durability", "levels": med, "frame_encoding": encoding, "rounds": rounds,
           "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "machine": {"cpu_model": cpu_model(), "logical_cores": os.cpu_count(), "filesystem": _fs(base.parent),
                       "python": platform.python_version(), "numpy": np.__version__,
                       "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
           "note": args.note,
           "commit": _commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps(med, indent=2))
    return out


if __name__ == "__main__":
    main()
