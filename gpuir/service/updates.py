"""Updates in the service: checked at the door, merged and logged by the writer, replayed exactly.

An update (``PATCH`` merges, ``PUT`` replaces; :mod:`gpuir.memory.updates`)
reads the stored record, so the writer thread commits it alone, in its place in
the queue (after the writes queued before it): it merges each patch into the
stored version, checks the result, applies the **whole new versions** with
:meth:`Memory.upsert(..., replace=True) <gpuir.Memory.upsert>` -- which logs them
as one ``put`` frame of the memory's log (durable before it returns) -- and only
then acknowledges. Replay applies the logged versions as they are, so a replayed
update gives the same records (and the same history) whatever the merge rules.
A patch that changes nothing is acknowledged without a log frame.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ..memory import updates as memory_updates
from ..memory.expiry import now_ms
from ..memory.intake import canonical_records, fold_expiry
from ..memory.records import RecordError, normalize_records
from ..memory.stamps import stamp_records
from .errors import (
    SEP,
    NotFoundError,
    StoreFailedError,
    TenantError,
    internal_id,
    tenants_own,
)
from .validate import check_record

log = logging.getLogger("gpuir.service.store")  # the store's writer thread runs these

__all__ = ["check_patches", "commit_update"]


def check_patches(tenant: str, patches: Sequence[dict[str, Any]], time_unit: str | None) -> list[dict[str, Any]]:
    """The patches of a request, checked and in the log's form (internal ids, times as epoch ms).

    Raises
    ------
    TenantError
        A patch naming another tenant (or removing the tenant).
    RecordError
        A malformed patch (named by its position and id).
    """
    out = []
    for i, p in enumerate(patches):
        if not isinstance(p, dict):
            raise RecordError(f"records[{i}] is a {type(p).__name__}; each record must be a dict")
        rid = p.get("id")
        if not isinstance(rid, str) or not rid:
            raise RecordError(f"records[{i}].id: a non-empty string is required")
        if "tenant" in p and p["tenant"] != tenant:
            raise TenantError(f"records[{i}].tenant is {p['tenant']!r}, but the request is for tenant {tenant!r}: "
                              "a key may write only its own tenant (and cannot remove it)")
        check_record(p, i)
        out.append({**p, "id": internal_id(tenant, rid), "tenant": tenant})
    try:
        out = canonical_records(out, time_unit)
        memory_updates.check_ids(out, "update")
    except RecordError as e:
        raise tenants_own(e, tenant) from None
    return out


def commit_update(store: Any, op: Any) -> None:
    """Merge, check, apply (logged by the memory: durable) and acknowledge one update (called by the writer
    thread).

    The future gives ``(updated, created)``: records that existed and changed (one left as it was counts 0,
    as in ``Memory.update``), and records an upsert created."""
    mem = store.memory
    if store.failed is not None:
        op.future.set_exception(StoreFailedError(store.failed))
        return
    recs = op.records
    if mem.stamp == "add":  # a memory with record_times: the change's updated_at, decided before it is logged
        recs = stamp_records(recs, "update", now_ms())
    ids = [r["id"] for r in recs]
    try:
        missing = [rid for rid in ids if rid not in mem]
        created = len(missing)  # an upsert creates these (a PUT answers "created")
        if missing and not op.options.get("upsert"):
            shown = ", ".join(repr(m.split(SEP, 1)[1]) for m in missing[:5])
            raise NotFoundError(f"no record {shown} in tenant {op.tenant!r}")
        current = dict(zip(*mem.stored([rid for rid in ids if rid in mem])))
        new, labels, _, _ = memory_updates.plan(recs, current, bool(op.options.get("replace")))
        for i, r in enumerate(new):
            r["tenant"] = op.tenant  # a replace keeps the tenant boundary
            check_record(r, i)
        normalize_records(fold_expiry(new), labels=labels)  # the merged versions are records
    except RecordError as e:
        op.future.set_exception(tenants_own(e, op.tenant))
        return
    except NotFoundError as e:
        op.future.set_exception(e)
        return
    if not new:  # nothing changes (as Memory.update: 0, nothing logged)
        op.future.set_result((0, 0))
        return
    t0 = time.perf_counter()
    try:  # the memory logs the new versions (one frame, durable) before the call returns
        mem.upsert(new, replace=True, time_unit="ms")
    except BaseException as e:  # noqa: BLE001 - the memory's log says whether anything was stored
        op.future.set_exception(store.write_error(e))
        return
    if store.on_group is not None:
        store.on_group(1, time.perf_counter() - t0)
    try:
        if store.statistics == "tenant":  # then the tenant's search memory (its own ids), as adds do, given
            # the vectors the shared memory stores now: a changed text is encoded once, by the shared memory
            cut = len(op.tenant) + len(SEP)
            vecs = store._stored_vectors(store.hybrid_embedding(), [r["id"] for r in new])
            store._tenant_memory(op.tenant).upsert([{**r, "id": r["id"][cut:]} for r in new], replace=True,
                                                   time_unit="ms", vectors=vecs)
    except BaseException as e:  # noqa: BLE001 - checked above, so an internal failure: stop writing
        op.future.set_exception(store._fail(e))
        return
    op.future.set_result((len(new) - created, created))  # (a created record is always new)
