"""The service's store over a sharded memory (``gpuir serve`` on a directory made by ``ShardedMemory.create``).

:class:`ShardedStore` is a :class:`~gpuir.service.store.ServiceStore` whose
memory is a :class:`~gpuir.cluster.ShardedMemory`: requests are validated at
the door as before (the same rules, the same errors), the writer thread groups
waiting operations as before, and a group is acknowledged once every owning
shard has applied it and its memory has logged it (each shard's memory's own
write-ahead log, :mod:`gpuir.memory.durable`, at the level the sharded memory
was created with: ``ShardedMemory.create(durability=...)``, default ``"fsync"``). Ids are namespaced ``TENANT/ID`` as in the pooled store; create the memory
with ``route="tenant"`` so that every tenant lives on one shard and its searches
ask that shard only.

**Statistics are pooled.** A sharded memory's scores are those of one memory
holding every record (exact global statistics): a tenant's scores move when
another tenant adds records with its words. The server therefore starts only
with ``--statistics pooled`` given explicitly; statistics per tenant over shards
are not built.

The Ray runtime: local on loopback by default; ``gpuir serve --ray-address``
(or ``GPUIR_RAY_ADDRESS``) joins a cluster.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from ..cluster import ShardedMemory, ShardUnavailableError
from ..memory import RecordError, UnknownIdError
from ..storage.dirlock import check_path
from .store import (
    SEP,
    NotFoundError,
    ServiceStore,
    StoreFailedError,
    StoreOp,
    WriteFailedError,
    check_group,
    concat_batches,
    external_hit,
    internal_id,
    pooled_where,
    warm_up,
)

log = logging.getLogger("gpuir.service.sharded")

#: Environment variable naming the Ray cluster to join (unset: a local runtime on loopback).
RAY_ADDRESS_ENV = "GPUIR_RAY_ADDRESS"


class ShardedStore(ServiceStore):
    """A sharded memory served durably (see the module docstring); the interface of :class:`ServiceStore`.

    ``memory`` is the :class:`~gpuir.cluster.ShardedMemory` (a :class:`~gpuir.memory.protocol.MemoryAPI`,
    as a ``ServiceStore``'s ``Memory`` is): the service reads it through that protocol.

    Raises
    ------
    ValueError
        ``statistics`` other than "pooled", ``salvage`` (each shard checks its own log at start), or
        ``durability`` (a sharded memory's is chosen when it is created).
    """

    def __init__(self, root: str | Path, checkpoint_every: int = 10_000, checkpoint_seconds: float = 60.0,
                 lock_timeout: float = 10.0, memory_options: dict[str, Any] | None = None,
                 max_group: int = 1024, salvage: bool = False, statistics: str = "pooled",
                 address: str | None = None, durability: str | None = None):
        if statistics != "pooled":
            raise ValueError(
                f"{root} is a sharded memory: its BM25 statistics are global over every tenant (the scores of one "
                "memory holding all records), so one tenant's records change another's scores. Serve it with "
                "--statistics pooled (statistics per tenant are not built for sharded memories)")
        if salvage:
            raise ValueError("--salvage applies to one memory's log; each shard of a sharded memory checks its own "
                             "log when it starts and names any damage")
        if durability is not None:
            raise ValueError("--durability applies to one memory; a sharded memory's shards keep the level chosen "
                             "by ShardedMemory.create(durability=...) (default fsync)")
        self.statistics = "pooled"
        self.tenants: dict[str, Any] = {}
        self.root = check_path(root)
        self.checkpoint_every = int(checkpoint_every)
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.max_group = max_group
        self.failed: str | None = None
        self.memory = ShardedMemory.open(self.root, address=address or os.environ.get(RAY_ADDRESS_ENV) or None,
                                         lock_timeout=lock_timeout)
        info = self.memory.info()
        self.replayed = sum(s["replayed_operations"] for s in info["shard_list"])
        self.replay_seconds = max(s["open_s"] for s in info["shard_list"])
        self.recovery = None
        self._pending = 0  # records written since the last checkpoint of the shards
        self.checkpoints = 0
        # the single store's background save (ServiceStore._checkpoint_safely reads it): a sharded checkpoint
        # runs in the writer thread, each shard writing its files outside its own lock, so there is none
        self._ckpt = None
        warm_up()
        self.last_checkpoint = time.monotonic()
        self.on_group = None
        self._q: queue.Queue[StoreOp | None] = queue.Queue()
        self._closed = False
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._writer, name="gpuir-service-writer", daemon=True)
        self._thread.start()

    def _commit(self, group: list[StoreOp]) -> None:
        """Check a group's ids, then write it: consecutive adds as one ``ShardedMemory.add``."""
        mem: ShardedMemory = self.memory
        asked = list(dict.fromkeys(rid for op in group for rid in (op.batch.ids if op.kind == "add" else op.ids)))
        try:
            live = {rid for rid, ok in zip(asked, mem.contains(asked)) if ok}
        except ShardUnavailableError as e:
            for op in group:
                op.future.set_exception(WriteFailedError(f"{e}; nothing of this request was stored"))
            return
        ok = check_group(group, live)
        t0 = time.perf_counter()
        done: list[tuple[StoreOp, int]] = []
        try:
            run: list[tuple[StoreOp, int]] = []
            for op, n in ok + [(None, 0)]:  # a sentinel flushes the last run of adds
                if op is not None and op.kind == "add":
                    run.append((op, n))
                    continue
                if run:
                    mem.add(concat_batches([o.batch for o, _ in run]))
                    done += run
                    run = []
                if op is not None:
                    if op.ids:
                        mem.delete(op.ids, missing_ok=True)
                    done.append((op, n))
        except (ShardUnavailableError, RecordError, OSError) as e:
            err = WriteFailedError(f"the sharded memory could not store this request ({type(e).__name__}: {e})")
            stored = {id(o) for o, _ in done}
            for op, _n in ok:
                if id(op) not in stored and not op.future.done():
                    op.future.set_exception(err)
        except BaseException as e:  # an internal failure: stop writing (every acknowledged write is in a shard's log)
            self.failed = (f"the server stopped accepting writes after an internal error ({type(e).__name__}: {e}); "
                           "restart it (the shards' memories' logs hold every acknowledged write)")
            log.error("%s", self.failed)
            for op, _ in ok:
                if not op.future.done():
                    op.future.set_exception(StoreFailedError(self.failed))
            if not isinstance(e, Exception):
                raise
        if self.on_group is not None and done:
            self.on_group(len(done), time.perf_counter() - t0)
        self._pending += sum(n for _, n in done)
        for op, n in done:
            if not op.future.done():
                op.future.set_result(n)

    def _commit_update(self, op: StoreOp) -> None:
        """One update (PATCH/PUT): merged by the coordinator from the stored versions, durable on the owning
        shard before the answer (:meth:`ShardedMemory.update <gpuir.cluster.ShardedMemory.update>`)."""
        mem: ShardedMemory = self.memory
        if self.failed is not None:
            op.future.set_exception(StoreFailedError(self.failed))
            return
        replace = bool(op.options.get("replace"))
        created = 0
        try:
            if op.options.get("upsert"):
                created = sum(1 for r in op.records if r["id"] not in mem)  # the writer is alone: no race
                n = mem.upsert(op.records, replace=replace, time_unit="ms")
            else:
                n = mem.update(op.records, replace=replace, time_unit="ms")
        except UnknownIdError as e:
            shown = ", ".join(repr(m.split(SEP, 1)[1]) for m in e.ids[:5])
            op.future.set_exception(NotFoundError(f"no record {shown} in tenant {op.tenant!r}"))
            return
        except RecordError as e:
            op.future.set_exception(RecordError(str(e).replace(f"'{op.tenant}{SEP}", "'")))
            return
        except (ShardUnavailableError, OSError) as e:
            op.future.set_exception(WriteFailedError(f"the sharded memory could not store this request "
                                                     f"({type(e).__name__}: {e})"))
            return
        self._pending += n
        op.future.set_result((n - created, created))

    def reader(self, tenant: str, where: dict[str, Any] | None) -> tuple[Any, Any, bool]:
        """(the sharded memory, ``where`` with internal ids and the tenant, ids internal): a tenant's
        records are on one shard (``route="tenant"``), which lists and counts them."""
        from .store import check_tenant

        check_tenant(tenant)
        return self.memory, pooled_where(where, tenant), True

    def checkpoint(self, background: bool = False) -> None:
        """Fold every shard's log into its memory (each shard writes its files outside its own lock, so the
        shards' writers never wait for the files; ``background`` is the single store's option, unused)."""
        self.memory.save()
        self._pending = 0
        self.checkpoints += 1
        self.last_checkpoint = time.monotonic()

    @property
    def pending_records(self) -> int:
        """Records written since the last checkpoint of the shards (each in its shard's memory's log)."""
        return self._pending

    def get(self, tenant: str, rid: str) -> dict[str, Any] | None:
        from .store import check_tenant

        check_tenant(tenant)
        rec = self.memory.get([internal_id(tenant, rid)], missing_ok=True)[0]
        return None if rec is None else external_hit(rec)

    def tenant_count(self) -> int:
        return len(self.memory.tenants())

    def search(self, queries: list[str], k: int, wheres: list[dict[str, Any]], backend: str = "auto",
               tenants: list[str] | None = None) -> list[list[dict[str, Any]]]:
        if tenants is None:
            tenants = [w["tenant"] for w in wheres]
        ws = [pooled_where(w, t) for w, t in zip(wheres, tenants)]
        res = self.memory.search(queries, k=k, where=ws, backend=backend)
        return [[external_hit(h) for h in res.hits(i)] for i in range(len(queries))]

    def close(self, checkpoint: bool = True) -> None:
        """Stop the writer (after the queued writes), checkpoint the shards, stop them, release the directory."""
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join()
        self.memory.close()
