"""The HTTP API of the memory service (FastAPI).

Routes (the OpenAPI schema is served at ``/openapi.json``)::

    POST   /v1/tenants/{tenant}/records        {"records": [...]}            -> {"added": n}   (once durable)
    POST   /v1/tenants/{tenant}/search         {"queries": [...], "k": 10, "where": {...}, "config": NAME}
                                                -> {"results": [{"hits": [{"id", "score", "text", ...}]}]}
    GET    /v1/tenants/{tenant}/records/{id}   -> the record                  (404: no such record)
    DELETE /v1/tenants/{tenant}/records/{id}   -> {"deleted": 1}              (404: no such record)
    GET    /healthz                            (no key)
    GET    /metrics                            Prometheus text format (no key)

and the routes of :mod:`gpuir.service.records_api`: list (cursors), count,
update (PATCH merges, PUT replaces), history and export of a tenant's records.

Every ``/v1`` route needs ``Authorization: Bearer KEY`` with a key of the path's
tenant: no key or an unknown one is 401, a key of another tenant 403. The
tenant is forced onto every added record (a record naming another tenant is
403) and into every search's ``where`` (a ``where`` naming another tenant is
403), so a key of tenant A can neither read nor write tenant B. Bodies over
``max_body_bytes`` are 413; a malformed body is 422 whose ``detail`` names the
field (``loc``).

``config`` in a search names a retriever configuration saved as
``<MEMORY_DIR>.configs/NAME.json`` (``RetrieverConfig.save``); without it a
search is plain exact BM25 (:meth:`gpuir.Memory.search`), micro-batched with
other requests (:mod:`gpuir.service.batcher`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from ..memory import RecordError, WhereError
from ..memory.where import with_time_unit
from .batcher import MicroBatcher
from .keys import KeyFileError, KeyStore
from .store import (
    ConflictError,
    ServiceStore,
    StoreFailedError,
    TenantError,
    WriteFailedError,
    check_tenant,
    external_hit,
)

try:
    import prometheus_client as prom
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi import Path as PathParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt
except ImportError as e:  # pragma: no cover - exercised by the CLI test with the extra present
    raise ImportError(f"the memory service needs its extra ({e.name} is missing): pip install 'gpuir[service]'") from e

CONFIG_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


# ---------------------------------------------------------------------- request models
class Record(BaseModel):
    """A record as ``gpuir memory add`` takes it (see :mod:`gpuir.memory.records`); ``tenant`` comes from the path."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=1024, pattern=r"^[^/]+$",
                    description="unique in the tenant; no '/' (it names the record in URLs)")
    text: str
    session: str | None = None
    role: Literal["user", "assistant", "tool", "system"] | None = None
    agent: str | None = None
    tenant: str | None = Field(None, description="optional; must equal the path's tenant")
    time: StrictInt | StrictFloat | str | None = Field(
        None, description="ISO 8601, or a number with the request's time_unit")
    expires_at: StrictInt | StrictFloat | str | None = Field(
        None, description="when the record expires (hidden, then purged): ISO 8601, or a number with time_unit")
    importance: float | None = None
    type: str | None = None
    metadata: dict[str, Any] | None = None


class AddRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    records: list[Record] = Field(min_length=1, max_length=10_000)
    time_unit: Literal["s", "ms", "us", "ns"] | None = Field(
        None, description="unit of times sent as bare numbers (without it a bare number is refused)")


class AddResponse(BaseModel):
    added: int


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[str] = Field(min_length=1, max_length=1024)
    k: int = Field(10, ge=1, le=1000)
    where: dict[str, Any] | list[dict[str, Any] | None] | None = Field(
        None, description="a filter for every query, or one per query (see gpuir.memory.where); the tenant is forced")
    config: str | None = Field(None, description="a retriever configuration saved as <MEMORY_DIR>.configs/NAME.json; "
                                                 "default: exact BM25 (Memory.search)")
    min_score: float | None = Field(None, description="drop hits scoring below it")
    time_unit: Literal["s", "ms", "us", "ns"] | None = Field(
        None, description="unit of times given as bare numbers in where")


class Hits(BaseModel):
    hits: list[dict[str, Any]]


class SearchResponse(BaseModel):
    results: list[Hits]


