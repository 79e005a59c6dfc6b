"""``where`` filters: a small filter language, compiled once per distinct filter, evaluated per segment.

Grammar (JSON; ``docs/memory.md`` has it with examples)::

    where     := { clause, clause, ... }              every clause must hold (AND)
    clause    := "$and": [where, ...]                 all of them
               | "$or":  [where, ...]                 at least one
               | "$not": where                        not this one
               | field: value                         shorthand for {"eq": value}
               | field: { op: value, ... }            every operator must hold (AND)
               | "metadata": { path: value-or-ops, ... }   the same as "metadata.<path>": ...
    field     := "id" | "text" | "session" | "role" | "agent" | "tenant" | "type"
               | "time" | "expires_at" | "created_at" | "updated_at" | "importance"
               | "metadata.<path>"
    path      := key ( "." key )*                     walks nested metadata objects
    op        := eq | ne | in | nin | gt | gte | lt | lte | contains | icontains | exists
                                                      ("$eq" etc. also accepted)

Semantics (``v`` is the record's value of the field; "present" = the field is
there and not JSON null):

=============  ==============================================================
``eq x``       present and equal to x; ``x`` null: not present. Equality is
               JSON equality of the whole value (a number equals a number of
               the same value, never a bool or a string; a list equals only an
               equal list); a list never equals one of its elements (use
               ``contains``)
``ne x``       not ``eq x`` (so records without the field match ``ne``)
``in [x..]``   ``eq`` one of them; ``nin``: ``eq`` none of them
``gt gte       present, of the value's kind (number with number, string with
lt lte x``     string by code points, time with time), and compared
``contains x`` v is a list holding an element equal to x, or v is a string and
               x a string found in it
``icontains x`` x a string; v a string holding x, or a list holding a string
               equal to x, both ignoring case (``str.casefold``)
``exists b``   present (b true) or not present (b false)
=============  ==============================================================

Fields: ``id`` and ``text`` (always present; strings), ``session``, ``agent``,
``tenant``, ``type`` (strings), ``role`` (one of the roles: eq/ne/in/nin/exists),
``time``, ``expires_at``, ``created_at`` and ``updated_at`` (times, the last two
kept by a memory with ``record_times``: ISO 8601 strings, timezone-aware datetimes,
or numbers with ``time_unit``; not ``contains``), ``importance`` (numbers; not
``contains``), ``metadata.<path>`` (any JSON value; a path walks objects only: a
list or scalar met on the way means the key is not present; a key that itself
holds a "." is found too: ``metadata.a.b`` names ``{"a": {"b": ..}}`` or, where
there is none, ``{"a.b": ..}``). Numbers compare as float64.

Anything else is a :class:`WhereError` naming the clause and the fix: an unknown
field or operator, a value of the wrong kind, a list given as a value (write
``{"in": [...]}``, ``{"contains": ...}`` or ``{"eq": [...]}``), an empty
condition, a range on a bool, ``"*"`` as the value of ``session``, ``agent`` or
``type`` (not a wildcard here: write ``{"exists": true}``; mem0's ``*`` is
translated by :mod:`gpuir.compat.mem0`), ``icontains`` with anything but a
string. A filter never matches nothing silently because of its shape.

**Tenant is a hard boundary.** A ``tenant`` clause names exactly one tenant (a
string, or ``{"eq": "..."}``) and stands at the top level (directly, or inside
top-level ``$and`` lists); a tenant under ``$or`` or ``$not``, a second tenant,
membership, ranges or null on tenant are refused. So no ``where`` can widen a
tenant's search: the tenant's rows are the set every other clause narrows, and
:meth:`Memory.search <gpuir.memory.Memory.search>` checks every hit's tenant
again before returning it.

**Compiled once per distinct filter**: :func:`compile_where` caches the compiled
:class:`Where` by the filter's canonical JSON (and ``time_unit``), so a filter
repeated across calls or queries is parsed and checked once. A compiled filter
turns into one boolean mask per segment, vectorised over its columns (string
fields through their dictionaries, metadata through per-segment columns of each
path, parsed once per segment and cached). Time clauses at the top level also
say which time partitions can hold a match; the others are never read.
Expired records (``expires_at`` past) are hidden by every mask of a search
(:mod:`gpuir.memory.expiry`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import numpy as np

from .columns import Interner
from .expiry import NEVER, expiry_column
from .records import EXPIRES_KEY, MISSING_TIME, ROLES, STRING_FIELDS, RecordError
from .segments import Segment, SegView
from .stamps import STAMP_FIELDS, stamp_column
from .timeutil import check_time_unit, parse_time

#: Comparison operators.
OPS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "contains", "icontains", "exists")
#: String values that look like a wildcard: refused as literal values (see :meth:`_Compiler.scalar`).
WILDCARDS = ("*",)
#: Logical operators.
LOGICAL = ("$and", "$or", "$not")
_RANGES = ("gt", "gte", "lt", "lte")
_RANGE = {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}
_PYCMP = {"gt": lambda a, b: a > b, "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b,
          "lte": lambda a, b: a <= b}
_STAMP_KEYS = frozenset(STAMP_FIELDS.values())
_TIMES = ("time", "expires_at", "created_at", "updated_at")
_FILTERABLE = ("id", "text") + STRING_FIELDS + ("time", "expires_at", "created_at", "updated_at", "importance")
#: Compiled filters kept (least recently used dropped first).
CACHE_SIZE = 1024


class WhereError(ValueError):
    """A malformed ``where``; the message names the clause and the fix."""


# --------------------------------------------------------------------------- the compiled tree


@dataclass(frozen=True)
class Cond:
    """One operator on one field: ``field`` (or "metadata" with ``path``), ``op``, checked ``value``."""

    field: str
    path: tuple[str, ...] | None
    op: str
    value: Any


@dataclass(frozen=True)
class And:
    children: tuple


@dataclass(frozen=True)
class Or:
    children: tuple


@dataclass(frozen=True)
class Not:
    child: Any


@dataclass(frozen=True)
class Where:
    """A compiled ``where`` (immutable: shared by every search that uses the same filter).

    Attributes
    ----------
    root : Cond, And, Or, Not or None
        The filter without its tenant clause (None: the tenant alone, or nothing).
    tenant : str or None
        The tenant this filter confines to.
    time_lo, time_hi : int or None
        Inclusive epoch-ms bounds that top-level time clauses put on a match (None = open).
    timed_only : bool
        Records without a time cannot match.
    untimed_only : bool
        Only records without a time can match.
    expire : int or None
        Hide records with ``expires_at <= expire`` (set per search: :meth:`at`).
    """

    root: Any = None
    tenant: str | None = None
    time_lo: int | None = None
    time_hi: int | None = None
    timed_only: bool = False
    untimed_only: bool = False
    expire: int | None = None
    conds: list = field(default_factory=list, compare=False, repr=False)  # every Cond, for inspection

    def at(self, expire: int | None) -> Where:
        """This filter hiding the records expired at ``expire`` (epoch ms; None: hide none)."""
        return self if expire == self.expire else dataclasses.replace(self, expire=expire)

    # ---------------------------------------------------------------- partitions
    def may_match_partition(self, key: int | None, window_ms: int | None) -> bool:
        """Whether partition ``key`` (None = records without a time) can hold a match."""
        if window_ms is None:  # one partition, timed and untimed records together
            return True
        if key is None:
            return not self.timed_only
        if self.untimed_only:
            return False
        lo, hi = key * window_ms, (key + 1) * window_ms - 1
        return (self.time_hi is None or lo <= self.time_hi) and (self.time_lo is None or hi >= self.time_lo)

    def may_match_segment(self, seg: Segment) -> bool:
        if seg.time_min is None:
            return not self.timed_only
        if self.untimed_only:
            return bool(np.any(seg.time == MISSING_TIME))
        return (self.time_hi is None or seg.time_min <= self.time_hi) and (
            self.time_lo is None or seg.time_max >= self.time_lo)  # type: ignore[operator]

    # ---------------------------------------------------------------- masks
    def mask(self, view: SegView, dicts: dict[str, Interner]) -> np.ndarray:
        """Rows of ``view`` that are live, not expired, and pass the filter.

        Returns
        -------
        ndarray, shape (n,), bool, host
        """
        seg = view.seg
        m = np.ones(seg.n_docs, dtype=bool) if view.live is None else view.live.copy()
        if not self.may_match_segment(seg):
            m[:] = False
            return m
        if self.expire is not None:
            col = expiry_column(seg)
            if col is not None:
                m &= col > self.expire
        if self.tenant is not None and m.any():
            code = dicts["tenant"].lookup(self.tenant)
            t = np.zeros(seg.n_docs, dtype=bool)
            if code >= 0:
                t[seg.rows_with_codes("tenant", np.asarray([code], dtype=np.int64))] = True
            m &= t
        if self.root is not None and m.any():
            m &= _eval(self.root, seg, dicts)
        return m

    def passes_all(self, views: Sequence[SegView], dicts: dict[str, Interner]) -> bool:
        """Whether every live record of ``views`` passes this filter, so that searching with it is searching
        without it (a tenant's filter on a memory that holds only that tenant; the expiry of a search when
        nothing has expired yet). Decided only for a filter without conditions besides its tenant and
        expiry (False otherwise); stops at the first segment holding a record that fails."""
        if self.root is not None or self.timed_only or self.untimed_only:
            return False
        return all(self.rows(v, dicts).size == v.n_live for v in views)

    def rows(self, view: SegView, dicts: dict[str, Interner]) -> np.ndarray:
        """The rows :meth:`mask` is True at: ndarray (m,), int64, ascending.

        A filter with a tenant starts from that tenant's rows (the segment's index of
        rows by code, built once per segment) and tests only them, so a tenant's search
        costs what the tenant holds, not what the segment holds (the agent case: one
        tenant among many in a shared memory).
        """
        if self.tenant is None:
            return np.flatnonzero(self.mask(view, dicts)).astype(np.int64)
        seg = view.seg
        code = dicts["tenant"].lookup(self.tenant)
        if code < 0 or not self.may_match_segment(seg):
            return np.zeros(0, np.int64)
        rows = seg.rows_with_codes("tenant", np.asarray([code], dtype=np.int64))
        if view.live is not None and rows.size:
            rows = rows[view.live[rows]]
        if self.expire is not None and rows.size:
            col = expiry_column(seg)
            if col is not None:
                rows = rows[col[rows] > self.expire]
        if self.root is not None and rows.size:
            rows = rows[_eval(self.root, seg, dicts)[rows]]
        return rows


# --------------------------------------------------------------------------- compile

_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()


def _key_default(x: Any) -> str:
    if isinstance(x, datetime):
        return f"\x00datetime:{x.isoformat()}:{x.tzinfo!r}"
    if isinstance(x, date):
        return f"\x00date:{x.isoformat()}"
    raise TypeError  # not cacheable: compiled without the cache (and its errors raised)


def where_from_json(text: str, what: str = "where") -> dict[str, Any]:
    """A ``where`` given as JSON text (a CLI option, an HTTP query parameter), parsed.

    Raises
    ------
    ValueError
        Not JSON, or not a JSON object of conditions; the message names ``what``.
    """
    try:
        w = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(w, dict):
        raise ValueError(f'{what} must be a JSON object of conditions, e.g. {{"tenant": "acme"}}')  # noqa: TRY004
    return w


def compile_where(where: Mapping[str, Any] | None, dicts: dict[str, Interner] | None = None, what: str = "where",
                  time_unit: str | None = None) -> Where | None:
    """Check and compile one ``where`` dict (None -> None); cached per distinct filter.

    Parameters
    ----------
    where : dict or None
    dicts : unused (compiled filters do not depend on a memory); kept for callers
    what : how messages name the filter
    time_unit : {"s", "ms", "us", "ns"} or None
        The unit of bare numbers given as times; None refuses them.

    Raises
    ------
    WhereError
        See the module docstring.
    """
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise WhereError(f"{what} must be a dict (a JSON object) of conditions, got {type(where).__name__}")
    try:
        check_time_unit(time_unit)
    except ValueError as e:
        raise WhereError(str(e)) from None
    try:
        key = (json.dumps(where, sort_keys=True, default=_key_default, allow_nan=True), time_unit)
    except (TypeError, ValueError):
        key = None
    if key is not None:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
                return hit
    w = _Compiler(time_unit).compile(where, what)
    if key is not None:
        with _cache_lock:
            _cache[key] = w
            if len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return w


def compile_wheres(where: Any, n_queries: int, dicts: dict[str, Interner] | None = None,
                   time_unit: str | None = None, expire: int | None = None) -> list[Where | None]:
    """One compiled filter per query from ``where``: None, one dict for all, or a list of n_queries.

    ``expire`` (epoch ms, see :func:`gpuir.memory.expiry.cutoff`): every query's
    filter, ``None`` included, hides the records expired then.
    """
    if where is None:
        out: list[Where | None] = [None] * n_queries
    elif isinstance(where, Mapping):
        out = [compile_where(where, dicts, time_unit=time_unit)] * n_queries
    elif isinstance(where, Sequence) and not isinstance(where, (str, bytes)):
        if len(where) != n_queries:
            raise WhereError(f"where has {len(where)} entries for {n_queries} queries: give one dict (or None) "
                             "per query, or a single dict for all")
        out = [compile_where(w, dicts, f"where[{i}]", time_unit) for i, w in enumerate(where)]
    else:
        raise WhereError(f"where must be None, a dict, or a list of dicts (one per query), got {type(where).__name__}")
    if expire is not None:
        out = [(w if w is not None else Where()).at(expire) for w in out]
    return out


def _json_value(x: Any, what: str, depth: int = 0) -> Any:
    """A JSON value checked (finite numbers, string keys, bounded depth)."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, float)):
        if isinstance(x, float) and not math.isfinite(x):
            raise WhereError(f"{what}: numbers must be finite, got {x!r}")
        return x
    if depth > 32:
        raise WhereError(f"{what}: the value is nested too deeply")
    if isinstance(x, (list, tuple)):
        return [_json_value(v, what, depth + 1) for v in x]
    if isinstance(x, Mapping):
        if not all(isinstance(k, str) for k in x):
            raise WhereError(f"{what}: object keys must be strings")
        return {k: _json_value(v, what, depth + 1) for k, v in x.items()}
    raise WhereError(f"{what}: metadata values in conditions are JSON values (strings, numbers, booleans, null, "
                     f"lists, objects), got {type(x).__name__}")


