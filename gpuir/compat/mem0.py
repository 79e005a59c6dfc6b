"""mem0's face over gpuir: ``Memory`` and ``AsyncMemory`` with mem0's method names, arguments and return shapes.

Code written against mem0 (``from mem0 import Memory``) runs on gpuir by changing
the import::

    from gpuir.compat.mem0 import Memory

    m = Memory()                                    # hybrid: BM25 + all-MiniLM-L6-v2, no torch
    m.add("I moved to Berlin last year", user_id="alice")
    m.search("where does Alice live?", filters={"user_id": "alice"})["results"]

What maps to what (docs/from-mem0.md has the whole table):

* a message (``str``, ``{"role", "content"[, "name"]}`` or a list of them) is one
  gpuir record, stored as given: ``infer=False`` is the only mode (gpuir runs no
  LLM; ``infer=True`` raises :class:`InferNotSupported`). System messages are
  skipped, as mem0 skips them with ``infer=False``.
* ``user_id`` -> the record's ``tenant`` (a hard boundary: a search names one user
  or none), ``agent_id`` -> ``agent``, ``run_id`` -> ``session``, the message's
  role -> ``role``, its ``name`` -> ``metadata.actor_id``, ``metadata`` ->
  ``metadata``.
* ``created_at`` / ``updated_at``: the record times the memory keeps itself
  (``gpuir.Memory``'s default, ``record_times=True``: :mod:`gpuir.memory.stamps`),
  and filters on them are filters on those times. ``updated_at`` is None until
  the memory is changed, as mem0's (a record whose ``updated_at`` equals its
  ``created_at`` was never changed). A memory made with ``record_times=False``
  (or saved before times were the default) keeps the older mapping: created_at ->
  the record's ``time`` (written on add), ``updated_at`` kept in the metadata
  under :data:`UPDATED_KEY` (hidden from what mem0's calls return).
* ids are generated (UUID4 strings, as mem0's).
* search: the default memory stores a MiniLM vector per record on add and ranks by
  the hybrid ranking of :class:`gpuir.Memory` itself (``Memory(ranking="hybrid")``,
  :mod:`gpuir.memory.hybrid`: the same code path and the same settings, chosen held
  out on LoCoMo); ``hybrid=False`` keeps BM25 alone. A result's ``score`` is the
  hybrid's calibrated relevance, a probability from 0 to 1 that the memory is one
  the question needs (or its BM25 score with ``hybrid=False``), and ``threshold``
  drops results scoring below it -- on the relevance scale, ``threshold=0.5``: at
  least as likely relevant as not. The default is no threshold (mem0's default 0.1
  is a cosine, which drops almost nothing; a relevance of 0.1 would drop most hits
  of a large memory).
* filters: mem0's words, translated to :mod:`gpuir.memory.where` (:func:`translate_filters`):
  ``AND`` / ``OR`` / ``NOT`` (a list: none of them holds), ``eq ne gt gte lt lte
  in nin contains icontains``, ``"*"`` (the field is present). ``user_id`` names
  one user; ``"*"`` or a list of users is refused with the fix.
* history: ADD / UPDATE / DELETE events, mem0's dict shape, kept by this object
  (in memory, for the life of the process).

Not yet in :class:`gpuir.Memory` itself, so done here (issue 37): generated ids,
``delete_all`` by scope, ``reset``, the event history (mem0's shape).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..memory import Memory as CoreMemory
from ..memory.hybrid import DEFAULT_EMBEDDING
from ..memory.where import WhereError

__all__ = ["UPDATED_KEY", "AsyncMemory", "InferNotSupported", "Memory", "translate_filters"]

log = logging.getLogger(__name__)  # gpuir.compat.mem0

#: Metadata key holding a record's last update time (ISO 8601), hidden from results.
UPDATED_KEY = "_mem0_updated_at"
_ENTITY = {"user_id": "tenant", "agent_id": "agent", "run_id": "session"}
_FIELD_OF_KEY = {"role": "role", "memory": "text", "data": "text", "created_at": "time"}
#: ... over a memory that keeps record times (``gpuir.Memory(record_times=True)``, the default).
_FIELD_OF_KEY_TIMES = {**_FIELD_OF_KEY, "created_at": "created_at", "updated_at": "updated_at"}
_OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains")


class InferNotSupported(ValueError):
    """``infer=True``: gpuir stores what it is given and runs no LLM."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _check_id(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{name} must be a non-empty string, got {v!r}")
    return v.strip()


