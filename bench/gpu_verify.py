#!/usr/bin/env python
"""Verify and time the GPU path on a device, in one command that fits a 10-minute call.

    python bench/gpu_verify.py --out bench/results/            # everything (~8 min budget)
    python bench/gpu_verify.py --quick --out bench/results/    # smaller grid (~3 min)
    python bench/gpu_verify.py --parts tests sanitize          # some parts only
    python bench/gpu_verify.py --dry-run --out /tmp/x          # no device: kernel model, tiny sizes

Parts (``--parts``, default all, in this order):

* ``tests``    -- the GPU test suite: ``pytest --require-gpu -m gpu tests/`` (fails
  instead of skipping when no device can be used).
* ``sanitize`` -- compute-sanitizer memcheck, racecheck, synccheck and initcheck
  on a workload that launches every kernel (tile and haystack scoring, dense
  rows, the selection and its sort path), with CuPy's memory pools disabled
  so that every allocation is visible to the tool; the workload also checks
  its results against NumPy.
* ``scale``    -- cases a small test cannot reach: B x N > 2^31 (no B x N buffer
  exists any more), more rows than one wave of the selection, k > 4096, doc ids
  past 2^22. Every returned (id, score) is checked against the NumPy
  reference's score for that id (exact float32 bits), rows for order,
  uniqueness and padding, a sample of rows against ``NumpyScorer`` in full, and
  the same batch is run twice and compared.
* ``timings``  -- per-phase times (host prep, transfers, scoring, top-k) at
  N in {190k, 2.7M, 8.8M} x B in {1, 16, 128, 1024} x k in {10, 100, 1000}
  (``--quick``: fewer), queries/s, p50 latency of one query, and each as a
  fraction of the postings floor: the bytes of the query terms' postings
  (doc id + weight, 8 bytes each) over the device-to-device copy bandwidth
  measured here.
* ``filtered`` -- LongMemEval-shaped batches: one 500-record haystack per query,
  contiguous (a tenant's own range) and scattered; per-query time, the path
  each row took, exactness against NumPy.
* ``bm25s``    -- bm25s with its numba backend on this machine's CPU, same corpus
  and queries (optional: skipped, and said so, when bm25s/numba are missing).

Corpora are generated on the device (a vectorised Zipf generator, :func:`zipf_csr`;
nothing large is carried to the machine). Output: ``gpu_verify_<device>_<date>.json``
and ``.md`` in ``--out`` naming the device, driver, CUDA and CuPy versions; a
short table is printed last. ``--budget-s`` (default 540) stops starting new
cells when the time is spent and records which were skipped.

``--dry-run`` runs every part without a device: the kernels are the NumPy model
(:mod:`gpuir.backends.kernel_model`) behind a fake ``cupy``, the GPU tests run on
it through ``gpuir.backends.model_device_plugin``, sanitizer commands are
printed but not run, sizes are tiny, and no timing is a GPU figure (the JSON
says ``"dry_run": true``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("tests", "sanitize", "scale", "timings", "filtered", "bm25s")
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
FULL = {"n_docs": [190_000, 2_700_000, 8_800_000], "batch": [1, 16, 128, 1024], "k": [10, 100, 1000]}
QUICK = {"n_docs": [190_000, 2_700_000], "batch": [1, 128, 1024], "k": [10, 100]}
DRY = {"n_docs": [3000], "batch": [1, 8], "k": [10]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for the JSON and markdown")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, help="parts to run (default all)")
    p.add_argument("--quick", action="store_true", help="smaller grid (N <= 2.7M, fewer B and k)")
    p.add_argument("--dry-run", action="store_true", help="no device: kernel model, tiny sizes, no GPU figures")
    p.add_argument("--n-docs", type=int, nargs="+", default=None, help="override the corpus sizes")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="override the batch sizes")
    p.add_argument("-k", type=int, nargs="+", default=None, help="override k")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this many seconds")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per cell (B = 1: 5x as many)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    grid = DRY if a.dry_run else (QUICK if a.quick else FULL)
    a.n_docs = a.n_docs or grid["n_docs"]
    a.batch = a.batch or grid["batch"]
    a.k = a.k or grid["k"]
    for name in ("n_docs", "batch", "k"):
        if min(getattr(a, name)) < 1:
            p.error(f"--{name.replace('_', '-')} values must be positive")
    if a.budget_s <= 0:
        p.error("--budget-s must be positive")
    return a


# =============================================================================
# Corpus and queries
# =============================================================================
def zipf_csr(n_docs: int, n_terms: int, mean_len: float, seed: int, xp: Any):
    """A synthetic CSR index: Poisson document lengths, Zipf (1/rank) term draws.

    Runs on the device when ``xp`` is cupy (a sort of the (term, doc) keys), so
    millions of documents take seconds.

    Returns
    -------
    offsets (V+1,) int64, doc_ids (P,) int32, tfs (P,) int32, doc_lens (N,) int32,
    and (tok_off (N+1,) int64, tok_terms (T,) int32): each document's tokens (for
    queries and bm25s) -- all host arrays.
    """
    rs = xp.random.RandomState(seed)
    lens = xp.maximum(rs.poisson(mean_len, n_docs), 1).astype(xp.int64)
    tok_off = xp.zeros(n_docs + 1, dtype=xp.int64)
    tok_off[1:] = xp.cumsum(lens)
    total = int(tok_off[-1])
    doc = xp.searchsorted(tok_off, xp.arange(total, dtype=xp.int64), side="right") - 1
    u = rs.random_sample(total)
    rank = xp.minimum(xp.floor(xp.exp(u * np.log(n_terms + 1.0))).astype(xp.int64) - 1, n_terms - 1)
    perm = xp.asarray(np.random.default_rng(seed).permutation(n_terms).astype(np.int64))
    term = perm[rank]  # heavy terms spread over the id range
    del u, rank
    key, tf = xp.unique(term * n_docs + doc, return_counts=True)
    t_sorted = key // n_docs
    offsets = xp.searchsorted(t_sorted, xp.arange(n_terms + 1, dtype=xp.int64), side="left")
    get = (lambda a: a.get()) if hasattr(xp, "cuda") else (lambda a: np.asarray(a))
    out = (get(offsets).astype(np.int64), get(key % n_docs).astype(np.int32), get(tf).astype(np.int32),
           get(lens).astype(np.int32), get(tok_off), get(term).astype(np.int32))
    return out


def make_index(n_docs: int, seed: int, xp: Any):
    from gpuir.index.csr import CSRIndex

    n_terms = max(1000, min(400_000, n_docs // 20))
    offsets, doc_ids, tfs, lens, tok_off, tok = zipf_csr(n_docs, n_terms, 30.0, seed, xp)
    idx = CSRIndex(offsets=offsets, doc_ids=doc_ids, tfs=tfs, doc_lens=lens,
                   vocab=[f"t{i:07d}" for i in range(n_terms)], ids=_Ids(n_docs))
    return idx, tok_off, tok


class _Ids(list):
    """Document ids "0".."N-1" without materialising millions of strings."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return str(range(self.n)[i])