class _Compiler:
    def __init__(self, time_unit: str | None):
        self.time_unit = time_unit
        self.tenant: str | None = None
        self.lo: int | None = None
        self.hi: int | None = None
        self.timed_only = False
        self.untimed_only = False
        self.conds: list[Cond] = []

    def compile(self, where: Mapping[str, Any], what: str) -> Where:
        root = self.clauses(where, what, top=True, outer=True)
        return Where(root=root, tenant=self.tenant, time_lo=self.lo, time_hi=self.hi, timed_only=self.timed_only,
                     untimed_only=self.untimed_only, conds=self.conds)

    def clauses(self, where: Any, what: str, top: bool, outer: bool = False) -> Any:
        if not isinstance(where, Mapping):
            raise WhereError(f"{what} must be a dict (a JSON object) of conditions, got {type(where).__name__}")
        if not where:
            if outer:  # {} as the whole filter: no filter
                return None
            raise WhereError(f"{what} is an empty filter: give at least one condition")
        nodes = []
        for k, v in where.items():
            if not isinstance(k, str):
                raise WhereError(f"{what}: keys must be field names (strings), got {k!r}")
            node = self.clause(k, v, what, top)
            if node is not None:
                nodes.append(node)
        if not nodes:
            return None
        return nodes[0] if len(nodes) == 1 else And(tuple(nodes))

    def clause(self, k: str, v: Any, what: str, top: bool) -> Any:
        if k.startswith("$"):
            if k not in LOGICAL:
                raise WhereError(f"{what}: unknown logical operator {k!r}; use {', '.join(LOGICAL)}")
            here = f"{what}.{k}"
            if k == "$not":
                if not isinstance(v, Mapping):
                    raise WhereError(f'{here} takes one filter (a dict), e.g. {{"$not": {{"role": "tool"}}}}')
                node = self.clauses(v, here, top=False)
                return Not(node)
            if not isinstance(v, (list, tuple)) or not v:
                raise WhereError(f"{here} takes a non-empty list of filters (dicts)")
            kids = [self.clauses(w, f"{here}[{i}]", top=(top and k == "$and")) for i, w in enumerate(v)]
            kids = [x for x in kids if x is not None]
            if not kids:
                return None
            return (And if k == "$and" else Or)(tuple(kids))
        if k == "metadata":
            if not isinstance(v, Mapping) or not v:
                raise WhereError(f'{what}: "metadata" takes a non-empty dict of key -> condition, e.g. '
                                 '{"metadata": {"speaker": "Caroline"}}')
            nodes = []
            for mk, mv in v.items():
                if not isinstance(mk, str):
                    raise WhereError(f"{what}: metadata keys must be strings, got {mk!r}")
                nodes.append(self.field("metadata", self.path(mk, what), mv, what, top))
            return nodes[0] if len(nodes) == 1 else And(tuple(nodes))
        if k.startswith("metadata."):
            return self.field("metadata", self.path(k[len("metadata."):], what), v, what, top)
        if k in _FILTERABLE:
            return self.field(k, None, v, what, top)
        raise WhereError(f"{what}: unknown field {k!r}; filter on {', '.join(_FILTERABLE)}, 'metadata.<key>', or "
                         f"combine filters with {', '.join(LOGICAL)}")

    @staticmethod
    def path(key: str, what: str) -> tuple[str, ...]:
        parts = tuple(key.split("."))
        if not key or any(not p for p in parts):
            raise WhereError(f'{what}: "metadata.{key}" needs a key after each dot, e.g. "metadata.speaker" or '
                             '"metadata.place.city"')
        if parts[0] == EXPIRES_KEY:
            raise WhereError(f"{what}: filter on the field 'expires_at', not on its storage key")
        if parts[0] in _STAMP_KEYS:
            raise WhereError(f"{what}: filter on the field {parts[0][1:]!r}, not on its storage key")
        return parts

    def field(self, fld: str, path: tuple[str, ...] | None, v: Any, what: str, top: bool) -> Any:
        name = "metadata." + ".".join(path) if path is not None else fld
        here = f"{what}[{name!r}]"
        if fld == "tenant":
            return self.tenant_clause(v, what, top)
        ops = _ops(v, here)
        nodes = []
        for op, val in ops.items():
            c = Cond(fld, path, op, self.value(fld, op, val, here))
            self.conds.append(c)
            if top and fld == "time":
                self.bound(c)
            nodes.append(c)
        return nodes[0] if len(nodes) == 1 else And(tuple(nodes))

    def tenant_clause(self, v: Any, what: str, top: bool) -> None:
        one = v.get("eq", v.get("$eq")) if isinstance(v, Mapping) and len(v) == 1 and set(v) <= {"eq", "$eq"} else v
        if not isinstance(one, str):
            raise WhereError(
                f"{what}: tenant is a hard boundary: name exactly one tenant as a string, e.g. "
                f'{{"tenant": "acme"}} (got {json.dumps(v, default=str)}); search tenants one at a time')
        if not top:
            raise WhereError(f"{what}: tenant is a hard boundary: it cannot stand under $or or $not; name it once at "
                             'the top level, e.g. {"tenant": "acme", "$or": [...]}')
        if self.tenant is not None and self.tenant != one:
            raise WhereError(f"{what}: tenant is a hard boundary: this filter names two tenants ({self.tenant!r} and "
                             f"{one!r}); search tenants one at a time")
        self.tenant = one

    def value(self, fld: str, op: str, val: Any, here: str) -> Any:
        if op == "exists":
            if not isinstance(val, bool):
                raise WhereError(f'{here}: "exists" takes true or false, got {val!r}')
            if fld in ("id", "text"):
                raise WhereError(f"{here}: every record has an {fld}; 'exists' cannot be false or tell anything")
            return val
        if op in ("in", "nin"):
            if not isinstance(val, (list, tuple)):
                raise WhereError(f'{here}: "{op}" takes a list of values, got {type(val).__name__}')
            return tuple(self.scalar(fld, x, here, op) for x in val)
        return self.scalar(fld, val, here, op)

    def scalar(self, fld: str, x: Any, here: str, op: str) -> Any:
        ranged = op in _RANGES
        if x is None and (ranged or op in ("contains", "icontains")):
            raise WhereError(f"{here}: {op!r} needs a value, got null")
        if op == "icontains" and not isinstance(x, str):
            raise WhereError(f"{here}: 'icontains' (contains, ignoring case) takes a string, got {x!r}")
        if op in ("eq", "ne") and isinstance(x, str) and x in WILDCARDS and fld in STRING_FIELDS \
                and fld not in ("role", "tenant"):
            raise WhereError(f'{here}: {x!r} is not a wildcard here; for "any {fld}" write {{"exists": true}} '
                             f'(for the literal value write {{"in": [{x!r}]}})')
        if fld == "metadata":
            if ranged and (isinstance(x, bool) or not isinstance(x, (int, float, str))):
                raise WhereError(f"{here}: a range needs a number or a string, got {x!r}")
            return _json_value(x, here)
        if fld in ("id", "text") + STRING_FIELDS:
            if x is None:
                if fld in ("id", "text"):
                    raise WhereError(f"{here}: every record has an {fld}; null never matches")
                return None
            if fld == "role":
                if ranged or op in ("contains", "icontains"):
                    raise WhereError(f"{here}: role takes equality and membership only (eq, ne, in, nin, exists), "
                                     f"not {op!r}")
                if x not in ROLES:
                    raise WhereError(f"{here}: role {x!r} is not one of {', '.join(ROLES)}")
            if not isinstance(x, str):
                raise WhereError(f"{here}: {fld} values are strings, got {type(x).__name__} {x!r}")
            return x
        if op in ("contains", "icontains"):
            raise WhereError(f"{here}: {op!r} applies to strings and lists; {fld} is a "
                             f"{'time' if fld in _TIMES else 'number'} (use gt, gte, lt, lte)")
        if x is None:
            return None
        if fld in _TIMES:
            try:
                return parse_time(x, f"{here} value", self.time_unit)
            except RecordError as e:
                raise WhereError(str(e)) from None
        # importance
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise WhereError(f"{here}: importance values are finite numbers, got {x!r}")
        return float(x)

    def bound(self, c: Cond) -> None:
        """Partition bounds from a top-level time condition (conservative: only what every match must meet)."""
        op, val = c.op, c.value
        if op == "exists":
            if val:
                self.timed_only = True
            else:
                self.untimed_only = True
            return
        if op in ("ne", "nin"):
            return
        if op in ("eq", "in"):
            vals = (val,) if op == "eq" else val
            timed = [x for x in vals if x is not None]
            if len(timed) < len(vals):  # null accepted: untimed records can match
                if not timed:
                    self.untimed_only = True
                return
            self.timed_only = True
            if not timed:  # {"in": []}
                self.lo, self.hi = 1, 0
                return
            lo, hi = min(timed), max(timed)
        else:
            self.timed_only = True
            lo = {"gt": val + 1, "gte": val}.get(op)
            hi = {"lt": val - 1, "lte": val}.get(op)
        if lo is not None:
            self.lo = lo if self.lo is None else max(self.lo, lo)
        if hi is not None:
            self.hi = hi if self.hi is None else min(self.hi, hi)


