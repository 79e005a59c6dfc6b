"""One batch of the GPU search, bracketed for a profiler (Nsight Compute) on a device machine.

    ncu --clock-control none --profile-from-start off --set detailed -o /tmp/p python bench/gpu_profile.py
    python bench/gpu_profile.py --n-docs 2700000 --batch 1024 -k 10     # without a profiler: kernel times

The corpus and queries are ``bench/gpu_verify.py``'s (Zipf terms, Poisson lengths, queries drawn from
documents). The batch is searched ``--warm`` times first (compilation, the directory, allocations), then
once between ``cudaProfilerStart`` and ``cudaProfilerStop``, so a profiler started with
``--profile-from-start off`` sees exactly one search's kernels. Without a profiler the script prints the
phase times of that search (``CupyScorer.timing``) and its counters as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _profiler(cp, what: str) -> None:
    """cudaProfilerStart / cudaProfilerStop (absent from the kernel model's fake cupy: then nothing)."""
    fn = getattr(getattr(getattr(cp, "cuda", None), "profiler", None), what, None)
    if fn is not None:
        fn()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-docs", type=int, default=2_700_000)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--warm", type=int, default=2, help="searches before the profiled one")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if min(a.n_docs, a.batch, a.k) < 1 or a.warm < 0:
        p.error("--n-docs, --batch and -k must be positive, --warm non-negative")

    import cupy as cp
    from gpu_verify import cycle, make_index, make_queries

    from gpuir.backends.cupy_backend import CupyScorer
    from gpuir.bm25 import BM25Params

    t = time.perf_counter()
    # the corpus is drawn on the device (the kernel model's fake cupy has no random: NumPy then)
    idx, tok_off, tok = make_index(a.n_docs, a.seed, cp if hasattr(cp, "random") else np)
    qs = cycle(make_queries(tok_off, tok, idx.n_terms, 2048, a.seed), a.batch)
    gpu = CupyScorer(idx, BM25Params())
    build_s = time.perf_counter() - t
    sync = getattr(cp.cuda.runtime, "deviceSynchronize", lambda: None)  # (the model runs synchronously)
    for _ in range(a.warm):
        gpu.search(qs, a.k)
    sync()
    _profiler(cp, "start")
    t = time.perf_counter()
    res = gpu.search(qs, a.k)
    sync()
    wall = time.perf_counter() - t
    _profiler(cp, "stop")
    gpu.timing = True
    timed = gpu.search(qs, a.k)
    keys = ("candidates", "tiles_scored", "tile_items", "light_pairs", "overflow_rows", "persistent_blocks",
            "blocks_scored", "blocks_skipped", "n_tiles")
    print(json.dumps({"n_docs": a.n_docs, "batch": a.batch, "k": a.k, "postings": int(idx.n_postings),
                      "build_s": round(build_s, 2), "profiled_search_s": wall,
                      "phases_s": timed.meta.get("timings"), **{k: res.meta.get(k) for k in keys}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
