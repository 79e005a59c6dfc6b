"""The service's durable memory: a :class:`~gpuir.memory.Memory` behind a write-ahead log.

:class:`ServiceStore` owns the memory directory while the server runs (it holds
the memory's writer lock). Writes go through one writer thread that groups the
operations waiting for it (group commit): validate each, append them all to the
log, one ``fsync``, apply them to the memory, then resolve each caller's
future -- so a write is acknowledged only once it is durable, and a search
started after the acknowledgement sees it (read-your-writes). See
:mod:`gpuir.service.wal` for the log and the crash argument.

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
from ..memory.intake import canonical_records, fold_expiry
from ..memory.persist import CURRENT, MemoryFormatError, check_not_orphaned
from ..memory.records import RecordBatch, normalize_records
from ..storage.dirlock import check_path, is_claimed
from ..wal import WriteAheadLog, encode_payload, segments
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


def pooled_where(where: dict[str, Any] | None, tenant: str) -> dict[str, Any] | None:
    """A tenant's ``where`` for the shared memory: conditions on ``id`` name the internal ids ``TENANT/ID``.

    Strings compared with an id are prefixed, in every clause (``$and``, ``$or``,
    ``$not`` included): ``eq``, ``ne``, ``in``, ``nin`` and the ranges (a common
    prefix keeps the order of strings). ``contains`` on ``id`` is refused (a
    substring could match the prefix); anything else is left for
    :mod:`gpuir.memory.where` to refuse.
    """
    if not isinstance(where, dict) or not where:
        return where
    pre = (lambda x: internal_id(tenant, x) if isinstance(x, str) else x)
    out: dict[str, Any] = {}
    for k, v in where.items():
        if k in ("$and", "$or") and isinstance(v, list):
            out[k] = [pooled_where(w, tenant) for w in v]
        elif k == "$not":
            out[k] = pooled_where(v, tenant)
        elif k == "id" and isinstance(v, dict):
            if {"contains", "$contains", "icontains", "$icontains"} & set(v):
                from ..memory.where import WhereError

                raise WhereError("where['id']: 'contains' on ids is not available with pooled statistics "
                                 "(`gpuir serve --statistics pooled`); use eq, in or a range")
            out[k] = {op: ([pre(x) for x in val] if isinstance(val, list) else pre(val)) for op, val in v.items()}
        elif k == "id":
            out[k] = pre(v)
        else:
            out[k] = v
    return out


class StoreOp:
    __slots__ = ("batch", "future", "ids", "kind", "options", "payload", "records", "tenant")

    def __init__(self, kind: str, tenant: str, records=None, ids=None, options=None):
        self.kind, self.tenant, self.records, self.ids = kind, tenant, records, ids
        self.options = options or {}
        self.batch = None
        self.payload: bytes | None = None  # the log frame's JSON, encoded at the door
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
                    f"{clash[0].split(SEP, 1)[1]!r}: delete them first (an add never replaces a record)"))
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
        Fold the log into the memory's segments (``Memory.save``) once it holds
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
        segments aside (see :mod:`gpuir.service.wal`). Without it, damage is a
        :class:`~gpuir.service.wal.WALCorruptError` and nothing is changed.
    statistics : {"tenant", "pooled"}
        BM25 statistics per tenant (default: a search memory per tenant, see the
        module docstring) or over all tenants (searches run on the shared memory).

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
                 max_group: int = 1024, salvage: bool = False, statistics: str = "tenant"):
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
        if (self.root / CURRENT).exists():
            self.memory = Memory.open(self.root, writer=True, verify=True, lock_timeout=lock_timeout)
        else:
            if self.root.exists() and any(self.root.iterdir()) and not is_claimed(self.root):
                raise ValueError(f"{self.root} is not empty and not a gpuir memory: choose a new or empty directory")
            if self.root.is_dir():
                # segments, manifests or a log without CURRENT: a damaged memory, never a new empty one
                check_not_orphaned(self.root, extra=[p.name for _, p in segments(self.root)])
            self.memory = Memory(**(memory_options or {}))
            self.memory.save(self.root, lock_timeout=lock_timeout)
        try:
            self.wal = WriteAheadLog(self.root)
            t0 = time.perf_counter()
            self.recovery = self.wal.recover(self.memory.info()["generation"], salvage=salvage)
            self.replayed = self._replay_all(self.recovery.ops, salvage and bool(self.recovery.skipped))
            self.replay_seconds = time.perf_counter() - t0
            self.checkpoints = 0
            self.last_checkpoint = time.monotonic()
            if self.recovery.needs_checkpoint:  # a salvaged or version-1 log: fold it now, set damage aside
                self.checkpoint()
            if statistics == "tenant":
                self._empty = self._new_tenant_memory()  # searched for a tenant without records
                self._build_tenant_memories()
        except BaseException:
            self.wal.close()
            self.memory.close(discard_unsaved=True)  # everything is still in the log
            raise
        warm_up()
        self.last_checkpoint = time.monotonic()
        self.on_group: Callable[[int, float], None] | None = None  # (ops, fsync seconds), for metrics
        self._q: queue.Queue[StoreOp | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._writer, name="gpuir-service-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ per-tenant search memories
    def _new_tenant_memory(self) -> Memory:
        cfg = self.memory.config()
        bm = cfg["bm25"]
        m = Memory(analyzer=cfg["analyzer"], method=bm["method"], k1=bm["k1"], b=bm["b"], delta=bm["delta"],
                   partition_days=None, merge_factor=cfg["merge_factor"], merge_min=cfg["merge_min"],
                   history_limit=0)  # histories live in the shared memory (one copy)
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
        for tenant, recs in by_tenant.items():
            self._tenant_memory(tenant).add(recs, time_unit="ms")  # read back: times are epoch ms
        if by_tenant:
            log.info("built %d tenant search memories (%d records) in %.2f s", len(by_tenant), len(snap),
                     time.perf_counter() - t0)

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
            recs = canonical_records(recs, time_unit)
            batch = normalize_records(fold_expiry(recs))
        except RecordError as e:  # name the tenant's ids, not the internal ones
            raise RecordError(str(e).replace(f"'{tenant}{SEP}", "'")) from None
        op = StoreOp("add", tenant, records=recs)
        op.batch = batch
        try:
            op.payload = encode_payload({"op": "add", "records": recs})
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
        gives the number of records, once durable. Unknown ids (without ``upsert``) fail it with
        :class:`NotFoundError`; a merged record that is malformed, with ``RecordError``."""
        check_tenant(tenant)
        recs = check_patches(tenant, patches, time_unit)
        return self._submit(StoreOp("update", tenant, records=recs, options={"replace": replace, "upsert": upsert}))

    def _submit(self, op: StoreOp) -> cf.Future:
        if self._closed:
            raise RuntimeError("the store is closed")
        if self.failed is not None:
            raise StoreFailedError(self.failed)
        self._q.put(op)
        return op.future

    def _writer(self) -> None:
        while True:
            timeout = max(0.05, self.checkpoint_seconds - (time.monotonic() - self.last_checkpoint))
            try:
                first = self._q.get(timeout=timeout)
            except queue.Empty:
                if self.wal.ops:
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
            if self.wal.ops >= self.checkpoint_every or (
                    self.wal.ops and time.monotonic() - self.last_checkpoint >= self.checkpoint_seconds):
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
        """Validate, log (one fsync), apply, acknowledge a group of operations."""
        mem = self.memory
        ok = check_group(group, mem)
        logged = [(op, n) for op, n in ok if n]
        if logged and self.failed is not None:
            err: BaseException = StoreFailedError(self.failed)
            for op, _ in ok:
                op.future.set_exception(err)
            return
        if logged:
            for op, _ in logged:
                if op.kind == "delete":
                    op.payload = encode_payload({"op": "delete", "ids": op.ids})
            t0 = time.perf_counter()
            n_ops = sum(n for _, n in logged)
            try:
                mark = self.wal.append_payloads([op.payload for op, _ in logged], n_ops)
            except Exception as e:  # noqa: BLE001 - rolled back by the log: nothing of the group is stored
                err = WriteFailedError(
                    f"the write-ahead log could not be written ({os_reason(e)}): nothing of this request was "
                    "stored; retry once the server has disk space again", getattr(e, "errno", None))
                for op, _ in ok:
                    op.future.set_exception(err)
                return
            if self.on_group is not None:
                self.on_group(len(logged), time.perf_counter() - t0)
            try:
                # apply in order, consecutive adds as one Memory.add (fewer, larger segments)
                run: list = []
                for op, _ in logged:
                    if op.kind == "add":
                        run.append(op.batch)
                        continue
                    if run:
                        self._apply_adds(run)
                        run = []
                    mem.delete(op.ids, missing_ok=True)
                if run:
                    self._apply_adds(run)
                if self.statistics == "tenant":  # then each tenant's search memory, in the log's order
                    cut = {op.tenant: len(op.tenant) + len(SEP) for op, _ in logged}
                    for op, _ in logged:
                        tm = self._tenant_memory(op.tenant)
                        if op.kind == "add":
                            tm.add(tenant_batch(op.batch, op.tenant))
                        else:
                            tm.delete([rid[cut[op.tenant]:] for rid in op.ids], missing_ok=True)
            except BaseException as e:  # validated at the door, so an internal failure: stop writing
                self.wal.rollback(mark, n_ops)  # the log must not replay what was not acknowledged
                self.failed = (f"the server stopped accepting writes after an internal error ({type(e).__name__}: "
                               f"{e}); restart it (the log holds every acknowledged write)")
                log.error("%s", self.failed)
                for op, _ in ok:
                    if not op.future.done():
                        op.future.set_exception(StoreFailedError(self.failed))
                if not isinstance(e, Exception):
                    raise
                return
        for op, n in ok:
            op.future.set_result(n)

    def _apply_adds(self, batches: list[RecordBatch]) -> None:
        """One ``Memory.add`` for the group's consecutive adds (already validated: their columns are joined)."""
        self.memory.add(batches[0] if len(batches) == 1 else concat_batches(batches))

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_safely(self) -> None:
        if self.failed is not None:
            return
        try:
            self.checkpoint()
        except Exception as e:  # noqa: BLE001 - the log still holds everything; try again later
            log.warning("checkpoint failed, will retry: %s: %s", type(e).__name__, e)
            self.last_checkpoint = time.monotonic()

    def checkpoint(self) -> None:
        """Fold the log into the memory's segments (call from the writer thread, or when it is stopped).

        Steps: ``Memory.save`` (under the memory's writer lock) commits generation
        G+1; start a new log segment for G+1; delete the older segments. A save
        that fails changes nothing (appends go on in the old segment).
        """
        self.memory.save()
        older = self.wal.after_save(self.memory.info()["generation"])
        self.wal.drop(older)
        self.checkpoints += 1
        self.last_checkpoint = time.monotonic()

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
               tenants: list[str] | None = None) -> list[list[dict[str, Any]]]:
        """Hits (the tenant's own ids) of each query; ``wheres[i]`` names query i's tenant (``"tenant"``).

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
            res = self.memory.search(queries, k=k, where=ws, backend=backend)
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
            res = m.search([queries[i] for i in idx], k=max(1, min(k, len(m))), where=ws, backend=backend)
            for j, i in enumerate(idx):
                out[i] = res.hits(j)
        return out

    def close(self, checkpoint: bool = True) -> None:
        """Stop the writer (after the queued writes), checkpoint, release the directory."""
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join()
        try:
            if checkpoint and self.wal.ops and self.failed is None:
                self.checkpoint()
        finally:
            self.wal.close()
            self.memory.close(discard_unsaved=True)  # what was not saved is in the log