def _ops(v: Any, what: str) -> dict[str, Any]:
    if isinstance(v, Mapping):
        if not v:
            raise WhereError(f"{what}: an empty condition; use a value or {{op: value}} with op in {', '.join(OPS)}")
        out = {}
        for k in v:
            op = k[1:] if isinstance(k, str) and k.startswith("$") else k
            if op not in OPS:
                raise WhereError(f"{what}: unknown operator {k!r}; use {', '.join(OPS)} (to compare with an "
                                 'object, write {"eq": {...}})')
            if op in out:
                raise WhereError(f"{what}: operator {op!r} given twice")
            out[op] = v[k]
        return out
    if isinstance(v, (list, tuple, set)):
        raise WhereError(f'{what}: a list is ambiguous; for membership write {{"in": [...]}}, for an element of a '
                         'list {"contains": x}, for the whole list {"eq": [...]}')
    return {"eq": v}


# --------------------------------------------------------------------------- evaluation


def _eval(node: Any, seg: Segment, dicts: dict[str, Interner]) -> np.ndarray:
    """The rows of ``seg`` (all, live or not) that pass ``node``: ndarray (n,), bool."""
    if isinstance(node, Cond):
        return _cond(node, seg, dicts)
    if isinstance(node, And):
        m = _eval(node.children[0], seg, dicts)
        for c in node.children[1:]:
            if not m.any():
                break
            m &= _eval(c, seg, dicts)
        return m
    if isinstance(node, Or):
        m = _eval(node.children[0], seg, dicts)
        for c in node.children[1:]:
            if m.all():
                break
            m |= _eval(c, seg, dicts)
        return m
    if isinstance(node, Not):
        return ~_eval(node.child, seg, dicts) if node.child is not None else np.zeros(seg.n_docs, dtype=bool)
    raise TypeError(f"not a filter node: {node!r}")  # pragma: no cover