def make_queries(tok_off: np.ndarray, tok: np.ndarray, n_terms: int, n: int, seed: int) -> list[np.ndarray]:
    """n queries: 2-6 tokens of a random document, plus sometimes a random Zipf term (may miss)."""
    rng = np.random.default_rng(seed + 1)
    docs = rng.integers(0, tok_off.size - 1, n)
    out = []
    for d in docs.tolist():
        toks = tok[tok_off[d]:tok_off[d + 1]]
        q = rng.choice(toks, size=min(toks.size, int(rng.integers(2, 7))), replace=False)
        if rng.random() < 0.3:
            q = np.append(q, int(np.exp(rng.random() * np.log(n_terms + 1.0))) - 1)
        out.append(np.asarray(q, np.int64))
    return out


# =============================================================================
# Exactness checks
# =============================================================================
def reference_scores(ref, q: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The NumPy reference's float32 score of each document ``ids`` for query ``q``.

    Uses the reference's own exact rescoring (``NumpyScorer._exact_scores``:
    ascending term id from 0.0, ``w * float32(c)`` for repeats) plus its row
    constant for bm25l / bm25+.

    Returns
    -------
    scores : ndarray (m,), float32, host
    matched : ndarray (m,), bool, host: the document holds at least one query term
    """
    terms, mult = np.unique(q, return_counts=True)
    order = np.argsort(ids, kind="stable")
    s = np.empty(ids.size, np.float32)
    s[order] = ref._exact_scores(ids[order], terms, mult)
    if ref._has_w0:
        s = s + np.float32((ref.w0[terms] * mult).sum(dtype=np.float32))
    idx = ref.index
    hit = np.zeros(ids.size, bool)
    for t in terms.tolist():
        hit |= np.isin(ids, idx.doc_ids[idx.offsets[t]:idx.offsets[t + 1]])
    return s, hit


def check_results(ref, queries, res, allow=None) -> dict[str, Any]:
    """Every returned (id, score) against the reference score for that id; order, uniqueness, padding."""
    bad_score = bad_order = bad_dup = bad_filter = 0
    n_checked = 0
    mag = np.uint32(0x7FFFFFFF)
    for i, q in enumerate(queries):
        ids, sc = res.ids[i], res.scores[i]
        m = ids >= 0
        if not np.all(m[:m.sum()]) or not np.all(np.isneginf(sc[~m])):
            bad_order += 1
        d, s = ids[m], sc[m]
        if d.size == 0:
            continue
        want, hit = reference_scores(ref, np.asarray(q, np.int64), d)
        n_checked += d.size
        bad_score += int(np.count_nonzero(((want.view(np.uint32) & mag) != (s.view(np.uint32) & mag)) | ~hit))
        if np.unique(d).size != d.size:
            bad_dup += 1
        if not np.all((s[:-1] > s[1:]) | ((s[:-1] == s[1:]) & (d[:-1] < d[1:]))):
            bad_order += 1
        if allow is not None and allow[i] is not None and not np.isin(d, allow[i]).all():
            bad_filter += 1
    return {"pairs_checked": n_checked, "wrong_scores": bad_score, "misordered_rows": bad_order,
            "duplicate_rows": bad_dup, "filter_violations": bad_filter,
            "ok": bad_score == bad_order == bad_dup == bad_filter == 0}


def exact_equal(a, b) -> bool:
    mag = np.uint32(0x7FFFFFFF)
    return bool(np.array_equal(a.ids, b.ids)
                and np.array_equal(a.scores.view(np.uint32) & mag, b.scores.view(np.uint32) & mag))


# =============================================================================
# Machine description
# =============================================================================
def machine(dry: bool) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_gpu import machine as base_machine  # versions of gpuir, Python, NumPy, CuPy, CPU, gpu_report

    info = base_machine()
    info["dry_run"] = dry
    info["cpu_count"] = os.cpu_count()
    if dry:
        info["device"] = "none (dry run: NumPy kernel model)"
        info["cupy"] = None
        return info
    import cupy as cp

    rep = info["gpu"]
    props = cp.cuda.runtime.getDeviceProperties(0)
    info["device"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    info["sm_count"] = int(props.get("multiProcessorCount", 0))
    info["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    info["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    info["driver"] = rep.get("nvml", {}).get("driver")
    with contextlib.suppress(Exception):
        from cupy.cuda import nvrtc

        info["nvrtc"] = ".".join(map(str, nvrtc.getVersion()))
    return info


# =============================================================================
# Parts
# =============================================================================
class Run:
    """Shared state: arguments, clock, results, the corpora built so far."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.t0 = time.perf_counter()
        self.out: dict[str, Any] = {"args": {k: v for k, v in vars(args).items()}, "parts": {}, "skipped": []}
        self._corpora: dict[int, Any] = {}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def skip(self, what: str) -> None:
        self.out["skipped"].append(what)
        print(f"[gpu_verify] budget spent: skipped {what}", file=sys.stderr)

    def xp(self):
        if self.args.dry_run:
            return np
        import cupy

        return cupy

    def corpus(self, n_docs: int):
        """(index, NumPy reference scorer, queries pool, tokens) for N documents, generated once."""
        if n_docs not in self._corpora:
            from gpuir.backends.numpy_backend import NumpyScorer
            from gpuir.bm25 import BM25Params

            t = time.perf_counter()
            idx, tok_off, tok = make_index(n_docs, self.args.seed, self.xp())
            ref = NumpyScorer(idx, BM25Params())
            qs = make_queries(tok_off, tok, idx.n_terms, max(self.args.batch + [1024]), self.args.seed)
            self._corpora[n_docs] = (idx, ref, qs, (tok_off, tok))
            print(f"[gpu_verify] corpus N={n_docs}: {idx.n_postings} postings, V={idx.n_terms}, "
                  f"{time.perf_counter() - t:.1f}s", file=sys.stderr)
        return self._corpora[n_docs]

    def scorer(self, n_docs: int, **opts):
        """The CupyScorer of corpus N (one at a time on the device), built once per options."""
        from gpuir.backends.cupy_backend import CupyScorer
        from gpuir.bm25 import BM25Params

        key = (n_docs, tuple(sorted(opts.items())))
        if getattr(self, "_scorer_key", None) != key:
            self._scorer = None
            idx = self.corpus(n_docs)[0]
            t = time.perf_counter()
            self._scorer = CupyScorer(idx, BM25Params(), **opts)
            self._scorer_key = key
            print(f"[gpu_verify] scorer N={n_docs}: {time.perf_counter() - t:.1f}s "
                  f"(directory {self._scorer.directory_bytes / 1e6:.1f} MB)", file=sys.stderr)
        return self._scorer


