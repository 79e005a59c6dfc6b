"""The service's durable memory: a :class:`~gpuir.memory.Memory` on its directory, with the memory's own log.

:class:`ServiceStore` owns the memory directory while the server runs (it holds
the memory's writer lock). Durability is the memory's: every write is logged by
the memory itself (:mod:`gpuir.memory.durable`, ``memory-wal-*.log``) before
its call returns, at the level ``durability`` (default ``"fsync"``); the
service keeps no log of its own. Writes go through one writer thread that groups
the operations waiting for it: validate each, then apply them in order --
consecutive adds as one ``Memory.add``, consecutive deletes as one
``Memory.delete``, so a group of adds costs one log append and one ``fsync`` --
then resolve each caller's future. A write is therefore acknowledged only once
it is durable, and a search started after the acknowledgement sees it
(read-your-writes).

**Older directories.** A directory written by a gpuir whose service kept its own
log (``service-wal-*.log``, :mod:`gpuir.wal`) is folded once at start: the old
log is read (a torn tail dropped, damage refused unless ``salvage``), its
operations applied to the memory, the memory saved, and only then the old log
deleted (:func:`gpuir.memory.durable.fold_service_log`).

Record ids are namespaced by tenant inside the memory (``TENANT/ID``; tenant
names cannot contain ``/``), so tenants may use the same ids, and an id of one
tenant can never name another tenant's record. The service strips the prefix
from everything it returns.

**Statistics per tenant** (the default, ``statistics="tenant"``). The memory
directory holds one shared :class:`~gpuir.memory.Memory` -- the durable state
the log is folded into, unchanged -- and the store keeps beside it, in RAM, one
*search memory* per tenant: a ``Memory`` with the same settings holding only
that tenant's records (with the tenant's own ids), built at start from the
shared memory (in add order) and kept in step by the writer thread (each logged
operation is applied to the shared memory and then to its tenant's search
memory, before it is acknowledged). Searches and reads run on the tenant's
search memory, so a tenant's BM25 statistics (N, df, avgdl) are its own
records' and its scores equal those of a memory holding only its records, bit
for bit: another tenant's adds never change them. ``statistics="pooled"``
searches the shared memory instead (statistics over every tenant; one copy of
the records in RAM). Nothing on disk differs between the two: the choice can
change at any restart.

**Hybrid ranking** (``ranking="hybrid"``, ``gpuir serve --ranking hybrid``: a
new memory created as ``Memory(ranking="hybrid")``, or a directory that holds
one). The shared memory stores an all-MiniLM-L6-v2 vector per record (encoded
once, when the write is applied); each tenant's search memory is hybrid too and
takes its records' vectors from the shared memory (:class:`SharedVectors`:
copied on add and at start, never encoded twice; an update's changed text is
encoded again for the tenant, in the same batch, so its vector is the same).
A search then ranks as :meth:`gpuir.Memory.search` with ``ranking="hybrid"``
(:mod:`gpuir.memory.hybrid`) and every hit's score is a calibrated relevance
from 0 to 1; ``ranking="bm25"`` per search keeps exact BM25.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..memory import Memory, RecordError
from ..memory.durable import check_durability, fold_service_log, log_holds_writes
from ..memory.hybrid import DEFAULT_EMBEDDING, check_ranking
from ..memory.intake import canonical_records, fold_expiry
from ..memory.persist import CURRENT, MemoryFormatError, check_not_orphaned, read_manifest
from ..memory.records import RecordBatch, normalize_records
from ..memory.scope import tenant_where
from ..storage.dirlock import check_path, is_claimed
from ..wal import encode_payload, segments
from .errors import (
    SEP,
    TENANT_RE,
    ConflictError,
    NotFoundError,
    StoreFailedError,
    TenantError,
    WriteFailedError,
    check_tenant,
    external_hit,
    internal_id,
    os_reason,
    tenants_own,
)
from .updates import check_patches, commit_update
from .validate import check_ids, check_record

__all__ = [  # the errors and id helpers live in gpuir.service.errors; re-exported here for callers of the store
    "SEP", "STATISTICS", "TENANT_RE", "ConflictError", "NotFoundError", "ServiceStore", "StoreFailedError",
    "TenantError", "WriteFailedError", "check_tenant", "external_hit", "internal_id",
]

log = logging.getLogger("gpuir.service.store")

#: The ways a store can compute BM25 statistics (see the module docstring).
STATISTICS = ("tenant", "pooled")

class SharedVectors:
    """The encoder of a hybrid store's tenant search memories: the shared memory's embedding.

    One model in RAM, and the same vectors as the shared memory's: a tenant memory
    is given its records' stored vectors on add (``vectors=``), and what it must
    encode itself (an update's changed text, a question) goes through the shared
    memory's embedding, which returns exactly what it stores.

    Parameters
    ----------
    emb : gpuir.memory.embeddings.Embedding
        The shared memory's embedding that the hybrid ranking searches.
    """

    def __init__(self, emb: Any):
        self.emb = emb
        self.model_name = emb.model

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        """(n, dim) vectors of the embedding's dtype, normalised, host: as the shared memory stores them."""
        return self.emb.encode(texts, "a tenant's search memory")

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """(B, dim) float32 query vectors, normalised, host."""
        return self.emb.encode_queries(queries)


def warm_up() -> None:
    """Run one add and one search on a scratch memory, so that the first request does not pay
    for the lazy imports and compiled kernels (seconds)."""
    m = Memory(partition_days=None)
    m.add([{"id": "w", "text": "warm up the engine", "tenant": "w", "time": "1970-01-01"}])
    m.search(["warm engine"], k=1, where={"tenant": "w"})


def concat_batches(batches: Sequence[RecordBatch]) -> RecordBatch:
    """Validated record batches joined in order (no re-validation: each was built by ``normalize_records``)."""
    return RecordBatch(
        ids=[x for b in batches for x in b.ids],
        texts=[x for b in batches for x in b.texts],
        strings={f: [x for b in batches for x in b.strings[f]] for f in batches[0].strings},
        time=np.concatenate([b.time for b in batches]),
        importance=np.concatenate([b.importance for b in batches]),
        metadata=[x for b in batches for x in b.metadata],
    )


def tenant_batch(batch: RecordBatch, tenant: str) -> RecordBatch:
    """``batch`` (internal ids ``TENANT/ID``) with the tenant's own ids, for its search memory."""
    cut = len(tenant) + len(SEP)
    return dataclasses.replace(batch, ids=[rid[cut:] for rid in batch.ids])


#: A tenant's ``where`` for the shared memory (ids prefixed): :func:`gpuir.memory.scope.tenant_where`.
pooled_where = tenant_where


class StoreOp:
    __slots__ = ("batch", "future", "ids", "kind", "options", "records", "tenant")

    def __init__(self, kind: str, tenant: str, records=None, ids=None, options=None):
        self.kind, self.tenant, self.records, self.ids = kind, tenant, records, ids
        self.options = options or {}
        self.batch = None
        self.future: cf.Future = cf.Future()



def check_group(group: list[StoreOp], live: Any) -> list[tuple[StoreOp, int]]:
    """The operations of a group commit that may be written, each with its record count.

    ``live``: the ids stored before the group (anything supporting ``in``). An
    add whose id exists (or is added earlier in the group and not deleted since)
    fails alone with :class:`ConflictError` (its future is set); a delete keeps
    only the ids live at its place in the group (``op.ids`` narrowed, possibly
    to none). The rest of the group is unaffected: one request's bad ids never
    fail another's writes.
    """
    pending: set[str] = set()
    removed: set[str] = set()
    ok: list[tuple[StoreOp, int]] = []
    for op in group:
        if op.kind == "add":
            clash = [rid for rid in op.batch.ids if (rid in live and rid not in removed) or rid in pending]
            if clash:
                op.future.set_exception(ConflictError(
                    f"{len(clash)} id(s) already exist in tenant {op.tenant!r}, e.g. "
                    f"{clash[0].split(SEP, 1)[1]!r}: an add never replaces a record; change it with PATCH or PUT "
                    "(the client's update), or delete it first"))
                continue
            pending.update(op.batch.ids)
            ok.append((op, len(op.batch.ids)))
        else:
            now = [rid for rid in dict.fromkeys(op.ids) if (rid in live and rid not in removed) or rid in pending]
            pending.difference_update(now)
            removed.update(now)
            op.ids = now
            ok.append((op, len(now)))
    return ok


class ServiceStore:
    """A memory directory served durably.

    Parameters
    ----------
    root : the memory directory (created when missing or empty)
    checkpoint_every : int
        Fold the memory's log into its segments (``Memory.save``) once it holds
        this many records (adds plus deletes).
    checkpoint_seconds : float
        ... or when the log is non-empty and this many seconds passed since the last checkpoint.
    lock_timeout : float
        Seconds to wait for the memory's writer lock.
    memory_options : dict
        ``Memory(...)`` arguments used only when the memory is created.
    salvage : bool
        Start although the log is damaged: keep every intact frame, log what is
        skipped, fold the result into the memory at once and set the damaged
        segments aside (see :mod:`gpuir.wal`). Without it, damage is a
        :class:`~gpuir.wal.WALCorruptError` and nothing is changed.
    statistics : {"tenant", "pooled"}
        BM25 statistics per tenant (default: a search memory per tenant, see the
        module docstring) or over all tenants (searches run on the shared memory).
    durability : {"fsync", "flush", "none"}, optional
        The memory's durability (:mod:`gpuir.memory.durable`): what a write has
        done when it is acknowledged. Default ``"fsync"``: a write acknowledged
        survives a crash of the process and a power cut.
    ranking : {"bm25", "hybrid"}, optional
        A new memory's ranking (default "bm25"; "hybrid" stores a MiniLM vector per
        record, see the module docstring). A directory that holds a memory keeps its
        own; naming another one is a ValueError.

    Raises
    ------
    MemoryFormatError
        The directory holds a memory's files but no commit (``CURRENT``
        missing), or a damaged memory: never read as a new, empty memory.
    WALCorruptError
        Damage to acknowledged writes in the log (unless ``salvage``).
    """

    def __init__(self, root: str | Path, checkpoint_every: int = 10_000, checkpoint_seconds: float = 60.0,
                 lock_timeout: float = 10.0, memory_options: dict[str, Any] | None = None,
                 max_group: int = 1024, salvage: bool = False, statistics: str = "tenant",
                 durability: str | None = None, ranking: str | None = None):
        self.durability = check_durability("fsync" if durability is None else durability)
        if ranking is not None:
            check_ranking(ranking)
        if statistics not in STATISTICS:
            raise ValueError(f"statistics must be one of {', '.join(STATISTICS)}, got {statistics!r}")
        self.statistics = statistics
        #: tenant -> its search memory (statistics="tenant"; written by the writer thread only)
        self.tenants: dict[str, Memory] = {}
        self.root = check_path(root)
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        self.checkpoint_every = checkpoint_every
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.max_group = max_group
        self.failed: str | None = None  # why writes are refused (an internal failure), else None
        self._ckpt: threading.Thread | None = None  # a checkpoint finishing in the background
        self.checkpoints = 0
        t0 = time.perf_counter()
        if (self.root / CURRENT).exists():
            gen = int(read_manifest(self.root)[1]["generation"])
            # the memory replays its own log (every write acknowledged before a crash) as it opens
            self.memory = Memory.open(self.root, writer=True, verify=True, lock_timeout=lock_timeout,
                                      durability=self.durability, salvage=salvage)
        else:
            if self.root.exists() and any(self.root.iterdir()) and not is_claimed(self.root):
                raise ValueError(f"{self.root} is not empty and not a gpuir memory: choose a new or empty directory")
            if self.root.is_dir():
                # segments, manifests or a log without CURRENT: a damaged memory, never a new empty one
                check_not_orphaned(self.root, extra=[p.name for _, p in segments(self.root, "service")]
                                   + [p.name for _, p in segments(self.root, "memory") if log_holds_writes(p)])
            gen = None
            opts = {**(memory_options or {}), "durability": self.durability}
            if ranking is not None:
                opts["ranking"] = ranking
            self.memory = Memory(**opts)
            self.memory.save(self.root, lock_timeout=lock_timeout)
        #: the memory's ranking ("bm25" or "hybrid"), the default of every search
        self.ranking = self.memory.config().get("ranking", "bm25")
        if ranking is not None and ranking != self.ranking:
            self.memory.close(discard_unsaved=True)
            raise ValueError(f"{self.root} holds a memory ranked {self.ranking!r}; it cannot be served as "
                             f"{ranking!r} (a memory's ranking is chosen when it is created): omit --ranking, or "
                             "serve a new directory")
        self.memory.allow_unscoped()  # every request is confined to its key's tenant here (require_scope memories)
        try:
            self.replayed = self.memory._writer._replayed  # operations the memory's log replayed
            if gen is not None:  # an older gpuir's own service log: applied once, saved, then deleted
                self.replayed += fold_service_log(self.memory._writer, gen,
                                                  lambda ops, salv: self._replay_all(ops, salv), salvage=salvage)
            self.replay_seconds = time.perf_counter() - t0
            self.last_checkpoint = time.monotonic()
            if statistics == "tenant":
                self._empty = self._new_tenant_memory()  # searched for a tenant without records
                self._build_tenant_memories()
        except BaseException:
            self.memory.close(discard_unsaved=True)  # everything acknowledged is in a log still
            raise
        warm_up()
        self.last_checkpoint = time.monotonic()
        self.on_group: Callable[[int, float], None] | None = None  # (ops, fsync seconds), for metrics
        self._q: queue.Queue[StoreOp | None] = queue.Queue()
        self._closed = False
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._writer, name="gpuir-service-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ per-tenant search memories
    def hybrid_embedding(self) -> str | None:
        """The name of the shared memory's embedding that the hybrid ranking searches, or None (a store ranked
        "bm25", or no vectors): the vectors a tenant's search memory is given."""
        if self.ranking != "hybrid":
            return None
        names = sorted(self.memory.embeddings)
        if DEFAULT_EMBEDDING in names:
            return DEFAULT_EMBEDDING
        return names[0] if len(names) == 1 else None

    def _new_tenant_memory(self) -> Memory:
        cfg = self.memory.config()
        bm = cfg["bm25"]
        extra: dict[str, Any] = {}
        name = self.hybrid_embedding()
        if name is not None:  # the shared memory's vectors and encoder (SharedVectors)
            emb = self.memory.embedding(name)
            extra = {"ranking": "hybrid", "embeddings": {name: {"encoder": SharedVectors(emb), "dtype": emb.dtype}}}
        m = Memory(analyzer=cfg["analyzer"], method=bm["method"], k1=bm["k1"], b=bm["b"], delta=bm["delta"],
                   partition_days=None, merge_factor=cfg["merge_factor"], merge_min=cfg["merge_min"],
                   history_limit=0, record_times=False,  # histories live in the shared memory (one copy); so do
                   **extra)  # the records' times: copied as the shared memory holds them, never stamped here
        m.window_ms = self.memory.window_ms  # the same time partitions as the shared memory
        return m

    def _tenant_memory(self, tenant: str) -> Memory:
        m = self.tenants.get(tenant)
        if m is None:
            m = self.tenants[tenant] = self._new_tenant_memory()
        return m

    def _build_tenant_memories(self) -> None:
        """One search memory per tenant from the shared memory's live records, in add order."""
        t0 = time.perf_counter()
        snap = self.memory.snapshot()
        by_tenant: dict[str, list[dict[str, Any]]] = {}
        for _, vi, row in snap.live_records():
            rec = snap.record(vi, row)
            tenant = rec.get("tenant")
            rid = rec["id"]
            if not isinstance(tenant, str) or not rid.startswith(tenant + SEP):
                raise MemoryFormatError(f"{self.root}: record {rid!r} is not a record of the service (its id must "
                                        "be TENANT/ID, with its tenant): serve a memory the service created")
            rec["id"] = rid[len(tenant) + 1:]
            by_tenant.setdefault(tenant, []).append(rec)
        name = self.hybrid_embedding()
        for tenant, recs in by_tenant.items():
            self._tenant_memory(tenant).add(recs, time_unit="ms",  # read back: times are epoch ms
                                            vectors=self._stored_vectors(name, [internal_id(tenant, r["id"])
                                                                                for r in recs]))
        if by_tenant:
            log.info("built %d tenant search memories (%d records) in %.2f s", len(by_tenant), len(snap),
                     time.perf_counter() - t0)

    def _stored_vectors(self, name: str | None, ids: list[str]) -> dict[str, np.ndarray] | None:
        """``vectors=`` for a tenant memory's add: the shared memory's stored vectors of ``ids`` (internal)."""
        return None if name is None else {name: self.memory.vectors(ids, embedding=name)}

    # ------------------------------------------------------------------ replay
    def _replay_all(self, ops: list[dict[str, Any]], salvage: bool) -> int:
        """Apply the logged operations in order (consecutive adds as one ``Memory.add``); returns their count.

        ``salvage`` (a log with skipped damage): one by one, and an operation that
        cannot be applied (ids a damaged log repeats) is skipped and logged, not fatal.
        """
        if salvage:
            for op in ops:
                self._replay_salvaged(op)
            return len(ops)
        run: list[dict[str, Any]] = []  # consecutive logged adds, replayed as one Memory.add
        in_run: set[str] = set()
        for op in ops:
            if op.get("op") == "add":
                ids = [r.get("id") for r in op["records"]]
                if in_run.intersection(ids):  # an id added again (its record expired meanwhile): in order
                    self.memory.add(run, time_unit="ms")
                    run, in_run = [], set()
                run.extend(op["records"])
                in_run.update(ids)
            else:
                if run:
                    self.memory.add(run, time_unit="ms")
                    run, in_run = [], set()
                self._replay(op)
        if run:
            self.memory.add(run, time_unit="ms")
        return len(ops)

    def _replay(self, op: dict[str, Any]) -> None:
        # logged times are epoch ms (canonical since updates; before, as clients sent them: ms or ISO)
        if op.get("op") == "add":
            self.memory.add(op["records"], time_unit="ms")
        elif op.get("op") == "put":  # whole new versions, computed when the update was logged
            self.memory.upsert(op["records"], replace=True, time_unit="ms")
        elif op.get("op") == "delete":
            self.memory.delete(op["ids"], missing_ok=True)
        else:
            raise MemoryFormatError(f"{self.root}: unknown operation in the write-ahead log: {op.get('op')!r}")

    def _replay_salvaged(self, op: dict[str, Any]) -> None:
        try:
            if op.get("op") == "add":
                recs = [r for r in op.get("records", []) if isinstance(r, dict) and r.get("id") not in self.memory]
                if len(recs) < len(op.get("records", [])):
                    log.warning("salvage: %d record(s) of a logged add already exist; kept the existing ones",
                                len(op["records"]) - len(recs))
                self.memory.add(recs, time_unit="ms")
            else:
                self._replay(op)
        except (RecordError, MemoryFormatError, TypeError, KeyError) as e:
            log.warning("salvage: skipped a logged %r operation that cannot be applied: %s", op.get("op"), e)

    # ------------------------------------------------------------------ writes
    def add(self, tenant: str, records: Sequence[dict[str, Any]], time_unit: str | None = None) -> cf.Future:
        """Queue an add for ``tenant``; the future gives the count once durable and applied.

        The records' ids are the tenant's; each record's ``tenant`` is set to
        ``tenant`` (a different one raises :class:`TenantError` at once).
        Malformed records, and records the log cannot hold (see
        :mod:`gpuir.service.validate`), raise :class:`~gpuir.memory.RecordError`
        at once: they never join a group commit, so they never fail another
        request's write.
        """
        check_tenant(tenant)
        recs = []
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                raise RecordError(f"record {i} is a {type(r).__name__}; each record must be a dict")
            t = r.get("tenant", tenant)
            if t != tenant:
                raise TenantError(f"records[{i}].tenant is {t!r}, but the request is for tenant {tenant!r}: "
                                  "a key may write only its own tenant")
            rid = r.get("id")
            if not isinstance(rid, str) or not rid:
                raise RecordError(f"records[{i}].id: a non-empty string is required")
            check_record(r, i)
            recs.append({**r, "id": internal_id(tenant, rid), "tenant": tenant})
        try:  # times become epoch ms once, here: the log holds them so (replayed with time_unit="ms")
            recs = canonical_records(recs, time_unit, stamp=self.memory.stamp)  # (times of record_times: logged)
            batch = normalize_records(fold_expiry(recs))
        except RecordError as e:  # name the tenant's ids, not the internal ones
            raise tenants_own(e, tenant) from None
        op = StoreOp("add", tenant, records=recs)
        op.batch = batch
        try:  # what the memory's log cannot hold fails here, alone, never inside a group
            encode_payload({"op": "add", "records": recs})
        except (ValueError, TypeError) as e:  # check_record lets nothing through that fails here
            raise RecordError(f"a record cannot be written to the log: {e}") from None
        return self._submit(op)

    def delete(self, tenant: str, ids: Sequence[str]) -> cf.Future:
        """Queue a delete of the tenant's ids; the future gives how many existed (and are now deleted)."""
        check_tenant(tenant)
        check_ids(list(ids))
        op = StoreOp("delete", tenant, ids=[internal_id(tenant, i) for i in ids])
        return self._submit(op)

    def update(self, tenant: str, patches: Sequence[dict[str, Any]], replace: bool = False, upsert: bool = False,
               time_unit: str | None = None) -> cf.Future:
        """Queue an update of the tenant's records (:meth:`gpuir.Memory.update` semantics: fields merged,
        metadata key by key; ``replace`` replaces whole records; ``upsert`` adds unknown ids); the future
        gives ``(updated, created)``, once durable: the records that existed and those the upsert created.
        Unknown ids (without ``upsert``) fail it with :class:`NotFoundError`; a merged record that is
        malformed, with ``RecordError``."""
        check_tenant(tenant)
        recs = check_patches(tenant, patches, time_unit)
        return self._submit(StoreOp("update", tenant, records=recs, options={"replace": replace, "upsert": upsert}))

    def _submit(self, op: StoreOp) -> cf.Future:
        if self._closed:
            raise RuntimeError("the store is closed")
        with self._submit_lock:  # a writer thread that fails drains the queue under it: no op is left behind
            if self.failed is not None:
                raise StoreFailedError(self.failed)
            self._q.put(op)
        return op.future

    def _writer(self) -> None:
        """The writer thread. Should it ever end on an unexpected error, the store stops accepting writes and
        answers every queued one with that error (an HTTP 503), instead of leaving them waiting for ever."""
        try:
            self._write_loop()
        except BaseException as e:
            with self._submit_lock:
                self.failed = (f"the server stopped accepting writes after an internal error in its writer thread "
                               f"({type(e).__name__}: {e}); restart it (every acknowledged write is in the log)")
                log.exception("%s", self.failed)
                while True:
                    try:
                        op = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if op is not None and not op.future.done():
                        op.future.set_exception(StoreFailedError(self.failed))

    def _write_loop(self) -> None:
        while True:
            timeout = max(0.05, self.checkpoint_seconds - (time.monotonic() - self.last_checkpoint))
            try:
                first = self._q.get(timeout=timeout)
            except queue.Empty:
                if self.pending_records:
                    self._checkpoint_safely()
                continue
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < self.max_group:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
            self._commit_in_order(group)
            pending = self.pending_records
            if pending >= self.checkpoint_every or (
                    pending and time.monotonic() - self.last_checkpoint >= self.checkpoint_seconds):
                self._checkpoint_safely()
            if stop:
                return

    def _commit_in_order(self, group: list[StoreOp]) -> None:
        """Commit a group in order: adds and deletes together, each update alone (it reads the stored records)."""
        try:
            self.memory.purge_expired()  # an expired id is free again; its record is hidden already
        except Exception as e:  # noqa: BLE001 - the records stay hidden; purged by a later write
            log.warning("purging expired records failed: %s: %s", type(e).__name__, e)
        run: list[StoreOp] = []
        for op in group:
            if op.kind != "update":
                run.append(op)
                continue
            if run:
                self._commit(run)
                run = []
            self._commit_update(op)
        if run:
            self._commit(run)

    def _commit_update(self, op: StoreOp) -> None:
        """Commit one update (:func:`gpuir.service.updates.commit_update`; a sharded store overrides it)."""
        commit_update(self, op)

    def _commit(self, group: list[StoreOp]) -> None:
        """Validate, apply (the memory logs each call before it returns: durable), acknowledge a group.

        The group's operations are applied in order, consecutive adds as one ``Memory.add`` and
        consecutive deletes as one ``Memory.delete`` (one log append and one ``fsync`` each). A call
        whose log append fails stores nothing: its operations and every later one of the group fail
        with :class:`WriteFailedError` (nothing of them is stored); the earlier ones are durable and
        acknowledged.
        """
        ok = check_group(group, self.memory)
        logged = [(op, n) for op, n in ok if n]
        if logged and self.failed is not None:
            err: BaseException = StoreFailedError(self.failed)
            for op, _ in ok:
                op.future.set_exception(err)
            return
        runs: list[list[StoreOp]] = []  # consecutive operations of one kind
        for op, _ in logged:
            if runs and runs[-1][0].kind == op.kind:
                runs[-1].append(op)
            else:
                runs.append([op])
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            err = self._apply_run(run)
            if err is not None:
                for op in (o for r in runs[i:] for o in r):
                    if not op.future.done():
                        op.future.set_exception(err)
                for op, n in ok:  # the earlier runs are durable; an operation with nothing to write has no frame
                    if not op.future.done():
                        op.future.set_result(n)
                return
            if self.on_group is not None:
                self.on_group(len(run), time.perf_counter() - t0)
        for op, n in ok:
            op.future.set_result(n)

    def _apply_run(self, run: list[StoreOp]) -> BaseException | None:
        """Apply consecutive operations of one kind to the memory (logged by it), then to the tenants'
        search memories; returns the error to give their callers (None: durable and applied)."""
        mem = self.memory
        try:
            if run[0].kind == "add":
                self._apply_adds([op.batch for op in run])
            else:
                mem.delete([rid for op in run for rid in op.ids], missing_ok=True)
        except BaseException as e:  # noqa: BLE001 - the memory's log says whether anything was stored
            return self.write_error(e)
        try:
            if self.statistics == "tenant":  # then each tenant's search memory, in the log's order
                name = self.hybrid_embedding()
                for op in run:
                    tm = self._tenant_memory(op.tenant)
                    if op.kind == "add":
                        tm.add(tenant_batch(op.batch, op.tenant), vectors=self._stored_vectors(name, op.batch.ids))
                    else:
                        cut = len(op.tenant) + len(SEP)
                        tm.delete([rid[cut:] for rid in op.ids], missing_ok=True)
        except BaseException as e:  # noqa: BLE001 - validated at the door, so an internal failure
            return self._fail(e)
        return None

    def write_error(self, e: BaseException) -> BaseException:
        """The error for the callers of a memory write that raised ``e`` (called by the writer thread).

        A log append that failed (``ENOSPC``, ``EIO``, a short write) was rolled back by the memory:
        nothing is stored, :class:`WriteFailedError` (507 when the disk is full). A failed ``fsync``
        leaves the memory refusing writes with the write applied in RAM: the log is cut back to its
        last durable frame (every acknowledged write) and the memory opened again from its directory
        -- then nothing of the request is stored either, and the server goes on. Anything else (or a
        reopen that fails) stops the server's writes (:class:`StoreFailedError`).
        """
        if isinstance(e, OSError):
            why = self.memory_log_failed()
            if why is None or self._reopen(why):
                return WriteFailedError(
                    f"the write-ahead log could not be written ({os_reason(e)}): nothing of this request was "
                    "stored; retry once the server has disk space again", getattr(e, "errno", None))
        return self._fail(e)

    def _reopen(self, why: str) -> bool:
        """After a failed fsync: cut the memory's log back to what was durable, open the memory again (it
        replays its log), rebuild the tenants' search memories. True when done."""
        mem = self.memory
        try:
            mem._writer._log.wal.cut_to_synced()
        except OSError as e:
            log.error("the memory's log could not be cut back after a failed fsync (%s): %s", e, why)
            return False
        mem._writer._log.close()
        mem._writer._log = None  # (nothing after the cut is durable: no final save of the RAM state either)
        mem.close(discard_unsaved=True)
        try:
            self.memory = Memory.open(self.root, writer=True, verify=False, durability=self.durability)
            self.memory.allow_unscoped()
            if self.statistics == "tenant":
                self.tenants = {}
                self._build_tenant_memories()
        except Exception as e:  # noqa: BLE001 - reported as the store's failure by the caller
            log.error("reopening the memory after a failed fsync failed: %s: %s", type(e).__name__, e)
            return False
        log.warning("the memory's log failed to sync; cut back to its last durable frame and reopened (%s)", why)
        return True

    def memory_log_failed(self) -> str | None:
        """Why the memory's log refuses writes (a failed ``fsync``: what it held may be lost), else None."""
        mlog = getattr(getattr(self.memory, "_writer", None), "_log", None)  # (a Memory's writer)
        return None if mlog is None else mlog.failed

    def _fail(self, e: BaseException) -> StoreFailedError:
        """Stop accepting writes after an internal failure (or a failed fsync); the error for the callers."""
        why = self.memory_log_failed()
        if why is not None:
            self.failed = (f"the server stopped accepting writes: {why}. Restart it (the memory's log holds every "
                           "write acknowledged before)")
        else:
            self.failed = (f"the server stopped accepting writes after an internal error ({type(e).__name__}: "
                           f"{e}); restart it (the memory's log holds every acknowledged write)")
        log.error("%s", self.failed)
        if not isinstance(e, Exception):
            raise e
        return StoreFailedError(self.failed)

    @property
    def pending_records(self) -> int:
        """Records logged since the last checkpoint (the memory's log: what a crash would replay); at
        durability "none", records written since the last save (what a crash would lose)."""
        mlog = getattr(getattr(self.memory, "_writer", None), "_log", None)  # (a Memory's writer)
        return int(self.memory.unsaved) if mlog is None else int(mlog.ops)

    def _apply_adds(self, batches: list[RecordBatch]) -> None:
        """One ``Memory.add`` for the group's consecutive adds (already validated: their columns are joined)."""
        self.memory.add(batches[0] if len(batches) == 1 else concat_batches(batches))

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_safely(self) -> None:
        if self.failed is not None:
            return
        if self._ckpt is not None and self._ckpt.is_alive():
            return  # one checkpoint at a time; the writer never waits for one
        own = getattr(getattr(self.memory, "_writer", None), "_ckpt_thread", None)
        if own is not None and own.is_alive():
            return  # the memory is checkpointing itself (its log grew past CHECKPOINT_EVERY): that one folds it
        self.last_checkpoint = time.monotonic()
        try:
            self.checkpoint(background=True)
        except Exception as e:  # noqa: BLE001 - the log still holds everything; try again later
            log.warning("checkpoint failed, will retry: %s: %s", type(e).__name__, e)

    def checkpoint(self, background: bool = False) -> None:
        """Fold the memory's log into its segments: a save (call from the writer thread, or when it is stopped).

        In the writer thread the memory takes its snapshot and starts a new log segment whose header
        names the generation this save will commit (``Memory.begin_save``); then, in a background
        thread with ``background`` (the writer goes on acknowledging writes into the new segment),
        the save writes its files and commits, and the memory deletes the older segments. A crash
        before the commit replays the old segments and the new one in order; a failed save leaves
        them for the next (:mod:`gpuir.memory.durable`).
        """
        job = self.memory.begin_save()

        def finish() -> None:
            try:
                job.finish()
            except Exception as e:
                if not background:
                    raise
                log.warning("checkpoint failed, will retry: %s: %s", type(e).__name__, e)
                return
            self.checkpoints += 1
            self.last_checkpoint = time.monotonic()

        if background:
            self._ckpt = threading.Thread(target=finish, name="gpuir-service-checkpoint", daemon=True)
            self._ckpt.start()
        else:
            finish()

    # ------------------------------------------------------------------ reads
    def get(self, tenant: str, rid: str) -> dict[str, Any] | None:
        check_tenant(tenant)
        if self.statistics == "tenant":
            m = self.tenants.get(tenant)
            return None if m is None else m.get([rid], missing_ok=True)[0]
        rec = self.memory.get([internal_id(tenant, rid)], missing_ok=True)[0]
        return None if rec is None else external_hit(rec)

    def reader(self, tenant: str, where: dict[str, Any] | None) -> tuple[Memory, Any, bool]:
        """(memory, where, ids internal) for reading a tenant's records (list, count): its search memory
        (its own ids) with statistics per tenant, else the shared memory with ``where`` made internal."""
        check_tenant(tenant)
        if self.statistics == "tenant":
            return self.tenants.get(tenant) or self._empty, where, False
        return self.memory, pooled_where(where, tenant), True

    def tenant_count(self) -> int:
        """Tenants holding at least one live record."""
        if self.statistics == "tenant":
            return sum(1 for m in self.tenants.values() if len(m))
        return int(self.memory.info()["tenants"])

    def search(self, queries: list[str], k: int, wheres: list[dict[str, Any]], backend: str = "auto",
               tenants: list[str] | None = None, ranking: str | None = None) -> list[list[dict[str, Any]]]:
        """Hits (the tenant's own ids) of each query; ``wheres[i]`` names query i's tenant (``"tenant"``).

        ``ranking``: "bm25" or "hybrid" (None: the memory's own, :attr:`ranking`), as
        :meth:`gpuir.Memory.search` takes it; "hybrid" scores each hit by a relevance in [0, 1].

        With statistics per tenant, the queries of each tenant go to its search
        memory (one ``Memory.search`` per tenant of the batch; the tenant
        condition is implied and dropped); pooled, one ``Memory.search`` on the
        shared memory with ids in ``where`` made internal.

        Returns
        -------
        list (one per query) of lists of hit dicts, best first
        """
        if tenants is None:
            tenants = [w["tenant"] for w in wheres]
        if self.statistics == "pooled":
            ws = [pooled_where(w, t) for w, t in zip(wheres, tenants)]
            res = self.memory.search(queries, k=k, where=ws, backend=backend, ranking=ranking)
            return [[external_hit(h) for h in res.hits(i)] for i in range(len(queries))]
        out: list[list[dict[str, Any]]] = [[] for _ in queries]
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(tenants):
            groups.setdefault(t, []).append(i)
        for t, idx in groups.items():
            m = self.tenants.get(t)
            if m is None:  # a tenant without records: its filters are still checked (422 when malformed)
                m = self._empty
            ws = []
            for i in idx:
                w = {f: v for f, v in wheres[i].items() if f != "tenant"} if wheres[i] else None
                ws.append(w or None)
            res = m.search([queries[i] for i in idx], k=max(1, min(k, len(m))), where=ws, backend=backend,
                           ranking=ranking)
            for j, i in enumerate(idx):
                out[i] = res.hits(j)
        return out

    def close(self, checkpoint: bool = True) -> None:
        """Stop the writer (after the queued writes), checkpoint, release the directory (``checkpoint=False``:
        no final save, as after a crash: the next start replays the memory's log)."""
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join()
        if self._ckpt is not None:
            self._ckpt.join()
        try:
            if checkpoint and self.pending_records and self.failed is None:
                self.checkpoint()
        finally:
            mem = self.memory
            if not checkpoint and getattr(getattr(mem, "_writer", None), "_log", None) is not None:
                # as after a crash: no final save; the memory's log keeps every write (replayed at the next open)
                mem._writer._log.close()
                mem._writer._log = None
            mem.close(discard_unsaved=True)  # what was not saved is in the memory's log