def _cond(c: Cond, seg: Segment, dicts: dict[str, Interner]) -> np.ndarray:
    col = _column(c, seg, dicts)
    op, val = c.op, c.value
    if op == "exists":
        p = col.present()
        return p if val else ~p
    if op == "eq":
        return col.eq(val)
    if op == "ne":
        return ~col.eq(val)
    if op in ("in", "nin"):
        m = np.zeros(seg.n_docs, dtype=bool)
        for x in val:
            m |= col.eq(x)
        return m if op == "in" else ~m
    if op == "contains":
        return col.contains(val)
    if op == "icontains":
        return col.icontains(val)
    return col.range(op, val)


def _column(c: Cond, seg: Segment, dicts: dict[str, Interner]):
    if c.field == "metadata":
        return meta_column(seg, c.path)  # type: ignore[arg-type]
    if c.field in STRING_FIELDS:
        return _DictColumn(seg, c.field, dicts[c.field])
    if c.field in ("id", "text"):
        return _TextColumn(seg, c.field)
    if c.field == "time":
        return _NumColumn(seg.time, seg.time != MISSING_TIME)
    if c.field == "expires_at":
        e = expiry_column(seg)
        if e is None:
            return _NumColumn(np.zeros(seg.n_docs, np.int64), np.zeros(seg.n_docs, dtype=bool))
        return _NumColumn(e, e != NEVER)
    if c.field in STAMP_FIELDS:
        col = stamp_column(seg, c.field)
        if col is None:
            return _NumColumn(np.zeros(seg.n_docs, np.int64), np.zeros(seg.n_docs, dtype=bool))
        return _NumColumn(col, col != MISSING_TIME)
    imp = seg.importance
    return _NumColumn(imp, ~np.isnan(imp))


