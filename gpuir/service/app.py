"""The HTTP API of the memory service (FastAPI).

Routes (the OpenAPI schema is served at ``/openapi.json``)::

    POST   /v1/tenants/{tenant}/records        {"records": [...]}            -> {"added": n}   (once durable)
    POST   /v1/tenants/{tenant}/search         {"queries": [...], "k": 10, "where": {...}, "config": NAME}
                                                -> {"results": [{"hits": [{"id", "score", "text", ...}]}]}
    GET    /v1/tenants/{tenant}/records/{id}   -> the record                  (404: no such record)
    DELETE /v1/tenants/{tenant}/records/{id}   -> {"deleted": 1}              (404: no such record)
    GET    /healthz                            {"status": "ok"}; counts only with an operator key
    GET    /metrics                            Prometheus text format (operator key)

and the routes of :mod:`gpuir.service.records_api`: list (cursors), count,
update (PATCH merges, PUT replaces), history and export of a tenant's records.

Every ``/v1`` route needs ``Authorization: Bearer KEY`` with a key of the path's
tenant: no key or an unknown one is 401, a key of another tenant 403. The key
is checked before the body is read. The tenant is forced onto every added
record (a record naming another tenant is 403) and into every search's
``where`` (a ``where`` naming another tenant is 403), so a key of tenant A can
neither read nor write tenant B. Bodies over ``max_body_bytes`` are 413; a
malformed body is 422 whose ``detail`` names the field (``loc``), never echoing
the value (strict JSON, see :mod:`gpuir.service.body`); a key over its rate
limit is 429 with ``Retry-After``; a search over the work limits is 422.

``config`` in a search names a retriever configuration saved as
``<MEMORY_DIR>.configs/NAME.json`` (``RetrieverConfig.save``); without it a
search is :meth:`gpuir.Memory.search` with the memory's ranking (exact BM25, or
hybrid for a memory served with ``gpuir serve --ranking hybrid``; ``"ranking"``
in the request overrides it), micro-batched with other requests
(:mod:`gpuir.service.batcher`). ``min_score`` compares with the scores returned,
as :meth:`gpuir.Memory.search` does: with the hybrid ranking a calibrated
relevance, which must lie in [0, 1] (422 otherwise). With ``config`` it is
refused (422, :data:`CONFIG_MIN_SCORE`): a fused score has no fixed scale, and
no configuration has a relevance calibrated held out for record hits
(:mod:`gpuir.retrieve.relevance`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import re
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..memory import RecordError, WhereError
from ..memory.protocol import shard_list
from ..memory.where import with_time_unit
from .batcher import MicroBatcher
from .body import BodyError
from .errors import ConflictError, StoreFailedError, TenantError, WriteFailedError, check_tenant, external_hit
from .gcpauses import GcPauses
from .http import detail_422, field_error, force_tenant, openapi_body, read_body, write_failed
from .keys import OPERATOR, KeyFileError, KeyStore, parse_key
from .ratelimit import RateLimiter
from .store import ServiceStore

try:
    import prometheus_client as prom
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi import Path as PathParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field
except ImportError as e:  # pragma: no cover - exercised by the CLI test with the extra present
    raise ImportError(f"the memory service needs its extra ({e.name} is missing): pip install 'gpuir[service]'") from e

CONFIG_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # with fullmatch
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # Pydantic's regex: '$' is the end of the text
#: What counts as a term when a search's work is bounded (before the analyzer: a run of word characters).
WORD_RE = re.compile(r"\w+")
#: HTTP methods with their own metric series; any other is counted as "other".
METHODS = frozenset({"GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH"})


@dataclass(frozen=True)
class Limits:
    """Bounds on one request's work (see docs/service.md, "Limits").

    Attributes
    ----------
    max_query_terms : int
        Most terms (runs of word characters) in all the queries of one search request.
    max_hits : int
        Most hits one search may ask for: queries x k.
    max_response_bytes : int
        Largest reply of a search (its JSON, in bytes); a larger one is refused (422).
    batch_terms : int
        Most query terms in one scorer call: a request with more is split into
        several calls, and the event loop serves other requests between them.
    rate : float
        Requests per second per API key (0: unlimited).
    burst : int
        Requests a key may send at once after a quiet spell.
    """

    max_query_terms: int = 8192
    max_hits: int = 20_000
    max_response_bytes: int = 8 << 20
    batch_terms: int = 2048
    rate: float = 100.0
    burst: int = 200


# ---------------------------------------------------------------------- request models
class Record(BaseModel):
    """A record as ``gpuir memory add`` takes it (see :mod:`gpuir.memory.records`); ``tenant`` comes from the path.

    Validated in strict mode (:mod:`gpuir.service.body`): ``true`` is not a number, ``"3"`` not an integer.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(min_length=1, max_length=1024, pattern=r"^[^/]+$",
                    description="unique in the tenant; no '/' (it names the record in URLs)")
    text: str
    session: str | None = None
    role: Literal["user", "assistant", "tool", "system"] | None = None
    agent: str | None = None
    tenant: str | None = Field(None, description="optional; must equal the path's tenant")
    time: int | float | str | None = Field(
        None, description="ISO 8601, or a number with the request's time_unit")
    expires_at: int | float | str | None = Field(
        None, description="when the record expires (hidden, then purged): ISO 8601, or a number with time_unit")
    importance: float | None = Field(None, description="a number (not a boolean)")
    type: str | None = None
    metadata: dict[str, Any] | None = None


class AddRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    records: list[Record] = Field(min_length=1, max_length=10_000)
    time_unit: Literal["s", "ms", "us", "ns"] | None = Field(
        None, description="unit of times sent as bare numbers (without it a bare number is refused)")


class AddResponse(BaseModel):
    added: int


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    queries: list[str] = Field(min_length=1, max_length=1024)
    k: int = Field(10, ge=1, le=1000)
    where: dict[str, Any] | list[dict[str, Any] | None] | None = Field(
        None, description="a filter for every query, or one per query (see gpuir.memory.where); the tenant is forced")
    config: str | None = Field(None, description="a retriever configuration saved as <MEMORY_DIR>.configs/NAME.json; "
                                                 "default: exact BM25 (Memory.search)")
    min_score: float | None = Field(
        None, description="drop hits scoring below it: with the hybrid ranking a calibrated relevance in [0, 1] "
                          "(0.5: as likely relevant as not), with bm25 a BM25 score; refused with config (a fused "
                          "score has no fixed scale and no calibrated relevance for records)")
    ranking: Literal["bm25", "hybrid"] | None = Field(
        None, description="without config: bm25 (exact BM25) or hybrid (BM25 + MiniLM, scores a relevance in [0, 1]; "
                          "a memory served with --ranking hybrid); default: the memory's")
    time_unit: Literal["s", "ms", "us", "ns"] | None = Field(
        None, description="unit of times given as bare numbers in where")
    explain: bool = Field(False, description="with config: each hit carries channels, {kind: {rank, contribution}} "
                                             "(gpuir.service.explain); ignored without config")


class Hits(BaseModel):
    hits: list[dict[str, Any]]


class SearchResponse(BaseModel):
    results: list[Hits]


class DeleteResponse(BaseModel):
    deleted: int


def _split(queries: list[str], terms: list[int], wheres: list[Any], max_queries: int, max_terms: int):
    """Consecutive chunks of a search, each at most ``max_queries`` queries and ``max_terms`` terms
    (a single larger query is a chunk of its own)."""
    start, n, t = 0, 0, 0
    for i, ti in enumerate(terms):
        if n and (n + 1 > max_queries or t + ti > max_terms):
            yield queries[start:i], wheres[start:i], t
            start, n, t = i, 0, 0
        n += 1
        t += ti
    if n:
        yield queries[start:], wheres[start:], t


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
            # bounded label sets: a route template or "other", a known method or "other", a status code
            name = getattr(scope.get("route"), "path", "other")
            method = scope["method"] if scope["method"] in METHODS else "other"
            code = str(status) if 100 <= status <= 599 else "other"
            self.svc.m_requests.labels(name, method, code).inc()
            self.svc.m_latency.labels(name, method).observe(time.perf_counter() - t0)


