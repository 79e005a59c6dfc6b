"""``where`` filters: compiled once per query, evaluated per segment into allow masks.

Syntax (conditions on different keys are AND-combined)::

    {"tenant": "acme"}                                    equality
    {"role": {"in": ["user", "assistant"]}}               membership
    {"time": {"gte": "2024-05-01", "lt": "2024-06-01"}}   range (gt, gte, lt, lte; combinable)
    {"importance": {"gte": 0.5}, "type": "fact"}          several fields
    {"metadata.speaker": "Caroline"}                      a metadata key (top level)
    {"metadata": {"speaker": "Caroline", "turn": {"lt": 5}}}   the same, nested form
    {"session": None}                                     the field is absent

Fields: ``id`` (equality and membership only), ``session``, ``role``, ``agent``,
``tenant``, ``type`` (strings; ranges compare code points), ``time`` (values as
records take them: epoch ms, ISO 8601, datetime), ``importance`` (numbers),
``metadata.<key>`` (JSON scalars: a string matches strings, a number numbers, a
bool bools; ranges on numbers or strings). ``text`` cannot be filtered (search it).

**Tenant is a hard boundary.** A ``tenant`` condition must name exactly one
tenant (a string, or ``{"eq": ...}``); membership, ranges or ``None`` on tenant
are refused, so no ``where`` can widen a tenant's search to another tenant. The
tenant's rows are the starting set every other condition narrows (conditions
only ever AND), and :meth:`Memory.search <gpuir.memory.Memory.search>` checks
every hit's tenant again before returning it.

A compiled filter (:class:`Where`) turns into one boolean allow mask per
segment (vectorised over the segment's columns; never a Python loop over
postings or rows), which the search applies before top-k; a time condition
also says which time partitions can hold a match, so the others are never
touched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .columns import Interner
from .records import MISSING_TIME, ROLES, STRING_FIELDS, RecordError, to_epoch_ms
from .segments import Segment, SegView

#: Comparison operators of a condition dict.
OPS = ("eq", "in", "gt", "gte", "lt", "lte")
_RANGE = {"gt": np.greater, "gte": np.greater_equal, "lt": np.less, "lte": np.less_equal}
_FILTERABLE = ("id",) + STRING_FIELDS + ("time", "importance")


class WhereError(ValueError):
    """A malformed ``where``; the message names the key and the fix."""


@dataclass
class Cond:
    """One field's condition: ``ops`` maps operator -> value(s), all AND-ed.

    For ``eq``, ``in``: a tuple of accepted values (``None`` = absent).
    """

    field: str
    key: str | None
    ops: dict[str, Any]


@dataclass
class Where:
    """A compiled ``where``.

    Attributes
    ----------
    conds : list of Cond
    tenant : str or None
        The tenant this search is confined to.
    time_lo, time_hi : int or None
        Inclusive epoch-ms bounds implied by the time conditions (None = open).
    timed_only : bool
        Records without a time cannot match (a time condition other than ``None``).
    untimed_only : bool
        Only records without a time can match (``{"time": None}``).
    """

    conds: list[Cond] = field(default_factory=list)
    tenant: str | None = None
    time_lo: int | None = None
    time_hi: int | None = None
    timed_only: bool = False
    untimed_only: bool = False

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
            return seg.time_min is None or bool(np.any(seg.time == MISSING_TIME))
        return (self.time_hi is None or seg.time_min <= self.time_hi) and (
            self.time_lo is None or seg.time_max >= self.time_lo)  # type: ignore[operator]

    # ---------------------------------------------------------------- masks
    def mask(self, view: SegView, dicts: dict[str, Interner]) -> np.ndarray:
        """Rows of ``view`` that are live and pass every condition.

        Returns
        -------
        ndarray, shape (n,), bool, host
        """
        seg = view.seg
        m = np.ones(seg.n_docs, dtype=bool) if view.live is None else view.live.copy()
        if not self.may_match_segment(seg):
            m[:] = False
            return m
        for c in self.conds:
            if not m.any():
                break
            m &= _cond_mask(c, seg, dicts)
        return m


# --------------------------------------------------------------------------- compile


def compile_where(where: Mapping[str, Any] | None, dicts: dict[str, Interner], what: str = "where") -> Where | None:
    """Check and compile one ``where`` dict (None -> None).

    Raises
    ------
    WhereError
        Unknown field or operator, wrong value type, a tenant that is not one string.
    """
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise WhereError(f"{what} must be a dict (a JSON object) of conditions, got {type(where).__name__}")
    out = Where()
    items: list[tuple[str, str | None, Any]] = []
    for k, v in where.items():
        if not isinstance(k, str):
            raise WhereError(f"{what}: keys must be field names (strings), got {k!r}")
        if k == "metadata":
            if not isinstance(v, Mapping) or not v:
                raise WhereError(f'{what}: "metadata" takes a non-empty dict of key -> condition, e.g. '
                                 '{"metadata": {"speaker": "Caroline"}}')
            for mk, mv in v.items():
                if not isinstance(mk, str):
                    raise WhereError(f"{what}: metadata keys must be strings, got {mk!r}")
                items.append(("metadata", mk, mv))
        elif k.startswith("metadata."):
            if len(k) == len("metadata."):
                raise WhereError(f'{what}: "metadata." needs a key after the dot, e.g. "metadata.speaker"')
            items.append(("metadata", k[len("metadata."):], v))
        elif k in _FILTERABLE:
            items.append((k, None, v))
        elif k == "text":
            raise WhereError(f"{what}: 'text' cannot be filtered; put the words in the query")
        else:
            raise WhereError(f"{what}: unknown field {k!r}; filter on {', '.join(_FILTERABLE)} or 'metadata.<key>'")
    for fld, key, v in items:
        name = f"metadata.{key}" if key is not None else fld
        if fld == "tenant":
            one = v.get("eq") if isinstance(v, Mapping) and set(v) == {"eq"} else v
            if not isinstance(one, str):
                raise WhereError(
                    f"{what}: tenant is a hard boundary: name exactly one tenant as a string, e.g. "
                    f'{{"tenant": "acme"}} (got {json.dumps(v, default=str)}); search tenants one at a time'
                )
            out.tenant = one
            out.conds.insert(0, Cond("tenant", None, {"eq": (one,)}))  # first; every other condition narrows it
            continue
        ops = _ops(v, f"{what}[{name!r}]")
        c = Cond(fld, key, {})
        for op, val in ops.items():
            c.ops[op] = _check_value(fld, op, val, f"{what}[{name!r}]")
        if fld == "time":
            _time_bounds(out, c)
        out.conds.append(c)
    return out


def compile_wheres(where: Any, n_queries: int, dicts: dict[str, Interner]) -> list[Where | None]:
    """One compiled filter per query from ``where``: None, one dict for all, or a list of n_queries."""
    if where is None:
        return [None] * n_queries
    if isinstance(where, Mapping):
        w = compile_where(where, dicts)
        return [w] * n_queries
    if isinstance(where, Sequence) and not isinstance(where, (str, bytes)):
        if len(where) != n_queries:
            raise WhereError(f"where has {len(where)} entries for {n_queries} queries: give one dict (or None) "
                             "per query, or a single dict for all")
        return [compile_where(w, dicts, f"where[{i}]") for i, w in enumerate(where)]
    raise WhereError(f"where must be None, a dict, or a list of dicts (one per query), got {type(where).__name__}")


def _ops(v: Any, what: str) -> dict[str, Any]:
    if isinstance(v, Mapping):
        if not v:
            raise WhereError(f"{what}: an empty condition; use a value or {{op: value}} with op in {', '.join(OPS)}")
        bad = [k for k in v if k not in OPS]
        if bad:
            raise WhereError(f"{what}: unknown operator {bad[0]!r}; use {', '.join(OPS)}")
        return dict(v)
    if isinstance(v, (list, tuple, set)):
        raise WhereError(f'{what}: a list is ambiguous; for membership write {{"in": [...]}}')
    return {"eq": v}


def _check_value(fld: str, op: str, val: Any, what: str) -> Any:
    """Validate and convert a condition's value(s): a tuple for eq/in, one value for ranges."""
    if op == "in":
        if not isinstance(val, (list, tuple)):
            raise WhereError(f'{what}: "in" takes a list of values, got {type(val).__name__}')
        vals = list(val)
    elif op == "eq":
        vals = [val]
    else:
        if val is None:
            raise WhereError(f"{what}: {op!r} needs a value, got null")
        if fld in ("id", "role"):
            raise WhereError(f"{what}: {fld} takes equality and membership only, not {op!r}")
        return _scalar(fld, val, what, ranged=True)
    return tuple(_scalar(fld, x, what, ranged=False) for x in vals)