class _NumColumn:
    """A numeric column (time, expires_at, importance) with its presence mask."""

    def __init__(self, values: np.ndarray, present: np.ndarray):
        self.values, self._present = values, present

    def present(self) -> np.ndarray:
        return self._present.copy()

    def eq(self, x: Any) -> np.ndarray:
        if x is None:
            return ~self._present
        return (self.values == x) & self._present

    def range(self, op: str, x: Any) -> np.ndarray:
        return _RANGE[op](self.values, x) & self._present

    def contains(self, x: Any) -> np.ndarray:  # pragma: no cover - refused at compile time
        raise WhereError("'contains' does not apply to times and numbers")

    icontains = contains


class _DictColumn:
    """A dictionary-encoded string field: tests run on the distinct values, rows found by code."""

    def __init__(self, seg: Segment, fld: str, interner: Interner):
        self.seg, self.fld, self.interner = seg, fld, interner
        self.codes = seg.codes[fld]

    def _rows(self, codes: list[int]) -> np.ndarray:
        m = np.zeros(self.seg.n_docs, dtype=bool)
        if codes:
            m[self.seg.rows_with_codes(self.fld, np.asarray(sorted(codes), dtype=np.int64))] = True
        return m

    def present(self) -> np.ndarray:
        return self.codes >= 0

    def eq(self, x: Any) -> np.ndarray:
        if x is None:
            return self.codes < 0
        code = self.interner.lookup(x)  # an unknown value (-1) must not match the absent rows (code -1)
        return self._rows([code]) if code >= 0 else np.zeros(self.seg.n_docs, dtype=bool)

    def _where_values(self, test) -> np.ndarray:
        values = list(self.interner.values)
        used = np.unique(self.codes[self.codes >= 0])
        ok = [int(c) for c in used.tolist() if c < len(values) and test(values[c])]
        return self._rows(ok)

    def range(self, op: str, x: Any) -> np.ndarray:
        cmp = _PYCMP[op]
        return self._where_values(lambda s: cmp(s, x))

    def contains(self, x: str) -> np.ndarray:
        return self._where_values(lambda s: x in s)

    def icontains(self, x: str) -> np.ndarray:
        f = x.casefold()
        return self._where_values(lambda s: f in s.casefold())


