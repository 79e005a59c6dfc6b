#!/usr/bin/env python
"""CPU benchmark: gpuir's compiled (numba) and NumPy backends against the BM25 peers, on one core,
then gpuir-numba's thread scaling.

Corpora
-------
* ``longmemeval``: every turn (``content``) of every question's
  ``haystack_sessions`` in LongMemEval-S (``gpuir.datapath.longmemeval_path("s")``),
  de-duplicated by text (about 189k documents); the 499 questions are the queries.
* ``synthetic``: :func:`gpuir.synthetic.generate` (1M records and 2,000
  recency-biased queries by default); recall@10 against its gold is reported
  as a sanity check.

Libraries (all in this process, one after the other, on one core)
-----------------------------------------------------------------
* ``gpuir-numba`` / ``gpuir-numpy``: ``BM25Index.build(..., analyzer="bm25s")``,
  ``search(backend="numba" | "numpy")`` (identical results: numpy is the
  reference, numba its compiled twin). Build time includes creating the scorer
  (the per-posting weights; for numba also the block index), so that it compares
  with bm25s, which precomputes its scores at index time. Numba's compiled code
  is loaded from its on-disk cache by an untimed warm-up on a tiny index (the
  first run on a machine compiles it, tens of seconds, once).
* ``bm25s-numpy`` / ``bm25s-numba``: ``bm25s.tokenize(stopwords="en",
  stemmer=Stemmer("english"))`` (token for token the same as gpuir's "bm25s"
  analyzer), ``BM25(backend=...)``, ``retrieve(n_threads=1)``.
* ``tantivy``: in-RAM index, default BM25 (k1=1.2, b=0.75), one writer thread,
  its own tokenizer (simple: split on non-alphanumerics)
  with lowercase, the same 33 stopwords and its Snowball English stemmer;
  default ``index_option`` (positions: a query word its tokenizer splits, such as
  ``covid_19``, becomes a phrase). A query is its bm25s-pattern tokens OR-ed.
  Hits are DocAddresses; mapping them to document numbers (for the quality
  columns) is not timed.
* ``sqlite-fts5``: stdlib sqlite3, ``:memory:`` FTS5 table with
  ``tokenize='porter unicode61'`` (its own tokenizer and Porter stemmer; no
  stopword removal in the index); a query is the OR of its tokens (bm25s token
  pattern, the 33 stopwords removed query-side) ranked by ``bm25()``
  (k1=1.2, b=0.75).
* ``rank_bm25``: ``BM25Okapi`` (k1=1.2, b=0.75; its own idf with an epsilon floor)
  over gpuir's "bm25s" tokens, on a subset of ``--rank-bm25-docs`` documents
  only (it scores every document in Python); gpuir-numba is measured on the same
  subset (row ``gpuir-numba@subset``) for comparison.

Every library uses lucene-style BM25 with k1=1.2, b=0.75, top-10.

Method
------
Thread pools are pinned to one (``OMP/MKL/OPENBLAS/NUMBA/RAYON_NUM_THREADS=1``,
set before any import) and the process is pinned to one CPU
(``sched_setaffinity``; ``--no-pin`` to skip). Build time is from raw strings to
a searchable index. Query throughput includes query analysis: one warm-up pass
(JIT compilation, caches), then ``--repeats`` timed passes over the same queries;
the median pass gives queries/s. Slow libraries are timed on a prefix of the
queries so a pass fits the time budget (``--budget-s``); the JSON records how
many. Memory: resident set size (psutil) sampled every 5 ms during the build;
``build_peak_mb`` is the peak above the RSS before the build, ``index_mb`` what
remains after it (freed memory is handed back with ``malloc_trim`` between
libraries).

Thread scaling (``--threads``, default 1, 2, 4, ... up to the cores the process
may use): after its single-core row, gpuir-numba answers the same queries with
``threads=t`` on t CPUs (``sched_setaffinity`` widened to t of them), query
analysis included. The thread counts take turns pass by pass (at least 5
rounds after a warm-up) so that load from other jobs hits them alike;
queries/s is each count's best pass (the median is in the JSON) and the
speed-up is over t = 1 in the same run.

Usage
-----
::

    .venv/bin/python bench/bench_cpu.py                # full run (tens of minutes)
    .venv/bin/python bench/bench_cpu.py --quick        # a minute or two
    .venv/bin/python bench/bench_cpu.py --render-only bench/results/bench_cpu.json

Writes ``bench/results/bench_cpu.json`` (``--out``), prints a table, and renders
the tables into ``docs/benchmarks.md`` between the ``bench_cpu`` markers, a bar
plot into ``docs/img/bench_cpu.png`` and the thread scaling into
``docs/img/bench_cpu_threads.png`` (``--no-docs`` to skip; see
``bench_cpu_report.py``).
"""

