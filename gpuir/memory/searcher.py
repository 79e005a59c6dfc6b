"""The snapshot searcher of a memory: every read of one immutable snapshot (Lucene's ``IndexSearcher``).

:class:`SnapshotSearcher` answers :class:`~gpuir.memory.store.Memory`'s reads: BM25 search (the plain
question in one call, :func:`~gpuir.memory.partitions.scan_unfiltered`; any mode, filter and edge rule
through :func:`~gpuir.memory.partitions.scan`), dense vector search, and lookups -- get, vectors, list,
count, the ids matching a filter, history, export, info. Each read takes one
:class:`~gpuir.memory.snapshot.Snapshot` -- the one published when it starts (the writer's ``_snap``), or
the one given -- and reads nothing the writer changes but the id map (under the commit lock: an id is
resolved now, then checked live in the snapshot), the embeddings and the history. Searches run from any
number of threads and never wait for the writer (:mod:`gpuir.memory.writer`). The scope check is the
facade's: a searcher's methods check nothing of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..backends import resolve_backend, resolve_memory_backend
from . import listing, warmup
from .embeddings import Embedding, VectorError
from .errors import UnknownIdError
from .expiry import cutoff, now_ms
from .export import write_export
from .hitorder import by_time, newest_ties, threshold
from .hybrid import DEFAULT_EMBEDDING, check_ranking, hybrid_search
from .idmap import locate
from .partitions import scan, scan_unfiltered
from .records import MISSING_TIME, format_time, id_list
from .search import MemoryResults, make_engine, plan_queries
from .searchargs import check_search_args
from .snapshot import Snapshot
from .termstats import TermStats, query_terms, restate, term_stats
from .timeutil import check_time_unit, public_record
from .vecsearch import check_method, search_snapshot
from .where import compile_wheres
from .writer import IndexWriter


class SnapshotSearcher:
    """The reads of a memory whose writer is ``writer`` (:class:`~gpuir.memory.writer.IndexWriter`): each on
    one snapshot, the current one unless a method is given another. Made by
    :class:`~gpuir.memory.store.Memory`, whose reads are documented there.
    """

    def __init__(self, writer: IndexWriter):
        self._w = writer

    def contains(self, rid: object) -> bool:
        """Whether ``rid`` names a live record now (``id in memory``)."""
        if not isinstance(rid, str):
            return False
        with self._w._commit_lock:
            return self._w._ids.get(rid) is not None

    def match_ids(self, where: Any = None, time_unit: str | None = None) -> list[str]:
        """The ids of the live records passing ``where`` (all without one), in add order: what
        ``delete(where=where)`` would delete now."""
        snap = self._w._snap
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        return listing.ids_matching(snap, w)

    def get(self, ids: Iterable[str], missing_ok: bool = False) -> list[dict[str, Any] | None]:
        """The records with these ids, in the order given (``time`` and ``expires_at`` as ISO 8601 strings).

        See :meth:`gpuir.memory.Memory.get`.
        """
        ids = id_list(ids, "get")
        with self._w._commit_lock:
            snap = self._w._snap
            seq_of = self._w._ids.get_many(ids, snap.views)
        known = sorted({s for s in seq_of if s is not None})
        where: dict[int, tuple[int, int]] = {}
        if known:
            arr = np.asarray(known, dtype=np.int64)
            pos_of = {id(v): i for i, v in enumerate(snap.views)}
            for v, rows in locate(snap.views, arr):
                vi = pos_of[id(v)]
                for r in rows.tolist():
                    where[int(v.seg.seqs[r])] = (vi, r)
        found = [where[s] for s in seq_of if s is not None]
        got = iter(snap.records([v for v, _ in found], [r for _, r in found]))
        recs = [None if s is None else next(got) for s in seq_of]
        now = now_ms()
        recs = [None if r is None or r.get("expires_at", now + 1) <= now else r for r in recs]
        unknown = [i for i, r in zip(ids, recs) if r is None]
        if unknown and not missing_ok:
            raise UnknownIdError(unknown, "get")
        return [None if r is None else public_record(r) for r in recs]

    def seqs_of(self, ids: Iterable[str], snapshot: Snapshot | None = None) -> list[int | None]:
        """The sequence number of each id, in the order given (None: no live record of ``snapshot`` has it).

        See :meth:`gpuir.memory.Memory.seqs_of`.
        """
        ids = id_list(ids, "seqs_of")
        with self._w._commit_lock:
            snap = self._w._snap if snapshot is None else snapshot
            seqs = self._w._ids.get_many(ids, snap.views)
        if snapshot is None or not ids:
            return seqs
        arr = np.asarray([-1 if s is None else s for s in seqs], dtype=np.int64)
        live = snapshot.locate(arr)[0] >= 0
        return [s if ok else None for s, ok in zip(seqs, live.tolist())]

    def list(self, where: Any = None, order_by: str = "seq", descending: bool = False, limit: int = 100,
             cursor: str | None = None, time_unit: str | None = None) -> listing.Page:
        """A page of the records passing ``where``, in a stable order, with a cursor for the next page.

        See :meth:`gpuir.memory.Memory.list`.
        """
        snap = self._w._snap
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        fp = listing.fingerprint(where, order_by, descending, time_unit)
        return listing.list_page(snap, w, fp, order_by, descending, limit, cursor)

    def count(self, where: Any = None, time_unit: str | None = None) -> int:
        """The number of records passing ``where`` (expired records excluded)."""
        snap = self._w._snap
        return listing.count(snap, compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0])

    def history(self, id: str) -> list[dict[str, Any]]:
        """The earlier versions of record ``id``, oldest first, as record dicts ([] when none; see
        :mod:`gpuir.memory.history`). The current version is :meth:`get`'s."""
        if not isinstance(id, str):
            raise TypeError(f"history: the id must be a string, got {type(id).__name__}")
        return self._w._history.get(id)

    def export(self, path: str | os.PathLike, where: Any = None, vectors: Any = None, history: bool = True,
               time_unit: str | None = None) -> int:
        """Write the records (those passing ``where``; all by default) to a JSON-lines file, exactly.

        See :meth:`gpuir.memory.Memory.export`.
        """
        snap = self._w._snap
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        seqs, _, vis, rows = listing._matches(snap, w)
        order = np.argsort(seqs, kind="stable")
        recs = [public_record(snap.record(int(vis[i]), int(rows[i]))) for i in order.tolist()]
        if isinstance(vectors, str):
            emb = self.embedding(vectors)
            col = {}
            for i in order.tolist():
                v = snap.views[int(vis[i])].seg.vectors(emb.name)[int(rows[i])]
                col[snap.views[int(vis[i])].seg.ids[int(rows[i])]] = np.asarray(v, np.float32)
            vectors = col
        hist = []
        if history:
            names = self._w._history.ids() if where is None else [r["id"] for r in recs if r["id"] in self._w._history]
            hist = [(rid, self._w._history.get(rid)) for rid in names]
        return write_export(path, {"config": self._w.config()}, recs, hist, vectors)

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, backend: str = "auto",
               mode: str = "exhaustive", max_partitions: int | None = None, epsilon: float | None = None,
               decay: float = 0.5, snapshot: Snapshot | None = None, min_score: float | None = None,
               ties: str | None = None, order_by: str = "score", time_unit: str | None = None,
               stats: TermStats | None = None, ranking: str | None = None) -> MemoryResults:
        """Top-k records of each query, with exact global BM25 (or hybrid: ``ranking``).

        See :meth:`gpuir.memory.Memory.search`.
        """
        ranking = self._w._ranking if ranking is None else check_ranking(ranking)
        queries, k, ties, min_score, budget = check_search_args(
            queries, k, mode, max_partitions, epsilon, decay, min_score, ties, order_by, time_unit)
        if ranking == "hybrid":
            if mode != "exhaustive" or ties != "oldest" or order_by != "score" or stats is not None:
                raise ValueError("ranking='hybrid' searches every partition in score order (mode='exhaustive', "
                                 "ties='oldest', order_by='score', no stats); pass ranking='bm25' for the others")
            if len(self._w._emb) > 1 and DEFAULT_EMBEDDING not in self._w._emb:
                raise VectorError(f"ranking='hybrid' fuses BM25 with the embedding {DEFAULT_EMBEDDING!r}, or the "
                                  f"memory's only one; this memory has {', '.join(sorted(self._w._emb))}")
            snap = snapshot if snapshot is not None else self._w._snap
            return hybrid_search(self, self.embedding(None if DEFAULT_EMBEDDING not in self._w._emb
                                                       else DEFAULT_EMBEDDING), queries, k, where, backend, snap,
                                 min_score, time_unit, MemoryResults)
        tiered = warmup.tiered(backend)  # (the compiled engine still starting in this process: NumPy now)
        name, reason = ("numpy", warmup.REASON) if tiered else resolve_memory_backend(backend)
        snap = snapshot if snapshot is not None else self._w._snap
        if stats is not None:
            snap = restate(snap, stats)
        t0 = time.perf_counter()
        wheres = compile_wheres(where, len(queries), snap.dicts, time_unit, cutoff(snap))
        scan_wheres = _vacuous_dropped(snap, wheres)
        plans = plan_queries(snap, list(queries), stats)
        t1 = time.perf_counter()
        engine = make_engine(snap, name)
        k = min(k, max(snap.n_docs, 1))  # nothing is sized by a huge k: results are min(k, N) wide, as BM25Index's
        arrays = None
        if mode == "exhaustive" and ties != "newest" and min_score is None and order_by == "score" \
                and all(w is None for w in scan_wheres):  # the common question: one call, no per-query objects
            arrays = scan_unfiltered(snap, engine, plans, k)
        if arrays is None:
            arrays = self._scan_hits(snap, engine, plans, scan_wheres, k, mode, budget, ties, min_score, order_by)
        if name != "numpy":
            self._w._served_by = name
        if name == "numba":
            warmup.mark_ready()
        elif tiered:  # answered: now load the compiled engine (and lay out this snapshot for it)
            warmup.start(lambda: warm_compiled_engine(self, snap, queries[0]))
        seqs, scores, vidx, rows, read, scanned = arrays
        _check_tenants(snap, wheres, vidx, rows)
        return MemoryResults(seqs, scores, snap, vidx, rows, {
            "backend": name, "backend_reason": reason, "mode": mode, "max_partitions": budget,
            "postings_read": read, "partitions_scanned": scanned,
            "partitions": len(snap.partitions), "snapshot_version": snap.version, "ties": ties,
            "timings": {"analyze_s": t1 - t0, "search_s": time.perf_counter() - t1},
        })

    @staticmethod
    def _scan_hits(snap: Snapshot, engine, plans, wheres, k: int, mode: str, budget, ties: str,
                   min_score: float | None, order_by: str) -> tuple[np.ndarray, ...]:
        """:meth:`search`'s general path: each query's hits through :func:`~gpuir.memory.partitions.scan`
        (any mode and filter), then the edge rules (:mod:`gpuir.memory.hitorder`), as
        :func:`~gpuir.memory.partitions.scan_unfiltered`'s arrays."""
        out = scan(snap, engine, plans, wheres, k + 1 if ties == "newest" else k, mode, budget)
        if ties == "newest" or min_score is not None or order_by == "time":  # at the edge (gpuir.memory.hitorder)
            edged = []
            for i, (h, r, p) in enumerate(out):
                if ties == "newest":
                    h = newest_ties(h, k, snap, lambda n, i=i: scan(snap, engine, [plans[i]], [wheres[i]], n, mode,
                                                                        budget)[0][0])
                h = threshold(h, min_score)
                edged.append((by_time(h, snap) if order_by == "time" else h, r, p))
            out = edged
        B = len(plans)
        seqs = np.full((B, k), -1, dtype=np.int64)
        scores = np.full((B, k), -np.inf, dtype=np.float32)
        vidx = np.full((B, k), -1, dtype=np.int64)
        rows = np.full((B, k), -1, dtype=np.int64)
        for i, (h, _, _) in enumerate(out):
            m = len(h)
            seqs[i, :m], scores[i, :m], vidx[i, :m], rows[i, :m] = h.seqs, h.scores, h.vidx, h.rows
        return (seqs, scores, vidx, rows, np.array([r for _, r, _ in out], dtype=np.int64),
                np.array([p for _, _, p in out], dtype=np.int64))

    def term_stats(self, queries: str | Sequence[str]) -> TermStats:
        """This memory's live N, total length and the df of the queries' analysed terms (a shard's report)."""
        if isinstance(queries, str):
            queries = [queries]
        snap = self._w._snap
        return term_stats(snap, query_terms(snap, list(queries)))

    def search_vectors(self, queries: Any, k: int = 10, where: Any = None, embedding: str | None = None,
                       backend: str = "auto", method: str = "exact", snapshot: Snapshot | None = None,
                       time_unit: str | None = None) -> MemoryResults:
        """Top-k records of each query by the cosine of its vector and the records' stored vectors; exact.

        See :meth:`gpuir.memory.Memory.search_vectors`.
        """
        emb = self.embedding(embedding)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        check_method(method)
        check_time_unit(time_unit)
        t0 = time.perf_counter()
        if isinstance(queries, str) or (isinstance(queries, Sequence) and queries and
                                        all(isinstance(q, str) for q in queries)):
            q = emb.encode_queries([queries] if isinstance(queries, str) else list(queries))
        else:
            q = emb.queries(queries)
        t1 = time.perf_counter()
        name, reason = resolve_backend(backend)
        snap = snapshot if snapshot is not None else self._w._snap
        if any(emb.name not in v.seg.vector_names for v in snap.views):
            raise VectorError(f"this snapshot predates embedding {emb.name!r}: search the current one")
        wheres = compile_wheres(where, q.shape[0], snap.dicts, time_unit, cutoff(snap))
        k = min(int(k), max(snap.n_docs, 1))
        seqs, scores, vidx, rows = search_snapshot(snap, emb.name, q, k, wheres, name, method)
        _check_tenants(snap, wheres, vidx, rows)
        return MemoryResults(seqs, scores, snap, vidx, rows, {
            "backend": name, "backend_reason": reason, "mode": "dense", "method": method,
            "embedding": emb.name, "snapshot_version": snap.version, "ties": "oldest",
            "timings": {"encode_s": t1 - t0, "search_s": time.perf_counter() - t1},
        })

    def embedding(self, name: str | None = None) -> Embedding:
        """The named embedding (default: the only one). See :meth:`gpuir.memory.Memory.embedding`."""
        if not self._w._emb:
            raise VectorError("this memory stores no vectors: give Memory(embeddings={name: encoder}), "
                              "add_embedding(name, encoder), or add(records, vectors={name: array})")
        if name is None:
            if len(self._w._emb) > 1:
                raise VectorError(f"this memory has several embeddings ({', '.join(sorted(self._w._emb))}): "
                                  "name one with embedding=")
            return next(iter(self._w._emb.values()))
        emb = self._w._emb.get(name)
        if emb is None:
            raise VectorError(f"no embedding {name!r} in this memory (it has {', '.join(sorted(self._w._emb))})")
        return emb

    def vectors(self, ids: Iterable[str], embedding: str | None = None) -> np.ndarray:
        """The stored vectors of live records: ndarray (len(ids), dim), the embedding's dtype, host.

        See :meth:`gpuir.memory.Memory.vectors`.
        """
        emb = self.embedding(embedding)
        ids = id_list(ids, "vectors")
        with self._w._commit_lock:
            snap = self._w._snap
            seq_of = self._w._ids.get_many(ids, snap.views)
        unknown = [i for i, q in zip(ids, seq_of) if q is None]
        if unknown:
            raise UnknownIdError(unknown, "vectors")
        out = np.zeros((len(ids), emb.dim or 0), dtype=emb.dtype)
        pos: dict[int, list[int]] = {}
        for i, q in enumerate(seq_of):
            pos.setdefault(int(q), []).append(i)
        for v, rows in locate(snap.views, np.asarray(sorted(pos), dtype=np.int64)):
            vec = v.seg.vectors(emb.name)
            for q, r in zip(v.seg.seqs[rows].tolist(), rows.tolist()):
                out[pos[q]] = vec[r]
        return out

    def info(self) -> dict[str, Any]:
        """Counts for people: records, tenants, segments, partitions, time span, deletions, settings."""
        snap = self._w._snap
        tenants: dict[str, int] = {}
        tmin, tmax = None, None
        parts = []
        for key, vids in snap.partitions:
            n = sum(snap.views[i].n_live for i in vids)
            entry: dict[str, Any] = {"key": key, "records": n, "segments": len(vids)}
            if key is not None and self._w.window_ms is not None:
                entry["start"] = format_time(key * self._w.window_ms)
                entry["end"] = format_time((key + 1) * self._w.window_ms)
            parts.append(entry)
        for v in snap.views:
            rows = v.live_rows()
            c = v.seg.codes["tenant"][rows]
            u, cnt = np.unique(c, return_counts=True)
            for code, x in zip(u.tolist(), cnt.tolist()):
                name = "" if code < 0 else self._w._dicts["tenant"].values[code]
                tenants[name] = tenants.get(name, 0) + x
            t = v.seg.time[rows]
            t = t[t != MISSING_TIME]
            if t.size:
                tmin = int(t.min()) if tmin is None else min(tmin, int(t.min()))
                tmax = int(t.max()) if tmax is None else max(tmax, int(t.max()))
        no_tenant = tenants.pop("", 0)
        return {
            "path": str(self._w._path) if self._w._path else None,
            "records": snap.n_docs,
            "tenants": len(tenants),
            "records_without_tenant": no_tenant,
            "largest_tenants": dict(sorted(tenants.items(), key=lambda kv: (-kv[1], kv[0]))[:10]),
            "segments": len(snap.views),
            "deleted_not_purged": sum(v.seg.n_docs - v.n_live for v in snap.views),
            "partitions": len(snap.partitions),
            "partition_list": parts,
            "time_span": None if tmin is None else {"min": format_time(tmin), "max": format_time(tmax),
                                                    "min_ms": tmin, "max_ms": tmax},
            "terms": int(np.count_nonzero(snap.df)),
            "postings": sum(int(v.seg.df.sum()) for v in snap.views),
            "avgdl": snap.avgdl,
            "generation": self._w._gen,
            "embeddings": self._w.embeddings,
            **self._w.config(),
        }