class _TextColumn:
    """``id`` or ``text``: one string per row, always present."""

    def __init__(self, seg: Segment, fld: str):
        self.seg, self.fld = seg, fld

    def _strings(self) -> list[str]:
        if self.fld == "id":
            got = self.seg.cache.get("id_list")
            if got is None:
                got = self.seg.cache["id_list"] = self.seg.ids.tolist()
            return got
        return self.seg.texts.tolist()

    def present(self) -> np.ndarray:
        return np.ones(self.seg.n_docs, dtype=bool)

    def eq(self, x: Any) -> np.ndarray:
        m = np.zeros(self.seg.n_docs, dtype=bool)
        if self.fld == "id":
            idx = self.seg.cache.get("id_index")
            if idx is None:
                idx = self.seg.cache["id_index"] = {s: i for i, s in enumerate(self._strings())}
            r = idx.get(x)
            if r is not None:
                m[r] = True
            return m
        return np.fromiter((s == x for s in self._strings()), dtype=bool, count=self.seg.n_docs)

    def range(self, op: str, x: Any) -> np.ndarray:
        cmp = _PYCMP[op]
        return np.fromiter((cmp(s, x) for s in self._strings()), dtype=bool, count=self.seg.n_docs)

    def contains(self, x: str) -> np.ndarray:
        return np.fromiter((x in s for s in self._strings()), dtype=bool, count=self.seg.n_docs)

    def icontains(self, x: str) -> np.ndarray:
        f = x.casefold()
        return np.fromiter((f in s.casefold() for s in self._strings()), dtype=bool, count=self.seg.n_docs)