class DeleteResponse(BaseModel):
    deleted: int


def _write_failed(e: Exception) -> HTTPException:
    """507 when the disk is full (retry later: nothing was stored), 503 for another failure to write."""
    status = 507 if isinstance(e, WriteFailedError) and e.no_space else 503
    return HTTPException(status, str(e), headers={"Retry-After": "5"})


def _field_error(loc: list[Any], msg: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": ["body", *loc], "msg": msg, "type": "value_error"}]}, status_code=422)


# ---------------------------------------------------------------------- body size limit
class BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes (declared length or as it streams)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    n = 0
                if n > self.limit:
                    return await self._reject(send)
        seen = 0
        started = rejected = False

        async def guarded_receive():
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:  # a body streamed without a length: answer now, end the app's read
                    rejected = True
                    if not started:
                        await self._reject(send)
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg):
            nonlocal started
            if rejected:
                return  # the 413 was sent
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        await self.app(scope, guarded_receive, guarded_send)

    async def _reject(self, send):
        body = (b'{"detail":"request body over the limit of %d bytes: send fewer records per request"}'
                % self.limit)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class Measure:
    """ASGI middleware: request counts and latencies per route template, method and status."""

    def __init__(self, app, service: Service):
        self.app, self.svc = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 500

        async def send_status(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, send_status)
        finally:
            name = getattr(scope.get("route"), "path", "other")
            self.svc.m_requests.labels(name, scope["method"], str(status)).inc()
            self.svc.m_latency.labels(name, scope["method"]).observe(time.perf_counter() - t0)