def _scalar(fld: str, x: Any, what: str, ranged: bool) -> Any:
    if x is None:
        if fld == "id":
            raise WhereError(f"{what}: every record has an id; null never matches")
        return None
    if fld in ("id",) + STRING_FIELDS:
        if not isinstance(x, str):
            raise WhereError(f"{what}: {fld} values are strings, got {type(x).__name__} {x!r}")
        if fld == "role" and x not in ROLES:
            raise WhereError(f"{what}: role {x!r} is not one of {', '.join(ROLES)}")
        return x
    if fld == "time":
        try:
            return to_epoch_ms(x, f"{what} value")
        except RecordError as e:
            raise WhereError(str(e)) from None
    if fld == "importance":
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise WhereError(f"{what}: importance values are finite numbers, got {x!r}")
        return float(x)
    # metadata: JSON scalars
    if isinstance(x, bool):
        if ranged:
            raise WhereError(f"{what}: a range needs a number or a string, got {x!r}")
        return x
    if isinstance(x, (int, float)):
        if not math.isfinite(x):
            raise WhereError(f"{what}: numbers must be finite, got {x!r}")
        return x
    if isinstance(x, str):
        return x
    raise WhereError(f"{what}: metadata values in conditions are strings, numbers, booleans or null, "
                     f"got {type(x).__name__}")


