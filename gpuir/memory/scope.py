"""Scopes: views of a memory confined to one tenant (and optionally one agent and one session).

:meth:`Memory.scope <gpuir.memory.Memory.scope>` returns a :class:`Scope`, a
view through which every read and every write stays inside the scope:

* **reads** (``search``, ``search_vectors``, ``get``, ``list``, ``count``,
  ``history``) see only the records whose ``tenant``, ``agent`` and ``session``
  equal the scope's (the fields the scope names); a record outside the scope is
  invisible: ``get`` of its id is an :class:`~gpuir.memory.UnknownIdError`, as
  for an id that names nothing. A ``where`` naming another tenant is refused
  with :class:`ScopeError` (the service answers 403 to the same filter); a
  ``where`` naming another agent or session simply matches nothing (it is
  AND-ed with the scope).
* **writes** (``add``, ``update``, ``replace``, ``upsert``, ``delete``,
  ``delete_all``) fill in the scope's fields on records that lack them, refuse
  (:class:`ScopeError`) a record or a change naming other values, and reach
  only the records inside the scope (``update`` or ``delete`` of an id outside
  it is an unknown id).

**Ids are unique per tenant**, as in the service (:mod:`gpuir.service`): a
scope naming a tenant ``T`` stores the record ``x`` under the id ``T/x``
(:func:`internal_id`; tenant names are 1 to 64 letters, digits, ``_`` or
``-``, so they never hold the ``/``) and gives ``x`` back everywhere, so two
tenants may both hold an ``x``, and no id of one can name a record of another.
This is the service's own layout: a directory the service wrote opens with
``Memory.open(path).scope(tenant=T)`` and shows tenant ``T``'s records with the
ids the service's clients use, and the service serves a memory written through
scopes the same way. A record of tenant ``T`` added *without* a scope keeps its
stored id (``x``): the scope finds it by that id too (``get``, ``update``,
``delete``, ``history`` look for ``T/x`` first, then ``x`` of tenant ``T``), and
an ``add`` of ``x`` through the scope is refused while it exists. Conditions on
``id`` in a scope's ``where`` name the scope's ids (:func:`tenant_where`).

A scope without a tenant (``mem.scope(agent="a")``) confines reads and writes
to the agent (or session) the same way, with the memory's ids as they are.

``Memory(require_scope=True)`` (saved with the memory) makes every unscoped
read and write of records refuse (:class:`ScopeError`): a memory holding
several tenants can then be reached only through a scope naming a tenant. The
operations on the whole memory (``save``, ``merge``, ``info``, ``export``,
``import_``, ``reset``) stay available on the memory itself.

Scores in a scope are those of the whole memory's statistics (N, df, average
length over every tenant), as with the service's ``--statistics pooled``; the
service's default gives each tenant its own statistics.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import UnknownIdError
from .records import RecordError
from .search import MemoryResults

if TYPE_CHECKING:  # pragma: no cover
    from .listing import Page

Memory = Any  # gpuir.memory.Memory (not imported: the store imports this module)

__all__ = ["SCOPE_FIELDS", "SEP", "TENANT_RE", "PrefixedResults", "Scope", "ScopeError", "ScopedResults",
           "check_tenant", "confine_where", "external_hit", "internal_id", "tenant_where"]

#: Tenant names: letters, digits, ``_`` and ``-``, 1 to 64 characters, starting with a letter or digit
#: (``\\Z``, not ``$``: ``$`` also matches before a trailing newline). Use with ``fullmatch``.
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
#: Between a tenant and a record's own id in the stored id (``tenant/id``).
SEP = "/"
#: The record fields a scope can confine, in order.
SCOPE_FIELDS = ("tenant", "agent", "session")


class ScopeError(ValueError):
    """A read or write reaches outside its scope (another tenant, agent or session), or a memory made
    with ``require_scope=True`` was used without one. The service answers 403 for it."""


def check_tenant(tenant: str) -> str:
    """``tenant`` if it is a valid tenant name (the whole string), else ``ValueError``."""
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        raise ValueError(f"tenant {tenant!r}: use 1 to 64 letters, digits, '_' or '-', starting with a letter or digit")
    return tenant


def internal_id(tenant: str, rid: str) -> str:
    """The stored id of a tenant's record ``rid``: ``tenant/rid``."""
    return f"{tenant}{SEP}{rid}"