#: Kinds of a metadata value in a :class:`MetaColumn`.
ABSENT, NULL, BOOL, NUM, STR, LIST, OBJ = range(7)


def jkey(v: Any) -> Any:
    """A hashable key of a JSON value under the filter's equality (numbers by value, bools apart)."""
    if v is None:
        return ("z",)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, (list, tuple)):
        return ("l", tuple(jkey(x) for x in v))
    return ("o", tuple(sorted((k, jkey(x)) for k, x in v.items())))


@dataclass
class MetaColumn:
    """One metadata path of one segment, as columns (built on first use, cached on the segment).

    Attributes
    ----------
    kind : ndarray (n,), int8: ABSENT, NULL, BOOL, NUM, STR, LIST or OBJ
    num : ndarray (n,), float64: numbers (NaN otherwise)
    scode : ndarray (n,), int32: index into ``svals`` for strings, -1 otherwise
    svals : list of str, sorted
    whole : dict jkey -> ndarray of rows: list and object values, by value
    elems : dict jkey -> ndarray of rows: the rows whose list holds an element of that value
    ielems : dict str -> ndarray of rows: the rows whose list holds a string element, by its casefold
    """

    kind: np.ndarray
    num: np.ndarray
    scode: np.ndarray
    svals: list[str]
    whole: dict
    elems: dict
    ielems: dict = field(default_factory=dict)

    def present(self) -> np.ndarray:
        return self.kind > NULL

    def _rows(self, rows: Any) -> np.ndarray:
        m = np.zeros(self.kind.shape[0], dtype=bool)
        if rows is not None and len(rows):
            m[rows] = True
        return m

    def eq(self, x: Any) -> np.ndarray:
        if x is None:
            return self.kind <= NULL
        if isinstance(x, bool):
            return (self.kind == BOOL) & (self.num == float(x))
        if isinstance(x, (int, float)):
            return (self.kind == NUM) & (self.num == float(x))
        if isinstance(x, str):
            j = int(np.searchsorted(self.svals, x)) if self.svals else 0
            if j < len(self.svals) and self.svals[j] == x:
                return self.scode == j
            return np.zeros(self.kind.shape[0], dtype=bool)
        return self._rows(self.whole.get(jkey(x)))

    def range(self, op: str, x: Any) -> np.ndarray:
        if isinstance(x, str):
            cmp = _PYCMP[op]
            ok = [j for j, s in enumerate(self.svals) if cmp(s, x)]
            return np.isin(self.scode, np.asarray(ok, dtype=np.int32)) & (self.kind == STR)
        return (self.kind == NUM) & _RANGE[op](self.num, float(x))

    def contains(self, x: Any) -> np.ndarray:
        m = self._rows(self.elems.get(jkey(x)))
        if isinstance(x, str):
            ok = [j for j, s in enumerate(self.svals) if x in s]
            if ok:
                m |= np.isin(self.scode, np.asarray(ok, dtype=np.int32))
        return m

    def icontains(self, x: str) -> np.ndarray:
        f = x.casefold()
        m = self._rows(self.ielems.get(f))
        ok = [j for j, s in enumerate(self.svals) if f in s.casefold()]
        if ok:
            m |= np.isin(self.scode, np.asarray(ok, dtype=np.int32))
        return m


