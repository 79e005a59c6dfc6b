"""The main job (``gpuir demo`` / ``make demo``).

Generate synthetic agent memory, index it, answer the queries in batches on the
best available backend, and print what a user wants to know: records/s indexed,
queries/s, p50/p99 batch latency, Recall@10 against the generator's gold, and
which backend ran and why.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def recall_at_k(ids: np.ndarray, gold: list[np.ndarray]) -> float:
    """Mean over queries of |top-k ∩ gold| / |gold|.

    Parameters
    ----------
    ids : ndarray (Q, k), int64, host (-1 = padding)
    gold : list of Q ndarrays of relevant document numbers
    """
    vals = [np.isin(g, row).mean() if len(g) else 0.0 for row, g in zip(ids, gold)]
    return float(np.mean(vals)) if vals else 0.0


def _plain_reason(reason: str) -> str:
    """The backend choice's reason with CuPy's raw error replaced by the one-line diagnosis."""
    from ._compat import cuda_device
    from .gpu_info import diagnose

    raw = cuda_device()
    if raw[0] or not raw[1] or raw[1] not in reason:
        return reason
    return reason.replace(raw[1], diagnose(raw)[1])


def run_demo(
    n_records: int = 200_000,
    n_queries: int = 2_000,
    seed: int = 0,
    batch_size: int = 256,
    k: int = 10,
    backend: str = "auto",
    out=sys.stdout,
) -> dict:
    """Run the main job and print its figures; returns them as a dict."""
    from .backends import resolve_backend
    from .engine import BM25Index
    from .synthetic import generate

    if n_records < 1 or n_queries < 1 or batch_size < 1 or k < 1:
        raise ValueError("--records, --queries, --batch-size and -k must all be positive")
    name, reason = resolve_backend(backend)
    reason = _plain_reason(reason)
    def p(*a):
        print(*a, file=out, flush=True)

    p(f"gpuir demo: {n_records:,} synthetic agent-memory records, {n_queries:,} queries, seed {seed}")
    p(f"backend: {name} ({reason})")

    t0 = time.perf_counter()
    mem = generate(n_records=n_records, n_queries=n_queries, seed=seed)
    t_gen = time.perf_counter() - t0
    p(f"generated in {t_gen:.1f} s")

    t0 = time.perf_counter()
    idx = BM25Index.build(mem.texts, ids=mem.ids, progress=None)
    t_build = time.perf_counter() - t0
    p(
        f"indexed {idx.n_docs:,} records in {t_build:.1f} s = {idx.n_docs / t_build:,.0f} records/s "
        f"({idx.csr.n_terms:,} terms, {idx.csr.n_postings:,} postings)"
    )

    queries = list(mem.queries)
    # warm-up: scorer construction (posting weights, device upload) is not query time
    idx.search(queries[: min(batch_size, len(queries))], k=k, backend=name)
    lat, all_ids = [], []
    t0 = time.perf_counter()
    for s in range(0, len(queries), batch_size):
        tb = time.perf_counter()
        res = idx.search(queries[s : s + batch_size], k=k, backend=name)
        lat.append(time.perf_counter() - tb)
        all_ids.append(res.ids)
    t_q = time.perf_counter() - t0
    ids = np.concatenate(all_ids)
    rec = recall_at_k(ids, mem.gold)
    lat_ms = np.asarray(lat) * 1e3
    figures = {
        "records": idx.n_docs,
        "queries": len(queries),
        "backend": name,
        "backend_reason": reason,
        "records_per_s": idx.n_docs / t_build,
        "queries_per_s": len(queries) / t_q,
        "batch_size": batch_size,
        "p50_batch_ms": float(np.percentile(lat_ms, 50)),
        "p99_batch_ms": float(np.percentile(lat_ms, 99)),
        f"recall_at_{k}": rec,
    }
    p(f"searched {len(queries):,} queries in batches of {batch_size}: {figures['queries_per_s']:,.0f} queries/s")
    p(f"batch latency: p50 {figures['p50_batch_ms']:.1f} ms, p99 {figures['p99_batch_ms']:.1f} ms")
    p(f"Recall@{k} against the generator's gold: {rec:.4f}")
    return figures