def external_hit(hit: dict[str, Any]) -> dict[str, Any]:
    """A hit or record with the tenant prefix removed from its id (changed in place; returned)."""
    rid = hit["id"]
    hit["id"] = rid.split(SEP, 1)[1] if SEP in rid else rid
    return hit


def _strip(rec: dict[str, Any], prefix: str) -> dict[str, Any]:
    rid = rec.get("id")
    if prefix and isinstance(rid, str) and rid.startswith(prefix):
        rec["id"] = rid[len(prefix):]
    return rec


def tenant_where(where: dict[str, Any] | None, tenant: str) -> dict[str, Any] | None:
    """A tenant's ``where`` for the shared memory: conditions on ``id`` name the stored ids ``TENANT/ID``.

    Strings compared with an id are prefixed, in every clause (``$and``, ``$or``,
    ``$not`` included): ``eq``, ``ne``, ``in``, ``nin`` and the ranges (a common
    prefix keeps the order of strings). ``contains`` on ``id`` is refused (a
    substring could match the prefix); anything else is left for
    :mod:`gpuir.memory.where` to refuse.
    """
    if not isinstance(where, dict) or not where:
        return where
    pre = (lambda x: internal_id(tenant, x) if isinstance(x, str) else x)
    out: dict[str, Any] = {}
    for k, v in where.items():
        if k in ("$and", "$or") and isinstance(v, list):
            out[k] = [tenant_where(w, tenant) for w in v]
        elif k == "$not":
            out[k] = tenant_where(v, tenant)
        elif k == "id" and isinstance(v, dict):
            if {"contains", "$contains", "icontains", "$icontains"} & set(v):
                from .where import WhereError

                raise WhereError("where['id']: 'contains' on ids is not available in a tenant's scope or with "
                                 "pooled statistics (`gpuir serve --statistics pooled`): ids are stored as "
                                 "tenant/id; use eq, in or a range")
            out[k] = {op: ([pre(x) for x in val] if isinstance(val, list) else pre(val)) for op, val in v.items()}
        elif k == "id":
            out[k] = pre(v)
        else:
            out[k] = v
    return out


def _named_tenants(where: Mapping[str, Any]) -> list[Any]:
    """The tenant values a filter names at its top level (directly or in top-level ``$and`` lists)."""
    out = [where["tenant"]] if "tenant" in where else []
    subs = where.get("$and")
    for sub in subs if isinstance(subs, list) else ():
        if isinstance(sub, Mapping):
            out += _named_tenants(sub)
    return out


def confine_where(where: Any, fields: Mapping[str, str], what: str = "where") -> dict[str, Any] | None:
    """``where`` AND the scope's ``fields`` (``{"tenant": T, "agent": A, ...}``), as one filter.

    Raises
    ------
    ScopeError
        ``where`` names a tenant other than the scope's (``{"tenant": T}`` or
        ``{"tenant": {"eq": T}}`` of the scope's own tenant is allowed). The
        service's HTTP routes answer 403 for it, the MCP server a tool error.
    """
    if where is None or (isinstance(where, Mapping) and not where):
        return dict(fields) or None
    if not isinstance(where, Mapping):
        from .where import WhereError

        raise WhereError(f"{what} must be a dict of conditions (a JSON object), got {type(where).__name__}")
    t = fields.get("tenant")
    if t is not None:
        for v in _named_tenants(where):
            if v not in (t, {"eq": t}, {"$eq": t}):
                raise ScopeError(f"{what}.tenant names another tenant than {t!r} ({v!r}): a scope of tenant {t!r} "
                                 "reads and writes only its own records")
    out = dict(fields)
    rest = {k: v for k, v in where.items() if not (k == "tenant" and t is not None)}
    clash = {k: rest.pop(k) for k in list(rest) if k in out}
    out.update(rest)
    if clash:  # the caller's conditions on a scope field: AND-ed (they can only narrow)
        out["$and"] = [*(out.get("$and") or []), clash] if isinstance(out.get("$and"), list) else [clash]
    return out