from __future__ import annotations

import os

# Single core: must happen before NumPy / Numba / tantivy are imported.
for _v in (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "RAYON_NUM_THREADS",
):
    os.environ[_v] = "1"

import argparse
import ctypes
import datetime as _dt
import gc
import gzip
import json
import platform
import re
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from typing_extensions import Self

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_report import MARK_BEGIN, MARK_END, print_table, write_docs, write_markdown  # noqa: F401

sys.path.pop(0)

ALL_LIBS = ("gpuir-numba", "gpuir-numpy", "bm25s-numpy", "bm25s-numba", "tantivy", "sqlite-fts5", "rank_bm25")
GPUIR = ("gpuir-numba", "gpuir-numpy")
#: The row every other library's top-10 is compared with: the reference backend.
REF = "gpuir-numpy"
ALL_CORPORA = ("longmemeval", "synthetic")
K1, B = 1.2, 0.75
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


# ---------------------------------------------------------------------------
# Machine, memory
# ---------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str]:
    import importlib.metadata as md
    import sqlite3

    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in ("gpuir", "numpy", "scipy", "PyStemmer", "bm25s", "numba", "tantivy",
                 "rank-bm25", "psutil", "matplotlib"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def machine_info(pinned: list[int] | None) -> dict[str, Any]:
    import psutil

    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "pinned_cpus": pinned,
        "thread_env": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS",
                                                      "RAYON_NUM_THREADS")},
    }


def _trim() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


class PeakRSS:
    """Context manager sampling this process's RSS every ``interval`` seconds.

    Attributes after exit: ``base_mb``, ``peak_mb`` (absolute, MiB).
    """

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.base_mb = self.peak_mb = 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        import psutil

        p = psutil.Process()
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, p.memory_info().rss / 2**20)
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self.base_mb = self.peak_mb = rss_mb()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak_mb = max(self.peak_mb, rss_mb())


# ---------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------


@dataclass
class Corpus:
    name: str
    texts: list[str]
    queries: list[str]
    gold: list[np.ndarray] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: Each text's session id, where the corpus has sessions (LongMemEval: the first session holding the turn).
    sessions: list[str] | None = None


