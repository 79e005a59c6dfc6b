"""Agent-framework adapters over a gpuir memory: LangChain, LlamaIndex, MCP.

Each adapter wraps a **memory backend**: anything with

* ``search(queries, k=10, where=None) -> list[list[dict]]`` -- per query, hits
  best first, each a dict with ``"id"``, ``"score"``, ``"text"`` and the
  record's other fields (``session``, ``time``, ``metadata``, ...);
* ``add(records) -> int`` and ``delete(ids) -> int``;

and, where the backend has them (a local memory and the service client do),
``update(records) -> int`` (each an ``id`` and the fields to change, merged as
:meth:`gpuir.Memory.update` merges), ``list(where=None, limit=100,
cursor=None) -> Page`` and ``count(where=None) -> int``.

:func:`as_backend` gives that interface to a local :class:`gpuir.Memory` or
:class:`gpuir.Retriever`; the service client
(``gpuir.service.client.MemoryClient``) already has it and is used as is.

The frameworks are optional extras, imported only when an adapter is built:
``pip install 'gpuir[langchain]'``, ``'gpuir[llamaindex]'``, ``'gpuir[mcp]'``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..results import HitLists

__all__ = ["LocalBackend", "MemoryBackend", "as_backend", "hit_metadata", "require"]


@runtime_checkable
class MemoryBackend(Protocol):
    """What every adapter calls (see the module docstring)."""

    def search(self, queries: Sequence[str], k: int = 10, where: Any = None) -> list[list[dict[str, Any]]]: ...

    def add(self, records: Iterable[Mapping[str, Any]]) -> int: ...

    def delete(self, ids: Iterable[str]) -> int: ...


def require(module: str, extra: str) -> Any:
    """Import ``module`` of an optional framework, or raise ImportError naming ``pip install 'gpuir[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"this adapter needs {module.split('.')[0]}, which is not installed: pip install 'gpuir[{extra}]' ({e})"
        ) from e


class LocalBackend:
    """A :class:`gpuir.Memory` (or a scope of one, :mod:`gpuir.memory.scope`) or :class:`gpuir.Retriever`
    as a :class:`MemoryBackend`.

    ``add`` and ``delete`` change the memory and, when it has a directory
    (opened from or saved to one), save it before returning, so an
    acknowledged change is on disk.
    """

    def __init__(self, memory: Any, retriever: Any = None, autosave: bool = True):
        self.memory = memory
        self.retriever = retriever
        self.autosave = autosave

    def search(self, queries: Sequence[str], k: int = 10, where: Any = None) -> HitLists:
        qs = [queries] if isinstance(queries, str) else list(queries)
        if not qs:
            return HitLists()
        scope = self.memory if self.retriever is not None and hasattr(self.memory, "fields") else None
        if scope is not None:  # a scope's retriever searches the whole memory: confine it here
            where = scope._wheres(where)
        res = (self.retriever or self.memory).search(qs, k=k, where=where)
        if scope is not None:
            return HitLists([scope._external_hit(h) for h in res.hits(i)] for i in range(len(res)))
        return HitLists(res.hits(i) for i in range(len(res)))

    def _saved(self, n: int) -> int:
        if self.autosave and self.memory.path is not None:
            self.memory.save()
        return n

    def add(self, records: Iterable[Mapping[str, Any]]) -> int:
        return self._saved(self.memory.add(list(records)))

    def delete(self, ids: Iterable[str], missing_ok: bool = True) -> int:
        return self._saved(self.memory.delete(list(ids), missing_ok=missing_ok))

    def update(self, records: Iterable[Mapping[str, Any]], replace: bool = False) -> int:
        return self._saved(self.memory.update(list(records), replace=replace))

    def list(self, where: Any = None, limit: int = 100, cursor: str | None = None, order_by: str = "seq",
             descending: bool = False) -> Any:
        return self.memory.list(where=where, order_by=order_by, descending=descending, limit=limit, cursor=cursor)

    def count(self, where: Any = None) -> int:
        return self.memory.count(where=where)


def as_backend(obj: Any, autosave: bool = True) -> MemoryBackend:
    """The :class:`MemoryBackend` of ``obj``: a Memory, a Retriever, or an object that already is one.

    Parameters
    ----------
    obj : gpuir.Memory, gpuir.Retriever, or an object with search/add/delete
        (e.g. ``gpuir.service.client.MemoryClient``), used as is.
    autosave : bool
        Local memories with a directory: save after every add/delete.

    Raises
    ------
    TypeError
        ``obj`` is none of these (the message says what is needed).
    """
    from ..memory import Memory, Scope
    from ..retrieve import Retriever

    if isinstance(obj, Retriever):
        return LocalBackend(obj.memory, obj, autosave)
    if isinstance(obj, (Memory, Scope)):
        return LocalBackend(obj, None, autosave)
    if all(callable(getattr(obj, m, None)) for m in ("search", "add", "delete")):
        return obj
    raise TypeError(
        f"a memory backend must be a gpuir.Memory, a gpuir.Retriever, or have search(queries, k, where), "
        f"add(records) and delete(ids) (like gpuir.service.client.MemoryClient); got {type(obj).__name__}"
    )


def hit_metadata(hit: Mapping[str, Any]) -> dict[str, Any]:
    """A hit's fields for a framework's metadata: everything but ``text``, ``metadata`` flattened in.

    The record's own ``metadata`` dict is merged at the top level (its keys do
    not override ``id``, ``score`` or the record fields), so frameworks that
    expect flat string-keyed metadata can filter on it.
    """
    out = {key: v for key, v in hit.items() if key not in ("text", "metadata")}
    meta = hit.get("metadata")
    if isinstance(meta, Mapping):
        for key, v in meta.items():
            out.setdefault(str(key), v)
    return out
