#!/usr/bin/env python
"""GPU BM25 benchmark (issue 3): queries/s and per-phase time, against the peers.

Corpora: LongMemEval-S (the loader's documents, see gpuir.eval.datasets) and
synthetic agent memory of 1M and 5M records (gpuir.synthetic.generate).
Batch sizes 1 .. 4096 (powers of 4 by default), k in {10, 100, 1000}.

Systems, in one process, same queries, same tokens where the library allows:

* ``gpuir-cupy``   -- this repository's CUDA kernels (phases: h2d, score, top-k, d2h)
* ``gpuir-numpy``  -- the NumPy reference
* ``bm25s-numpy``, ``bm25s-numba`` -- bm25s (pip install 'gpuir[bench]')
* ``bm25s-cupy``   -- optional; bm25s's CuPy path lives in a separate
  environment (``--bm25s-cupy-python /path/to/python``) and is run as a subprocess
* ``torch-sparse`` -- a torch baseline: CSR (N x V) document-term weight matrix
  times a (V x B) query matrix (torch.sparse.mm), then torch.topk, on the GPU

Bandwidth floor: the fused design reads each posting of each query term at
most once (doc id + float32 weight, 8 bytes); the floor of a batch is those
bytes over the device-to-device copy bandwidth measured here (cupy copy of a
1 GiB buffer); reported as ``floor_s`` and ``fraction_of_floor`` per cell.
For correctness checks and the sanitizers, run bench/gpu_verify.py first.

Method: warm-up runs, then the median of ``--repeats`` timed runs per cell;
JSON to ``bench/results/gpu_<gpu>_<date>.json`` naming the GPU, driver, CUDA,
CuPy, torch, bm25s and gpuir versions and the CPU.

Without a usable GPU it exits 2 with the reason (it never falls back silently).
Not run in the session that wrote it: no GPU was available there.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SYSTEMS = ("gpuir-cupy", "gpuir-numpy", "bm25s-numpy", "bm25s-numba", "bm25s-cupy", "torch-sparse")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", nargs="+", default=["longmemeval-s", "synthetic-1m", "synthetic-5m"],
                   help="longmemeval-s, synthetic-<N>[k|m] (e.g. synthetic-1m)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024, 4096])
    p.add_argument("-k", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--systems", nargs="+", default=[s for s in SYSTEMS if s != "bm25s-cupy"], choices=SYSTEMS)
    p.add_argument("--n-queries", type=int, default=4096, help="queries drawn per corpus (cycled for big batches)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cpu-max-batch", type=int, default=256,
                   help="largest batch timed on CPU systems (they are linear in B)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--longmemeval-path", default=None)
    p.add_argument("--bm25s-cupy-python", default=None, help="python of an env with bm25s + cupy")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/gpu_<gpu>_<date>.json)")
    return p.parse_args(argv)


def median_time(fn: Callable[[], Any], repeats: int, warmup: int, sync: Callable[[], None] = lambda: None):
    for _ in range(warmup):
        fn()
    sync()
    ts, last = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        last = fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), last


def machine() -> dict[str, Any]:
    from gpuir import __version__
    from gpuir.gpu_info import gpu_report

    info: dict[str, Any] = {"gpuir": __version__, "python": sys.version.split()[0],
                            "platform": platform.platform(), "cpu": platform.processor() or platform.machine()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info["gpu"] = gpu_report()
    for mod in ("cupy", "torch", "bm25s", "numba", "numpy"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional peers
            info[mod] = None
    return info


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (GB/s, read + write counted)."""
    import cupy as cp

    a = cp.empty(nbytes // 4, dtype=cp.float32)
    b = cp.empty_like(a)
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    b[...] = a
    ev0.record()
    for _ in range(10):
        b[...] = a
    ev1.record()
    ev1.synchronize()
    s = cp.cuda.get_elapsed_time(ev0, ev1) / 1e3 / 10
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / s / 1e9


def load_corpus(name: str, args) -> tuple[list[str], list[str], list[str]]:
    """(doc ids, doc texts, query texts)."""
    if name == "longmemeval-s":
        from gpuir.eval.datasets import load_longmemeval

        ds = load_longmemeval(args.longmemeval_path, split="s")
        qs = [getattr(q, "text", None) or q.question for q in ds.queries]
        return ds.doc_ids, ds.doc_texts, qs
    if name.startswith("synthetic-"):
        from gpuir.synthetic import generate

        n = name.split("-", 1)[1].lower()
        mult = {"k": 1_000, "m": 1_000_000}.get(n[-1], 1)
        n_rec = int(float(n.rstrip("km")) * mult)
        c = generate(n_rec, n_queries=args.n_queries, seed=args.seed)
        return c.ids, c.texts, c.queries
    raise SystemExit(f"unknown corpus {name!r}: use longmemeval-s or synthetic-<N>[k|m]")


def batch_of(queries: list[str], b: int) -> list[str]:
    reps = -(-b // len(queries))
    return (queries * reps)[:b]


def torch_sparse_runner(index, device: str):
    """Document-term weights as a torch CSR matrix on the GPU; returns run(term_lists, k)."""
    import torch

    from gpuir.backends.numpy_backend import NumpyScorer

    ref = NumpyScorer(index.csr, index.params)
    csr = index.csr
    term_of = np.repeat(np.arange(csr.n_terms), np.diff(csr.offsets))
    # (N x V) with rows = documents: transpose the term-major postings.
    order = np.lexsort((term_of, csr.doc_ids))
    crow = np.zeros(csr.n_docs + 1, dtype=np.int64)
    crow[1:] = np.cumsum(np.bincount(csr.doc_ids, minlength=csr.n_docs))
    W = torch.sparse_csr_tensor(
        torch.from_numpy(crow), torch.from_numpy(term_of[order].astype(np.int64)),
        torch.from_numpy(ref.weights[order]), size=(csr.n_docs, csr.n_terms), device=device,
    )

    def run(term_lists, k):
        rows, cols, vals = [], [], []
        for i, t in enumerate(term_lists):
            u, c = np.unique(t, return_counts=True)
            rows.append(u)
            cols.append(np.full(u.size, i))
            vals.append(c.astype(np.float32))
        B = len(term_lists)
        Q = torch.zeros((csr.n_terms, B), device=device)
        if rows:
            Q[torch.from_numpy(np.concatenate(rows)).to(device), torch.from_numpy(np.concatenate(cols)).to(device)] = \
                torch.from_numpy(np.concatenate(vals)).to(device)
        S = (W @ Q).T  # (B, N)
        return torch.topk(S, min(k, csr.n_docs), dim=1)

    return run, (lambda: torch.cuda.synchronize())


def bm25s_runner(ids, texts, backend: str):
    import bm25s

    ret = bm25s.BM25(backend=backend)
    ret.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)

    def run(qs, k):
        return ret.retrieve(bm25s.tokenize(qs, show_progress=False), k=min(k, len(texts)),
                            show_progress=False, n_threads=0)

    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    from gpuir._compat import cuda_device

    usable, why = cuda_device()
    if not usable:
        print(f"bench_gpu: no GPU can be used: {why}. This benchmark measures the cupy backend "
              "against its peers and needs an NVIDIA GPU with 'gpuir[gpu]' installed; for CPU "
              "numbers use bench/bench_cpu.py.", file=sys.stderr)
        return 2
    import cupy as cp

    from gpuir.engine import BM25Index

    info = machine()
    bw = copy_bandwidth_gbs()
    results: list[dict[str, Any]] = []
    for corpus in args.corpora:
        ids, texts, queries = load_corpus(corpus, args)
        t0 = time.perf_counter()
        index = BM25Index.build(texts, ids=ids, progress=False)
        build_s = time.perf_counter() - t0
        N = index.n_docs
        terms_all = index.query_terms(queries)
        gpu = index.scorer("cupy")
        runners: dict[str, Any] = {}
        if "gpuir-numpy" in args.systems:
            np_scorer = index.scorer("numpy")
            runners["gpuir-numpy"] = (lambda ts, k, s=np_scorer: s.search(ts, k), lambda: None)
        if "torch-sparse" in args.systems:
            try:
                runners["torch-sparse"] = torch_sparse_runner(index, "cuda")
            except Exception as e:  # noqa: BLE001
                print(f"torch-sparse skipped: {e}", file=sys.stderr)
        for b_backend in ("numpy", "numba"):
            if f"bm25s-{b_backend}" in args.systems:
                try:
                    r = bm25s_runner(ids, texts, b_backend)
                    runners[f"bm25s-{b_backend}"] = (lambda ts, k, qs=None, r=r: r(qs, k), lambda: None)
                except Exception as e:  # noqa: BLE001
                    print(f"bm25s-{b_backend} skipped: {e}", file=sys.stderr)
        from gpuir.progress import progress_bar

        for k, B in progress_bar([(k, B) for k in args.k for B in args.batch_sizes], desc=f"{corpus} k x batch",
                                 unit="case"):  # on a terminal only
            qb = batch_of(queries, B)
            tb = batch_of(terms_all, B)
            df = np.diff(index.csr.offsets)
            floor = 8 * sum(int(df[np.unique(t)].sum()) for t in tb) / (bw * 1e9)
            med, res = median_time(lambda gpu=gpu, tb=tb, k=k: gpu.search(tb, k), args.repeats, args.warmup,
                                   cp.cuda.Device().synchronize)
            results.append({"corpus": corpus, "n_docs": N, "system": "gpuir-cupy", "k": k, "batch": B,
                            "median_s": med, "qps": B / med, "phases": res.meta["timings"],
                            "floor_s": floor, "fraction_of_floor": floor / med})
            for name, (run, sync) in runners.items():
                if name != "torch-sparse" and B > args.cpu_max_batch:
                    continue
                if name.startswith("bm25s"):
                    fn = (lambda run=run, qb=qb, k=k: run(None, k, qs=qb))
                else:
                    fn = (lambda run=run, tb=tb, k=k: run(tb, k))
                try:
                    med, _ = median_time(fn, args.repeats, args.warmup, sync)
                except Exception as e:  # noqa: BLE001 - e.g. torch OOM on a 5M x 4096 buffer
                    results.append({"corpus": corpus, "system": name, "k": k, "batch": B, "error": str(e)})
                    continue
                results.append({"corpus": corpus, "n_docs": N, "system": name, "k": k, "batch": B,
                                "median_s": med, "qps": B / med})
            print(json.dumps(results[-1]), file=sys.stderr)
        if args.bm25s_cupy_python:
            cmd = [args.bm25s_cupy_python, "-c", "import bm25s, cupy; print('ok')"]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            results.append({"corpus": corpus, "system": "bm25s-cupy",
                            "note": "run bench in that env with --systems bm25s-cupy", "probe": r.stdout.strip()})
        results.append({"corpus": corpus, "n_docs": N, "build_s": build_s, "system": "build"})
    gpu_name = (info["gpu"].get("nvml", {}).get("devices") or [{"name": "gpu"}])[0]["name"]
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / (
        f"gpu_{gpu_name.replace(' ', '_')}_{_dt.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": info, "copy_bandwidth_gbs": bw, "args": vars(args),
                               "results": results}, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