# ---------------------------------------------------------------------- the app
#: The 422 of a search naming both ``config`` and ``min_score``. A retriever's fused score has no fixed scale,
#: and the only relevance calibrated held out for a configuration (:data:`gpuir.retrieve.relevance.CALIBRATED`)
#: is the default configuration's, for sessions; the service's searches with ``config`` return records.
CONFIG_MIN_SCORE = (
    "min_score is not accepted with config: a retriever configuration's fused score has no fixed scale, and no "
    "configuration has a relevance calibrated for record hits (gpuir.retrieve.relevance calibrates the default "
    "configuration's sessions only: Retriever.search(unit='session', min_score=...) in Python). Omit min_score "
    "and cut with k; or filter a channel's raw scores with ChannelConfig(min_score=...) in the saved "
    "configuration; or omit config on a memory served with --ranking hybrid, whose min_score is a calibrated "
    "relevance in [0, 1]")


class FieldError(ValueError):
    """A request's field that cannot be honoured (a 422 naming ``field``, with ``msg`` saying what to do)."""

    def __init__(self, field: str, msg: str):
        super().__init__(f"{field}: {msg}")
        self.field, self.msg = field, msg


class Service:
    """Everything one running server holds: the store, keys, batcher, retrievers and metrics."""

    def __init__(self, memory_dir: str | Path, batch_window_ms: float = 2.0, max_batch: int = 256,
                 checkpoint_every: int = 10_000, checkpoint_seconds: float = 60.0, backend: str = "auto",
                 salvage: bool = False, statistics: str = "tenant", limits: Limits | None = None,
                 operator_reads: bool = False, durability: str | None = None, ranking: str | None = None):
        self.root = Path(memory_dir)
        #: whether an operator key may read (never write) every tenant's records (search, list, history, overview)
        self.operator_reads = bool(operator_reads)
        self.options = {"checkpoint_every": checkpoint_every, "checkpoint_seconds": checkpoint_seconds,
                        "salvage": salvage, "statistics": statistics, "durability": durability}
        if ranking is not None:  # (a sharded memory takes no ranking: it is chosen by ShardedMemory.create)
            self.options["ranking"] = ranking
        self.backend = backend
        self.limits = limits or Limits()
        self.max_batch = max_batch
        self.rate = RateLimiter(self.limits.rate, self.limits.burst)
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
        self.m_group = prom.Histogram("gpuir_wal_group_ops", "write operations per memory write: one log append + fsync",
                                      registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.m_fsync = prom.Histogram("gpuir_wal_append_seconds", "memory write time: log append + apply + fsync", registry=r,
                                      buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1))
        self.m_records = prom.Gauge("gpuir_records", "live records in the memory", registry=r)
        self.m_records.set_function(lambda: len(self.store.memory) if self.store else 0)
        self.m_checkpoints = prom.Gauge("gpuir_checkpoints", "checkpoints since start", registry=r)
        self.m_checkpoints.set_function(lambda: self.store.checkpoints if self.store else 0)
        self.m_wal_ops = prom.Gauge("gpuir_wal_pending_records", "records in the log not yet folded by a save",
                                    registry=r)
        self.m_wal_ops.set_function(lambda: self.store.pending_records if self.store else 0)
        self.gc_pauses = GcPauses(prom.Histogram(
            "gpuir_gc_pause_seconds", "the process's garbage-collector passes (each holds every request)",
            ["generation"], registry=r, buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5)))
        prom.Gauge("gpuir_gc_frozen_objects", "objects out of the collector's passes (gpuir serve freezes what "
                   "it loaded to start)", registry=r).set_function(gc.get_freeze_count)
        self.batcher = MicroBatcher(batch_window_ms / 1000.0, max_batch, max_terms=self.limits.batch_terms,
                                    on_batch=lambda n, reqs, s: self.m_batch.observe(n))
        self._retrievers: dict[str, tuple[Any, threading.Lock]] = {}
        # Exact BM25 on a CPU engine holds the GIL: it runs on the event loop's thread (see batcher)
        from ..backends import resolve_memory_backend

        try:
            self.bm25_inline = resolve_memory_backend(backend)[0] != "cupy"
        except ValueError:  # an unusable backend: each search reports it
            self.bm25_inline = False

    def open(self) -> None:
        self.keys.refresh()
        from ..cluster.layout import is_sharded

        if is_sharded(self.root):  # a directory made by ShardedMemory.create: shards on Ray (gpuir[ray])
            from ..cluster.sharded import NO_HYBRID

            if self.options.get("ranking", "bm25") != "bm25":
                raise ValueError(f"{self.root} is a sharded memory, which cannot be served --ranking hybrid: "
                                 f"{NO_HYBRID}. Omit --ranking (exact BM25), or serve one memory created with "
                                 "`gpuir serve NEW_DIR --ranking hybrid`")
            self.options.pop("ranking", None)
            from .sharded import ShardedStore

            self.store = ShardedStore(self.root, **self.options)
        else:
            self.store = ServiceStore(self.root, **self.options)
        self.store.on_group = lambda n, s: (self.m_group.observe(n), self.m_fsync.observe(s))
        self.gc_pauses.install()

    def close(self) -> None:
        self.gc_pauses.remove()
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ search functions
    def bm25(self, queries: list[str], k: int, wheres: list[Any]) -> list[list[dict[str, Any]]]:
        return self.store.search(queries, k, wheres, backend=self.backend)

    @property
    def ranking(self) -> str:
        """The memory's ranking, the default of a search without config: "bm25" or "hybrid"."""
        return getattr(self.store, "ranking", "bm25")

    def hybrid(self, queries: list[str], k: int, wheres: list[Any]) -> list[list[dict[str, Any]]]:
        """:meth:`gpuir.Memory.search` with ``ranking="hybrid"`` (a hybrid memory only: see :meth:`search_fn`)."""
        return self.store.search(queries, k, wheres, backend=self.backend, ranking="hybrid")

    def search_fn(self, ranking: str | None, min_score: float | None):
        """(batch key, function, inline) of a search without config; :class:`FieldError` names the field to fix.

        ``ranking``: the request's (None: the memory's). ``min_score`` is checked against the ranking's scale:
        a relevance in [0, 1] with "hybrid" (:mod:`gpuir.memory.hybrid`), a BM25 score otherwise.
        """
        ranking = self.ranking if ranking is None else ranking
        if ranking == "hybrid" and self.store.memory.sharded:
            from ..cluster.sharded import NO_HYBRID

            raise FieldError("ranking", f"this server's memory is sharded: {NO_HYBRID}. Omit ranking (exact "
                                        "BM25), or serve one memory created with `gpuir serve NEW_DIR --ranking "
                                        "hybrid`")
        if ranking == "hybrid" and self.ranking != "hybrid":
            raise FieldError("ranking", "this memory stores no vectors, so it cannot rank hybrid: serve a new "
                                        "memory directory with `gpuir serve DIR --ranking hybrid`, or omit ranking "
                                        "(exact BM25)")
        if min_score is not None and ranking == "hybrid" and not 0.0 <= min_score <= 1.0:
            raise FieldError("min_score", f"with the hybrid ranking a hit's score is a calibrated relevance, so "
                                          f"min_score must lie in [0, 1] (0.5: as likely relevant as not), got "
                                          f"{min_score}")
        if ranking == "hybrid":
            return "hybrid", self.hybrid, False  # encodes each question: off the event loop, batched apart
        if self.ranking == "hybrid":
            return "bm25", lambda q, k, w: self.store.search(q, k, w, backend=self.backend, ranking="bm25"), \
                self.bm25_inline
        return None, self.bm25, self.bm25_inline

    def configs_dir(self) -> Path:
        return self.root.with_name(self.root.name + ".configs")

    def retriever_fn(self, name: str, explain: bool = False):
        if not CONFIG_RE.fullmatch(name):
            raise LookupError(f"config {name!r}: use 1 to 64 letters, digits, '_' or '-'")
        path = self.configs_dir() / f"{name}.json"
        if not path.is_file():
            have = sorted(p.stem for p in self.configs_dir().glob("*.json")) if self.configs_dir().is_dir() else []
            raise LookupError(f"config {name!r}: no {path} (available: {', '.join(have) or 'none'}; "
                              "omit config for exact BM25)")
        from ..retrieve import Retriever

        store = self.store
        if store.memory.sharded:  # a Retriever reads one Memory's segments (gpuir.memory.protocol)
            raise LookupError(f"config {name!r}: retriever configs are not served over a sharded memory (omit config "
                              "for exact BM25)")

        def retriever(tenant: str | None):
            """The retriever of the tenant's search memory (statistics per tenant), or of the shared memory."""
            key = (name, tenant)
            if key not in self._retrievers:
                mem = store.memory if tenant is None else store.tenants[tenant]
                self._retrievers[key] = (Retriever.from_config(mem, path), threading.Lock())
            return self._retrievers[key]

        def hits(retr, res, i: int) -> list[dict[str, Any]]:
            got = res.hits(i)
            if explain:
                from .explain import channel_contributions

                parts = channel_contributions(retr, res, i)
                if parts is not None:
                    for h in got:
                        h["channels"] = parts.get(h["id"], {})
            return got

        def run(queries: list[str], k: int, wheres: list[Any]) -> list[list[dict[str, Any]]]:
            if store.statistics == "pooled":
                retr, lock = retriever(None)
                with lock:  # a retriever's catalog catches up with the memory on every search
                    res = retr.search(queries, k=k, where=wheres, backend=self.backend)
                return [[external_hit(h) for h in hits(retr, res, i)] for i in range(len(queries))]
            out: list[list[dict[str, Any]]] = [[] for _ in queries]
            groups: dict[str, list[int]] = {}
            for i, w in enumerate(wheres):
                groups.setdefault(w["tenant"], []).append(i)
            for tenant, idx in groups.items():
                if tenant not in store.tenants or not len(store.tenants[tenant]):
                    continue
                retr, lock = retriever(tenant)
                ws = [{f: v for f, v in wheres[i].items() if f != "tenant"} or None for i in idx]
                with lock:
                    res = retr.search([queries[i] for i in idx], k=k, where=ws, backend=self.backend)
                for j, i in enumerate(idx):
                    out[i] = hits(retr, res, j)
            return out

        return run