def part_tests(run: Run) -> dict[str, Any]:
    if run.args.dry_run:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "gpuir.backends.model_device_plugin", "-m", "gpu", "tests/test_cupy_backend.py"]
    else:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--require-gpu", "-m", "gpu", "tests/"]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False,
                       timeout=max(30.0, min(300.0, run.left())))
    lines = (r.stdout + r.stderr).strip().splitlines()
    out = {"cmd": " ".join(cmd), "returncode": r.returncode, "ok": r.returncode == 0, "summary": lines[-3:],
           "seconds": round(time.perf_counter() - t, 1), "on": "kernel model" if run.args.dry_run else "device"}
    if r.returncode != 0:
        out["failures"] = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:30]
    try:
        import Stemmer  # noqa: F401 - PyStemmer, needed by the default analyzer of engine-level tests
    except ImportError:
        out["note"] = ("PyStemmer is not installed: gpu tests that build an index with the default analyzer "
                       "fail for that reason alone; carry the PyStemmer wheel to the device")
    return out


SANITIZE_WORKLOAD = r"""
import sys, numpy as np
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import cupy
cupy.cuda.set_allocator(None); cupy.cuda.set_pinned_memory_allocator(None)  # every allocation visible
from _helpers import random_index, random_queries
from gpuir.backends.cupy_backend import CupyScorer
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import BM25Params
N = 20011
idx = random_index(N, 300, seed=1)
qs = random_queries(300, 12, seed=2)
rng = np.random.default_rng(3)
allow = [None, np.sort(rng.choice(N, 500, replace=False)), np.arange(9000, 9500), None] * 3
bad = 0
for method, hay in (("lucene", "auto"), ("bm25+", "always")):
    ref, gpu = NumpyScorer(idx, BM25Params(method=method)), CupyScorer(idx, BM25Params(method=method), haystack=hay)
    for k, al in ((10, None), (100, allow), (5000, None)):
        a, b = ref.search(qs, k, al), gpu.search(qs, k, al)
        bad += not (np.array_equal(a.ids, b.ids) and np.array_equal(np.abs(a.scores), np.abs(b.scores)))
    bad += not np.array_equal(ref.score_matrix(qs[:3], allow[:3]), gpu.score_matrix(qs[:3], allow[:3]))
print("mismatches", bad)
sys.exit(1 if bad else 0)
"""


