"""HTTP helpers the service's route modules share (:mod:`gpuir.service.app`, :mod:`gpuir.service.records_api`).

Bodies are read after authentication, strictly (:mod:`gpuir.service.body`); a
write that failed maps to 507 (disk full) or 503; a 422 carries FastAPI's
``detail`` list; a tenant key's ``where`` is confined to its tenant.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse, Response

from ..memory.scope import ScopeError, confine_where
from .body import parse_body
from .errors import TenantError, WriteFailedError

__all__ = ["detail_422", "field_error", "force_tenant", "openapi_body", "read_body", "write_failed"]


def write_failed(e: Exception) -> HTTPException:
    """507 when the disk is full (retry later: nothing was stored), 503 for another failure to write."""
    status = 507 if isinstance(e, WriteFailedError) and e.no_space else 503
    return HTTPException(status, str(e), headers={"Retry-After": "5"})


def field_error(loc: list[Any], msg: str, kind: str = "value_error") -> JSONResponse:
    return detail_422([{"loc": ["body", *loc], "msg": msg, "type": kind}])


def detail_422(detail: list[dict[str, Any]]) -> Response:
    # ensure_ascii: a message quoting a client's string can never fail to encode
    return Response(json.dumps({"detail": detail}, ensure_ascii=True, default=str).encode(), status_code=422,
                    media_type="application/json")


async def read_body(request: Request, model):
    """The request's body as ``model`` (strict JSON: :mod:`gpuir.service.body`), read after authentication."""
    return parse_body(await request.body(), request.headers.get("content-type"), model)


def openapi_body(model) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a route that reads its body itself (after the key check)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


def force_tenant(where: dict[str, Any] | None, tenant: str, loc: list[Any]) -> dict[str, Any]:
    """``where`` confined to ``tenant`` (:func:`gpuir.memory.scope.confine_where`: the rule a memory's scopes
    and the MCP server apply); :class:`TenantError` (403) when it names another tenant."""
    try:
        return confine_where(where, {"tenant": tenant}, ".".join(map(str, loc)))
    except ScopeError as e:
        raise TenantError(f"{e} (a key may search only its own tenant)") from None