def _cond(key: str, value: Any, what: str, times: bool = False) -> dict[str, Any]:
    """One mem0 condition ``key: value`` as a gpuir clause (``times``: the memory keeps record times)."""
    fields = _FIELD_OF_KEY_TIMES if times else _FIELD_OF_KEY
    if key in _ENTITY:
        field = _ENTITY[key]
    elif key in fields:
        field = fields[key]
    else:
        field = "metadata." + key
    if field == "tenant":
        if value == "*" or not isinstance(value, str) and not (
                isinstance(value, Mapping) and set(value) == {"eq"} and isinstance(value["eq"], str)):
            raise WhereError(f"{what}: user_id names one user (gpuir keeps users apart: tenant is a hard boundary); "
                             f"got {value!r}. Search users one at a time, or filter on agent_id / run_id alone")
        return {"tenant": value if isinstance(value, str) else value["eq"]}
    if isinstance(value, str) and value == "*":
        return {field: {"exists": True}}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for op, x in value.items():
            if op not in _OPS:
                raise WhereError(f"{what}[{key!r}]: unknown operator {op!r}; mem0's are {', '.join(_OPS)}")
            out[op] = x
        return {field: out}
    return {field: {"eq": value}}


def translate_filters(filters: Mapping[str, Any] | None, what: str = "filters",
                      times: bool = False) -> dict[str, Any] | None:
    """mem0's filter dict as a :mod:`gpuir.memory.where` filter.

    Parameters
    ----------
    filters : dict or None
        ``{"user_id": "u", "category": {"in": [...]}, "OR": [...], ...}`` as mem0 takes them.
    times : bool
        The memory keeps record times (``gpuir.Memory(record_times=True)``, the default): ``created_at``
        and ``updated_at`` filter on them. False: ``created_at`` filters on the record's ``time``.

    Returns
    -------
    dict or None

    Raises
    ------
    WhereError (a ValueError)
        Anything mem0 would not take or gpuir cannot honour, naming the fix.
    """
    if filters is None:
        return None
    if not isinstance(filters, Mapping):
        raise WhereError(f"{what} must be a dict, got {type(filters).__name__}")
    parts: list[dict[str, Any]] = []
    tenant: dict[str, Any] = {}
    for key, value in filters.items():
        if key in ("AND", "OR", "NOT", "$and", "$or", "$not"):
            name = key.lstrip("$").upper()
            if name == "NOT" and isinstance(value, Mapping):
                value = [value]
            if not isinstance(value, (list, tuple)) or not value:
                raise WhereError(f"{what}: {key} takes a non-empty list of filters (dicts)")
            kids = [translate_filters(v, f"{what}.{key}[{i}]", times) for i, v in enumerate(value)]
            kids = [k for k in kids if k]
            if not kids:
                continue
            if name == "AND":
                parts.extend(kids)
            elif name == "OR":
                parts.append({"$or": kids})
            else:  # NOT [a, b]: none of them holds
                parts.append({"$not": kids[0] if len(kids) == 1 else {"$or": kids}})
        else:
            c = _cond(str(key), value, what, times)
            if "tenant" in c:
                tenant = c
            else:
                parts.append(c)
    out: dict[str, Any] = dict(tenant)
    if len(parts) == 1 and not (set(parts[0]) & set(out)):
        out.update(parts[0])
    elif parts:
        out["$and"] = parts
    return out


