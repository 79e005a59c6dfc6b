#!/usr/bin/env python
"""Verify and time the GPU path in one device call that always returns evidence.

    python bench/gpu_verify.py                      # everything, 540 s budget, files to $OUT (or bench/results/)
    python bench/gpu_verify.py --budget-s 300       # the same order, less time: later steps are skipped, and say so
    python bench/gpu_verify.py --steps tests timings_small
    python bench/gpu_verify.py --dry-run --out /tmp/x   # no device: kernel model, tiny sizes, same order and files

A GPU machine is lent rarely and briefly (about 15 minutes in all, at most 10
per command, and only files under ``$OUT`` come back), so the script is built
around three rules:

* **Results are written as soon as they exist.** Each finished step (and each
  timing cell) is appended to ``<stem>.jsonl`` and flushed to disk, and the
  markdown summary ``<stem>.md`` is rewritten after every step; subprocess
  output goes to ``<stem>.log``. A kill at any moment leaves everything done so
  far. Three files per run (the limit is 8), under a name unique to the run
  (device, date and time, process id), in ``$OUT`` when that is set, else
  ``--out``. Every file starts with the commit and a sha256 of the kernel
  sources and of the Python sources (:func:`provenance`).
* **Everything is bounded by the remaining budget.** A step starts only if its
  minimum time is left; each subprocess (pytest, compute-sanitizer) gets a
  timeout of min(its cap, time left) and is killed with its process group; every
  check loop stops at its deadline and reports how far it got; a timed run is
  repeated only while one more (as long as the slowest so far) ends in the
  budget, so a cell keeps at least one timing.
* **The most valuable evidence first** (:data:`STEPS`): the core GPU tests
  under ``--require-gpu`` -> timings on the small grid (2.7M documents, B = 1
  and 1,024, k = 10 and 100) with bm25s-numba on the same corpus -> scale
  (8.8M documents: B = 1,024 timings, B x N > 2^31, k > 4096, 20,000 rows; at
  most 64 rows checked against the NumPy reference per case) -> racecheck and
  memcheck -> the memory (1M records, one and weekly partitions, B = 1, 64,
  1,024: memory on cupy vs numba vs the static index on cupy, bit for bit) -> the rest (filtered batches, synccheck, initcheck, the other
  timing cells, the remaining GPU tests).

Exactness checks compare every returned (id, float32 score) with the NumPy
reference's score for that id (bit for bit), rows for order (score desc, doc
asc), uniqueness and padding, and a few rows with ``NumpyScorer`` in full.

Corpora are generated on the device (a vectorised Zipf generator,
:func:`zipf_csr`; nothing large travels to the machine). ``--dry-run`` runs the
same steps, order, budget and file writing without a device: the kernels are the
NumPy model (:mod:`gpuir.backends.kernel_model`) behind a fake ``cupy``, the GPU
tests run on it through ``gpuir.backends.model_device_plugin``, sanitizer
commands are recorded but not run, sizes are tiny, and no figure is a GPU figure
(``"dry_run": true``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

#: The GPU test modules run first (the engine's own parity tests); the rest come last.
CORE_TEST_MODULES = ("tests/test_cupy_backend.py", "tests/test_search.py", "tests/test_bm25_toy.py",
                     "tests/test_guarantees_search.py")
REST_TEST_MODULES = ("tests/test_memory.py", "tests/test_fusion.py", "tests/test_dense_index.py",
                     "tests/test_late_interaction.py", "tests/test_gpu_selection.py")
#: In a dry run, the modules of each list run on the kernel model: the fake cupy covers the BM25 engine and the
#: memory, not the dense and late-interaction arrays.
MODEL_TEST_MODULES = {CORE_TEST_MODULES: ("tests/test_cupy_backend.py",), REST_TEST_MODULES: ("tests/test_memory.py",)}
SIZES = {"device": {"n_small": 2_700_000, "n_scale": 8_800_000, "n_rest": 190_000, "many_rows": 20_000,
                    "check_rows": 64, "filtered_batch": 500, "p50_queries": 200, "memory_records": 1_000_000,
                    "memory_max_batch": 1024},
         "dry": {"n_small": 700, "n_scale": 1100, "n_rest": 500, "many_rows": 24,
                 "check_rows": 8, "filtered_batch": 4, "p50_queries": 3, "memory_records": 3000,
                 "memory_max_batch": 64}}


@dataclass(frozen=True)
class Step:
    """One step of the run: ``fn(run)`` returns a JSON-able dict (``"ok"``: pass/fail, if it checks)."""

    name: str
    fn: Callable[[Run], dict[str, Any]]
    need_s: float  # start only if at least this much budget is left
    what: str


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", default=None,
                   help="directory for the files (default: $OUT when set, else bench/results/)")
    p.add_argument("--steps", nargs="+", default=None, choices=[s.name for s in STEPS],
                   help="steps to run, in the fixed order (default all)")
    p.add_argument("--dry-run", action="store_true", help="no device: kernel model, tiny sizes, no GPU figures")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="wall-clock budget of the whole run in seconds (default 540)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 1024], help="batch sizes of the small grid")
    p.add_argument("-k", type=int, nargs="+", default=[10, 100], help="k of the small grid")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per cell (median)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.budget_s <= 0:
        p.error("--budget-s must be positive")
    for name in ("batch", "k"):
        if min(getattr(a, name)) < 1:
            p.error(f"--{name} values must be positive")
    if a.repeats < 1:
        p.error("--repeats must be positive")
    a.steps = a.steps or [s.name for s in STEPS]
    a.sizes = dict(SIZES["dry" if a.dry_run else "device"])
    if a.out is None:
        a.out = os.environ.get("OUT") or str(ROOT / "bench" / "results")
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
    del doc
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


def cycle(pool: list, n: int) -> list:
    """The first n items of ``pool`` repeated."""
    return (pool * (-(-n // len(pool))))[:n]


# =============================================================================
# Exactness checks (bounded by a deadline)
# =============================================================================
def reference_scores(ref, q: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The NumPy reference's float32 score of each document ``ids`` for query ``q``.

    Uses the reference's own exact rescoring (``NumpyScorer.exact_scores``:
    ascending term id from 0.0, ``w * float32(c)`` for repeats, plus the row
    constant for bm25l / bm25+).

    Returns
    -------
    scores : ndarray (m,), float32, host
    matched : ndarray (m,), bool, host: the document holds at least one query term
        (a binary search in each term's doc-sorted posting list).
    """
    terms = np.unique(q)
    s = ref.exact_scores(q, ids)
    idx = ref.index
    hit = np.zeros(ids.size, bool)
    for t in terms.tolist():
        lst = idx.doc_ids[idx.offsets[t]:idx.offsets[t + 1]]
        if lst.size:
            hit |= lst[np.minimum(np.searchsorted(lst, ids), lst.size - 1)] == ids
    return s, hit


