"""Deletes at scale: by filter, a scope's every record, and a guarded reset; all through the delete of ids.

:meth:`Memory.delete(where=...) <gpuir.memory.Memory.delete>` resolves the
filter to the ids of the live records passing it (the writer's current
snapshot, under the writer's lock, so no write slips between the two) and
deletes them through the same path as ``Memory.delete(ids)``: a bulk delete is
an ordinary delete of ids (one call), in the memory, in its history and in any
log of its writes. :meth:`Scope.delete_all <gpuir.memory.scope.Scope.delete_all>`
is ``delete(where=)`` of the scope's own filter; :meth:`Memory.reset
<gpuir.memory.Memory.reset>` (``confirm=True`` required) deletes every live id
the same way, then forgets the histories kept after earlier deletes.

An empty ``where`` (``{}``) is refused: deleting everything is ``reset``'s job,
which asks for confirmation. Expired records are purged by the delete itself
(every write purges them first).

**Unknown ids, everywhere the same.** ``Memory.delete(ids)`` raises
:class:`~gpuir.memory.UnknownIdError` naming every id that names no live record
(nothing is deleted) unless ``missing_ok=True``; the scopes, the HTTP service
(``DELETE`` of one id: 404; ``POST .../delete`` with ``ids``: 404 naming them
unless ``"missing_ok": true``) and both service clients (``delete`` raises
``UnknownIdError`` unless ``missing_ok=True``) do the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .expiry import cutoff
from .listing import ids_matching
from .where import WhereError, compile_wheres

Memory = Any  # gpuir.memory.Memory (not imported: the store imports this module)

__all__ = ["check_delete_where", "check_reset", "delete_where", "reset"]


def check_delete_where(ids: Iterable[str] | None, where: Any) -> dict[str, Any]:
    """The refusals of a delete by ``where`` (``ids`` must be None), the same for every memory class
    (:class:`~gpuir.cluster.ShardedMemory` calls it too); returns ``where``.

    Raises
    ------
    TypeError
        Both ids and ``where``, or neither.
    WhereError
        ``where`` is not a dict, or is empty (that is :meth:`Memory.reset <gpuir.memory.Memory.reset>`'s job).
    """
    if ids is not None:
        raise TypeError("delete: give ids or where=, not both")
    if where is None:
        raise TypeError("delete: give the ids to delete, or where= (a filter); reset(confirm=True) deletes "
                        "every record")
    if not isinstance(where, dict):
        raise WhereError(f"delete: where must be a dict of conditions (a JSON object), got {type(where).__name__}")
    if not where:
        raise WhereError("delete: where={} would delete every record; call reset(confirm=True) for that")
    return where


def check_reset(confirm: Any) -> None:
    """A reset's guard: ValueError unless ``confirm`` is True (the same for every memory class)."""
    if confirm is not True:
        raise ValueError("reset deletes every record of the memory: call reset(confirm=True) to do it")


def delete_where(mem: Memory, ids: Iterable[str] | None, where: Any, keep_history: bool,
                 time_unit: str | None) -> int:
    """:meth:`Memory.delete` given ``where`` (``ids`` must be None): the ids passing it, deleted as ids."""
    check_delete_where(ids, where)
    with mem._write_lock:
        mem._writer._check_writable()
        snap = mem.snapshot()
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        found = ids_matching(snap, w)
        if not found:
            return 0
        return mem.delete(found, missing_ok=True, keep_history=keep_history)


def reset(mem: Memory, confirm: bool) -> int:
    """:meth:`Memory.reset`: delete every live id (one delete call), then forget every kept history."""
    check_reset(confirm)
    from .scope import inside_scope

    with mem._write_lock, inside_scope():  # a reset is of the whole memory (require_scope lets it through)
        mem._writer._check_writable()
        found = ids_matching(mem.snapshot(), None)
        n = mem.delete(found, missing_ok=True) if found else 0
        mem._writer._history.drop(mem._writer._history.ids())
        return n
