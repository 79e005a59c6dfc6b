"""Routes to see and change a tenant's records: list (with cursors), count, update, replace, history, export.

::

    GET    /v1/tenants/{tenant}/records?where=JSON&order_by=seq|time|created_at|updated_at&descending=false&limit=100&cursor=C
                                        -> {"records": [...], "cursor": "..." | null}
    GET    /v1/tenants/{tenant}/count?where=JSON            -> {"count": n}
    PATCH  /v1/tenants/{tenant}/records/{id}   {fields}     -> {"updated": 1, "record": {...}}  (merge; durable)
    PUT    /v1/tenants/{tenant}/records/{id}   {record}     -> {"updated": 1, "created": 0, "record": {...}}  (replace)
                                                            or {"updated": 0, "created": 1, "record": {...}}  (create)
    GET    /v1/tenants/{tenant}/records/{id}/history        -> {"versions": [...]}  (oldest first)
    GET    /v1/tenants/{tenant}/export                      -> JSON lines (gpuir.memory.export's format)
    POST   /v1/tenants/{tenant}/delete  {"ids": [...], "missing_ok": false}
                                        | {"where": {...}} | {"all": true}   -> {"deleted": n}  (durable)

The tenant is forced into every ``where`` (one naming another tenant is 403) and
onto every record; ids are the tenant's own. ``PATCH`` merges the fields given
into the stored record (``null`` removes a field or a metadata key; metadata
merges key by key; :mod:`gpuir.memory.updates`); ``PUT`` replaces the record
(creating it when new). Both are durable on reply, as adds are
(:mod:`gpuir.service.updates`). ``time_unit`` (query parameter) gives the unit
of times sent as bare numbers. Cursors are bound to their filter and order.

``POST .../delete`` deletes many records in one request, as ``Memory.delete``
does (:mod:`gpuir.memory.bulk`): by ``ids`` (an id the tenant does not hold is
404 naming every such id in ``detail.unknown_ids``, and nothing is deleted,
unless ``"missing_ok": true``: then they are skipped; the single ``DELETE`` of
an unknown id is 404 too), by ``where`` (the tenant's records passing it,
resolved to ids when the request is read and deleted as those ids; a ``where``
naming another tenant is 403; an empty one is 422), or ``"all": true`` (every
record of the tenant: a scope's ``delete_all``).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..memory import RecordError, WhereError
from ..memory.where import where_from_json
from .body import BodyError
from .errors import SEP, ConflictError, NotFoundError, StoreFailedError, TenantError, WriteFailedError, external_hit
from .http import detail_422, force_tenant, openapi_body, read_body, write_failed

TimeUnit = Literal["s", "ms", "us", "ns"]


class RecordFields(BaseModel):
    """Fields of a record (all optional: PATCH changes the fields given; null removes one); strict JSON
    (:mod:`gpuir.service.body`), read after the key check."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str | None = Field(None, description="optional; must equal the path's id")
    text: str | None = None
    session: str | None = None
    role: Literal["user", "assistant", "tool", "system"] | None = None
    agent: str | None = None
    tenant: str | None = Field(None, description="optional; must equal the path's tenant")
    time: int | float | str | None = Field(
        None, description="ISO 8601, or a number with the time_unit query parameter")
    expires_at: int | float | str | None = Field(
        None, description="when the record expires (hidden, then purged); ISO 8601 or a number with time_unit")
    importance: float | None = None
    type: str | None = None
    metadata: dict[str, Any] | None = Field(None, description="PATCH: merged key by key (null removes a key)")