def _sanitizer() -> str | None:
    return shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",
                     "/usr/local/cuda/compute-sanitizer/compute-sanitizer") if os.access(p, os.X_OK)), None)


def part_sanitize(run: Run) -> dict[str, Any]:
    code = SANITIZE_WORKLOAD.format(root=str(ROOT), tests=str(ROOT / "tests"))
    tool = _sanitizer()
    out: dict[str, Any] = {}
    for t in SANITIZER_TOOLS:
        cmd = [tool or "compute-sanitizer", "--tool", t, "--error-exitcode", "99", "--print-limit", "20",
               sys.executable, "-c", "<workload>"]
        if run.args.dry_run:
            out[t] = {"cmd": " ".join(cmd), "ran": False, "note": "dry run: not executed"}
            continue
        if tool is None:
            out[t] = {"ran": False, "ok": False, "note": "compute-sanitizer not found (CUDA toolkit)"}
            continue
        if run.left() < 30:
            run.skip(f"sanitize {t}")
            continue
        ts = time.perf_counter()
        try:
            r = subprocess.run([*cmd[:-1], code], capture_output=True, text=True, check=False,
                               timeout=max(30.0, min(240.0, run.left())))
            text = r.stdout + r.stderr
            errs = [ln for ln in text.splitlines() if "ERROR SUMMARY" in ln or "mismatches" in ln]
            out[t] = {"ran": True, "ok": r.returncode == 0, "returncode": r.returncode, "summary": errs[-3:],
                      "seconds": round(time.perf_counter() - ts, 1)}
            if r.returncode != 0:
                out[t]["tail"] = text.strip().splitlines()[-30:]
        except subprocess.TimeoutExpired:
            out[t] = {"ran": True, "ok": False, "note": "timed out"}
    return out