def _messages(messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if isinstance(messages, Mapping):
        return [dict(messages)]
    if isinstance(messages, Sequence):
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") is None or m.get("content") is None:
                raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
            out.append(dict(m))
        return out
    raise TypeError(f"messages must be a str, a dict or a list of dicts, got {type(messages).__name__}")


class Memory:
    """mem0's ``Memory`` on a :class:`gpuir.Memory`.

    Parameters
    ----------
    memory : gpuir.Memory, optional
        The memory to serve (default: a new one in RAM, or the one at ``path``).
    path : str or Path, optional
        A folder: opened when it holds a memory, else created there; every write
        call saves it before returning.
    hybrid : bool, default True
        Store a MiniLM vector per record on add and search with the memory's hybrid
        ranking (``gpuir.Memory.search(ranking="hybrid")``: one fusion, one set of
        settings, for every object); False: BM25 alone, no encoder loaded.
    encoder : object, optional
        The embedding's encoder (default :class:`gpuir.dense.encoder.Encoder`, the
        torch-free all-MiniLM-L6-v2; the relevance is calibrated for that one).
    """

    def __init__(self, memory: CoreMemory | None = None, *, path: str | Path | None = None, hybrid: bool = True,
                 encoder: Any = None):
        self.hybrid = bool(hybrid)
        self._path = Path(path) if path is not None else None
        emb = None
        if self.hybrid and memory is None:
            if encoder is None:
                from ..dense.encoder import Encoder

                encoder = Encoder(cache=False)  # the memory keeps the vectors: no second copy in the cache
            emb = {DEFAULT_EMBEDDING: encoder}
        if memory is None:
            if self._path is not None and self._path.is_dir() and any(self._path.iterdir()):
                memory = CoreMemory.open(self._path, embeddings=emb)
            else:
                memory = CoreMemory(embeddings=emb, ranking="hybrid" if self.hybrid else "bm25")
                if self._path is not None:
                    memory.save(self._path)
        elif self.hybrid and not memory.embeddings:
            raise ValueError("hybrid=True needs a memory with an embedding: give gpuir.Memory(embeddings="
                             "{'minilm': Encoder()}), or hybrid=False")
        self.memory = memory
        #: The memory keeps record times (created_at / updated_at come from them); else the older mapping.
        self._times = getattr(memory, "stamp", "id") == "add"
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.RLock()

    @classmethod
    def from_config(cls, config_dict: Mapping[str, Any] | None = None) -> Memory:
        """mem0's ``Memory.from_config``: ``vector_store.config.path`` becomes ``path``; an ``llm``
        section is ignored (nothing here calls an LLM); the embedder is gpuir's MiniLM."""
        cfg = dict(config_dict or {})
        path = ((cfg.get("vector_store") or {}).get("config") or {}).get("path")
        return cls(path=path)

    # ------------------------------------------------------------------ helpers
    def _saved(self) -> None:
        if self._path is not None:
            self.memory.save()

    def _event(self, memory_id: str, old: str | None, new: str | None, event: str, rec: Mapping[str, Any]) -> None:
        now = _now()
        self._events.setdefault(memory_id, []).append({
            "id": str(uuid.uuid4()), "memory_id": memory_id, "old_memory": old, "new_memory": new, "event": event,
            "created_at": now, "updated_at": now, "is_deleted": event == "DELETE",
            "actor_id": (rec.get("metadata") or {}).get("actor_id"), "role": rec.get("role"),
        })

    @staticmethod
    def _item(rec: Mapping[str, Any], score: float | None = None) -> dict[str, Any]:
        """A gpuir record as mem0's MemoryItem dict."""
        meta = dict(rec.get("metadata") or {})
        updated = meta.pop(UPDATED_KEY, None)  # (a memory without record times)
        created = rec.get("created_at")
        if created is None:  # a memory without record times: created_at is the time written on add
            created = rec.get("time")
        elif rec.get("updated_at") != created:  # the record's own times; None until changed, as mem0's
            updated = rec.get("updated_at")
        actor = meta.pop("actor_id", None)
        text = rec.get("text", "")
        out: dict[str, Any] = {
            "id": rec["id"], "memory": text, "hash": hashlib.md5(text.encode("utf-8")).hexdigest(),
            "metadata": meta or None, "score": score, "created_at": created, "updated_at": updated,
        }
        for key, fld in _ENTITY.items():
            if rec.get(fld) is not None:
                out[key] = rec[fld]
        if actor is not None:
            out["actor_id"] = actor
        if rec.get("role") is not None:
            out["role"] = rec["role"]
        return out

    @staticmethod
    def _scope(user_id: Any, agent_id: Any, run_id: Any, what: str, need: bool = True) -> dict[str, str]:
        ids = {"user_id": _check_id("user_id", user_id), "agent_id": _check_id("agent_id", agent_id),
               "run_id": _check_id("run_id", run_id)}
        ids = {k: v for k, v in ids.items() if v is not None}
        if need and not ids:
            raise ValueError(f"{what} needs at least one of user_id, agent_id, run_id")
        return ids

    def _where(self, filters: Mapping[str, Any] | None, scope: Mapping[str, str], what: str) -> dict[str, Any]:
        merged = dict(filters or {})
        for k, v in scope.items():
            if k in merged and merged[k] != v:
                raise ValueError(f"{what}: {k} given twice with different values ({v!r} and {merged[k]!r})")
            merged[k] = v
        if not any(k in merged for k in _ENTITY):
            raise ValueError(f"{what}: filters must contain at least one of user_id, agent_id, run_id, "
                             "e.g. filters={'user_id': 'u1'}")
        return translate_filters(merged, "filters", self._times) or {}

    # ------------------------------------------------------------------ mem0's calls
    def add(self, messages: Any, *, user_id: str | None = None, agent_id: str | None = None,
            run_id: str | None = None, metadata: Mapping[str, Any] | None = None, infer: bool = False,
            memory_type: str | None = None, prompt: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Store each message as a memory, as given.

        Returns
        -------
        dict: ``{"results": [{"id", "memory", "event": "ADD", "actor_id", "role"}, ...]}``

        Raises
        ------
        InferNotSupported
            ``infer=True`` (gpuir runs no LLM to extract facts: it stores what it is given).
        ValueError
            No user_id / agent_id / run_id, malformed messages or metadata.
        """
        if infer:
            raise InferNotSupported(
                "infer=True asks for an LLM to extract and merge facts; gpuir stores what it is given and runs no "
                "LLM. Pass infer=False (each message becomes one memory), or extract facts yourself and add them")
        if memory_type is not None or prompt is not None:
            raise ValueError("memory_type and prompt belong to mem0's LLM extraction, which gpuir does not run")
        if kwargs:
            raise TypeError(f"add() got unexpected arguments {sorted(kwargs)}")
        scope = self._scope(user_id, agent_id, run_id, "add")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        now = _now()
        recs, out = [], []
        for msg in _messages(messages):
            role = msg["role"]
            if role == "system":
                continue
            meta = dict(metadata or {})
            name = msg.get("name")
            if name:
                meta["actor_id"] = name
            rec = {"id": str(uuid.uuid4()), "text": str(msg["content"]), "role": role, "time": now,
                   **{_ENTITY[k]: v for k, v in scope.items()}}
            if meta:
                rec["metadata"] = meta
            recs.append(rec)
            out.append({"id": rec["id"], "memory": rec["text"], "event": "ADD", "actor_id": name or None,
                        "role": role})
        with self._lock:
            if recs:
                self.memory.add(recs)
                for r in recs:
                    self._event(r["id"], None, r["text"], "ADD", r)
                self._saved()
        return {"results": out}

    def search(self, query: str, *, top_k: int = 20, filters: Mapping[str, Any] | None = None,
               threshold: float | None = None, limit: int | None = None, user_id: str | None = None,
               agent_id: str | None = None, run_id: str | None = None, rerank: bool = False,
               **kwargs: Any) -> dict[str, Any]:
        """The memories best matching ``query`` within the scope.

        Parameters
        ----------
        query : str
        top_k : int, default 20
            (``limit``, mem0's older name, wins when given.)
        filters : dict, optional
            mem0's filters (:func:`translate_filters`); with ``user_id`` / ``agent_id`` /
            ``run_id`` (here or as arguments, as older mem0 took them) at least one.
        threshold : float or None, default None
            Drop results whose ``score`` is below it: a relevance between 0 and 1 (hybrid), or a
            BM25 score (``hybrid=False``). None keeps every result.

        Returns
        -------
        dict: ``{"results": [MemoryItem dicts with "score"], ...}``, best first.
        """
        if kwargs:
            raise TypeError(f"search() got unexpected arguments {sorted(kwargs)}")
        if rerank:
            raise ValueError("rerank=True needs a reranker model; gpuir's face has none")
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        k = int(limit if limit is not None else top_k)
        if k < 1:
            raise ValueError(f"top_k must be a positive integer, got {k}")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
            raise TypeError(f"threshold must be a number or None, got {threshold!r}")
        if threshold is not None and self.hybrid and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold is a relevance between 0 and 1 (the hybrid score), got {threshold!r}")
        where = self._where(filters, self._scope(user_id, agent_id, run_id, "search", need=False), "search")
        # the memory's own ranking: Memory.search(ranking="hybrid") is the one hybrid search of gpuir
        res = self.memory.search(query, k=k, where=where, ranking="hybrid" if self.hybrid else "bm25",
                                 min_score=None if threshold is None else float(threshold))
        return {"results": [self._item(h, float(h["score"])) for h in res.hits(0)]}  # hits: public records

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """The memory ``memory_id`` as mem0's MemoryItem dict, or None."""
        got = self.memory.get([memory_id], missing_ok=True)[0]
        return None if got is None else self._item(_public(got))

    def get_all(self, *, filters: Mapping[str, Any] | None = None, top_k: int = 100, limit: int | None = None,
                user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
                **kwargs: Any) -> dict[str, Any]:
        """Memories within the scope, oldest first: ``{"results": [MemoryItem dicts]}``."""
        if kwargs:
            raise TypeError(f"get_all() got unexpected arguments {sorted(kwargs)}")
        n = int(limit if limit is not None else top_k)
        if n < 1:
            raise ValueError(f"top_k must be a positive integer, got {n}")
        where = self._where(filters, self._scope(user_id, agent_id, run_id, "get_all", need=False), "get_all")
        page = self.memory.list(where=where, limit=n)
        return {"results": [self._item(r) for r in page.records]}

    def update(self, memory_id: str, data: str | None = None, *, text: str | None = None,
               metadata: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Change a memory's text (``data`` or ``text``) and/or merge ``metadata`` into its metadata."""
        text = text if text is not None else data
        if text is None and metadata is None:
            raise ValueError("update needs text (data) or metadata")
        with self._lock:
            old = self.memory.get([memory_id], missing_ok=True)[0]
            if old is None:
                raise ValueError(f"Memory with id {memory_id} not found")
            meta = {k: v for k, v in dict(metadata or {}).items() if k not in _ENTITY}
            if not self._times:  # (else the memory moves the record's updated_at itself)
                meta[UPDATED_KEY] = _now()
            rec: dict[str, Any] = {"id": memory_id, "metadata": meta}
            if text is not None:
                rec["text"] = str(text)
            self.memory.update([rec])
            self._event(memory_id, old["text"], rec.get("text", old["text"]), "UPDATE", old)
            self._saved()
        return {"message": "Memory updated successfully!"}

    def delete(self, memory_id: str) -> dict[str, str]:
        """Delete one memory (ValueError when there is none of that id)."""
        with self._lock:
            old = self.memory.get([memory_id], missing_ok=True)[0]
            if old is None:
                raise ValueError(f"Memory with id {memory_id} not found")
            self.memory.delete([memory_id])
            self._event(memory_id, old["text"], None, "DELETE", old)
            self._saved()
        return {"message": "Memory deleted successfully!"}

    def delete_all(self, user_id: str | None = None, agent_id: str | None = None,
                   run_id: str | None = None) -> dict[str, str]:
        """Delete every memory of the scope (at least one of user_id, agent_id, run_id; :meth:`reset` for all)."""
        scope = self._scope(user_id, agent_id, run_id, "delete_all (reset() deletes every memory)")
        with self._lock:
            self._delete_where(translate_filters(scope, times=self._times))
            self._saved()
        return {"message": "Memories deleted successfully!"}

    def _delete_where(self, where: dict[str, Any] | None) -> int:
        n = 0
        while True:
            page = self.memory.list(where=where, limit=1000)
            if not page.records:
                return n
            ids = [r["id"] for r in page.records]
            for r in page.records:
                self._event(r["id"], r["text"], None, "DELETE", r)
            self.memory.delete(ids, missing_ok=True)
            n += len(ids)

    def history(self, memory_id: str) -> list[dict[str, Any]]:
        """The memory's ADD / UPDATE / DELETE events, oldest first (mem0's history dicts)."""
        return [dict(e) for e in self._events.get(memory_id, [])]

    def reset(self) -> None:
        """Delete every memory and the history."""
        with self._lock:
            self._delete_where(None)
            self._events.clear()
            self._saved()

    def close(self) -> None:
        """Save (when the memory has a path) and release it."""
        if self._path is not None:
            self.memory.close()

    def __enter__(self) -> Memory:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"gpuir.compat.mem0.Memory(hybrid={self.hybrid}, records={self.memory.len()})"


def _public(rec: Mapping[str, Any]) -> dict[str, Any]:
    from ..memory.timeutil import public_record

    return public_record(dict(rec))


class AsyncMemory:
    """mem0's ``AsyncMemory``: :class:`Memory`'s calls as coroutines (each runs in a worker thread).

    Takes :class:`Memory`'s arguments.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self.sync = kwargs.pop("sync", None) or Memory(*args, **kwargs)

    @classmethod
    def from_config(cls, config_dict: Mapping[str, Any] | None = None) -> AsyncMemory:
        return cls(sync=Memory.from_config(config_dict))

    async def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.sync, name), *args, **kwargs)

    async def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        return await self._run("add", messages, **kwargs)

    async def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        return await self._run("search", query, **kwargs)

    async def get(self, memory_id: str) -> dict[str, Any] | None:
        return await self._run("get", memory_id)

    async def get_all(self, **kwargs: Any) -> dict[str, Any]:
        return await self._run("get_all", **kwargs)

    async def update(self, memory_id: str, data: str | None = None, **kwargs: Any) -> dict[str, str]:
        return await self._run("update", memory_id, data, **kwargs)

    async def delete(self, memory_id: str) -> dict[str, str]:
        return await self._run("delete", memory_id)

    async def delete_all(self, user_id: str | None = None, agent_id: str | None = None,
                         run_id: str | None = None) -> dict[str, str]:
        return await self._run("delete_all", user_id, agent_id, run_id)

    async def history(self, memory_id: str) -> list[dict[str, Any]]:
        return await self._run("history", memory_id)

    async def reset(self) -> None:
        return await self._run("reset")

    def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncMemory:  # noqa: PYI034
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