_inside = threading.local()


@contextmanager
def inside_scope():
    """Calls on the memory made here come from a scope (``require_scope`` lets them through)."""
    depth = getattr(_inside, "depth", 0)
    _inside.depth = depth + 1
    try:
        yield
    finally:
        _inside.depth = depth


def in_scope() -> bool:
    """Whether this thread is inside a scope's call (:func:`inside_scope`)."""
    return getattr(_inside, "depth", 0) > 0


def require(what: str) -> None:
    """Refuse an unscoped ``what`` on a memory made with ``require_scope=True`` (called only for such a memory)."""
    if not in_scope():
        raise ScopeError(f"{what}: this memory was made with require_scope=True (it holds several tenants): "
                         f"use it through a scope, e.g. mem.scope(tenant='acme').{what}(...)")


@dataclass
class ScopedResults(MemoryResults):
    """:class:`~gpuir.memory.MemoryResults` of a scope: ids without the tenant prefix."""

    prefix: str = ""

    def ids(self, i: int) -> list[str]:
        n = len(self.prefix)
        return [r[n:] if n and r.startswith(self.prefix) else r for r in super().ids(i)]

    def hits(self, i: int) -> list[dict[str, Any]]:
        return [_strip(h, self.prefix) for h in super().hits(i)]


class PrefixedResults:
    """Any memory's search results (:class:`~gpuir.memory.protocol.SearchResults`, e.g. a
    :class:`~gpuir.cluster.ShardedMemory`'s) seen through a scope: ids without the tenant prefix.

    ``seqs`` (B, k) int64, ``scores`` (B, k) float32 and ``meta`` are the wrapped results' own.
    """

    def __init__(self, res: Any, prefix: str):
        self._res = res
        self.prefix = prefix
        self.seqs, self.scores, self.meta = res.seqs, res.scores, res.meta

    def __len__(self) -> int:
        return len(self._res)

    @property
    def shape(self) -> tuple[int, int]:
        return self.seqs.shape

    def ids(self, i: int) -> list[str]:
        n = len(self.prefix)
        return [r[n:] if n and r.startswith(self.prefix) else r for r in self._res.ids(i)]

    def hits(self, i: int) -> list[dict[str, Any]]:
        return [_strip(h, self.prefix) for h in self._res.hits(i)]


def _scoped_results(res: Any, prefix: str) -> ScopedResults | PrefixedResults:
    if isinstance(res, MemoryResults):
        return ScopedResults(res.seqs, res.scores, res.snapshot, res.vidx, res.rows, res.meta, prefix)
    return PrefixedResults(res, prefix)