def warm_compiled_engine(memory: Any = None, snapshot: Snapshot | None = None, query: str = "") -> None:
    """Load the compiled engine in this process: numba, then the functions a memory's searches call
    (from numba's cache), through searches of a tiny two-segment memory (:mod:`gpuir.memory.warmup`); then,
    given a ``memory`` (a Memory, or its searcher) and its ``snapshot``, search ``query`` there through the
    compiled engine, which makes each segment's compiled scorer and the snapshot's scan state (once per
    segment and process, and per snapshot: the first compiled search would otherwise pay them, 0.9 s for
    the 43 segments of 5M records)."""
    from ..backends import contract

    contract.first_bad_posting(np.zeros(2, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32), 0)
    w = IndexWriter(partition_days=None)
    m = SnapshotSearcher(w)
    try:
        w.add([{"id": "w1", "text": "warm the compiled engine", "session": "s"},
               {"id": "w2", "text": "the engine loads once per process"}])
        w.add([{"id": "w3", "text": "searches wait for nothing"}, {"id": "w4", "text": "the engine again"}])
        for qs in (["engine"], ["compiled engine", "loads once"]):
            m.search(qs, k=2, backend="numba")
            m.search(qs, k=2, backend="numba", where={"session": "s"})
    finally:
        w.close()
    if memory is not None:  # (twice: a snapshot's second compiled search fills its weight caches)
        for _ in range(2):
            memory.search([query or "warm"], k=10, backend="numba", snapshot=snapshot)