def load_longmemeval(max_docs: int | None = None, max_queries: int | None = None) -> Corpus:
    """Every haystack turn of LongMemEval-S, de-duplicated by text, and its 499 questions."""
    from gpuir.datapath import longmemeval_path

    path = longmemeval_path("s")
    if not path.exists():
        raise FileNotFoundError(
            f"LongMemEval-S not found at {path}: set GPUIR_DATA to the data folder, "
            "or run with --corpora synthetic"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    seen: dict[str, str] = {}  # turn text -> the first session holding it
    for entry in data:
        for sid, session in zip(entry["haystack_session_ids"], entry["haystack_sessions"]):
            for turn in session:
                seen.setdefault(turn["content"], sid)
    texts = list(seen)
    sessions = list(seen.values())
    queries = [e["question"] for e in data]
    del data, seen
    if max_docs:
        texts, sessions = texts[:max_docs], sessions[:max_docs]
    if max_queries:
        queries = queries[:max_queries]
    return Corpus("longmemeval", texts, queries, None,
                  {"source": str(path), "dedup": "by turn text", "n_docs": len(texts),
                   "n_queries": len(queries)}, sessions)


def load_synthetic(n_records: int, n_queries: int, seed: int) -> Corpus:
    from gpuir.synthetic import generate

    t0 = time.perf_counter()
    mem = generate(n_records, n_queries=n_queries, seed=seed)
    gen_s = time.perf_counter() - t0
    return Corpus("synthetic", mem.texts, mem.queries, mem.gold,
                  {"source": f"gpuir.synthetic.generate(n_records={n_records}, "
                             f"n_queries={n_queries}, seed={seed})",
                   "n_docs": n_records, "n_queries": n_queries, "generate_s": round(gen_s, 3)})


# ---------------------------------------------------------------------------
# Libraries: build(texts); search(queries, k) -> raw; to_ids(raw) -> (B, k) int64
# ---------------------------------------------------------------------------


class Lib:
    name = ""
    analyzer = ""

    def build(self, texts: list[str]) -> None:
        raise NotImplementedError

    def search(self, queries: list[str], k: int) -> Any:
        raise NotImplementedError

    def to_ids(self, raw: Any, k: int) -> np.ndarray:
        """Document numbers (B, k) int64, -1 padding (not timed)."""
        return np.asarray(raw, dtype=np.int64)

    def breakdown(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class GpuirLib(Lib):
    analyzer = 'gpuir "bm25s" (bm25s tokens: \\w\\w+, 33 stopwords, Snowball English)'

    def __init__(self, backend: str):
        from gpuir.engine import BM25Index

        self.backend = backend
        self.name = f"gpuir-{backend}"
        # untimed warm-up: imports, and numba's compiled kernels loaded from its cache
        BM25Index.build(["warm up", "the kernels"], analyzer="bm25s", progress=False).search(
            ["warm"], k=1, backend=backend)

    def build(self, texts):
        from gpuir.engine import BM25Index

        self.idx = BM25Index.build(texts, analyzer="bm25s", method="lucene", k1=K1, b=B,
                                   progress=False)
        self.idx.scorer(self.backend)  # per-posting weights, as bm25s precomputes its scores
        self._meta: dict = {}

    def search(self, queries, k):
        res = self.idx.search(queries, k=k, backend=self.backend)
        self._meta = res.meta
        return res.ids

    def breakdown(self):
        t = dict(self._meta.get("timings", {}))
        return {key: float(v) for key, v in t.items() if isinstance(v, (int, float))}

    def close(self):
        del self.idx


class Bm25sLib(Lib):
    analyzer = "bm25s.tokenize(stopwords='en', stemmer=Snowball English)"

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"bm25s-{backend}"
        self._tok_s = 0.0
        self._ret_s = 0.0

    def build(self, texts):
        import bm25s
        import Stemmer

        self.stemmer = Stemmer.Stemmer("english")
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, show_progress=False)
        self.r = bm25s.BM25(k1=K1, b=B, method="lucene", backend=self.backend)
        self.r.index(tokens, show_progress=False)

    def search(self, queries, k):
        import bm25s

        t0 = time.perf_counter()
        qt = bm25s.tokenize(queries, stopwords="en", stemmer=self.stemmer, return_ids=False,
                            show_progress=False)
        t1 = time.perf_counter()
        kw = {} if self.backend == "numba" else {"backend_selection": "numpy"}
        docs, scores = self.r.retrieve(qt, k=k, n_threads=1, show_progress=False, **kw)
        t2 = time.perf_counter()
        self._tok_s, self._ret_s = t1 - t0, t2 - t1
        return np.where(scores > 0, docs, -1)

    def breakdown(self):
        return {"tokenize_s": self._tok_s, "retrieve_s": self._ret_s}

    def close(self):
        del self.r


def _en_stopwords() -> list[str]:
    from gpuir.analysis import stopwords

    return sorted(stopwords("en"))


class TantivyLib(Lib):
    name = "tantivy"
    analyzer = "tantivy simple tokenizer + lowercase + same 33 stopwords + Snowball English"

    def build(self, texts):
        import tantivy

        analyzer = (
            tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
            .filter(tantivy.Filter.remove_long(40))
            .filter(tantivy.Filter.lowercase())
            .filter(tantivy.Filter.custom_stopword(_en_stopwords()))
            .filter(tantivy.Filter.stemmer("english"))
            .build()
        )
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("body", stored=False, tokenizer_name="gpuir_en")  # positions: default
        sb.add_unsigned_field("num", stored=True)
        self.index = tantivy.Index(sb.build())  # no path: in RAM
        self.index.register_tokenizer("gpuir_en", analyzer)
        writer = self.index.writer(heap_size=512 * 2**20, num_threads=1)
        Doc = tantivy.Document
        for i, t in enumerate(texts):
            writer.add_document(Doc(body=t, num=i))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, queries, k):
        out = []
        parse, search = self.index.parse_query, self.searcher.search
        for q in queries:
            qs = " ".join(_TOKEN.findall(q.lower()))
            if not qs:
                out.append([])
                continue
            out.append(search(parse(qs, ["body"]), k, count=False).hits)
        return out

    def to_ids(self, raw, k):
        ids = np.full((len(raw), k), -1, dtype=np.int64)
        for i, hits in enumerate(raw):
            for j, (_score, addr) in enumerate(hits):
                ids[i, j] = self.searcher.doc(addr)["num"][0]
        return ids

    def close(self):
        del self.searcher, self.index