def _walk(obj: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """The value at ``path``: nested objects key by key, and where a key is missing, a key holding the dots
    itself (``("a", "b")`` finds ``{"a": {"b": v}}``, else ``{"a.b": v}``)."""
    for i, p in enumerate(path):
        if not isinstance(obj, dict):
            return False, None
        if p in obj:
            obj = obj[p]
            continue
        for j in range(len(path), i + 1, -1):  # the longest dotted key first
            key = ".".join(path[i:j])
            if key in obj:
                return _walk(obj[key], path[j:]) if j < len(path) else (True, obj[key])
        return False, None
    return True, obj


def meta_column(seg: Segment, path: tuple[str, ...] | str) -> MetaColumn:
    """The :class:`MetaColumn` of metadata ``path`` in ``seg`` (parsed once per segment and path)."""
    if isinstance(path, str):
        path = tuple(path.split("."))
    ck = ("meta", path)
    col = seg.cache.get(ck)
    if col is not None:
        return col
    n = seg.n_docs
    kind = np.zeros(n, dtype=np.int8)
    num = np.full(n, np.nan)
    strs: list[str] = []
    srows: list[int] = []
    whole: dict[Any, list[int]] = {}
    elems: dict[Any, list[int]] = {}
    ielems: dict[str, list[int]] = {}
    for i, raw in enumerate(seg.meta.tolist()):
        if not raw:
            continue
        found, v = _walk(json.loads(raw), path)
        if not found:
            continue
        if v is None:
            kind[i] = NULL
        elif isinstance(v, bool):
            kind[i], num[i] = BOOL, float(v)
        elif isinstance(v, (int, float)):
            kind[i], num[i] = NUM, float(v)
        elif isinstance(v, str):
            kind[i] = STR
            strs.append(v)
            srows.append(i)
        else:
            kind[i] = LIST if isinstance(v, list) else OBJ
            whole.setdefault(jkey(v), []).append(i)
            if isinstance(v, list):
                for k in {jkey(x) for x in v}:
                    elems.setdefault(k, []).append(i)
                for k in {x.casefold() for x in v if isinstance(x, str)}:
                    ielems.setdefault(k, []).append(i)
    svals = sorted(set(strs))
    scode = np.full(n, -1, dtype=np.int32)
    if srows:
        pos = {s: j for j, s in enumerate(svals)}
        scode[np.asarray(srows, dtype=np.int64)] = np.fromiter((pos[s] for s in strs), np.int32, len(strs))
    arr = (lambda d: {k: np.asarray(r, dtype=np.int64) for k, r in d.items()})
    col = MetaColumn(kind, num, scode, svals, arr(whole), arr(elems), arr(ielems))
    seg.cache[ck] = col
    return col


def with_time_unit(where: Any, time_unit: str | None) -> Any:
    """``where`` (a filter, or a list of them) with every time given as a bare number read in ``time_unit``
    and written as an ISO 8601 string, so that it can travel on without its unit (e.g. through a batcher).

    Raises
    ------
    WhereError
        A time value that cannot be read in that unit.
    """
    from .timeutil import format_time

    if time_unit is None:
        return where
    try:
        check_time_unit(time_unit)
    except ValueError as e:
        raise WhereError(str(e)) from None

    def conv(x: Any, what: str) -> Any:
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            try:
                return format_time(parse_time(x, what, time_unit))
            except RecordError as e:
                raise WhereError(str(e)) from None
        if isinstance(x, (list, tuple)):
            return [conv(y, what) for y in x]
        return x

    def walk(w: Any, what: str) -> Any:
        if isinstance(w, (list, tuple)):
            return [walk(x, f"{what}[{i}]") for i, x in enumerate(w)]
        if not isinstance(w, Mapping):
            return w
        out = {}
        for k, v in w.items():
            if k in ("$and", "$or", "$not"):
                out[k] = walk(v, f"{what}.{k}")
            elif k in _TIMES:
                out[k] = ({op: conv(x, f"{what}[{k!r}]") for op, x in v.items()} if isinstance(v, Mapping)
                          else conv(v, f"{what}[{k!r}]"))
            else:
                out[k] = v
        return out

    return walk(where, "where")
