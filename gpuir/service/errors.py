"""The service's errors, tenant names and ids: what the store, its update path and the HTTP layer share.

Each error maps to one HTTP status (see each class); ids are kept internally as
``tenant/id`` (:func:`internal_id`) and shown to clients without the prefix
(:func:`external_hit`). Tenant names and ids are :mod:`gpuir.memory.scope`'s
(one rule for the service and a memory's scopes), re-exported here.
"""

from __future__ import annotations

import errno as _errno

from ..memory.scope import SEP, TENANT_RE, ScopeError, check_tenant, external_hit, internal_id
from ..storage.dirlock import os_error_message

__all__ = ["SEP", "TENANT_RE", "ConflictError", "NotFoundError", "StoreFailedError", "TenantError",
           "WriteFailedError", "check_tenant", "external_hit", "internal_id", "os_reason", "tenants_own"]


class TenantError(ScopeError):
    """A record or filter names another tenant than the request's (HTTP 403); the service's
    :class:`~gpuir.memory.scope.ScopeError`."""


class NotFoundError(KeyError):
    """An id naming no record of the tenant (HTTP 404)."""

    def __str__(self) -> str:  # KeyError's own str() is the repr of its message: quotes around it
        return str(self.args[0]) if self.args else ""


class ConflictError(ValueError):
    """An added id already exists in the tenant (HTTP 409)."""


class WriteFailedError(RuntimeError):
    """The log could not be written (full disk, I/O error): nothing of the request was stored (HTTP 507/503).

    Attributes
    ----------
    errno : the operating system's error number, or None
    """

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno

    @property
    def no_space(self) -> bool:
        return self.errno in (_errno.ENOSPC, _errno.EDQUOT)


class StoreFailedError(RuntimeError):
    """The store stopped accepting writes after an internal failure; restart the server (HTTP 503)."""


def tenants_own(e: Exception, tenant: str) -> Exception:
    """``e`` (a :class:`~gpuir.memory.RecordError`) naming the tenant's own ids, not the internal
    ``TENANT/ID`` ones; its ``loc`` (record and field) is kept."""
    from ..memory.records import RecordError

    return RecordError(str(e).replace(f"'{tenant}{SEP}", "'"), getattr(e, "loc", ()))


def os_reason(e: BaseException) -> str:
    """Why a write failed, in one line (an OSError's own words, else the exception's type and message)."""
    if isinstance(e, OSError):
        return os_error_message(e, "append to the log")
    return f"{type(e).__name__}: {e}"