class SqliteLib(Lib):
    name = "sqlite-fts5"
    analyzer = "FTS5 porter unicode61 (no stopwords in index; 33 removed query-side), OR query"

    def build(self, texts):
        import sqlite3

        self.con = sqlite3.connect(":memory:")
        try:
            self.con.execute(
                "CREATE VIRTUAL TABLE docs USING fts5(body, tokenize='porter unicode61')"
            )
        except sqlite3.OperationalError as e:
            raise RuntimeError(
                f"this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5: {e}; "
                "drop sqlite-fts5 from --libs"
            ) from e
        with self.con:
            self.con.executemany("INSERT INTO docs(rowid, body) VALUES (?, ?)",
                                 ((i + 1, t) for i, t in enumerate(texts)))
        self.stop = frozenset(_en_stopwords())

    def search(self, queries, k):
        sql = "SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY rank LIMIT ?"
        cur = self.con.cursor()
        out = []
        for q in queries:
            toks = [t for t in _TOKEN.findall(q.lower()) if t not in self.stop]
            if not toks:
                out.append([])
                continue
            match = " OR ".join('"' + t.replace('"', '""') + '"' for t in dict.fromkeys(toks))
            out.append([r[0] - 1 for r in cur.execute(sql, (match, k))])
        return out

    def to_ids(self, raw, k):
        ids = np.full((len(raw), k), -1, dtype=np.int64)
        for i, row in enumerate(raw):
            ids[i, : len(row)] = row
        return ids

    def close(self):
        self.con.close()


class RankBm25Lib(Lib):
    name = "rank_bm25"
    analyzer = 'gpuir "bm25s" tokens; BM25Okapi idf (epsilon floor)'

    def build(self, texts):
        from rank_bm25 import BM25Okapi

        from gpuir.analysis import Analyzer

        self.an = Analyzer("bm25s")
        self.bm = BM25Okapi([self.an(t) for t in texts], k1=K1, b=B)

    def search(self, queries, k):
        out = np.full((len(queries), k), -1, dtype=np.int64)
        for i, q in enumerate(queries):
            s = self.bm.get_scores(self.an(q))
            kk = min(k, s.size)
            top = np.argpartition(-s, kk - 1)[:kk]
            top = top[np.lexsort((top, -s[top]))]
            top = top[s[top] > 0]
            out[i, : top.size] = top
        return out

    def close(self):
        del self.bm


def make_lib(name: str) -> Lib:
    if name in GPUIR:
        return GpuirLib(name.split("-", 1)[1])
    if name in ("bm25s-numpy", "bm25s-numba"):
        return Bm25sLib(name.split("-", 1)[1])
    if name == "tantivy":
        return TantivyLib()
    if name == "sqlite-fts5":
        return SqliteLib()
    if name == "rank_bm25":
        return RankBm25Lib()
    raise ValueError(f"unknown library {name!r}: choose from {', '.join(ALL_LIBS)}")


# ---------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------