def _time_bounds(out: Where, c: Cond) -> None:
    for op, val in c.ops.items():
        if op in ("eq", "in"):
            timed = [v for v in val if v is not None]
            if len(timed) < len(val):  # null accepted: untimed records can match
                if not timed:
                    out.untimed_only = True
                    continue
                continue  # mixed: no partition bound from this operator
            out.timed_only = True
            if timed:
                lo, hi = min(timed), max(timed)
                out.time_lo = lo if out.time_lo is None else max(out.time_lo, lo)
                out.time_hi = hi if out.time_hi is None else min(out.time_hi, hi)
            else:  # {"in": []}
                out.time_lo, out.time_hi = 1, 0
        else:
            out.timed_only = True
            lo = {"gt": val + 1, "gte": val}.get(op)
            hi = {"lt": val - 1, "lte": val}.get(op)
            if lo is not None:
                out.time_lo = lo if out.time_lo is None else max(out.time_lo, lo)
            if hi is not None:
                out.time_hi = hi if out.time_hi is None else min(out.time_hi, hi)


# --------------------------------------------------------------------------- evaluation


def _cond_mask(c: Cond, seg: Segment, dicts: dict[str, Interner]) -> np.ndarray:
    n = seg.n_docs
    m = np.ones(n, dtype=bool)
    for op, val in c.ops.items():
        if c.field == "metadata":
            m &= _meta_mask(seg, c.key, op, val)  # type: ignore[arg-type]
        elif c.field == "id":
            m &= _id_mask(seg, val)
        elif c.field in STRING_FIELDS:
            m &= _string_mask(seg, c.field, op, val, dicts[c.field])
        else:
            col = seg.time if c.field == "time" else seg.importance
            missing = (col == MISSING_TIME) if c.field == "time" else np.isnan(col)
            if op in ("eq", "in"):
                hit = np.isin(col, np.asarray([v for v in val if v is not None], dtype=col.dtype))
                hit &= ~missing
                if any(v is None for v in val):
                    hit |= missing
                m &= hit
            else:
                m &= _RANGE[op](col, val) & ~missing
    return m