def _vacuous_dropped(snap: Snapshot, wheres: list) -> list:
    """``wheres`` with None for each filter that every live record of ``snap`` passes
    (:meth:`~gpuir.memory.where.Where.passes_all`: then the search is the plain question's), decided once
    per snapshot and filter (only a filter of a tenant and an expiry can pass everything; such a filter is
    hashable by value)."""
    if all(w is None for w in wheres):
        return wheres
    seen: dict[int, bool] = {}
    out = []
    for w in wheres:
        if w is not None:
            v = seen.get(id(w))
            if v is None:
                if w.root is not None:
                    v = False
                elif w.expire is not None:  # decided at this instant: kept per snapshot, it would add an
                    v = w.passes_all(snap.views, snap.dicts)  # entry per millisecond searched (never freed)
                else:
                    v = snap.cached(("passes_all", w), lambda w=w: w.passes_all(snap.views, snap.dicts))
                seen[id(w)] = v
            if v:
                w = None
        out.append(w)
    return out


def _check_tenants(snap: Snapshot, wheres, vidx: np.ndarray, rows: np.ndarray) -> None:
    """Defence in depth: a search naming a tenant returns only that tenant's records."""
    for i, w in enumerate(wheres):
        if w is None or w.tenant is None:
            continue
        want = snap.dicts["tenant"].lookup(w.tenant)
        for v, r in zip(vidx[i].tolist(), rows[i].tolist()):
            if v >= 0 and (want < 0 or int(snap.views[v].seg.codes["tenant"][r]) != want):
                raise RuntimeError(f"internal error: a search confined to tenant {w.tenant!r} found another "
                                   "tenant's record; refusing to return it")