def recall_any(ids: np.ndarray, gold: Sequence[np.ndarray]) -> float:
    """Share of queries with at least one gold record in their row of ``ids``."""
    hit = [np.isin(g, row).any() for row, g in zip(ids, gold)]
    return float(np.mean(hit)) if hit else float("nan")


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean |top-k(a) ∩ top-k(b)| / max(1, |top-k(a)|) over rows (real hits only)."""
    vals = []
    for ra, rb in zip(a, b):
        sa, sb = set(ra[ra >= 0].tolist()), set(rb[rb >= 0].tolist())
        if sa or sb:
            vals.append(len(sa & sb) / max(len(sa), len(sb)))
    return float(np.mean(vals)) if vals else float("nan")


def bench_one(lib: Lib, corpus: Corpus, texts: list[str], k: int, repeats: int,
              budget_s: float, log) -> tuple[dict[str, Any], np.ndarray]:
    """Build, warm up and time one library on one corpus; returns its row and ids."""
    _trim()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with PeakRSS() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        lib.build(texts)
        build_s, build_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    _trim()
    index_mb = rss_mb() - mem.base_mb
    log(f"  {lib.name:<14} built in {build_s:8.2f} s (peak +{mem.peak_mb - mem.base_mb:,.0f} MB)")

    queries = corpus.queries
    n_w = min(len(queries), 50)
    lib.search(queries[:n_w], k)  # warm-up: JIT compilation, caches
    t0 = time.perf_counter()
    lib.search(queries[:n_w], k)  # estimate the per-query time, warm
    est = max((time.perf_counter() - t0) / max(n_w, 1), 1e-7)
    n_use = len(queries)
    if est * n_use * repeats > budget_s:
        n_use = int(min(len(queries), max(n_w, budget_s / (est * repeats))))
    qs = queries[:n_use]
    times, cpu_times, raw = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        raw = lib.search(qs, k)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    med, med_cpu = float(np.median(times)), max(float(np.median(cpu_times)), 1e-9)
    ids = lib.to_ids(raw, k)
    row: dict[str, Any] = {
        "corpus": corpus.name,
        "library": lib.name,
        "analyzer": lib.analyzer,
        "n_docs": len(texts),
        "n_queries_timed": n_use,
        "n_queries_total": len(queries),
        "k": k,
        "build_s": round(build_s, 3),
        "build_cpu_s": round(build_cpu_s, 3),
        "qps": round(n_use / med, 2),
        "qps_cpu": round(n_use / med_cpu, 2),
        "ms_per_query": round(1000 * med / n_use, 4),
        "pass_times_s": [round(t, 4) for t in times],
        "pass_cpu_s": [round(t, 4) for t in cpu_times],
        "loadavg_1min": [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "build_peak_mb": round(mem.peak_mb - mem.base_mb, 1),
        "index_mb": round(index_mb, 1),
        "breakdown_s": {key: round(v, 4) for key, v in lib.breakdown().items()},
    }
    if corpus.gold is not None and len(texts) == len(corpus.texts):
        row["recall_any@10"] = round(recall_any(ids, corpus.gold[:n_use]), 4)
    log(f"  {lib.name:<14} {row['qps']:>10,.1f} q/s on {n_use} queries "
        f"(median of {repeats}: {med:.3f} s)")
    return row, ids


def _ratio(g: dict, peer: dict) -> dict[str, float]:
    """gpuir's speed over a peer's: > 1 means gpuir is faster (wall and CPU time)."""
    return {
        "qps": round(g["qps"] / peer["qps"], 3),
        "qps_cpu": round(g["qps_cpu"] / peer["qps_cpu"], 3),
        "build_speedup": round(peer["build_s"] / g["build_s"], 3),
        "build_speedup_cpu": round(peer["build_cpu_s"] / g["build_cpu_s"], 3),
    }


def thread_counts(spec: str | None, n_cpus: int) -> list[int]:
    """Thread counts of the scaling run: ``spec`` ("1,2,4") or 1, 2, 4, ... and ``n_cpus``."""
    if spec:
        counts = sorted({int(x) for x in spec.split(",") if x.strip()})
        bad = [c for c in counts if c < 1 or c > n_cpus]
        if bad:
            raise SystemExit(f"--threads {spec}: counts must lie in [1, {n_cpus}] (the CPUs this process may use)")
        return counts
    counts, t = [], 1
    while t < n_cpus:
        counts.append(t)
        t *= 2
    return [*counts, n_cpus]


def thread_scaling(lib: Lib, corpus: Corpus, k: int, repeats: int, cpus: list[int], counts: list[int],
                   log) -> list[dict[str, Any]]:
    """gpuir-numba's queries/s with t threads on t CPUs, query analysis included (see the module docstring).

    The thread counts take turns, pass by pass (``max(repeats, 5)`` rounds), so
    a burst of load from another job hits them alike; queries/s is the best
    pass of each (the median is recorded too).
    """
    from gpuir.backends.numba_backend import NumbaScorer

    idx, queries = lib.idx, corpus.queries  # type: ignore[attr-defined]
    scorers = {t: NumbaScorer(idx.csr, idx.params, threads=t) for t in counts}
    times: dict[int, list[float]] = {t: [] for t in counts}
    loads = []
    for rnd in range(max(repeats, 5) + 1):
        for t in counts:
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, set(cpus[:t]))
            t0 = time.perf_counter()
            scorers[t].search(idx.query_terms(queries), k)
            if rnd:  # round 0 warms up: the pools' threads and workspaces
                times[t].append(time.perf_counter() - t0)
        loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    rows: list[dict[str, Any]] = []
    for t in counts:
        rows.append({"threads": t, "cpus": cpus[:t], "qps": round(len(queries) / min(times[t]), 2),
                     "qps_median": round(len(queries) / float(np.median(times[t])), 2),
                     "pass_times_s": [round(x, 4) for x in times[t]], "loadavg_1min": max(loads)})
        rows[-1]["speedup"] = round(rows[-1]["qps"] / rows[0]["qps"], 3)
        log(f"  gpuir-numba threads={t}: {rows[-1]['qps']:,.1f} q/s ({rows[-1]['speedup']:.2f}x one thread)")
    del scorers
    _trim()
    return rows


def run(args, log=print) -> dict[str, Any]:
    pinned = None
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpus[0]})
        pinned = [cpus[0]]
    libs = [x.strip() for x in args.libs.split(",") if x.strip()]
    for name in libs:
        if name not in ALL_LIBS:
            raise SystemExit(f"unknown library {name!r} in --libs: choose from {', '.join(ALL_LIBS)}")
    corpora = [x.strip() for x in args.corpora.split(",") if x.strip()]
    for name in corpora:
        if name not in ALL_CORPORA:
            raise SystemExit(f"unknown corpus {name!r} in --corpora: choose from {', '.join(ALL_CORPORA)}")
    counts = thread_counts(args.threads, len(cpus))

    out: dict[str, Any] = {
        "benchmark": "bench_cpu",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(pinned),
        "versions": versions(),
        "config": {key: v for key, v in vars(args).items()},
        "bm25": {"method": "lucene", "k1": K1, "b": B},
        "corpora": {},
        "results": [],
        "ratios": {},
        "thread_scaling": {},
        "errors": [],
    }
    if args.note:
        out["note"] = args.note
    for cname in corpora:
        log(f"== corpus {cname}")
        if cname == "longmemeval":
            corpus = load_longmemeval(args.lme_max_docs, args.lme_max_queries or args.max_queries)
        else:
            corpus = load_synthetic(args.synthetic_records,
                                    args.max_queries or args.synthetic_queries, args.seed)
        out["corpora"][cname] = corpus.info
        log(f"   {len(corpus.texts):,} documents, {len(corpus.queries):,} queries")
        ids_of: dict[str, np.ndarray] = {}
        rows: dict[str, dict] = {}
        from gpuir.progress import progress_bar

        for name in progress_bar(libs, desc=f"{cname} libraries", unit="lib"):  # on a terminal only
            subset = name == "rank_bm25"
            names = ["gpuir-numba@subset", name] if subset else [name]
            texts = corpus.texts[: args.rank_bm25_docs] if subset else corpus.texts
            for nm in names:
                lib = None
                try:
                    lib = make_lib(nm.split("@")[0])
                    lib.name = nm
                    row, ids = bench_one(lib, corpus, texts, args.k, args.repeats,
                                         args.slow_budget_s if subset else args.budget_s, log)
                    if nm == "gpuir-numba" and not args.no_scaling:
                        out["thread_scaling"][cname] = thread_scaling(lib, corpus, args.k, args.repeats, cpus,
                                                                      counts, log)
                except Exception as e:  # noqa: BLE001 - keep the other libraries' figures
                    msg = f"{cname}/{nm}: {type(e).__name__}: {e}"
                    log("  FAILED " + msg)
                    out["errors"].append(msg)
                    continue
                finally:
                    if pinned:
                        os.sched_setaffinity(0, set(pinned))
                    if lib is not None:
                        lib.close()
                    del lib
                    _trim()
                ids_of[nm], rows[nm] = ids, row
                out["results"].append(row)
        # Agreement of each library's top-k with the reference's (same documents, shared query prefix).
        ref_all = REF if REF in ids_of else "gpuir-numba"
        for nm, row in rows.items():
            ref = "gpuir-numba@subset" if nm == "rank_bm25" else ref_all
            if nm not in (ref, "gpuir-numba@subset") and ref in ids_of:
                n = min(len(ids_of[nm]), len(ids_of[ref]))
                row["overlap@10_vs_gpuir"] = round(overlap(ids_of[nm][:n], ids_of[ref][:n]), 4)
        ratios = {}
        for g in GPUIR:
            for peer in ("gpuir-numpy", "bm25s-numpy", "bm25s-numba", "tantivy", "sqlite-fts5"):
                if g in rows and peer in rows and peer != g:
                    ratios[f"{g}/{peer}"] = _ratio(rows[g], rows[peer])
        if "gpuir-numba@subset" in rows and "rank_bm25" in rows:
            ratios["gpuir-numba/rank_bm25 (subset)"] = _ratio(rows["gpuir-numba@subset"], rows["rank_bm25"])
        out["ratios"][cname] = ratios
        del corpus, ids_of
        _trim()
    return out


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Single-core CPU benchmark of gpuir's NumPy backend against bm25s, "
                    "tantivy, SQLite FTS5 and rank_bm25.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--corpora", default=",".join(ALL_CORPORA),
                   help=f"comma-separated, from: {', '.join(ALL_CORPORA)}")
    p.add_argument("--libs", default=",".join(ALL_LIBS), help=f"comma-separated, from: {', '.join(ALL_LIBS)}")
    p.add_argument("--synthetic-records", type=int, default=1_000_000)
    p.add_argument("--synthetic-queries", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lme-max-docs", type=int, default=None, help="cap LongMemEval documents")
    p.add_argument("--lme-max-queries", type=int, default=None, help="cap LongMemEval queries")
    p.add_argument("--max-queries", type=int, default=None, help="cap queries per corpus")
    p.add_argument("--rank-bm25-docs", type=int, default=20_000, help="subset size for rank_bm25")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="timed passes (median reported)")
    p.add_argument("--budget-s", type=float, default=60.0,
                   help="time for the timed passes per library; slower ones time fewer queries")
    p.add_argument("--slow-budget-s", type=float, default=60.0, help="the same for rank_bm25")
    p.add_argument("--quick", action="store_true",
                   help="small sizes: 20k synthetic records / 200 queries, LongMemEval capped at "
                        "20k docs / 100 queries, 5k-doc rank_bm25 subset, 2 repeats, 5 s budgets "
                        "(explicit size options still win)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "bench_cpu.json")
    p.add_argument("--md", type=Path, default=REPO / "docs" / "benchmarks.md")
    p.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "bench_cpu.png")
    p.add_argument("--no-docs", action="store_true", help="do not touch docs/ (markdown and PNG)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    p.add_argument("--threads", default=None,
                   help="thread counts of gpuir-numba's scaling run, e.g. 1,2 (default 1, 2, 4, ... all CPUs)")
    p.add_argument("--no-scaling", action="store_true", help="skip the thread-scaling run")
    p.add_argument("--note", default=None, help="a note stored in the JSON and shown in the docs "
                                                "(e.g. that other jobs shared the machine)")
    p.add_argument("--render-only", type=Path, default=None, metavar="JSON",
                   help="re-render the table, markdown and plot from an existing JSON and exit")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0] for a in argv if a.startswith("--")}
        quick = {"--synthetic-records": ("synthetic_records", 20_000),
                 "--synthetic-queries": ("synthetic_queries", 200),
                 "--lme-max-docs": ("lme_max_docs", 20_000),
                 "--lme-max-queries": ("lme_max_queries", 100),
                 "--rank-bm25-docs": ("rank_bm25_docs", 5_000),
                 "--repeats": ("repeats", 2),
                 "--budget-s": ("budget_s", 5.0),
                 "--slow-budget-s": ("slow_budget_s", 5.0)}
        for opt, (dest, val) in quick.items():
            if opt not in given and val is not None:
                setattr(args, dest, val)
    for name in ("synthetic_records", "synthetic_queries", "rank_bm25_docs", "k", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_only:
        res = json.loads(args.render_only.read_text("utf-8"))
        print_table(res)
        if not args.no_docs:
            write_docs(res, args.md, args.png)
        return 0
    from tqdm import tqdm

    res = run(args, log=lambda s: tqdm.write(s, file=sys.stdout))  # lines above the progress bar
    args.out.parent.mkdir(parents=True, exist_ok=True)
    res["config"] = {key: (str(v) if isinstance(v, Path) else v) for key, v in res["config"].items()}
    args.out.write_text(json.dumps(res, indent=2) + "\n", "utf-8")
    print_table(res)
    print(f"wrote {args.out}")
    if not args.no_docs:
        write_docs(res, args.md, args.png)
        print(f"wrote {args.md} and {args.png}")
    return 1 if res["errors"] and not res["results"] else 0


if __name__ == "__main__":
    sys.exit(main())