def _error(loc: list[Any], msg: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": loc, "msg": msg, "type": "value_error"}]}, status_code=422)


def _where_param(text: str | None) -> dict[str, Any] | None:
    return None if text is None else where_from_json(text)


def _external_record(obj: dict[str, Any]) -> dict[str, Any]:
    """An export line with the tenant prefix removed from every id."""
    if "history" in obj:
        obj["history"] = obj["history"].split(SEP, 1)[-1]
        obj["versions"] = [external_hit(v) for v in obj["versions"]]
    elif "format" not in obj:
        external_hit(obj)
    return obj


class BulkDelete(BaseModel):
    """The body of ``POST .../delete``: exactly one of ids, where, all."""

    model_config = ConfigDict(extra="forbid", strict=True)
    ids: list[str] | None = Field(None, description="the tenant's ids to delete")
    missing_ok: bool = Field(False, description="skip ids the tenant does not hold (default: 404, nothing deleted)")
    where: dict[str, Any] | None = Field(None, description="delete the tenant's records passing this filter")
    all: bool = Field(False, description="delete every record of the tenant")
    time_unit: TimeUnit | None = None


def _matching_ids(mem: Any, where: dict[str, Any], time_unit: str | None) -> list[str]:
    """Ids of ``mem``'s records passing ``where`` (``Memory.match_ids``; pages of ``list`` for a sharded memory)."""
    if callable(getattr(mem, "match_ids", None)):
        return mem.match_ids(where, time_unit)
    out, cursor = [], None
    while True:
        page = mem.list(where, "seq", False, 1000, cursor, time_unit)
        out += [r["id"] for r in page.records]
        cursor = page.cursor
        if cursor is None:
            return out


def records_router(svc: Any, authorize: Any, authorize_read: Any = None) -> APIRouter:
    """The routes of this module over the service ``svc``, each behind ``authorize`` (the tenant's key); the
    routes that only read behind ``authorize_read`` (default: ``authorize``)."""

    r = APIRouter()
    authorize_read = authorize_read or authorize

    def tenant_where(where_text: str | None, tenant: str) -> dict[str, Any]:
        try:
            w = _where_param(where_text)
        except ValueError as e:
            raise HTTPException(422, [{"loc": ["query", "where"], "msg": str(e), "type": "value_error"}]) from None
        try:
            return force_tenant(w, tenant, ["where"])
        except TenantError as e:
            raise HTTPException(403, str(e)) from None

    @r.get("/v1/tenants/{tenant}/records", summary="List the tenant's records, a page at a time")
    async def list_records(tenant: str = Depends(authorize_read), where: str | None = Query(
            None, description="a filter as JSON (docs/memory.md, Filters); the tenant is forced"),
            order_by: Literal["seq", "time", "created_at", "updated_at"] = "seq", descending: bool = False,
            limit: int = Query(100, ge=1, le=1000), cursor: str | None = None, time_unit: TimeUnit | None = None):
        w = tenant_where(where, tenant)
        try:
            mem, w, internal = svc.store.reader(tenant, w)
            page = await asyncio.to_thread(mem.list, w, order_by, descending, limit, cursor, time_unit)
        except (WhereError, RecordError) as e:
            return _error(["query", "where"], str(e))
        except ValueError as e:  # a foreign or damaged cursor
            return _error(["query", "cursor"], str(e))
        recs = [external_hit(x) for x in page.records] if internal else page.records
        return JSONResponse({"records": recs, "cursor": page.cursor})

    @r.get("/v1/tenants/{tenant}/count", summary="Count the tenant's records passing a filter")
    async def count_records(tenant: str = Depends(authorize_read), where: str | None = None,
                            time_unit: TimeUnit | None = None):
        w = tenant_where(where, tenant)
        try:
            mem, w, _ = svc.store.reader(tenant, w)
            n = await asyncio.to_thread(mem.count, w, time_unit)
        except (WhereError, RecordError) as e:
            return _error(["query", "where"], str(e))
        return {"count": n}

    async def _put(tenant: str, rid: str, body: RecordFields, replace: bool, time_unit: str | None):
        fields = body.model_dump(exclude_unset=True)
        if fields.get("id", rid) != rid:
            return _error(["body", "id"], f"the body's id {fields['id']!r} differs from the path's {rid!r}")
        fields["id"] = rid
        if replace:
            fields = {k: v for k, v in fields.items() if v is not None}
        try:
            fut = svc.store.update(tenant, [fields], replace=replace, upsert=replace, time_unit=time_unit)
        except TenantError as e:
            raise HTTPException(403, str(e)) from None
        except RecordError as e:  # loc: the field (the path names the record)
            return _error(["body", *e.loc[1:]], str(e))
        except StoreFailedError as e:
            raise write_failed(e) from None
        try:
            updated, created = await asyncio.wrap_future(fut)
        except NotFoundError as e:
            raise HTTPException(404, str(e)) from None
        except RecordError as e:
            return _error(["body", *e.loc[1:]], str(e))
        except ConflictError as e:  # pragma: no cover - updates never conflict
            raise HTTPException(409, str(e)) from None
        except (WriteFailedError, StoreFailedError) as e:
            raise write_failed(e) from None
        rec = await asyncio.to_thread(svc.store.get, tenant, rid)
        if replace:  # PUT says which it did
            return {"updated": updated, "created": created, "record": rec}
        return {"updated": updated, "record": rec}

    @r.patch("/v1/tenants/{tenant}/records/{id}", summary="Change fields of a record, keeping the others (durable)",
             openapi_extra=openapi_body(RecordFields))
    async def patch_record(id: str, request: Request, tenant: str = Depends(authorize),
                           time_unit: TimeUnit | None = None):
        try:
            body = await read_body(request, RecordFields)
        except BodyError as e:
            return detail_422(e.detail)
        return await _put(tenant, id, body, False, time_unit)

    @r.put("/v1/tenants/{tenant}/records/{id}", summary="Replace a record, or create it (durable)",
           openapi_extra=openapi_body(RecordFields))
    async def put_record(id: str, request: Request, tenant: str = Depends(authorize),
                         time_unit: TimeUnit | None = None):
        try:
            body = await read_body(request, RecordFields)
        except BodyError as e:
            return detail_422(e.detail)
        if body.text is None:
            return _error(["body", "text"], "PUT replaces the whole record: give its text (PATCH changes some "
                                            "fields and keeps the others)")
        return await _put(tenant, id, body, True, time_unit)

    @r.get("/v1/tenants/{tenant}/records/{id}/history", summary="A record's earlier versions, oldest first")
    async def record_history(id: str, tenant: str = Depends(authorize_read)):
        from .errors import internal_id

        versions = await asyncio.to_thread(svc.store.memory.history, internal_id(tenant, id))
        return {"versions": [external_hit(v) for v in versions]}

    @r.post("/v1/tenants/{tenant}/delete", summary="Delete many records: by ids, by where, or all (durable)",
            openapi_extra=openapi_body(BulkDelete))
    async def bulk_delete(request: Request, tenant: str = Depends(authorize)):
        try:
            body = await read_body(request, BulkDelete)
        except BodyError as e:
            return detail_422(e.detail)
        given = [k for k in ("ids", "where", "all") if (getattr(body, k) not in (None, False))]
        if len(given) != 1:
            return _error(["body"], "give exactly one of ids, where, all (true)")
        if body.where is not None and not body.where:
            return _error(["body", "where"], 'an empty where would delete every record: send {"all": true}')
        if body.ids is not None:
            ids = list(dict.fromkeys(body.ids))
            known = await asyncio.to_thread(lambda: [svc.store.get(tenant, i) is not None for i in ids])
            unknown = [i for i, ok in zip(ids, known) if not ok]
            if unknown and not body.missing_ok:
                raise HTTPException(404, {"message": f"delete: {len(unknown)} unknown id(s) in tenant {tenant!r}: "
                                                     f"{', '.join(repr(i) for i in unknown[:5])} (nothing was "
                                                     "deleted; send \"missing_ok\": true to skip them)",
                                          "unknown_ids": unknown})
            ids = [i for i, ok in zip(ids, known) if ok]
        else:
            try:
                w = force_tenant(body.where, tenant, ["where"])
            except TenantError as e:
                raise HTTPException(403, str(e)) from None
            try:
                mem, w, internal = svc.store.reader(tenant, w)
                found = await asyncio.to_thread(_matching_ids, mem, w, body.time_unit)
            except (WhereError, RecordError) as e:
                return _error(["body", "where"], str(e))
            ids = [external_hit({"id": i})["id"] for i in found] if internal else found
        if not ids:
            return {"deleted": 0}
        try:
            n = await asyncio.wrap_future(svc.store.delete(tenant, ids))
        except RecordError as e:
            return _error(["body", "ids"], str(e))
        except (WriteFailedError, StoreFailedError) as e:
            raise write_failed(e) from None
        return {"deleted": n}

    @r.get("/v1/tenants/{tenant}/export", summary="Every record of the tenant as JSON lines (exact)")
    async def export_records(tenant: str = Depends(authorize_read)):
        fd, tmp = tempfile.mkstemp(prefix="gpuir-export-", suffix=".jsonl")
        os.close(fd)
        try:
            await asyncio.to_thread(svc.store.memory.export, tmp, {"tenant": tenant})
        except BaseException:
            os.unlink(tmp)
            raise

        def lines():
            try:
                with open(tmp, encoding="utf-8") as f:
                    for line in f:
                        yield json.dumps(_external_record(json.loads(line)), ensure_ascii=False,
                                         separators=(",", ":")) + "\n"
            finally:
                os.unlink(tmp)

        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"Content-Disposition": f'attachment; filename="{tenant}.jsonl"'})

    return r