def check_results(ref, queries, res, allow=None, rows: int | None = None,
                  deadline: float | None = None) -> dict[str, Any]:
    """Every returned (id, score) of the first ``rows`` rows against the reference; order, uniqueness, padding.

    Stops at ``deadline`` (a ``time.perf_counter()`` value) and says how many rows it checked.
    """
    bad_score = bad_order = bad_dup = bad_filter = 0
    n_checked = rows_checked = 0
    mag = np.uint32(0x7FFFFFFF)
    n = len(queries) if rows is None else min(rows, len(queries))
    for i in range(n):
        if deadline is not None and time.perf_counter() > deadline:
            break
        q = queries[i]
        ids, sc = res.ids[i], res.scores[i]
        m = ids >= 0
        rows_checked += 1
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
    return {"rows_checked": rows_checked, "rows_asked": n, "pairs_checked": n_checked, "wrong_scores": bad_score,
            "misordered_rows": bad_order, "duplicate_rows": bad_dup, "filter_violations": bad_filter,
            "ok": bad_score == bad_order == bad_dup == bad_filter == 0 and rows_checked > 0}


def exact_equal(a, b) -> bool:
    mag = np.uint32(0x7FFFFFFF)
    return bool(np.array_equal(a.ids, b.ids)
                and np.array_equal(a.scores.view(np.uint32) & mag, b.scores.view(np.uint32) & mag))


# =============================================================================
# Output: written as results arrive
# =============================================================================
class Report:
    """The run's three files, appended to and rewritten as results arrive.

    ``<stem>.jsonl``: one JSON object per line, ``{"step", "t", ...}``, flushed
    and fsynced on every write; ``<stem>.md``: the summary table, rewritten after
    every step; ``<stem>.log``: subprocess output.
    """

    def __init__(self, out_dir: str | Path, device: str, dry: bool):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        slug = "dryrun" if dry else "".join(c if c.isalnum() or c in "-." else "_" for c in device)[:40]
        base = f"gpu_verify_{slug}_{_dt.datetime.now().strftime('%Y%m%dT%H%M%S')}_{os.getpid()}"
        stem, i = base, 1
        while True:  # claim the name: the .jsonl is created exclusively, so two runs never share one
            try:
                with open(self.dir / f"{stem}.jsonl", "x", encoding="utf-8"):
                    break
            except FileExistsError:
                i += 1
                stem = f"{base}_{i}"
        self.stem = stem
        self.jsonl = self.dir / f"{stem}.jsonl"
        self.md = self.dir / f"{stem}.md"
        self.log = self.dir / f"{stem}.log"
        self.results: dict[str, Any] = {"machine": {}, "steps": {}, "cells": [], "skipped": []}
        self.t0 = time.perf_counter()
        #: The commit and source hashes, first in every file (:func:`provenance`).
        self.provenance = self.results["provenance"] = provenance()
        self.event("provenance", **self.provenance)
        self.log_text("provenance", json.dumps(self.provenance))
        self.write_md()

    def event(self, step: str, **data: Any) -> None:
        rec = {"step": step, "t": round(time.perf_counter() - self.t0, 2), **data}
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, default=_jsonable) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def log_text(self, header: str, text: str) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(f"\n===== {header} =====\n{text}\n")
            f.flush()

    def machine(self, info: dict[str, Any]) -> None:
        self.results["machine"] = info
        self.event("machine", **info)
        self.write_md()

    def cell(self, step: str, cell: dict[str, Any]) -> None:
        self.results["cells"].append({"step": step, **cell})
        self.event(step, cell=cell)
        print(f"[gpu_verify] {step}: {json.dumps(cell, default=_jsonable)}", file=sys.stderr, flush=True)

    def step_done(self, name: str, result: dict[str, Any], seconds: float) -> None:
        result = {**result, "seconds": round(seconds, 1)}
        self.results["steps"][name] = result
        self.event(name, done=True, result=result)
        self.write_md()

    def skipped(self, name: str, why: str) -> None:
        self.results["skipped"].append(f"{name} ({why})")
        self.event(name, skipped=why)
        print(f"[gpu_verify] skipped {name}: {why}", file=sys.stderr, flush=True)
        self.write_md()

    def write_md(self) -> None:
        tmp = self.md.with_suffix(".md.tmp")
        tmp.write_text(table(self.results), encoding="utf-8")
        os.replace(tmp, self.md)


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