def _string_mask(seg: Segment, fld: str, op: str, val: Any, interner: Interner) -> np.ndarray:
    n = seg.n_docs
    if op in ("eq", "in"):
        found = {-1 if v is None else interner.lookup(v) for v in val}
        # an unknown value (lookup -1) must not match the absent rows (code -1)
        wanted = sorted(c for c in found if c >= 0) + ([-1] if any(v is None for v in val) else [])
    else:
        cmp: Callable[[str], bool] = {"gt": lambda s: s > val, "gte": lambda s: s >= val,
                                      "lt": lambda s: s < val, "lte": lambda s: s <= val}[op]
        wanted = [i for i, s in enumerate(list(interner.values)) if cmp(s)]
    m = np.zeros(n, dtype=bool)
    if wanted:
        m[seg.rows_with_codes(fld, np.asarray(wanted, dtype=np.int64))] = True
    return m


def _id_mask(seg: Segment, val: tuple) -> np.ndarray:
    idx = seg.cache.get("id_index")
    if idx is None:
        idx = {s: i for i, s in enumerate(seg.ids.tolist())}
        seg.cache["id_index"] = idx
    m = np.zeros(seg.n_docs, dtype=bool)
    rows = [r for r in (idx.get(v) for v in val) if r is not None]
    if rows:
        m[np.asarray(rows, dtype=np.int64)] = True
    return m


#: Kinds of a metadata value in a :class:`MetaColumn`.
_ABSENT, _STR, _NUM, _BOOL, _NULL, _OTHER = range(6)


@dataclass
class MetaColumn:
    """One metadata key of one segment, as columns (built on first use, cached).

    Attributes
    ----------
    kind : ndarray (n,), int8: absent, str, number, bool, null or other (list/object)
    num : ndarray (n,), float64: numbers and bools (0/1); NaN otherwise
    scode : ndarray (n,), int32: index into ``svals`` for strings; -1 otherwise
    svals : list of str, sorted
    """

    kind: np.ndarray
    num: np.ndarray
    scode: np.ndarray
    svals: list[str]


def meta_column(seg: Segment, key: str) -> MetaColumn:
    """The :class:`MetaColumn` of ``key`` in ``seg`` (parsed once per segment and key)."""
    ck = ("meta", key)
    col = seg.cache.get(ck)
    if col is not None:
        return col
    n = seg.n_docs
    kind = np.zeros(n, dtype=np.int8)
    num = np.full(n, np.nan)
    strs: list[str] = []
    srows: list[int] = []
    for i, raw in enumerate(seg.meta.tolist()):
        if not raw:
            continue
        obj = json.loads(raw)
        if key not in obj:
            continue
        v = obj[key]
        if isinstance(v, bool):
            kind[i], num[i] = _BOOL, float(v)
        elif isinstance(v, (int, float)):
            kind[i], num[i] = _NUM, float(v)
        elif isinstance(v, str):
            kind[i] = _STR
            strs.append(v)
            srows.append(i)
        elif v is None:
            kind[i] = _NULL
        else:
            kind[i] = _OTHER
    svals = sorted(set(strs))
    scode = np.full(n, -1, dtype=np.int32)
    if srows:
        pos = {s: j for j, s in enumerate(svals)}
        scode[np.asarray(srows, dtype=np.int64)] = np.fromiter((pos[s] for s in strs), np.int32, len(strs))
    col = MetaColumn(kind, num, scode, svals)
    seg.cache[ck] = col
    return col


def _meta_mask(seg: Segment, key: str, op: str, val: Any) -> np.ndarray:
    col = meta_column(seg, key)
    if op in ("eq", "in"):
        m = np.zeros(seg.n_docs, dtype=bool)
        for v in val:
            if v is None:
                m |= (col.kind == _ABSENT) | (col.kind == _NULL)
            elif isinstance(v, bool):
                m |= (col.kind == _BOOL) & (col.num == float(v))
            elif isinstance(v, (int, float)):
                m |= (col.kind == _NUM) & (col.num == float(v))
            else:
                j = int(np.searchsorted(col.svals, v)) if col.svals else 0
                if j < len(col.svals) and col.svals[j] == v:
                    m |= col.scode == j
        return m
    if isinstance(val, str):
        ok = [j for j, s in enumerate(col.svals) if bool(_RANGE[op](s, val))]
        return np.isin(col.scode, np.asarray(ok, dtype=np.int32)) & (col.kind == _STR)
    return (col.kind == _NUM) & _RANGE[op](col.num, float(val))
