"""An MCP server over a gpuir memory, with the tools ``remember``, ``recall`` and ``forget``.

Run it on stdio (how agent hosts start MCP servers)::

    python -m gpuir.adapters.mcp_server MEMORY_DIR [--config RETRIEVER.json] [--tenant T]

``MEMORY_DIR`` is opened (or created when new or empty); every ``remember`` and
``forget`` is saved to it before the tool answers. ``--config`` searches with a
:class:`gpuir.Retriever` configuration instead of plain BM25. From Python,
:func:`build_server` wraps any memory backend (a ``Memory``, a ``Retriever``, or
``gpuir.service.client.MemoryClient``) and returns the
``mcp.server.mcpserver.MCPServer``.

Tools
-----
``remember(text, id=None, session=None, role=None, time=None, importance=None, metadata=None)``
    Store one record; returns ``{"added": 1, "id": ...}`` (a new id when none is given).
``recall(query, k=5, where=None)``
    The best ``k`` records: ``{"hits": [{"id", "score", "text", ...fields}]}``. With ``--tenant``, a
    ``where`` naming another tenant is a tool error (the service answers 403 to the same filter).
``forget(ids)``
    Delete records by id; returns ``{"deleted": n}`` (unknown ids are skipped).
``revise(id, text=None, session=None, role=None, time=None, importance=None, metadata=None)``
    Change a record, keeping the fields not given (metadata merged key by key, a null value removes
    a key); returns ``{"updated": 1, "id": ...}``.
``browse(where=None, limit=20, cursor=None, newest_first=True)``
    A page of records (newest first by default): ``{"records": [...], "cursor": ...}`` (pass the
    cursor back for the next page; null on the last).

Errors: a call the memory refuses (a bad record, an id that already exists, a
bad ``where``, a full disk, the service's 4xx/5xx) comes back to the agent as a
tool error carrying the memory's message (``is_error`` with the text), logged
at INFO without a traceback; only an unexpected failure (a bug) keeps MCP's
generic "Error executing tool" and logs its traceback.

Needs ``pip install 'gpuir[mcp]'`` (the official ``mcp`` package, 2.x).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from ..memory.stamps import uuid7
from . import LocalBackend, as_backend, require

__all__ = ["build_server", "main", "open_memory"]


def _expected_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean the call was refused (their message is for the agent), not a bug."""
    errs: list[type[BaseException]] = [ValueError, TypeError, LookupError, OSError]
    try:
        from ..service.client import ServiceError  # the service extra may be absent

        errs.append(ServiceError)
    except ImportError:
        pass
    return tuple(errs)


def _carry_errors(fn, tool_error: type[Exception]):
    """``fn`` with a refused call re-raised as MCP's ``ToolError``, whose message reaches the agent."""
    expected = _expected_errors()

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except expected as e:
            msg = " ".join(str(e).split()) or type(e).__name__
            raise tool_error(msg) from None

    return wrapped


def _is_duplicate(e: BaseException) -> bool:
    """Whether a backend's add refused an id that already exists (a Memory's DuplicateIdError, the
    service's 409)."""
    from ..memory.records import DuplicateIdError

    return isinstance(e, DuplicateIdError) or getattr(e, "status", None) == 409