# =============================================================================
# Provenance: the commit and the kernel sources every file names
# =============================================================================
def kernel_hash(kernel_dir: Path | None = None) -> str:
    """sha256 over the kernel sources (``kernels/*.cu`` and ``*.cuh``, by name, each name and its bytes):
    the code the device compiled, whatever the checkout."""
    import hashlib

    d = Path(kernel_dir) if kernel_dir is not None else ROOT / "kernels"
    h = hashlib.sha256()
    files = sorted(p for p in d.iterdir() if p.suffix in (".cu", ".cuh"))
    if not files:
        raise FileNotFoundError(f"no kernel sources in {d}")
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def source_hash(root: Path | None = None) -> str:
    """sha256 over the package's Python sources (``gpuir/**/*.py``, by path): names the host code when the
    checkout has no git metadata (a device machine gets a copy of the working tree)."""
    import hashlib

    r = Path(root) if root is not None else ROOT
    h = hashlib.sha256()
    for f in sorted((r / "gpuir").rglob("*.py")):
        h.update(str(f.relative_to(r)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit(root: Path | None = None) -> str:
    """``git rev-parse HEAD`` (``-dirty`` when tracked files differ), ``$GPUIR_COMMIT``, or ``"unknown (...)"``."""
    r = Path(root) if root is not None else ROOT
    try:
        head = subprocess.run(["git", "-C", str(r), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20, check=False)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(r), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=20, check=False)
            return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
        why = (head.stderr.strip().splitlines() or ["no git metadata"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"{type(e).__name__}: {e}"
    return os.environ.get("GPUIR_COMMIT") or f"unknown ({why[:120]})"


def provenance() -> dict[str, str]:
    """What every file of a run records: the commit, the kernel sources' hash and the Python sources' hash."""
    return {"commit": git_commit(), "kernel_sha256": kernel_hash(), "source_sha256": source_hash()}


# =============================================================================
# Machine description
# =============================================================================
def machine(dry: bool) -> dict[str, Any]:
    from bench_gpu import machine as base_machine  # versions of gpuir, Python, NumPy, CuPy, CPU, gpu_report

    info = base_machine()
    info["dry_run"] = dry
    info["cpu_count"] = os.cpu_count()
    info["date"] = _dt.datetime.now().isoformat(timespec="seconds")
    try:
        import Stemmer  # noqa: F401 - PyStemmer: the default analyzer of the engine-level tests needs it

        info["pystemmer"] = True
    except ImportError:
        info["pystemmer"] = False
    if dry:
        info["device"] = "none (dry run: NumPy kernel model)"
        info["cupy"] = None
        return info
    import cupy as cp

    rep = info.get("gpu") or {}
    props = cp.cuda.runtime.getDeviceProperties(0)
    info["device"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    info["sm_count"] = int(props.get("multiProcessorCount", 0))
    info["cc"] = f"{props.get('major')}.{props.get('minor')}"
    info["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    info["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    info["driver"] = (rep.get("nvml") or {}).get("driver")
    with contextlib.suppress(Exception):
        from cupy.cuda import nvrtc

        info["nvrtc"] = ".".join(map(str, nvrtc.getVersion()))
    return info


# =============================================================================
# The run: budget, corpora, scorers
# =============================================================================
class Run:
    """Shared state: arguments, the budget's clock, the report, the corpora built so far."""

    RESERVE_S = 5.0  # kept back from every subprocess timeout: time to write the files after a kill

    def __init__(self, args: argparse.Namespace, report: Report):
        self.args = args
        self.report = report
        self.sizes = args.sizes
        self.t0 = time.perf_counter()
        self._corpora: dict[int, Any] = {}
        self._scorer: Any = None
        self._scorer_key: Any = None

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def deadline(self, cap_s: float) -> float:
        """A perf_counter deadline: cap_s from now, never past the budget (less the reserve)."""
        return time.perf_counter() + max(0.0, min(cap_s, self.left() - self.RESERVE_S))

    def another(self, times: list[float], want: int) -> bool:
        """Whether to time one more run: fewer than ``want`` so far, and one more (as long as the slowest so
        far) still ends inside the budget, less the reserve. The first run is always timed."""
        if not times:
            return True
        return len(times) < want and self.left() - self.RESERVE_S > max(times)

    def xp(self):
        if self.args.dry_run:
            return np
        import cupy

        return cupy

    def drop(self, keep: int | None = None) -> None:
        """Forget the scorer and every corpus but ``keep`` (device memory back to the pool)."""
        self._scorer = self._scorer_key = None
        for n in [n for n in self._corpora if n != keep]:
            del self._corpora[n]
        if not self.args.dry_run:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()

    def corpus(self, n_docs: int):
        """(index, NumPy reference scorer, query pool, tokens) for N documents, generated once."""
        if n_docs not in self._corpora:
            from gpuir.backends.numpy_backend import NumpyScorer
            from gpuir.bm25 import BM25Params

            self.drop()
            t = time.perf_counter()
            idx, tok_off, tok = make_index(n_docs, self.args.seed, self.xp())
            t_gen = time.perf_counter() - t
            ref = NumpyScorer(idx, BM25Params())
            qs = make_queries(tok_off, tok, idx.n_terms, max(2048, self.sizes["p50_queries"]), self.args.seed)
            self._corpora[n_docs] = (idx, ref, qs, (tok_off, tok))
            self.report.event("corpus", n_docs=n_docs, postings=idx.n_postings, terms=idx.n_terms,
                              generate_s=round(t_gen, 2), total_s=round(time.perf_counter() - t, 2))
        return self._corpora[n_docs]

    def scorer(self, n_docs: int, **opts):
        """The CupyScorer of corpus N (one at a time on the device), built once per options."""
        from gpuir.backends.cupy_backend import CupyScorer
        from gpuir.bm25 import BM25Params

        key = (n_docs, tuple(sorted(opts.items())))
        if self._scorer_key != key:
            self._scorer = None
            idx = self.corpus(n_docs)[0]
            t = time.perf_counter()
            self._scorer = CupyScorer(idx, BM25Params(), **opts)
            self._scorer_key = key
            self.report.event("scorer", n_docs=n_docs, opts=opts, build_s=round(time.perf_counter() - t, 2),
                              upload_s=round(self._scorer.upload_s, 3), layout_s=round(self._scorer.layout_s, 3),
                              directory_built=self._scorer.directory_built,
                              directory_mb=round(self._scorer.directory_bytes / 1e6, 1))
        return self._scorer

    def bounded(self, cmd: list[str], cap_s: float, header: str, env: dict | None = None) -> dict[str, Any]:
        """Run ``cmd`` with a timeout of min(cap_s, time left - reserve); kill its process group on timeout.

        Returns returncode (None when killed), timed_out, seconds and the output's last lines;
        the whole output goes to the log file.
        """
        timeout = max(1.0, min(cap_s, self.left() - self.RESERVE_S))
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env={**os.environ, **(env or {})})
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        self.report.log_text(f"{header}: {' '.join(cmd)} (timeout {timeout:.0f}s)", out or "")
        lines = (out or "").strip().splitlines()
        return {"returncode": None if timed_out else proc.returncode, "timed_out": timed_out,
                "timeout_s": round(timeout, 1), "seconds": round(time.perf_counter() - t, 1), "tail": lines[-4:],
                "failures": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:40]}


# =============================================================================
# Steps
# =============================================================================
def _pytest(run: Run, modules: tuple[str, ...], cap_s: float, header: str) -> dict[str, Any]:
    if run.args.dry_run:  # the modules whose GPU tests the fake cupy can run (not the dense ones)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "gpuir.backends.model_device_plugin", "-m", "gpu", *MODEL_TEST_MODULES[modules]]
    else:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--require-gpu", "-m", "gpu",
               "--continue-on-collection-errors", *[m for m in modules if (ROOT / m).exists()]]
    r = run.bounded(cmd, cap_s, header)
    r["ok"] = r["returncode"] == 0
    r["on"] = "kernel model" if run.args.dry_run else "device"
    r["cmd"] = " ".join(cmd[1:])
    return r


def step_tests(run: Run) -> dict[str, Any]:
    return _pytest(run, CORE_TEST_MODULES, 150.0, "core GPU tests")


def step_tests_rest(run: Run) -> dict[str, Any]:
    return _pytest(run, REST_TEST_MODULES, 120.0, "other GPU tests")


def _postings_bytes(idx, qs) -> int:
    """Bytes of the query terms' postings: doc id (4) + weight (4) per posting, each distinct term once per query."""
    df = np.diff(idx.offsets)
    return 8 * sum(int(df[np.unique(q)].sum()) for q in qs)


def _time_cell(run: Run, step: str, n: int, B: int, k: int) -> dict[str, Any] | None:
    idx, ref, pool, _ = run.corpus(n)
    gpu = run.scorer(n)
    bw = run.report.results["machine"].get("copy_bandwidth_gbs")
    if B == 1:
        m = run.sizes["p50_queries"]
        qs = pool[:m]
        for q in qs[:5]:
            gpu.search([q], k)  # warm-up (and compile on first use)
        times = []
        for q in qs:
            if not run.another(times, len(qs)):  # (each query's search bounded by the budget)
                break
            t = time.perf_counter()
            gpu.search([q], k)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        qs = qs[:len(times)]
        m = len(qs)
        floor = _postings_bytes(idx, qs) / len(qs) / (bw * 1e9) if bw else None
        graph_runs = gpu.search([qs[0]], k).meta.get("graph_runs")
        gpu.graphs = False  # the same queries without CUDA graphs, for comparison
        plain = []
        for q in qs:
            if not run.another(plain, len(qs)):
                break
            t = time.perf_counter()
            gpu.search([q], k)
            plain.append(time.perf_counter() - t)
        gpu.graphs = True
        gpu.timing = True  # per-phase device times of one more search (events cost host time: not in the loop)
        last = gpu.search([qs[0]], k)
        gpu.timing = False
        threads = _concurrent(gpu, qs, k, deadline=run.deadline(60.0))
        cell = {"n_docs": n, "batch": 1, "k": k, "queries": m, "p50_ms": 1e3 * med,
                "p99_ms": 1e3 * float(np.percentile(times, 99)), "qps": 1.0 / med, "median_s": med,
                "graph_runs": graph_runs, "p50_ms_without_graphs": 1e3 * statistics.median(plain),
                "postings_floor_s": floor, "fraction_of_floor": (floor / med) if floor else None,
                "phases_s": last.meta.get("timings"), "concurrent": threads,
                # issue 35: 8 threads asking single questions against one thread (target >= 3x)
                "concurrent_over_one_thread": threads["qps"] * med if threads.get("qps") else None,
                "bytes_per_posting_read": 12, "floor_bytes_per_posting": 8}
    else:
        qs = cycle(pool, B)
        first = gpu.search(qs, k)  # warm-up (and compile on first use)
        times, last = [], first
        while run.another(times, run.args.repeats):  # (at least one; no repeat past the budget)
            t = time.perf_counter()
            last = gpu.search(qs, k)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        floor = _postings_bytes(idx, qs) / (bw * 1e9) if bw else None
        # issue 35 item 3: the same batch as one piece (no overlap of host work and copies with scoring)
        saved, gpu.pipeline_rows = getattr(gpu, "pipeline_rows", 0), 0
        one_piece: list[float] = []
        while saved and run.another(one_piece, max(1, run.args.repeats // 2)):
            t = time.perf_counter()
            gpu.search(qs, k)
            one_piece.append(time.perf_counter() - t)
        gpu.pipeline_rows = saved
        gpu.timing = True
        timed = gpu.search(qs, k)
        gpu.timing = False
        cell = {"n_docs": n, "batch": B, "k": k, "median_s": med, "qps": B / med, "times_s": times,
                "postings_floor_s": floor, "fraction_of_floor": (floor / med) if floor else None,
                "phases_s": timed.meta.get("timings"), "candidates": last.meta.get("candidates"),
                "tiles_scored": last.meta.get("tiles_scored"), "tile_items": last.meta.get("tile_items"),
                "tile_cells": (last.meta.get("n_tiles") or 0) * B, "light_pairs": last.meta.get("light_pairs"),
                "overflow_rows": last.meta.get("overflow_rows"), "persistent_blocks": last.meta.get("persistent_blocks"),
                "blocks_scored": last.meta.get("blocks_scored"), "blocks_skipped": last.meta.get("blocks_skipped"),
                "same_twice": exact_equal(first, last), "pipeline_rows": saved, "pieces": last.meta.get("pieces"),
                "median_s_one_piece": statistics.median(one_piece) if one_piece else None}
        chk = check_results(ref, qs, last, rows=run.sizes["check_rows"], deadline=run.deadline(20.0))
        cell["check"] = chk
        cell["ok"] = chk["ok"] and cell["same_twice"]
    run.report.cell(step, cell)
    return cell


def _concurrent(gpu, qs: list, k: int, n_threads: int = 8, deadline: float | None = None) -> dict[str, Any]:
    """Agents searching at once: ``n_threads`` threads, one query per search, all of ``qs`` each (each thread
    stops at ``deadline``, a ``time.perf_counter()`` value); queries/s."""
    import threading

    errors: list[str] = []
    done = [0] * n_threads

    def work(w: int):
        try:
            for q in qs:
                if deadline is not None and done[w] and time.perf_counter() > deadline:
                    return
                gpu.search([q], k)
                done[w] += 1
        except Exception as e:  # noqa: BLE001 - reported, not raised in a thread
            errors.append(f"{type(e).__name__}: {e}")

    ts = [threading.Thread(target=work, args=(w,)) for w in range(n_threads)]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    dt = time.perf_counter() - t
    return {"threads": n_threads, "queries": sum(done), "qps": sum(done) / dt, "errors": errors[:3]}


def _grid(run: Run, step: str, n: int, batches, ks) -> dict[str, Any]:
    cells, skipped = [], []
    for k in ks:
        for B in batches:
            if run.left() < 20:
                skipped.append(f"N={n} B={B} k={k}")
                continue
            cells.append(_time_cell(run, step, n, B, k))
    return {"n_docs": n, "cells": len(cells), "skipped": skipped,
            "ok": all(c.get("ok", True) for c in cells) and not skipped}


def step_timings_small(run: Run) -> dict[str, Any]:
    return _grid(run, "timings_small", run.sizes["n_small"], run.args.batch, run.args.k)


def step_bm25s(run: Run) -> dict[str, Any]:
    """bm25s with its numba backend on this machine's CPU, on the small grid's corpus and queries."""
    try:
        import bm25s
        import numba  # the backend needs it; its thread count below
    except ImportError as e:
        return {"skipped": f"bm25s / numba not installed ({e}); carry the bm25s wheel"}
    n = run.sizes["n_small"]
    idx, _, pool, (tok_off, tok) = run.corpus(n)
    vocab = {f"t{i:07d}": i for i in range(idx.n_terms)}
    t = time.perf_counter()
    docs = np.split(tok, tok_off[1:-1])
    docs = [d.tolist() for d in docs]
    retr = bm25s.BM25(backend="numba")
    retr.index(bm25s.tokenization.Tokenized(ids=docs, vocab=vocab), show_progress=False)
    del docs
    # every thread numba may use here (os.cpu_count() can exceed it: an affinity mask, NUMBA_NUM_THREADS)
    threads = int(numba.config.NUMBA_NUM_THREADS)
    out: dict[str, Any] = {"bm25s": bm25s.__version__, "n_docs": n, "index_s": round(time.perf_counter() - t, 1),
                           "cpu_threads": threads}
    for k in run.args.k:
        for B in run.args.batch:
            if run.left() < 15:
                run.report.skipped(f"bm25s B={B} k={k}", "budget")
                continue
            qs = cycle(pool, run.sizes["p50_queries"] if B == 1 else B)
            toks = bm25s.tokenization.Tokenized(ids=[q.tolist() for q in qs], vocab=vocab)
            if B == 1:
                one = [bm25s.tokenization.Tokenized(ids=[q.tolist()], vocab=vocab) for q in qs]
                retr.retrieve(one[0], k=k, show_progress=False, n_threads=1)
                times = []
                for x in one:
                    if not run.another(times, len(one)):
                        break
                    t = time.perf_counter()
                    retr.retrieve(x, k=k, show_progress=False, n_threads=1)
                    times.append(time.perf_counter() - t)
                med = statistics.median(times)
                cell = {"n_docs": n, "batch": 1, "k": k, "p50_ms": 1e3 * med, "qps": 1.0 / med, "threads": 1}
            else:
                # issue 35: bm25s-numba named with its thread count, one thread and every thread (16 on the
                # device machines): a GPU speedup is quoted against one of them, saying which
                for nt in dict.fromkeys((1, threads)):
                    if run.left() < 15:
                        run.report.skipped(f"bm25s B={B} k={k} threads={nt}", "budget")
                        continue
                    retr.retrieve(toks, k=k, show_progress=False, n_threads=nt)
                    times = []
                    while run.another(times, max(1, run.args.repeats // 2)):
                        t = time.perf_counter()
                        retr.retrieve(toks, k=k, show_progress=False, n_threads=nt)
                        times.append(time.perf_counter() - t)
                    med = statistics.median(times)
                    run.report.cell("bm25s", {"n_docs": n, "batch": B, "k": k, "median_s": med, "qps": B / med,
                                              "threads": nt})
                continue
            run.report.cell("bm25s", cell)
    return out


def step_scale(run: Run) -> dict[str, Any]:
    """N = 8.8M: B = 1,024 timings, then cases a small test cannot reach, each checked on <= 64 rows."""
    n = run.sizes["n_scale"]
    B = max(run.args.batch)
    grid = _grid(run, "scale", n, [B], run.args.k)
    _, ref, pool, _ = run.corpus(n)
    gpu = run.scorer(n)
    cases = [("k>4096", min(B, 16), 5000), ("many rows", run.sizes["many_rows"], 10)]
    out: dict[str, Any] = {"n_docs": n, "doc_ids_past_2^22": n > (1 << 22), "BxN_over_2^31": B * n > 2**31,
                           "timings": grid, "cases": []}
    for name, b, k in cases:
        if run.left() < 25:
            run.report.skipped(f"scale {name}", "budget")
            continue
        qs = cycle(pool, b)
        t = time.perf_counter()
        r1 = gpu.search(qs, k)
        dt = time.perf_counter() - t
        r2 = gpu.search(qs, k)
        chk = check_results(ref, qs, r1, rows=run.sizes["check_rows"], deadline=run.deadline(25.0))
        case = {"case": name, "batch": b, "k": k, "BxN": b * n, "seconds": round(dt, 3),
                "same_twice": exact_equal(r1, r2), **chk, "candidates": r1.meta.get("candidates"),
                "overflow_rows": r1.meta.get("overflow_rows"), "tiles_scored": r1.meta.get("tiles_scored"),
                "blocks_scored": r1.meta.get("blocks_scored"), "blocks_skipped": r1.meta.get("blocks_skipped")}
        if run.left() > 40:
            sub = qs[:4]
            case["numpy_full_equal_rows"] = len(sub)
            case["numpy_full_equal"] = exact_equal(ref.search(sub, k), gpu.search(sub, k))
        run.report.cell("scale", case)
        out["cases"].append(case)
    out["ok"] = grid["ok"] and all(c["ok"] and c["same_twice"] and c.get("numpy_full_equal", True)
                                   for c in out["cases"])
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
N = 9001
idx = random_index(N, 200, seed=1)
rng = np.random.default_rng(3)
allow = [None, np.sort(rng.choice(N, 300, replace=False)), np.arange(4000, 4300), None] * 2
qs = random_queries(200, len(allow), seed=2)
bad = 0
for method, hay in (("lucene", "auto"), ("bm25+", "always")):
    ref, gpu = NumpyScorer(idx, BM25Params(method=method)), CupyScorer(idx, BM25Params(method=method), haystack=hay)
    for k, al in ((10, None), (50, allow), (5000, None)):
        a, b = ref.search(qs, k, al), gpu.search(qs, k, al)
        bad += not (np.array_equal(a.ids, b.ids) and np.array_equal(np.abs(a.scores), np.abs(b.scores)))
    bad += not np.array_equal(ref.score_matrix(qs[:2], allow[:2]), gpu.score_matrix(qs[:2], allow[:2]))
print("mismatches", bad)
sys.exit(1 if bad else 0)
"""


DRY_PRELUDE = (
    "from gpuir.backends import model_device_plugin  # noqa: F401 - fake cupy on the kernel model\n"
    "from gpuir.backends.kernel_model import small_tiles\n"
    "small_tiles().__enter__()\n"
)


def _sanitizer() -> str | None:
    return shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",
                     "/usr/local/cuda/compute-sanitizer/compute-sanitizer") if os.access(p, os.X_OK)), None)


def _sanitize(run: Run, tool: str, cap_s: float) -> dict[str, Any]:
    code = SANITIZE_WORKLOAD.format(root=str(ROOT), tests=str(ROOT / "tests"))
    exe = _sanitizer()
    cmd = [exe or "compute-sanitizer", "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
           sys.executable, "-c", code]
    shown = " ".join(cmd[:-1]) + " <workload>"
    if run.args.dry_run:
        # The sanitizer is not run, but the workload is, on the kernel model: a broken workload shows here.
        r = run.bounded([sys.executable, "-c", DRY_PRELUDE + code], cap_s, f"workload of {tool} (kernel model)")
        return {"cmd": shown, "ran": False, "ok": r["returncode"] == 0, "workload": r,
                "note": "dry run: the workload ran on the kernel model, without the sanitizer"}
    if exe is None:
        return {"ran": False, "ok": False, "note": "compute-sanitizer not found (CUDA toolkit)"}
    r = run.bounded(cmd, cap_s, f"compute-sanitizer {tool}")
    r.pop("failures", None)
    r["summary"] = r.pop("tail")
    return {"cmd": shown, "ran": True, "ok": r["returncode"] == 0, **r}


def step_racecheck(run: Run) -> dict[str, Any]:
    return _sanitize(run, "racecheck", 90.0)


def step_memcheck(run: Run) -> dict[str, Any]:
    return _sanitize(run, "memcheck", 60.0)


def step_synccheck(run: Run) -> dict[str, Any]:
    return _sanitize(run, "synccheck", 45.0)


def step_initcheck(run: Run) -> dict[str, Any]:
    return _sanitize(run, "initcheck", 45.0)


def step_filtered(run: Run) -> dict[str, Any]:
    """LongMemEval-shaped batches: one 500-record haystack per query, contiguous (a tenant's range) and scattered."""
    n = run.sizes["n_rest"]
    _, ref, pool, _ = run.corpus(n)
    gpu = run.scorer(n)
    B = run.sizes["filtered_batch"]
    size = min(500, max(8, n // 50))
    rng = np.random.default_rng(run.args.seed + 7)
    qs = cycle(pool, B)
    shapes = {
        "contiguous": [np.arange(s, s + size, dtype=np.int64) for s in rng.integers(0, n - size, B)],
        "scattered": [np.sort(rng.choice(n, size, replace=False)).astype(np.int64) for _ in range(B)],
    }
    out: dict[str, Any] = {"n_docs": n, "batch": B, "haystack": size, "shapes": {}}
    for name, allow in shapes.items():
        if run.left() < 15:
            run.report.skipped(f"filtered {name}", "budget")
            continue
        gpu.search(qs, 10, allow)  # warm-up
        ts: list[float] = []
        while run.another(ts, run.args.repeats):
            t = time.perf_counter()
            res = gpu.search(qs, 10, allow)
            ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        chk = check_results(ref, qs, res, allow, rows=run.sizes["check_rows"], deadline=run.deadline(15.0))
        sub = slice(0, 16)
        equal = exact_equal(ref.search(qs[sub], 10, allow[sub]), gpu.search(qs[sub], 10, allow[sub]))
        cell = {"shape": name, "n_docs": n, "batch": B, "median_s": med, "per_query_ms": 1e3 * med / B,
                "qps": B / med, "haystack_rows": res.meta["haystack_rows"],
                "tile_rows": B - res.meta["haystack_rows"], "phases_s": res.meta["timings"],
                "numpy_full_equal_16": equal, **chk}
        run.report.cell("filtered", cell)
        out["shapes"][name] = cell
    out["ok"] = all(v["ok"] and v["numpy_full_equal_16"] for v in out["shapes"].values())
    return out


def step_timings_rest(run: Run) -> dict[str, Any]:
    """The other timing cells: a small corpus over more batch sizes, and k = 1,000."""
    batches, ks = ([1, 16], [10, 1000]) if run.args.dry_run else ([1, 16, 128, 1024], [10, 100, 1000])
    res = _grid(run, "timings_rest", run.sizes["n_rest"], batches, ks)
    if run.left() > 30:
        n = run.sizes["n_small"]
        big = _grid(run, "timings_rest", n, [16, 128], [10, 100])
        res = {"n_docs": [res["n_docs"], n], "cells": res["cells"] + big["cells"],
               "skipped": res["skipped"] + big["skipped"], "ok": res["ok"] and big["ok"]}
    return res


# =============================================================================
# The memory on the device (issue 34): memory on cupy vs numba vs the static index on cupy
# =============================================================================
def _grow_memory(run: Run, records: int, partition_days: float | None, deadline: float):
    """A Memory grown from gpuir.synthetic records in batches of 10,000 until ``records`` or the deadline."""
    from gpuir import Memory
    from gpuir.synthetic import generate

    g = generate(records, n_queries=1024, seed=run.args.seed)
    mem = Memory(partition_days=partition_days)
    step = max(1, min(10_000, records // 10))
    n = 0
    t = time.perf_counter()
    while n < records and time.perf_counter() < deadline:
        mem.add(g.records(n, min(n + step, records)))
        n = min(n + step, records)
    mem.wait_merges()
    return mem, g, n, time.perf_counter() - t


def _same_hits(x, y, rows: int) -> dict[str, Any]:
    """Ids (record ids, in order) and float32 score bits of two results, over the columns both have."""
    other = sum(x.ids(i) != y.ids(i) for i in range(rows))
    sx, sy = np.asarray(x.scores), np.asarray(y.scores)
    w = min(sx.shape[1], sy.shape[1])
    bits = bool(np.array_equal(sx[:rows, :w].view(np.uint32), sy[:rows, :w].view(np.uint32)))
    return {"rows": rows, "rows_with_other_ids": int(other), "scores_bit_equal": bits,
            "ok": other == 0 and bits}


def step_memory(run: Run) -> dict[str, Any]:
    """1M synthetic records (dry: a few thousand), one partition then weekly ones: batches of 1, 64 and 1,024
    on the memory on cupy (one device pass over all segments), the memory on numba (this machine's cores) and
    the static index on cupy, every result checked bit for bit against the others."""
    from gpuir import BM25Index, backends

    records = run.sizes["memory_records"]
    batches = [b for b in (1, 64, 1024) if b <= max(1, run.sizes["memory_max_batch"])]
    out: dict[str, Any] = {"records": records, "layouts": [], "ok": True}
    with contextlib.ExitStack() as st:
        if run.args.dry_run:  # the memory asks the backends module whether "cupy" can run: the fake device can
            old = backends.cuda_device
            backends.cuda_device = lambda: (True, "emulated device (kernel model)")
            st.callback(setattr, backends, "cuda_device", old)
        run.drop()
        for days in (None, 7.0):
            if run.left() < 30:
                out["layouts"].append({"partition_days": days, "skipped": f"budget: {run.left():.0f} s left"})
                continue
            mem, g, n, grow_s = _grow_memory(run, records, days, run.deadline(0.3 * run.left()))
            t = time.perf_counter()
            recs = g.records(0, n)
            static = BM25Index.build([r["text"] for r in recs], ids=[r["id"] for r in recs], progress=False)
            snap = mem.snapshot()
            lay = {"partition_days": days, "records": n, "grow_s": round(grow_s, 2),
                   "static_build_s": round(time.perf_counter() - t, 2), "segments": len(snap.views),
                   "partitions": len(snap.partitions), "cells": []}
            qs = list(g.queries)
            fns = {"memory_cupy": lambda q, m=mem: m.search(q, k=10, backend="cupy"),
                   "memory_numba": lambda q, m=mem: m.search(q, k=10, backend="numba"),
                   "static_cupy": lambda q, x=static: x.search(q, k=10, backend="cupy")}
            for B in batches:
                if run.left() < 10:
                    lay["cells"].append({"batch": B, "skipped": "budget"})
                    continue
                batch = cycle(qs, B)
                cell: dict[str, Any] = {"partition_days": days, "records": n, "segments": len(snap.views),
                                        "batch": B, "k": 10}
                last = {}
                for name, f in fns.items():
                    f(batch)  # warm: uploads, compiles, graphs
                    times: list[float] = []
                    while run.another(times, run.args.repeats):
                        t = time.perf_counter()
                        last[name] = f(batch)
                        times.append(time.perf_counter() - t)
                    med = statistics.median(times)
                    cell[name] = {"qps": B / med, "median_ms": 1e3 * med, "runs": len(times)}
                cell["check"] = {"memory_cupy_vs_memory_numba": _same_hits(last["memory_cupy"], last["memory_numba"], B),
                                 "memory_cupy_vs_static_cupy": _same_hits(last["memory_cupy"], last["static_cupy"], B)}
                cell["ok"] = all(c["ok"] for c in cell["check"].values())
                out["ok"] = out["ok"] and cell["ok"]
                run.report.cell("memory", cell)
                lay["cells"].append(cell)
            out["layouts"].append(lay)
            mem.close()
            mem = static = fns = last = None  # device copies go with them
            run.drop()
    return out


STEPS: list[Step] = [
    Step("tests", step_tests, 20, "core GPU tests: pytest --require-gpu -m gpu (the engine's parity tests)"),
    Step("timings_small", step_timings_small, 30, "N = 2.7M, B in {1, 1024}, k in {10, 100}; 64 rows checked"),
    Step("bm25s", step_bm25s, 45, "bm25s-numba on this machine's CPU, same corpus and queries"),
    Step("scale", step_scale, 60, "N = 8.8M: B = 1024 timings, k > 4096, 20,000 rows; 64 rows checked each"),
    Step("racecheck", step_racecheck, 25, "compute-sanitizer racecheck on a workload launching every kernel"),
    Step("memcheck", step_memcheck, 25, "compute-sanitizer memcheck, same workload"),
    Step("memory", step_memory, 90, ("the memory at 1M records, 1 and weekly partitions, B in {1, 64, 1024}: "
                                     "memory on cupy vs numba vs the static index on cupy, bit for bit")),
    Step("filtered", step_filtered, 20, "one 500-record haystack per query, contiguous and scattered"),
    Step("synccheck", step_synccheck, 20, "compute-sanitizer synccheck"),
    Step("initcheck", step_initcheck, 20, "compute-sanitizer initcheck"),
    Step("timings_rest", step_timings_rest, 30, "N = 190k over B in {1, 16, 128, 1024}, k up to 1,000"),
    Step("tests_rest", step_tests_rest, 30, "the other GPU-marked tests (memory, fusion, dense, selection)"),
]


# =============================================================================
# Report
# =============================================================================
def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def table(res: dict[str, Any]) -> str:
    m = res.get("machine") or {}
    versions = (f"driver {m.get('driver')}, CUDA runtime {m.get('cuda_runtime')} / driver {m.get('cuda_driver')}, "
                f"CuPy {m.get('cupy')}, NVRTC {m.get('nvrtc')}, NumPy {m.get('numpy')}, gpuir {m.get('gpuir')}, "
                f"CPU {m.get('cpu')} x {m.get('cpu_count')}, {m.get('date')}")
    lines = [f"# gpu_verify: {m.get('device')}", "", versions, ""]
    pv = res.get("provenance") or {}
    if pv:
        lines += [(f"Commit {pv.get('commit')}, kernel sources sha256 {pv.get('kernel_sha256')}, "
                   f"Python sources sha256 {pv.get('source_sha256')}"), ""]
    if m.get("dry_run"):
        lines += ["**Dry run: no device. Kernels ran as the NumPy model; no figure below is a GPU figure.**", ""]
    if m.get("copy_bandwidth_gbs"):
        lines += [f"Device-to-device copy bandwidth (read + write): {m['copy_bandwidth_gbs']:.0f} GB/s", ""]
    steps = res.get("steps", {})
    lines += ["| step | result | seconds | detail |", "| --- | --- | --- | --- |"]
    for name, r in steps.items():
        ok = r.get("ok")
        verdict = "pass" if ok else ("FAIL" if ok is False else ("not run" if r.get("ran") is False else "done"))
        if r.get("error"):
            verdict, detail = "ERROR", r["error"][:160]
        elif "tail" in r or "summary" in r:
            detail = " ".join((r.get("summary") or r.get("tail") or [])[-1:])[:160]
            if r.get("timed_out"):
                detail = f"timed out after {r.get('timeout_s')} s; " + detail
        elif "cases" in r:
            detail = "; ".join(f"{c['case']}: {c['pairs_checked']} pairs, {c['wrong_scores']} wrong"
                               for c in r["cases"])
        else:
            detail = r.get("skipped") or r.get("note") or ""
        lines.append(f"| {name} | {verdict} | {r.get('seconds', '-')} | {detail} |")
    cells = [c for c in res.get("cells", []) if c["step"] in ("timings_small", "scale", "timings_rest")
             and "case" not in c]
    if cells:
        lines += ["", ("| N | B | k | queries/s | p50 ms (B=1) | prep / h2d / plan / score / topk / d2h ms | "
                       "fraction of floor | checked |"), "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in cells:
            ph = c.get("phases_s") or {}
            phs = " / ".join(f"{1e3 * ph.get(x, 0.0):.3f}"
                             for x in ("prep_s", "h2d_s", "plan_s", "score_s", "topk_s", "d2h_s"))
            chk = c.get("check")
            checked = "-" if not chk else (f"{chk['rows_checked']} rows, {chk['wrong_scores']} wrong"
                                           + ("" if c.get("ok") else " FAIL"))
            lines.append(f"| {c['n_docs']} | {c['batch']} | {c['k']} | {c['qps']:.0f} | {_fmt(c.get('p50_ms'))} | "
                         f"{phs} | {_fmt(c.get('fraction_of_floor'))} | {checked} |")
    ones = [c for c in cells if c.get("batch") == 1 and c.get("p50_ms_without_graphs") is not None]
    if ones:
        lines += ["", "| N | k (B = 1) | p50 ms, CUDA graph | p50 ms, no graph | 8 threads at once, queries/s |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {c['n_docs']} | {c['k']} | {c['p50_ms']:.3f} | {c['p50_ms_without_graphs']:.3f} | "
                  f"{(c.get('concurrent') or {}).get('qps', 0):.0f} |" for c in ones]
    b = [c for c in res.get("cells", []) if c["step"] == "bm25s"]
    if b:
        lines += ["", "| bm25s-numba (CPU) N | B | k | queries/s | p50 ms |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {c['n_docs']} | {c['batch']} | {c['k']} | {c['qps']:.0f} | {_fmt(c.get('p50_ms'))} |" for c in b]
    mc = [c for c in res.get("cells", []) if c["step"] == "memory"]
    if mc:
        lines += ["", ("| memory: partition days | records | segments | B | memory cupy q/s | memory numba q/s | "
                       "static cupy q/s | bit-identical |"), "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {c['partition_days'] or 'one'} | {c['records']} | {c['segments']} | {c['batch']} | "
                  f"{c['memory_cupy']['qps']:.0f} | {c['memory_numba']['qps']:.0f} | {c['static_cupy']['qps']:.0f} | "
                  f"{'yes' if c.get('ok') else 'NO'} |" for c in mc]
    if res.get("skipped"):
        lines += ["", "Skipped: " + ", ".join(res["skipped"])]
    return "\n".join(lines) + "\n"


# =============================================================================
# Main
# =============================================================================
def main(argv=None) -> int:
    args = parse_args(argv)
    ctx: Any = contextlib.ExitStack()
    if args.dry_run:
        from gpuir.backends.kernel_model import fake_cupy_installed, small_tiles

        ctx.enter_context(fake_cupy_installed(seed=args.seed))
        ctx.enter_context(small_tiles())
    else:
        from gpuir._compat import cuda_device

        usable, why = cuda_device()
        if not usable:
            print(f"gpu_verify: no GPU can be used: {why}. Run on a machine with an NVIDIA GPU and "
                  "'gpuir[gpu]', or pass --dry-run to exercise the script on the kernel model.", file=sys.stderr)
            return 2
    failed: list[str] = []
    with ctx:
        info = machine(args.dry_run)
        report = Report(args.out, str(info.get("device", "device")), args.dry_run)
        print(f"[gpu_verify] writing {report.dir / report.stem}.{{jsonl,md,log}}", file=sys.stderr, flush=True)
        run = Run(args, report)
        if not args.dry_run:
            from bench_gpu import copy_bandwidth_gbs  # device-to-device copy of 1 GiB, read + write

            info["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
        info["budget_s"] = args.budget_s
        info["steps"] = args.steps
        report.machine(info)
        for step in STEPS:
            if step.name not in args.steps:
                continue
            if run.left() < step.need_s:
                report.skipped(step.name, f"budget: {run.left():.0f} s left, needs {step.need_s:.0f} s")
                continue
            print(f"[gpu_verify] step {step.name} ({run.left():.0f} s left): {step.what}", file=sys.stderr,
                  flush=True)
            t = time.perf_counter()
            try:
                r = step.fn(run)
            except Exception as e:  # noqa: BLE001 - one step failing must not hide the others
                r = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc().splitlines()[-12:]}
            report.step_done(step.name, r, time.perf_counter() - t)
            if r.get("ok") is False:
                failed.append(step.name)
        report.event("end", total_s=round(time.perf_counter() - run.t0, 1), failed=failed)
    print(table(report.results))
    print(f"wrote {report.dir / report.stem}.jsonl, .md and .log", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
