"""BM25 evaluation through :class:`gpuir.Memory`: one shared memory, and one memory per tenant.

``memory``
    One memory over the whole collection (:func:`gpuir.eval.records.dataset_records`,
    in document order), each question confined to its haystack by a ``where``:
    its tenant (``{"tenant": conversation}`` in LoCoMo, where every session
    belongs to one conversation) or, when its haystack is not one tenant's
    records (LongMemEval sessions are shared by several haystacks), the
    membership of its documents (``{"id": {"in": [...]}}``). Statistics are global,
    as in the ``bm25`` method, whose results it reproduces exactly (ids and
    float32 scores; tested).
``memory-tenant``
    One memory per tenant: a LoCoMo conversation, a LongMemEval question's
    haystack (its sessions, in haystack order). Statistics are the tenant's
    own, what a deployed per-user memory sees; it reproduces ``bm25-private``
    exactly.

Both take the ``bm25`` method's options (analyzer, variant, k1, b, delta).
Time partitions are off (``partition_days=None``): no question here filters
by time, so partitions could not change a result.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..memory import Memory
from ..results import padded_arrays
from .datasets import EvalDataset, EvalQuery
from .records import dataset_records
from .runner import Run, bm25_arguments, bm25_from_args, haystack_groups, register_method

_CACHE: dict[tuple, Any] = {}


def _memory(ds: EvalDataset, analyzer, variant, k1, b, delta) -> tuple[Memory, list[str | None]]:
    """The shared memory of ``ds`` (built once per data set and settings), and each document's tenant."""
    key = (id(ds), ds.n_docs, repr(analyzer), variant, float(k1), float(b), float(delta))
    if key not in _CACHE:
        if len(_CACHE) >= 4:
            _CACHE.pop(next(iter(_CACHE)))
        recs = dataset_records(ds)
        m = Memory(analyzer=analyzer, method=variant, k1=k1, b=b, delta=delta, partition_days=None)
        m.add(recs)
        _CACHE[key] = (ds, m, [r.get("tenant") for r in recs])  # ds kept alive: id(ds) stays unique
    return _CACHE[key][1], _CACHE[key][2]


def haystack_wheres(ds: EvalDataset, queries: Sequence[EvalQuery], tenants: list[str | None]) -> list[dict | None]:
    """Each question's ``where``: its tenant when its haystack is exactly that tenant's records, else its ids."""
    by_tenant: dict[str, set[str]] = {}
    for d, t in zip(ds.doc_ids, tenants):
        if t is not None:
            by_tenant.setdefault(t, set()).add(d)
    out: list[dict | None] = []
    for q in queries:
        if q.candidates is None:
            out.append(None)
        elif q.group in by_tenant and by_tenant[q.group] == set(q.candidates):
            out.append({"tenant": q.group})
        else:
            out.append({"id": {"in": list(q.candidates)}})
    return out


def _to_run(ds: EvalDataset, res, rows: np.ndarray, ranked: np.ndarray, scores: np.ndarray) -> None:
    idx = ds.doc_index
    for j, i in enumerate(rows.tolist()):
        ids = res.ids(j)
        ranked[i, : len(ids)] = [idx[d] for d in ids]
        scores[i, : len(ids)] = res.scores[j, : len(ids)]


@register_method("memory", help="BM25 through gpuir.Memory: one shared memory, questions confined by a where "
                 "(tenant or ids); equals bm25", add_arguments=bm25_arguments, from_args=bm25_from_args)
def memory_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                  progress: bool = False, analyzer: Any = "default", variant: str = "lucene", k1: float = 1.2,
                  b: float = 0.75, delta: float = 0.5, batch_size: int = 1024) -> Run:
    """One shared memory; each question filtered to its haystack (global statistics)."""
    t0 = time.perf_counter()
    m, tenants = _memory(ds, analyzer, variant, k1, b, delta)
    t_index = time.perf_counter() - t0
    wheres = haystack_wheres(ds, queries, tenants)
    B = len(queries)
    ranked, scores = padded_arrays(B, k)
    meta: dict[str, Any] = {}
    t1 = time.perf_counter()
    starts = range(0, B, batch_size)
    if progress and B > batch_size:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="search", unit="batch", file=sys.stderr)
    for s in starts:
        rows = np.arange(s, min(B, s + batch_size))
        res = m.search([queries[i].text for i in rows], k=k, where=[wheres[i] for i in rows], backend=backend)
        _to_run(ds, res, rows, ranked, scores)
        meta = res.meta
    n_tenant = sum(1 for w in wheres if w is not None and "tenant" in w)
    return Run(ranked, scores, {
        "backend": meta.get("backend"), "backend_reason": meta.get("backend_reason"),
        "memory": {"records": len(m), "segments": len(m.snapshot().views), "tenant_filters": n_tenant,
                   "id_filters": sum(1 for w in wheres if w is not None) - n_tenant},
        "bm25": m.params.to_dict(), "analyzer": m.analyzer_config,
        "timings": {"index_s": t_index, "search_s": time.perf_counter() - t1},
    })


@register_method("memory-tenant", help="BM25 through one gpuir.Memory per tenant (conversation / question "
                 "haystack): private statistics; equals bm25-private", add_arguments=bm25_arguments,
                 from_args=bm25_from_args)
def memory_tenant_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                         progress: bool = False, analyzer: Any = "default", variant: str = "lucene",
                         k1: float = 1.2, b: float = 0.75, delta: float = 0.5) -> Run:
    """One memory per distinct haystack (LoCoMo: conversation; LongMemEval: question)."""
    t0 = time.perf_counter()
    B = len(queries)
    ranked, scores = padded_arrays(B, k)
    idx = ds.doc_index
    meta: dict[str, Any] = {}
    items = haystack_groups(queries, progress, "tenants", "memory")
    for cands, qi in items:
        docs = ds.doc_ids if cands is None else cands
        tenant = queries[qi[0]].group
        m = Memory(analyzer=analyzer, method=variant, k1=k1, b=b, delta=delta, partition_days=None)
        m.add({"id": d, "text": ds.doc_texts[idx[d]], "tenant": tenant} for d in docs)
        rows = np.asarray(qi, dtype=np.int64)
        res = m.search([queries[i].text for i in qi], k=k, backend=backend)
        _to_run(ds, res, rows, ranked, scores)
        meta = res.meta
    return Run(ranked, scores, {
        "backend": meta.get("backend"), "backend_reason": meta.get("backend_reason"), "memories": len(items),
        "timings": {"search_s": time.perf_counter() - t0},
    })