def build_server(backend: Any, name: str = "gpuir-memory", tenant: str | None = None) -> Any:
    """An ``MCPServer`` with the tools ``remember``, ``recall`` and ``forget`` over ``backend``.

    Parameters
    ----------
    backend : gpuir.Memory, gpuir.Retriever or a MemoryBackend (e.g. MemoryClient)
    name : str
        The server's name, as MCP clients see it.
    tenant : str, optional
        Confine the server to one tenant: a local memory is used through its scope
        (``memory.scope(tenant=...)``, :mod:`gpuir.memory.scope`: records stored get
        this tenant, ids are the tenant's own, and every recall, browse, revise and
        forget reaches only its records); every tool's ``where`` naming another
        tenant is refused with a tool error (the service answers 403 to the same filter).
    """
    mcp_server = require("mcp.server.mcpserver", "mcp")
    tool_error = require("mcp.server.mcpserver.exceptions", "mcp").ToolError
    mem = as_backend(backend)
    scoped = False
    if tenant is not None:
        from ..memory.scope import check_tenant

        check_tenant(tenant)
        if isinstance(mem, LocalBackend) and not hasattr(mem.memory, "fields"):
            mem = LocalBackend(mem.memory.scope(tenant=tenant), mem.retriever, mem.autosave)
            scoped = True

    def confined(where: dict[str, Any] | None) -> dict[str, Any] | None:
        if tenant is None:
            return where
        from ..memory.scope import confine_where

        return confine_where(where, {"tenant": tenant})  # ScopeError (a tool error) for another tenant

    def tool():
        return lambda fn: server.tool()(_carry_errors(fn, tool_error))

    server = mcp_server.MCPServer(
        name,
        instructions="Long-term memory: remember stores a note, recall finds the most relevant ones, "
                     "forget deletes notes by id.",
    )

    @tool()
    def remember(text: str, id: str | None = None, session: str | None = None, role: str | None = None,
                 time: str | None = None, importance: float | None = None,
                 metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Store one memory record (text, and optional id, session, role, time, importance, metadata)."""
        rec: dict[str, Any] = {"id": id or uuid7(), "text": text}  # a new id: time-ordered, as Memory's
        for key, v in (("session", session), ("role", role), ("time", time), ("importance", importance),
                       ("metadata", metadata), ("tenant", tenant)):
            if v is not None:
                rec[key] = v
        try:
            return {"added": int(mem.add([rec])), "id": rec["id"]}
        except Exception as e:
            if _is_duplicate(e):  # the memory's message names its own method; the agent has a tool for it
                raise ValueError(f"the id {rec['id']!r} already exists, so nothing was stored: call the "
                                 "revise tool to change that record, or remember without an id to store a new "
                                 "one") from None
            raise

    @tool()
    def recall(query: str, k: int = 5, where: dict[str, Any] | None = None) -> dict[str, Any]:
        """The k memory records most relevant to the query, best first, optionally filtered by where."""
        return {"hits": mem.search([query], k=k, where=confined(where))[0]}

    @tool()
    def forget(ids: list[str]) -> dict[str, Any]:
        """Delete memory records by id; unknown ids are skipped."""
        return {"deleted": int(mem.delete(list(ids), missing_ok=True))}

    if callable(getattr(mem, "update", None)):
        @tool()
        def revise(id: str, text: str | None = None, session: str | None = None, role: str | None = None,
                   time: str | None = None, importance: float | None = None,
                   metadata: dict[str, Any] | None = None) -> dict[str, Any]:
            """Change a memory record, keeping the fields not given (metadata is merged key by key)."""
            rec: dict[str, Any] = {"id": id}
            for key, v in (("text", text), ("session", session), ("role", role), ("time", time),
                           ("importance", importance), ("metadata", metadata)):
                if v is not None:
                    rec[key] = v
            if tenant is not None and not scoped:  # (a scope refuses another tenant's id itself)
                got = mem.list(where={"tenant": tenant, "id": id}, limit=1).records
                if not got:
                    raise ValueError(f"no record {id!r} in tenant {tenant!r}")
            return {"updated": int(mem.update([rec])), "id": id}

    if callable(getattr(mem, "list", None)):
        @tool()
        def browse(where: dict[str, Any] | None = None, limit: int = 20, cursor: str | None = None,
                   newest_first: bool = True) -> dict[str, Any]:
            """A page of memory records (newest first by default), optionally filtered by where."""
            page = mem.list(where=confined(where), limit=limit, cursor=cursor, order_by="time", descending=newest_first)
            return {"records": page.records, "cursor": page.cursor}

    return server


def open_memory(path: str | Path) -> Any:
    """The memory in directory ``path``: opened when it holds one, created (and saved there) when new or empty."""
    from ..memory import Memory

    p = Path(path)
    if p.is_dir() and any(p.iterdir()):
        return Memory.open(p)
    mem = Memory()
    mem.save(p)
    return mem


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuir.adapters.mcp_server MEMORY_DIR``: serve the memory over MCP on stdio."""
    from ..cli_common import ArgumentParser, cli_logging, verbosity

    ap = ArgumentParser(prog="python -m gpuir.adapters.mcp_server", top=True,
                        description="Serve a gpuir memory over MCP (stdio) with remember/recall/forget.")
    ap.add_argument("memory_dir", metavar="MEMORY_DIR", help="memory directory (created when new or empty)")
    ap.add_argument("--config", default=None, help="a Retriever configuration JSON (default: plain BM25)")
    ap.add_argument("--tenant", default=None, help="confine the server to this tenant (default: none)")
    ap.add_argument("--name", default="gpuir-memory", help="server name (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        require("mcp.server.mcpserver", "mcp")
        mem = open_memory(args.memory_dir)
        backend: Any = mem
        if args.config:
            from ..retrieve import Retriever

            backend = Retriever.from_config(mem, args.config)
    except (ImportError, OSError, ValueError) as e:
        print(f"gpuir mcp server: {e}", file=sys.stderr)
        return 2
    try:
        with cli_logging(verbosity(args), prog="gpuir mcp server"):
            build_server(backend, name=args.name, tenant=args.tenant).run("stdio")
    finally:
        mem.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