# ---------------------------------------------------------------------- the app
class Service:
    """Everything one running server holds: the store, keys, batcher, retrievers and metrics."""

    def __init__(self, memory_dir: str | Path, batch_window_ms: float = 2.0, max_batch: int = 256,
                 checkpoint_every: int = 10_000, checkpoint_seconds: float = 60.0, backend: str = "auto",
                 salvage: bool = False):
        self.root = Path(memory_dir)
        self.options = {"checkpoint_every": checkpoint_every, "checkpoint_seconds": checkpoint_seconds,
                        "salvage": salvage}
        self.backend = backend
        self.store: ServiceStore | None = None
        self.keys = KeyStore(self.root)
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.m_requests = prom.Counter("gpuir_requests", "HTTP requests", ["route", "method", "status"], registry=r)
        self.m_latency = prom.Histogram("gpuir_request_seconds", "HTTP request latency", ["route", "method"],
                                        registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5,
                                                             5, 10))
        self.m_batch = prom.Histogram("gpuir_search_batch_queries", "queries per scorer call (micro-batches)",
                                      registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.m_group = prom.Histogram("gpuir_wal_group_ops", "write operations per fsync (group commit)",
                                      registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.m_fsync = prom.Histogram("gpuir_wal_append_seconds", "write-ahead log append + fsync time", registry=r,
                                      buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1))
        self.m_records = prom.Gauge("gpuir_records", "live records in the memory", registry=r)
        self.m_records.set_function(lambda: len(self.store.memory) if self.store else 0)
        self.m_checkpoints = prom.Gauge("gpuir_checkpoints", "checkpoints since start", registry=r)
        self.m_checkpoints.set_function(lambda: self.store.checkpoints if self.store else 0)
        self.m_wal_ops = prom.Gauge("gpuir_wal_pending_records", "records in the log not yet folded by a save",
                                    registry=r)
        self.m_wal_ops.set_function(lambda: self.store.wal.ops if self.store else 0)
        self.batcher = MicroBatcher(batch_window_ms / 1000.0, max_batch,
                                    on_batch=lambda n, reqs, s: self.m_batch.observe(n))
        self._retrievers: dict[str, tuple[Any, threading.Lock]] = {}
        # Exact BM25 on a CPU engine holds the GIL: it runs on the event loop's thread (see batcher)
        from ..backends import resolve_backend

        try:
            self.bm25_inline = resolve_backend(backend)[0] != "cupy"
        except ValueError:  # an unusable backend: each search reports it
            self.bm25_inline = False

    def open(self) -> None:
        self.keys.refresh()
        self.store = ServiceStore(self.root, **self.options)
        self.store.on_group = lambda n, s: (self.m_group.observe(n), self.m_fsync.observe(s))

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ search functions
    def bm25(self, queries: list[str], k: int, wheres: list[Any]) -> list[list[dict[str, Any]]]:
        res = self.store.memory.search(queries, k=k, where=wheres, backend=self.backend)
        return [[external_hit(h) for h in res.hits(i)] for i in range(len(queries))]

    def configs_dir(self) -> Path:
        return self.root.with_name(self.root.name + ".configs")

    def retriever_fn(self, name: str):
        if not CONFIG_RE.match(name):
            raise LookupError(f"config {name!r}: use letters, digits, '_' or '-'")
        if name not in self._retrievers:
            path = self.configs_dir() / f"{name}.json"
            if not path.is_file():
                have = sorted(p.stem for p in self.configs_dir().glob("*.json")) if self.configs_dir().is_dir() else []
                raise LookupError(f"config {name!r}: no {path} (available: {', '.join(have) or 'none'}; "
                                  "omit config for exact BM25)")
            from ..retrieve import Retriever

            self._retrievers[name] = (Retriever.from_config(self.store.memory, path), threading.Lock())
        retriever, lock = self._retrievers[name]

        def run(queries: list[str], k: int, wheres: list[Any]) -> list[list[dict[str, Any]]]:
            with lock:  # a retriever's catalog catches up with the memory on every search
                res = retriever.search(queries, k=k, where=wheres, backend=self.backend)
            return [[external_hit(h) for h in res.hits(i)] for i in range(len(queries))]

        return run


def _force_tenant(where: dict[str, Any] | None, tenant: str, loc: list[Any]) -> dict[str, Any]:
    w = dict(where or {})
    if "tenant" in w and w["tenant"] not in (tenant, {"eq": tenant}):
        raise TenantError(f"{'.'.join(map(str, loc))}.tenant names another tenant than {tenant!r}: "
                          "a key may search only its own tenant")
    w["tenant"] = tenant
    return w


def create_app(memory_dir: str | Path, batch_window_ms: float = 2.0, max_batch: int = 256,
               checkpoint_every: int = 10_000, checkpoint_seconds: float = 60.0, max_body_bytes: int = 4 << 20,
               backend: str = "auto", salvage: bool = False):
    """The ASGI application serving ``memory_dir`` (opened now, checkpointed and released at shutdown).

    ``salvage``: start although the write-ahead log is damaged (see :class:`~gpuir.service.store.ServiceStore`).
    """
    svc = Service(memory_dir, batch_window_ms, max_batch, checkpoint_every, checkpoint_seconds, backend, salvage)

    svc.open()  # here, not at startup: a locked or damaged directory is an error before listening

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await asyncio.to_thread(svc.close)

    app = FastAPI(title="gpuir memory service", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=__doc__.split("\n\n", 1)[0])
    app.state.service = svc

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad input back, and an input that cannot be written as
        # UTF-8 JSON (a lone surrogate in an id, ...) then turned the 422 into a 500: name the field only
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        body = json.dumps({"detail": detail}, ensure_ascii=True, default=str).encode()
        return Response(body, status_code=422, media_type="application/json")

    async def authorize(request: Request, tenant: str = PathParam(..., pattern=TENANT_PATTERN)) -> str:
        # async: a sync dependency would cost a worker-thread hop per request; this is a stat and a sha256
        h = request.headers.get("authorization", "")
        scheme, _, key = h.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise HTTPException(401, "missing API key: send 'Authorization: Bearer KEY' "
                                     "(create one with `gpuir serve-keys MEMORY_DIR add TENANT`)",
                                headers={"WWW-Authenticate": "Bearer"})
        try:
            owner = svc.keys.tenant_for(key.strip())
        except KeyFileError as e:
            raise HTTPException(500, str(e)) from None
        if owner is None:
            raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
        if owner != tenant:
            raise HTTPException(403, f"this key belongs to another tenant, not {tenant!r}")
        return tenant

    @app.post("/v1/tenants/{tenant}/records", response_model=AddResponse, summary="Add records (durable on reply)")
    async def add_records(body: AddRequest, tenant: str = Depends(authorize)):
        recs = [r.model_dump(exclude_none=True) for r in body.records]
        try:
            fut = svc.store.add(tenant, recs, time_unit=body.time_unit)
        except TenantError as e:
            raise HTTPException(403, str(e)) from None
        except RecordError as e:
            return _field_error(["records"], str(e))
        except StoreFailedError as e:
            raise _write_failed(e) from None
        try:
            n = await asyncio.wrap_future(fut)
        except ConflictError as e:
            raise HTTPException(409, str(e)) from None
        except (WriteFailedError, StoreFailedError) as e:
            raise _write_failed(e) from None
        return {"added": n}

    @app.post("/v1/tenants/{tenant}/search", response_model=SearchResponse, summary="Search the tenant's records")
    async def search(body: SearchRequest, tenant: str = Depends(authorize)):
        B = len(body.queries)
        try:
            if body.time_unit is not None:  # bare-number times in where, read in their unit once, here
                body.where = with_time_unit(body.where, body.time_unit)
            if isinstance(body.where, list):
                if len(body.where) != B:
                    return _field_error(["where"], f"{len(body.where)} filters for {B} queries: give one per "
                                                   "query, or a single object for all")
                wheres = [_force_tenant(w, tenant, ["where", i]) for i, w in enumerate(body.where)]
            else:
                wheres = [_force_tenant(body.where, tenant, ["where"])] * B
        except TenantError as e:
            raise HTTPException(403, str(e)) from None
        except (WhereError, RecordError) as e:
            return _field_error(["where"], str(e))
        if body.config is None:
            key, fn, inline = None, svc.bm25, svc.bm25_inline
        else:
            try:
                key, fn, inline = body.config, svc.retriever_fn(body.config), False
            except (LookupError, ValueError, TypeError) as e:
                return _field_error(["config"], str(e).strip("'\""))
        try:
            rows = await svc.batcher.search(key, fn, body.queries, body.k, wheres, inline=inline)
        except (WhereError, RecordError) as e:
            return _field_error(["where"], str(e))
        for row in rows:
            for h in row:
                if not math.isfinite(h["score"]):
                    raise HTTPException(500, "internal error: a non-finite score")
        if body.min_score is not None:
            rows = [[h for h in row if h["score"] >= body.min_score] for row in rows]
        # a JSONResponse skips re-validating every hit against the response model (documented by it)
        return JSONResponse({"results": [{"hits": row} for row in rows]})

    @app.get("/v1/tenants/{tenant}/records/{id}", summary="One record of the tenant")
    async def get_record(id: str, tenant: str = Depends(authorize)) -> dict[str, Any]:
        rec = await asyncio.to_thread(svc.store.get, tenant, id)
        if rec is None:
            raise HTTPException(404, f"no record {id!r} in tenant {tenant!r}")
        return rec

    @app.delete("/v1/tenants/{tenant}/records/{id}", response_model=DeleteResponse,
                summary="Delete a record (durable on reply)")
    async def delete_record(id: str, tenant: str = Depends(authorize)):
        try:
            n = await asyncio.wrap_future(svc.store.delete(tenant, [id]))
        except RecordError as e:
            return JSONResponse({"detail": [{"loc": ["path", "id"], "msg": str(e), "type": "value_error"}]},
                                status_code=422)
        except (WriteFailedError, StoreFailedError) as e:
            raise _write_failed(e) from None
        if not n:
            raise HTTPException(404, f"no record {id!r} in tenant {tenant!r}")
        return {"deleted": n}

    @app.get("/healthz", summary="Liveness and counts (no key)")
    async def healthz() -> dict[str, Any]:
        st = svc.store
        return {"status": "ok", "records": len(st.memory), "wal_pending_records": st.wal.ops,
                "checkpoints": st.checkpoints, "replayed_operations": st.replayed}

    @app.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
    async def metrics():
        return Response(prom.generate_latest(svc.registry), media_type=prom.CONTENT_TYPE_LATEST)

    from .records_api import records_router

    app.include_router(records_router(svc, authorize))
    app.add_middleware(Measure, service=svc)
    app.add_middleware(BodyLimit, limit=int(max_body_bytes))
    return app


__all__ = ["Service", "check_tenant", "create_app"]