class Scope:
    """A view of a :class:`~gpuir.memory.Memory` (or a :class:`~gpuir.cluster.ShardedMemory`) confined to a
    tenant, agent and/or session.

    The memory it wraps provides the protocol (:class:`~gpuir.memory.protocol.MemoryAPI`: ``seqs_of``,
    ``stored``, ``match_ids``, ``delete(where=)`` among the rest) and ``_write_lock``, a re-entrant lock
    every one of its writes takes, so that a scope's check-then-write (an add's id clash, an update's
    id lookup) is one step for the other writers.

    Made by :meth:`Memory.scope <gpuir.memory.Memory.scope>`; see the module
    docstring for what it confines and how ids are kept. Its methods take the
    memory's arguments and return what the memory's return (record ids are the
    scope's own).

    Examples
    --------
    >>> from gpuir import Memory
    >>> m = Memory()
    >>> ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    >>> ann.add([{"id": "n1", "text": "Rex likes the park"}])
    1
    >>> bob.add([{"id": "n1", "text": "Bob's cat sleeps all day"}])
    1
    >>> ann.search("park", k=3).hits(0)[0]["id"], ann.get(["n1"])[0]["tenant"]
    ('n1', 'ann')
    >>> bob.search("park", k=3).hits(0)
    []
    """

    def __init__(self, memory: Memory, tenant: str | None = None, agent: str | None = None,
                 session: str | None = None):
        fields: dict[str, str] = {}
        for name, v in (("tenant", tenant), ("agent", agent), ("session", session)):
            if v is None:
                continue
            if not isinstance(v, str) or not v:
                raise TypeError(f"scope: {name} must be a non-empty string, got {v!r}")
            fields[name] = v
        if not fields:
            raise ValueError("scope: name at least one of tenant, agent, session (e.g. mem.scope(tenant='acme'))")
        if tenant is not None:
            check_tenant(tenant)
        self.memory = memory
        self.fields = fields
        self.tenant, self.agent, self.session = tenant, agent, session
        self._prefix = "" if tenant is None else tenant + SEP

    def __repr__(self) -> str:
        return f"Scope({', '.join(f'{k}={v!r}' for k, v in self.fields.items())}, memory={self.memory!r})"

    def scope(self, tenant: str | None = None, agent: str | None = None, session: str | None = None) -> Scope:
        """A narrower scope (fields this one names cannot change)."""
        new = {"tenant": tenant, "agent": agent, "session": session}
        for k, v in new.items():
            if v is not None and k in self.fields and self.fields[k] != v:
                raise ScopeError(f"scope: this scope's {k} is {self.fields[k]!r}, not {v!r}")
        merged = {**{k: v for k, v in new.items() if v is not None}, **self.fields}
        return Scope(self.memory, **merged)

    @property
    def path(self):
        """The memory's directory (or None)."""
        return self.memory.path

    def save(self, *args, **kwargs):
        """Save the memory (all of it: a scope is a view)."""
        return self.memory.save(*args, **kwargs)

    # ------------------------------------------------------------------ ids
    def _internal(self, rid: str) -> str:
        return self._prefix + rid if self._prefix else rid

    def _external(self, rid: str) -> str:
        p = self._prefix
        return rid[len(p):] if p and rid.startswith(p) else rid

    def _external_hit(self, hit: dict[str, Any]) -> dict[str, Any]:
        return _strip(hit, self._prefix)

    def _fits(self, rec: Mapping[str, Any] | None) -> bool:
        return rec is not None and all(rec.get(k) == v for k, v in self.fields.items())

    def _check_ids(self, ids: Any, what: str) -> list[str]:
        from .records import id_list

        return id_list(ids, what)

    def _resolve(self, ids: Sequence[str]) -> list[str | None]:
        """The stored id of each of the scope's ids (None: no live record in the scope has it)."""
        mem = self.memory
        cands = [[self._internal(r)] + ([r] if self._prefix else []) for r in ids]
        flat = list(dict.fromkeys(c for cs in cands for c in cs))
        with inside_scope():
            seqs = mem.seqs_of(flat)
        live = [c for c, s in zip(flat, seqs) if s is not None]
        rec_of = dict(zip(*mem.stored(live))) if live else {}
        return [next((c for c in cs if self._fits(rec_of.get(c))), None) for cs in cands]

    def _fill(self, rec: Mapping[str, Any], i: int, what: str) -> dict[str, Any]:
        """``rec`` with the scope's fields filled in (ScopeError when it names others)."""
        if not isinstance(rec, Mapping):
            raise RecordError(f"{what}: record {i} is a {type(rec).__name__}; each record must be a dict")
        out = dict(rec)
        if what == "add" and out.get("id") is None:  # generated here: stored as tenant/id like any other
            from .stamps import uuid7

            out["id"] = uuid7()
        for k, v in self.fields.items():
            got = out.get(k)
            if got is None:
                out[k] = v
            elif got != v:
                rid = out.get("id")
                raise ScopeError(f"{what}: record {i}{f' (id {rid!r})' if isinstance(rid, str) else ''}: {k} is "
                                 f"{got!r}, but this scope's {k} is {v!r}: a scope writes only its own records")
        return out

    def _patch(self, rec: Mapping[str, Any], i: int, what: str, replace: bool) -> dict[str, Any]:
        """A change given to update: it may not move the record out of the scope."""
        if not isinstance(rec, Mapping):
            raise RecordError(f"{what}: record {i} is a {type(rec).__name__}; each record must be a dict")
        for k, v in self.fields.items():
            if k in rec and rec[k] is None and not replace:
                raise ScopeError(f"{what}: record {i} (id {rec.get('id')!r}): {k} cannot be removed in a scope "
                                 f"of {k} {v!r}")
        return self._fill({k: x for k, x in rec.items() if not (replace and x is None)}, i, what)

    # ------------------------------------------------------------------ reads
    def where(self, where: Any = None) -> dict[str, Any] | None:
        """The memory's filter for the scope's ``where`` (see :func:`confine_where`, :func:`tenant_where`)."""
        w = confine_where(where, self.fields)
        return tenant_where(w, self.tenant) if self.tenant is not None else w

    def _wheres(self, where: Any) -> Any:
        if isinstance(where, list):
            return [self.where(w) for w in where]
        return self.where(where)

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None,
               **kwargs: Any) -> ScopedResults | PrefixedResults:
        """:meth:`Memory.search <gpuir.memory.Memory.search>` of the scope's records."""
        with inside_scope():
            res = self.memory.search(queries, k=k, where=self._wheres(where), **kwargs)
        return _scoped_results(res, self._prefix)

    def search_vectors(self, queries: Any, k: int = 10, where: Any = None, **kwargs: Any) -> ScopedResults:
        """:meth:`Memory.search_vectors <gpuir.memory.Memory.search_vectors>` of the scope's records."""
        with inside_scope():
            res = self.memory.search_vectors(queries, k=k, where=self._wheres(where), **kwargs)
        return _scoped_results(res, self._prefix)

    def get(self, ids: Iterable[str], missing_ok: bool = False) -> list[dict[str, Any] | None]:
        """:meth:`Memory.get <gpuir.memory.Memory.get>`; an id outside the scope is unknown."""
        ids = self._check_ids(ids, "get")
        stored = self._resolve(ids)
        with inside_scope():
            got = self.memory.get([s for s in stored if s is not None], missing_ok=True)
        it = iter(got)
        recs = [None if s is None else next(it) for s in stored]
        unknown = [r for r, x in zip(ids, recs) if x is None]
        if unknown and not missing_ok:
            raise UnknownIdError(unknown, "get")
        return [None if x is None else _strip(x, self._prefix) for x in recs]

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._resolve([rid])[0] is not None

    def list(self, where: Any = None, **kwargs: Any) -> Page:
        """:meth:`Memory.list <gpuir.memory.Memory.list>` of the scope's records."""
        with inside_scope():
            page = self.memory.list(self.where(where), **kwargs)
        page.records = [_strip(r, self._prefix) for r in page.records]
        return page

    def count(self, where: Any = None, time_unit: str | None = None) -> int:
        """:meth:`Memory.count <gpuir.memory.Memory.count>` of the scope's records."""
        with inside_scope():
            return self.memory.count(self.where(where), time_unit=time_unit)

    def __len__(self) -> int:
        return self.count()

    def history(self, id: str) -> list[dict[str, Any]]:
        """:meth:`Memory.history <gpuir.memory.Memory.history>` of a record of the scope ([] for another's)."""
        if not isinstance(id, str):
            raise TypeError(f"history: the id must be a string, got {type(id).__name__}")
        stored = self._resolve([id])[0]
        with inside_scope():
            if stored is None:  # deleted with keep_history: the history's newest version says whose it was
                for c in [self._internal(id)] + ([id] if self._prefix else []):
                    vs = self.memory.history(c)
                    if vs and self._fits(vs[-1]):
                        stored = c
                        break
            if stored is None:
                return []
            return [_strip(v, self._prefix) for v in self.memory.history(stored)]

    # ------------------------------------------------------------------ writes
    def add(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None,
            vectors: Mapping[str, Any] | None = None) -> int:
        """:meth:`Memory.add <gpuir.memory.Memory.add>` with the scope's fields filled in.

        Raises
        ------
        ScopeError
            A record naming another tenant, agent or session (nothing is added).
        RecordError
            As ``Memory.add``; an id the scope already holds.
        """
        if isinstance(records, (Mapping, str, bytes)):
            raise RecordError("records must be an iterable of dicts (a list of records), not a single "
                              f"{type(records).__name__}")
        recs = [self._fill(r, i, "add") for i, r in enumerate(records)]
        mem = self.memory
        with mem._write_lock, inside_scope():
            if self._prefix:
                given = [r.get("id") for r in recs]
                ok = [i for i, r in enumerate(given) if isinstance(r, str) and r]
                held = self._resolve([given[i] for i in ok])
                clash = [ok[j] for j, s in enumerate(held) if s is not None]
                if clash:
                    raise RecordError(f"record {clash[0]} (id {given[clash[0]]!r}): the id already exists in tenant "
                                      f"{self.tenant!r} ({len(clash)} such record(s)); use update() to change it")
                recs = [{**r, "id": self._internal(r["id"])} if isinstance(r.get("id"), str) and r["id"] else r
                        for r in recs]
            return mem.add(recs, time_unit=time_unit, **({} if vectors is None else {"vectors": vectors}))

    def _put(self, records: Iterable[Mapping[str, Any]], replace: bool, time_unit: str | None, what: str) -> int:
        if isinstance(records, (Mapping, str, bytes)):
            raise RecordError("records must be an iterable of dicts (a list of records), not a single "
                              f"{type(records).__name__}")
        recs = [self._patch(r, i, what, replace) for i, r in enumerate(records)]
        for i, r in enumerate(recs):
            if not isinstance(r.get("id"), str) or not r["id"]:
                raise RecordError(f"{what}: record {i}: 'id' must be a non-empty string naming the record")
        mem = self.memory
        with mem._write_lock, inside_scope():
            stored = self._resolve([r["id"] for r in recs])
            unknown = [r["id"] for r, s in zip(recs, stored) if s is None]
            if unknown and what != "upsert":
                raise UnknownIdError(unknown, what)
            recs = [{**r, "id": s if s is not None else self._internal(r["id"])} for r, s in zip(recs, stored)]
            if what == "upsert":
                return mem.upsert(recs, replace=replace, time_unit=time_unit)
            return mem.update(recs, replace=replace, time_unit=time_unit)

    def update(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None) -> int:
        """:meth:`Memory.update <gpuir.memory.Memory.update>` of the scope's records (an id outside it is
        unknown; a change naming another tenant, agent or session is a :class:`ScopeError`)."""
        return self._put(records, replace, time_unit, "update")

    def replace(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        """:meth:`Memory.replace <gpuir.memory.Memory.replace>` of the scope's records (scope fields filled in)."""
        return self._put(records, True, time_unit, "replace")

    def upsert(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None) -> int:
        """:meth:`Memory.upsert <gpuir.memory.Memory.upsert>` inside the scope."""
        return self._put(records, replace, time_unit, "upsert")

    def delete(self, ids: Iterable[str] | None = None, missing_ok: bool = False, keep_history: bool = True,
               where: Any = None, time_unit: str | None = None) -> int:
        """:meth:`Memory.delete <gpuir.memory.Memory.delete>` of the scope's records, by id or by ``where``.

        An id outside the scope is unknown (:class:`~gpuir.memory.UnknownIdError`
        unless ``missing_ok``); ``where`` deletes the scope's records passing it.
        """
        mem = self.memory
        if (ids is None) == (where is None):
            raise TypeError("delete: give ids or where= (not both)")
        with mem._write_lock, inside_scope():
            if where is not None:
                return mem.delete(where=self.where(where), keep_history=keep_history, time_unit=time_unit)
            ids = list(dict.fromkeys(self._check_ids(ids, "delete")))
            stored = self._resolve(ids)
            unknown = [r for r, s in zip(ids, stored) if s is None]
            if unknown and not missing_ok:
                raise UnknownIdError(unknown, "delete")
            return mem.delete([s for s in stored if s is not None], missing_ok=True, keep_history=keep_history)

    def match_ids(self, where: Any = None, time_unit: str | None = None) -> list[str]:
        """The scope's ids of its records passing ``where`` (all without one), in add order."""
        with inside_scope():
            return [self._external(r) for r in self.memory.match_ids(self.where(where), time_unit)]

    def delete_all(self, keep_history: bool = True) -> int:
        """Delete every record of the scope (through the memory's delete of their ids); returns how many."""
        mem = self.memory
        with mem._write_lock, inside_scope():
            return mem.delete(where=self.where(None), keep_history=keep_history)