def part_scale(run: Run) -> dict[str, Any]:
    n = max(run.args.n_docs)
    _, ref, pool, _ = run.corpus(n)
    gpu = run.scorer(n)
    B = max(run.args.batch)
    cases = [("batch", B, 100), ("k>4096", min(B, 16), 5000)]
    if not run.args.dry_run:
        cases.append(("many rows", 20_000, 10))  # several waves of the selection
    out: dict[str, Any] = {"n_docs": n, "doc_ids_past_2^22": n > (1 << 22), "cases": []}
    for name, b, k in cases:
        if run.left() < 20:
            run.skip(f"scale {name}")
            continue
        qs = (pool * (-(-b // len(pool))))[:b]
        t = time.perf_counter()
        r1 = gpu.search(qs, k)
        dt = time.perf_counter() - t
        r2 = gpu.search(qs, k)
        chk = check_results(ref, qs[: min(b, 2048)], r1)
        case = {"case": name, "batch": b, "k": k, "BxN": b * n, "BxN_over_2^31": b * n > 2**31,
                "seconds": round(dt, 3), "same_twice": exact_equal(r1, r2), **chk,
                "candidates": r1.meta.get("candidates"), "overflow_rows": r1.meta.get("overflow_rows")}
        if run.left() > 60:
            sub = qs[:8]
            case["numpy_full_check_rows"] = len(sub)
            case["numpy_full_equal"] = exact_equal(ref.search(sub, k), gpu.search(sub, k))
        out["cases"].append(case)
        print(f"[gpu_verify] scale {name}: {json.dumps(case)}", file=sys.stderr)
    out["ok"] = all(c["ok"] and c["same_twice"] and c.get("numpy_full_equal", True) for c in out["cases"])
    return out


def _postings_bytes(idx, qs) -> int:
    tot = 0
    df = np.diff(idx.offsets)
    for q in qs:
        tot += int(df[np.unique(q)].sum())
    return 8 * tot


def part_timings(run: Run, bw: float | None) -> dict[str, Any]:
    cells = []
    for n in run.args.n_docs:
        if run.left() < 30:
            run.skip(f"timings N={n}")
            continue
        idx, _, pool, _ = run.corpus(n)
        gpu = run.scorer(n)
        for k in run.args.k:
            for B in run.args.batch:
                if run.left() < 15:
                    run.skip(f"timings N={n} k={k} B={B}")
                    continue
                qs = (pool * (-(-B // len(pool))))[:B]
                gpu.search(qs, k)  # warm-up (and compile on first use)
                reps = run.args.repeats * (5 if B == 1 else 1)
                times, last = [], None
                for _ in range(reps):
                    t = time.perf_counter()
                    last = gpu.search(qs, k)
                    times.append(time.perf_counter() - t)
                med = statistics.median(times)
                floor = _postings_bytes(idx, qs) / (bw * 1e9) if bw else None
                cell = {"n_docs": n, "batch": B, "k": k, "median_s": med, "qps": B / med,
                        "p50_ms": 1e3 * med if B == 1 else None,
                        "phases_s": last.meta["timings"], "candidates": last.meta["candidates"],
                        "tiles_scored": last.meta["tiles_scored"], "n_tiles_x_rows": last.meta["n_tiles"] * B,
                        "overflow_rows": last.meta["overflow_rows"], "postings_floor_s": floor,
                        "fraction_of_floor": (floor / med) if floor else None}
                cells.append(cell)
                print(f"[gpu_verify] {json.dumps(cell)}", file=sys.stderr)
    return {"copy_bandwidth_gbs": bw, "cells": cells}


def part_filtered(run: Run) -> dict[str, Any]:
    n = run.args.n_docs[min(1, len(run.args.n_docs) - 1)]
    _, ref, pool, _ = run.corpus(n)
    gpu = run.scorer(n)
    B = min(500, max(run.args.batch)) if not run.args.dry_run else 4
    size = min(500, max(8, n // 50))  # LongMemEval-S: ~500 records per question
    rng = np.random.default_rng(run.args.seed + 7)
    qs = (pool * (-(-B // len(pool))))[:B]
    shapes = {
        "contiguous": [np.arange(s, s + size, dtype=np.int64) for s in rng.integers(0, n - size, B)],
        "scattered": [np.sort(rng.choice(n, size, replace=False)).astype(np.int64) for _ in range(B)],
    }
    out: dict[str, Any] = {"n_docs": n, "batch": B, "haystack": size, "shapes": {}}
    for name, allow in shapes.items():
        if run.left() < 15:
            run.skip(f"filtered {name}")
            continue
        gpu.search(qs, 10, allow)  # warm-up
        ts = []
        for _ in range(run.args.repeats):
            t = time.perf_counter()
            res = gpu.search(qs, 10, allow)
            ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        chk = check_results(ref, qs, res, allow)
        sub = slice(0, 16)
        equal = exact_equal(ref.search(qs[sub], 10, allow[sub]), gpu.search(qs[sub], 10, allow[sub]))
        out["shapes"][name] = {"median_s": med, "per_query_ms": 1e3 * med / B, "qps": B / med,
                               "haystack_rows": res.meta["haystack_rows"], "tile_rows": B - res.meta["haystack_rows"],
                               "phases_s": res.meta["timings"], "numpy_full_equal_16": equal, **chk}
        print(f"[gpu_verify] filtered {name}: {json.dumps(out['shapes'][name])}", file=sys.stderr)
    out["ok"] = all(v["ok"] and v["numpy_full_equal_16"] for v in out["shapes"].values())
    return out


def part_bm25s(run: Run) -> dict[str, Any]:
    try:
        import bm25s
        import numba  # noqa: F401 - the backend needs it
    except ImportError as e:
        return {"skipped": f"bm25s / numba not installed ({e})"}
    out: dict[str, Any] = {"bm25s": bm25s.__version__, "cells": []}
    for n in [x for x in run.args.n_docs if x <= 2_700_000]:
        if run.left() < 60:
            run.skip(f"bm25s N={n}")
            continue
        idx, _, pool, (tok_off, tok) = run.corpus(n)
        vocab = {f"t{i:07d}": i for i in range(idx.n_terms)}
        docs = [tok[a:b].tolist() for a, b in zip(tok_off[:-1].tolist(), tok_off[1:].tolist())]
        retr = bm25s.BM25(backend="numba")
        retr.index(bm25s.tokenization.Tokenized(ids=docs, vocab=vocab), show_progress=False)
        del docs
        for k in [x for x in run.args.k if x <= 100]:
            B = min(1024, max(run.args.batch))
            qs = bm25s.tokenization.Tokenized(ids=[q.tolist() for q in (pool * 2)[:B]], vocab=vocab)
            retr.retrieve(qs, k=k, show_progress=False, n_threads=-1)
            t = time.perf_counter()
            retr.retrieve(qs, k=k, show_progress=False, n_threads=-1)
            dt = time.perf_counter() - t
            out["cells"].append({"n_docs": n, "batch": B, "k": k, "seconds": dt, "qps": B / dt,
                                 "cpu_threads": os.cpu_count()})
    return out


# =============================================================================
# Report
# =============================================================================
def table(res: dict[str, Any]) -> str:
    m = res["machine"]
    versions = (f"driver {m.get('driver')}, CUDA runtime {m.get('cuda_runtime')} / driver {m.get('cuda_driver')}, "
                f"CuPy {m.get('cupy')}, NVRTC {m.get('nvrtc')}, gpuir {m.get('gpuir')}, {m.get('date')}")
    lines = [f"# gpu_verify: {m.get('device')}", "", versions, ""]
    if m.get("dry_run"):
        lines += ["**Dry run: no device. Kernels ran as the NumPy model; no figure below is a GPU figure.**", ""]
    p = res["parts"]
    checks = []
    if "tests" in p:
        checks.append(("GPU test suite", p["tests"].get("ok"), " ".join(p["tests"].get("summary", [])[-1:])))
    if "sanitize" in p:
        for t, v in p["sanitize"].items():
            checks.append((f"compute-sanitizer {t}", v.get("ok") if v.get("ran") else None,
                           "; ".join(v.get("summary", [])) or v.get("note", "")))
    if "scale" in p:
        for c in p["scale"].get("cases", []):
            checks.append((f"scale {c['case']} (B={c['batch']}, k={c['k']}, N={p['scale']['n_docs']})",
                           c["ok"] and c["same_twice"] and c.get("numpy_full_equal", True),
                           f"{c['pairs_checked']} (id, score) pairs, {c['wrong_scores']} wrong"))
    if "filtered" in p:
        for name, v in p["filtered"].get("shapes", {}).items():
            checks.append((f"filtered {name}", v["ok"] and v["numpy_full_equal_16"],
                           f"{v['per_query_ms']:.3f} ms/query, {v['haystack_rows']} haystack rows"))
    lines += ["| check | result | detail |", "| --- | --- | --- |"]
    for name, ok, detail in checks:
        lines.append(f"| {name} | {'pass' if ok else ('not run' if ok is None else 'FAIL')} | {detail} |")
    cells = p.get("timings", {}).get("cells", [])
    if cells:
        lines += ["", f"copy bandwidth {p['timings'].get('copy_bandwidth_gbs')} GB/s", "",
                  "| N | B | k | qps | p50 ms (B=1) | prep / h2d / score / topk / d2h ms | fraction of floor |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in cells:
            ph = c["phases_s"]
            phs = " / ".join(f"{1e3 * ph.get(x, 0.0):.3f}" for x in ("prep_s", "h2d_s", "score_s", "topk_s", "d2h_s"))
            frac = f"{c['fraction_of_floor']:.3f}" if c.get("fraction_of_floor") else "-"
            p50 = f"{c['p50_ms']:.3f}" if c.get("p50_ms") else "-"
            lines.append(f"| {c['n_docs']} | {c['batch']} | {c['k']} | {c['qps']:.0f} | {p50} | {phs} | {frac} |")
    if "bm25s" in p:
        b = p["bm25s"]
        if "skipped" in b:
            lines += ["", f"bm25s-numba: skipped ({b['skipped']})"]
        else:
            lines += ["", "| bm25s-numba (CPU) N | B | k | qps |", "| --- | --- | --- | --- |"]
            lines += [f"| {c['n_docs']} | {c['batch']} | {c['k']} | {c['qps']:.0f} |" for c in b["cells"]]
    if res.get("skipped"):
        lines += ["", "Skipped for time: " + ", ".join(res["skipped"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    run = Run(args)
    ctx: Any = contextlib.nullcontext()
    if args.dry_run:
        from gpuir.backends.kernel_model import fake_cupy_installed, small_tiles

        ctx = contextlib.ExitStack()
        ctx.enter_context(fake_cupy_installed(seed=args.seed))
        ctx.enter_context(small_tiles())
    else:
        from gpuir._compat import cuda_device

        usable, why = cuda_device()
        if not usable:
            print(f"gpu_verify: no GPU can be used: {why}. Run on a machine with an NVIDIA GPU and "
                  "'gpuir[gpu]', or pass --dry-run to exercise the script on the kernel model.", file=sys.stderr)
            return 2
    with ctx:
        info = machine(args.dry_run)
        info["date"] = _dt.datetime.now().isoformat(timespec="seconds")
        res: dict[str, Any] = {"machine": info, "parts": {}}
        bw = None
        if not args.dry_run and "timings" in args.parts:
            from bench_gpu import copy_bandwidth_gbs  # device-to-device copy of 1 GiB, read + write

            bw = copy_bandwidth_gbs()
        for part in PARTS:
            if part not in args.parts:
                continue
            if part != "tests" and run.left() < 10:
                run.skip(part)
                continue
            print(f"[gpu_verify] part {part} ({run.left():.0f}s left)", file=sys.stderr)
            t = time.perf_counter()
            try:
                r = {"tests": part_tests, "sanitize": part_sanitize, "scale": part_scale,
                     "filtered": part_filtered, "bm25s": part_bm25s}.get(part)
                res["parts"][part] = r(run) if r else part_timings(run, bw)
            except Exception as e:  # noqa: BLE001 - one part failing must not hide the others
                res["parts"][part] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            res.setdefault("part_seconds", {})[part] = round(time.perf_counter() - t, 1)
        res["skipped"] = run.out["skipped"]
        res["args"] = run.out["args"]
        res["total_s"] = round(time.perf_counter() - run.t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = str(info.get("device", "device")).replace(" ", "_").replace("/", "_")
    stem = f"gpu_verify_{'dryrun' if args.dry_run else dev}_{_dt.date.today().isoformat()}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))
    md = table(res)
    (out / f"{stem}.md").write_text(md)
    print(md)
    print(f"wrote {out / stem}.json and .md", file=sys.stderr)
    failed = [k for k, v in res["parts"].items() if isinstance(v, dict) and v.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