def create_app(memory_dir: str | Path, batch_window_ms: float = 2.0, max_batch: int = 256,
               checkpoint_every: int = 10_000, checkpoint_seconds: float = 60.0, max_body_bytes: int = 4 << 20,
               backend: str = "auto", salvage: bool = False, statistics: str = "tenant",
               limits: Limits | None = None, operator_reads: bool = False, durability: str | None = None,
               ranking: str | None = None):
    """The ASGI application serving ``memory_dir`` (opened now, checkpointed and released at shutdown).

    ``salvage``: start although the write-ahead log is damaged (see :class:`~gpuir.service.store.ServiceStore`).
    ``durability``: the memory's durability level, "fsync" (default), "flush" or "none" (:mod:`gpuir.memory.durable`;
    a sharded memory's is chosen by ``ShardedMemory.create``).
    ``statistics``: "tenant" (default: each tenant's BM25 statistics are its own records') or "pooled".
    ``ranking``: a new memory's ranking, "bm25" (default) or "hybrid" (:class:`~gpuir.service.store.ServiceStore`).
    ``limits``: bounds on each request's work and the per-key rate (:class:`Limits`).
    ``operator_reads``: an operator key may read every tenant's records (search, list, count, get, history,
    overview; never a write), as the memory inspector page at ``/ui`` does for operators; default: it may not.
    """
    svc = Service(memory_dir, batch_window_ms, max_batch, checkpoint_every, checkpoint_seconds, backend, salvage,
                  statistics, limits, operator_reads, durability, ranking)

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

    def key_owner(request: Request, required: bool = True) -> tuple[str, str] | None:
        """(owner, key id) of the request's valid key; 401 when missing or unknown (None if not ``required``)."""
        h = request.headers.get("authorization", "")
        scheme, _, key = h.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            if not required:
                return None
            raise HTTPException(401, "missing API key: send 'Authorization: Bearer KEY' "
                                     "(create one with `gpuir serve-keys MEMORY_DIR add TENANT`)",
                                headers={"WWW-Authenticate": "Bearer"})
        try:
            owner = svc.keys.tenant_for(key)
        except KeyFileError as e:
            raise HTTPException(503, f"the server cannot read its keys: {e}") from None
        if owner is None:
            raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
        wait = svc.rate.take(parse_key(key)[1])
        if wait > 0:
            raise HTTPException(429, f"rate limit of this key ({svc.limits.rate:g} requests/s, bursts of "
                                     f"{svc.limits.burst}) reached: retry in {wait:.2f} s",
                                headers={"Retry-After": str(max(1, math.ceil(wait)))})
        return owner, parse_key(key)[1]

    async def authorize(request: Request, tenant: str = PathParam(..., pattern=TENANT_PATTERN)) -> str:
        # async: a sync dependency would cost a worker-thread hop per request; this is a stat and a sha256.
        # It runs before the body is read: an unauthenticated request is 401 whatever its body.
        owner, _ = key_owner(request)
        if owner == OPERATOR:
            raise HTTPException(403, "an operator key opens /metrics and /healthz, not a tenant's records"
                                + (" (it reads them, never writes them)" if svc.operator_reads else ""))
        if owner != tenant:
            raise HTTPException(403, f"this key belongs to another tenant, not {tenant!r}")
        return tenant

    async def authorize_read(request: Request, tenant: str = PathParam(..., pattern=TENANT_PATTERN)) -> str:
        """As ``authorize``, and an operator key reads any tenant when the server runs with ``operator_reads``."""
        owner, _ = key_owner(request)
        if owner == OPERATOR:
            if svc.operator_reads:
                return tenant
            raise HTTPException(403, "an operator key opens /metrics and /healthz, not a tenant's records "
                                     "(`gpuir serve --operator-reads` lets it read them)")
        if owner != tenant:
            raise HTTPException(403, f"this key belongs to another tenant, not {tenant!r}")
        return tenant

    def operator(request: Request, required: bool = True) -> bool:
        got = key_owner(request, required)
        if got is not None and got[0] != OPERATOR:
            if not required:
                return False
            raise HTTPException(403, "this needs an operator key (`gpuir serve-keys MEMORY_DIR add --operator`), "
                                     "not a tenant's key")
        return got is not None

    @app.post("/v1/tenants/{tenant}/records", response_model=AddResponse, summary="Add records (durable on reply)",
              openapi_extra=openapi_body(AddRequest))
    async def add_records(request: Request, tenant: str = Depends(authorize)):
        try:
            body = await read_body(request, AddRequest)
        except BodyError as e:
            return detail_422(e.detail)
        recs = [r.model_dump(exclude_none=True) for r in body.records]
        try:
            fut = svc.store.add(tenant, recs, time_unit=body.time_unit)
        except TenantError as e:
            raise HTTPException(403, str(e)) from None
        except RecordError as e:  # loc: the record and its field, when known
            return field_error(["records", *e.loc], str(e))
        except StoreFailedError as e:
            raise write_failed(e) from None
        try:
            n = await asyncio.wrap_future(fut)
        except ConflictError as e:
            raise HTTPException(409, str(e)) from None
        except (WriteFailedError, StoreFailedError) as e:
            raise write_failed(e) from None
        return {"added": n}

    @app.post("/v1/tenants/{tenant}/search", response_model=SearchResponse, summary="Search the tenant's records",
              openapi_extra=openapi_body(SearchRequest))
    async def search(request: Request, tenant: str = Depends(authorize_read)):
        try:
            body = await read_body(request, SearchRequest)
        except BodyError as e:
            return detail_422(e.detail)
        B = len(body.queries)
        lim = svc.limits
        if B * body.k > lim.max_hits:
            return field_error(["k"], f"{B} queries x k={body.k} asks for {B * body.k:,} hits, over the limit of "
                                       f"{lim.max_hits:,} per request: send fewer queries or a smaller k",
                                "limit_exceeded")
        terms = [len(WORD_RE.findall(q)) for q in body.queries]
        if sum(terms) > lim.max_query_terms:
            return field_error(["queries"], f"the queries hold {sum(terms):,} terms, over the limit of "
                                             f"{lim.max_query_terms:,} per request: split the request",
                                "limit_exceeded")
        try:
            if body.time_unit is not None:  # bare-number times in where, read in their unit once, here
                body.where = with_time_unit(body.where, body.time_unit)
            if isinstance(body.where, list):
                if len(body.where) != B:
                    return field_error(["where"], f"{len(body.where)} filters for {B} queries: give one per "
                                                   "query, or a single object for all")
                wheres = [force_tenant(w, tenant, ["where", i]) for i, w in enumerate(body.where)]
            else:
                wheres = [force_tenant(body.where, tenant, ["where"])] * B
        except TenantError as e:
            raise HTTPException(403, str(e)) from None
        except (WhereError, RecordError) as e:
            return field_error(["where"], str(e))
        if body.min_score is not None and not math.isfinite(body.min_score):
            return field_error(["min_score"], "min_score must be a finite number")
        if body.config is None:
            try:
                key, fn, inline = svc.search_fn(body.ranking, body.min_score)
            except FieldError as e:
                return field_error([e.field], e.msg)
        elif body.ranking is not None:
            return field_error(["ranking"], "ranking applies to searches without config (a retriever configuration "
                                            "ranks by its own channels): omit one of them")
        elif body.min_score is not None:
            return field_error(["min_score"], CONFIG_MIN_SCORE)
        else:
            try:
                key = (body.config, "explain") if body.explain else body.config  # batched apart: other replies
                fn, inline = svc.retriever_fn(body.config, explain=body.explain), False
            except (LookupError, ValueError, TypeError) as e:
                return field_error(["config"], str(e).strip("'\""))
        rows: list[list[dict[str, Any]]] = []
        try:
            # a large request in chunks: each is one scorer call (batched with others), and the event loop
            # serves other requests between them
            for qs, ws, t in _split(body.queries, terms, wheres, svc.max_batch, lim.batch_terms):
                rows += await svc.batcher.search(key, fn, qs, body.k, ws, inline=inline, terms=t)
        except (WhereError, RecordError) as e:
            return field_error(["where"], str(e))
        for row in rows:
            for h in row:
                if not math.isfinite(h["score"]):
                    raise HTTPException(500, "internal error: a non-finite score")
        if body.min_score is not None:
            rows = [[h for h in row if h["score"] >= body.min_score] for row in rows]
        # written here, not by a JSONResponse: the size is checked, and every hit is not re-validated
        data = json.dumps({"results": [{"hits": row} for row in rows]}, ensure_ascii=False,
                          separators=(",", ":")).encode("utf-8")
        if len(data) > lim.max_response_bytes:
            return field_error(["k"], f"the answer would be {len(data):,} bytes, over the limit of "
                                       f"{lim.max_response_bytes:,} per reply: send fewer queries or a smaller k",
                                "limit_exceeded")
        return Response(data, media_type="application/json")

    @app.get("/v1/tenants/{tenant}/records/{id}", summary="One record of the tenant")
    async def get_record(id: str, tenant: str = Depends(authorize_read)) -> dict[str, Any]:
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
            raise write_failed(e) from None
        if not n:
            raise HTTPException(404, f"no record {id!r} in tenant {tenant!r}")
        return {"deleted": n}

    @app.get("/healthz", summary="Liveness (no key); counts with an operator key")
    async def healthz(request: Request) -> dict[str, Any]:
        # without an operator key: nothing that changes with any tenant's activity
        if not operator(request, required=False):
            return {"status": "ok"}
        st = svc.store
        out = {"status": "ok", "records": len(st.memory), "tenants": st.tenant_count(),
               "statistics": st.statistics, "wal_pending_records": st.pending_records, "checkpoints": st.checkpoints,
               "replayed_operations": st.replayed}
        if st.memory.sharded:  # each shard's records, node, process and device (gpuir.memory.protocol)
            shards = await asyncio.to_thread(shard_list, st.memory)
            out["shards"] = [{k: s[k] for k in ("shard", "records", "node", "pid", "device", "backend")}
                             for s in shards]
        return out

    @app.get("/metrics", summary="Prometheus metrics (text format; operator key)", response_class=Response)
    async def metrics(request: Request):
        operator(request)
        return Response(prom.generate_latest(svc.registry), media_type=prom.CONTENT_TYPE_LATEST)

    from .records_api import records_router

    app.include_router(records_router(svc, authorize, authorize_read))
    from .ui import ui_router

    app.include_router(ui_router(svc, authorize_read, key_owner))
    app.add_middleware(Measure, service=svc)
    app.add_middleware(BodyLimit, limit=int(max_body_bytes))
    return app


__all__ = ["Limits", "Service", "check_tenant", "create_app"]
