"""The memory inspector page (``/ui``) and the two read routes it needs beyond the records API.

::

    GET /ui                               -> the page (HTML; no key: it holds no data)
    GET /ui/static/{name}                 -> its script and style sheet (package data, gpuir/service/static/)
    GET /v1/tenants                       -> {"tenants": [{"tenant", "records"}]}   (operator key, --operator-reads)
    GET /v1/tenants/{tenant}/overview?bins=40&top_sessions=30
                                          -> records over time, per session, segments (gpuir.memory.overview)

The page is static: it signs in with a key the user types, keeps it in the
tab's ``sessionStorage`` only, and calls the same API routes with it in the
``Authorization`` header, so it sees exactly what that key may see (a tenant
key its own tenant; an operator key every tenant when the server runs with
``--operator-reads``). It writes every datum into the page with
``textContent`` (never as markup), and its Content-Security-Policy allows
only its own script and style sheet: no inline script, no other origin.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from ..memory.overview import overview
from .keys import OPERATOR

#: The page's assets: name -> media type (nothing else under /ui/static is served).
ASSETS = {"ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}
#: Headers of every /ui answer: only the page's own assets run; nothing frames it; no referrer leaves.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> bytes:
    return resources.files("gpuir.service").joinpath("static", name).read_bytes()


def ui_router(svc: Any, authorize_read: Any, key_owner: Any) -> APIRouter:
    """The page's routes over the service ``svc`` (``authorize_read``: the read routes' key check)."""
    r = APIRouter()
    cache: dict[str, bytes] = {}

    def asset(name: str) -> bytes:
        if name not in cache:
            cache[name] = _asset(name)
        return cache[name]

    @r.get("/ui", include_in_schema=False)
    async def page() -> Response:
        return Response(asset("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)

    @r.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)

    @r.get("/v1/tenants", summary="Every tenant with its live records (operator key, `--operator-reads`)")
    async def tenants(request: Request) -> dict[str, Any]:
        owner, _ = key_owner(request)
        if owner != OPERATOR:
            raise HTTPException(403, "listing tenants needs an operator key, not a tenant's key")
        if not svc.operator_reads:
            raise HTTPException(403, "an operator key lists tenants only when the server runs with "
                                     "`gpuir serve --operator-reads`")
        st = svc.store
        if getattr(st, "sharded", False):
            raise HTTPException(422, "tenants are not listed over a sharded memory")
        if st.statistics == "tenant":
            got = {t: len(m) for t, m in list(st.tenants.items()) if len(m)}
        else:
            got = dict(st.memory.info()["largest_tenants"])
            if len(got) < st.tenant_count():  # info names the 10 largest: count the others too
                names = [t for t in st.memory.snapshot().dicts["tenant"].values if t not in got]
                for t in names:
                    n = st.memory.count({"tenant": t})
                    if n:
                        got[t] = n
        return {"tenants": [{"tenant": t, "records": n} for t, n in sorted(got.items())]}

    @r.get("/v1/tenants/{tenant}/overview", summary="The tenant's records over time, per session, and segments")
    async def tenant_overview(tenant: str = Depends(authorize_read),
                              bins: int = Query(40, ge=1, le=1000, description="most spans of over_time"),
                              top_sessions: int = Query(30, ge=1, le=1000, description="most sessions listed")):
        st = svc.store
        if getattr(st, "sharded", False):
            raise HTTPException(422, "the overview is not available over a sharded memory")
        if st.statistics == "tenant":
            mem = st.tenants.get(tenant)
            if mem is None:
                mem = st._empty
            return await asyncio.to_thread(overview, mem, None, bins, top_sessions)
        return await asyncio.to_thread(overview, st.memory, tenant, bins, top_sessions)

    return r
