"""The one interface of a memory: what :class:`~gpuir.memory.Memory` and
:class:`~gpuir.cluster.ShardedMemory` both implement, and what their users (the
HTTP service, agents, benchmarks) may rely on.

:class:`MemoryAPI` is a :class:`typing.Protocol` (``runtime_checkable``: an
``isinstance`` check tests that the methods exist, not their signatures). Its
methods are the public API of ``Memory``; each class documents its own
guarantees (a sharded memory's searches equal one memory's, bit for bit). Pass
arguments after the first by keyword: the classes add their own extras
(``Memory.add(vectors=, seqs=)``, ``Memory.export(vectors=)``) in different
places.

The API tests run on both classes through this protocol
(``tests/test_memory_protocol.py``), so a feature of ``Memory`` missing from
the sharded memory fails there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["MemoryAPI", "SearchResults", "shard_list"]


@runtime_checkable
class SearchResults(Protocol):
    """What a search returns: ``seqs`` (B, k) int64 (-1 pads), ``scores`` (B, k) float32 (-inf pads), host
    arrays, best first; ``ids(i)`` and ``hits(i)`` (dicts with ``id``, ``score``, ``text`` and the record's
    fields, times in ISO 8601) of question ``i``; ``meta`` (a dict)."""

    seqs: Any
    scores: Any
    meta: dict[str, Any]

    def __len__(self) -> int: ...

    def ids(self, i: int) -> list[str]: ...

    def hits(self, i: int) -> list[dict[str, Any]]: ...


@runtime_checkable
class MemoryAPI(Protocol):
    """Records with text and metadata, searchable with exact BM25 (see the module docstring).

    Writes
        ``add`` (new ids; RecordError for an id that exists), ``update`` (merge into existing records;
        UnknownIdError for an unknown id), ``replace``, ``upsert``, ``delete`` (by ids: ``missing_ok``,
        ``keep_history``; or by ``where=``), ``reset`` (``confirm=True``: every record and kept history),
        ``purge_expired``, ``import_`` (an export file, all or none).
    Reads
        ``search`` (``ranking="hybrid"``: one ``Memory`` with an embedding only; a sharded memory
        raises ValueError saying why, ``gpuir.cluster.sharded.NO_HYBRID``), ``get``, ``list``, ``count``, ``history``, ``match_ids`` (what ``delete(where=)``
        would delete), ``seqs_of``, ``stored``, ``export``, ``len()``, ``in``, ``config()``, ``info()``.
    Scopes
        ``scope(tenant=, agent=, session=)``: a :class:`~gpuir.memory.scope.Scope` (the same class for
        both) confining every read and write, with ``delete_all``; ``require_scope`` (made with
        ``require_scope=True``: unscoped reads and writes of records raise ScopeError) and
        ``allow_unscoped``. A scope also takes the memory's ``_write_lock`` (re-entrant; every write
        takes it) to check then write in one step.
    Unknown ids
        ``get``, ``update``, ``replace`` and ``delete`` raise :class:`~gpuir.memory.UnknownIdError`
        naming every unknown id (``.ids``, in the order given; ``delete`` names each once), and change
        nothing, unless ``missing_ok=True`` where offered; ``history`` of an unknown id is ``[]``.
    Upkeep
        ``merge`` (segments merged on demand), ``save``, ``close`` (and ``with``).
    Kind
        ``sharded``: False for one ``Memory``, True for a ``ShardedMemory`` (whose ``info()`` then
        holds ``shard_list``; its records live in other processes, so engines that read a memory's
        segments directly, such as a ``Retriever``, need one ``Memory``).
    """

    sharded: bool

    def add(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int: ...

    def update(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None) -> int: ...

    def replace(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int: ...

    def upsert(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None) -> int: ...

    def delete(self, ids: Iterable[str] | None = None, missing_ok: bool = False, keep_history: bool = True,
               where: Any = None, time_unit: str | None = None) -> int: ...

    def reset(self, confirm: bool = False) -> int: ...

    def purge_expired(self) -> int: ...

    def import_(self, path: str | os.PathLike, vectors: dict | None = None, replace: bool = False,
                check_config: bool = True) -> int: ...

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, backend: str = "auto",
               mode: str = "exhaustive", max_partitions: int | None = None, epsilon: float | None = None,
               decay: float = 0.5, *, min_score: float | None = None, ties: str | None = None,
               order_by: str = "score", time_unit: str | None = None, ranking: str | None = None
               ) -> SearchResults: ...

    def get(self, ids: Iterable[str], missing_ok: bool = False) -> list[dict[str, Any] | None]: ...

    def list(self, where: Any = None, order_by: str = "seq", descending: bool = False, limit: int = 100,
             cursor: str | None = None, time_unit: str | None = None) -> Any: ...

    def count(self, where: Any = None, time_unit: str | None = None) -> int: ...

    def history(self, id: str) -> list[dict[str, Any]]: ...

    def match_ids(self, where: Any = None, time_unit: str | None = None) -> list[str]: ...

    def seqs_of(self, ids: Iterable[str]) -> list[int | None]: ...

    def stored(self, ids: list[str]) -> tuple[list[str], list[dict[str, Any]]]: ...

    def scope(self, tenant: str | None = None, agent: str | None = None, session: str | None = None) -> Any: ...

    @property
    def require_scope(self) -> bool: ...

    def allow_unscoped(self, allow: bool = True) -> None: ...

    def export(self, path: str | os.PathLike, where: Any = None, *, history: bool = True,
               time_unit: str | None = None) -> int: ...

    def merge(self, partition: Any = "all") -> int: ...

    def config(self) -> dict[str, Any]: ...

    def info(self) -> dict[str, Any]: ...

    def save(self) -> Path: ...

    def close(self) -> None: ...

    def __len__(self) -> int: ...

    def __contains__(self, rid: object) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


def shard_list(memory: MemoryAPI) -> list[dict[str, Any]] | None:
    """Each shard's description (``info()["shard_list"]``) of a sharded memory; None for one memory."""
    return memory.info()["shard_list"] if memory.sharded else None
