"""The filter language (gpuir.memory.where) against a brute-force Python evaluation of its documented
semantics, over random records with list-valued, nested, null and mixed-type metadata: every operator
(eq ne in nin gt gte lt lte contains exists), every field, dotted paths, $and/$or/$not nested, one and
many segments and time partitions; plus the shapes that must be errors, the tenant boundary under
$or/$not, and compiling once per distinct filter. Seeded random generator (hypothesis is not
installed here): a failure replays exactly."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest

from gpuir import Memory
from gpuir.memory import WhereError
from gpuir.memory.where import compile_where

WORDS = ["apple", "banana", "cherry", "delta", "echo"]
TAGS = ["travel", "food", "work", 1, 2.5, True, None]
FIELDS_STR = ("session", "agent", "type")
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)
MISSING = object()


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def ms_of(s: str) -> int:
    dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return round(dt.timestamp() * 1000)


T0_MS = ms_of(T0.isoformat())
DAY = 86_400_000
T_EXPIRE = T0_MS + 2000 * 365 * DAY  # a time past every expires_at below: those records are hidden then


def random_record(rng: np.random.Generator, i: int) -> dict:
    rec: dict = {"id": f"r{i:03d}", "text": "common " + " ".join(rng.choice(WORDS, size=int(rng.integers(0, 4))))}
    if rng.random() < 0.8:
        rec["tenant"] = str(rng.choice(["acme", "globex"]))
    for f in FIELDS_STR:
        if rng.random() < 0.6:
            rec[f] = str(rng.choice(["a", "b", "c", "ab"]))
    if rng.random() < 0.7:
        rec["role"] = str(rng.choice(["user", "assistant", "tool"]))
    if rng.random() < 0.8:
        rec["time"] = iso(T0_MS + int(rng.integers(0, 6)) * DAY + int(rng.integers(0, 3)) * 1000)
    if rng.random() < 0.3:
        rec["expires_at"] = iso(T0_MS + 1000 * DAY * 365)  # far in the future: present, never expired
    if rng.random() < 0.6:
        rec["importance"] = float(rng.choice([0.0, 0.5, 1.0, 2.25]))
    if rng.random() < 0.85:
        meta: dict = {}
        r = rng.random
        if r() < 0.6:
            meta["s"] = str(rng.choice(["x", "y", "xy", "Yz"]))
        if r() < 0.6:
            meta["n"] = [0, 1, 2, 2.5, -1][int(rng.integers(0, 5))]
        if r() < 0.3:
            meta["flag"] = bool(r() < 0.5)
        if r() < 0.5:
            meta["tags"] = [TAGS[int(j)] for j in rng.integers(0, len(TAGS), size=int(rng.integers(0, 4)))]
        if r() < 0.4:  # one key holding a string, a number, a list, an object or null, by record
            meta["mixed"] = [None, "x", 1, ["x"], {"k": 1}, True][int(rng.integers(0, 6))]
        if r() < 0.5:
            obj: dict = {}
            if r() < 0.7:
                obj["k"] = str(rng.choice(["u", "v"])) if r() < 0.5 else int(rng.integers(0, 3))
            if r() < 0.3:
                obj["deep"] = {"z": int(rng.integers(0, 2))}
            meta["obj"] = obj
        if meta or r() < 0.5:
            rec["metadata"] = meta
    return rec


# --------------------------------------------------------------------------- the brute-force reference


def field_value(rec: dict, field: str):
    """The record's value of a filter field (MISSING when absent); times as epoch ms."""
    if field.startswith("metadata."):
        v = rec.get("metadata", MISSING)
        for part in field[len("metadata."):].split("."):
            if not isinstance(v, dict) or part not in v:
                return MISSING
            v = v[part]
        return v
    v = rec.get(field, MISSING)
    if field in ("time", "expires_at") and isinstance(v, str):
        return ms_of(v)
    return v


def present(v) -> bool:
    return v is not MISSING and v is not None


def json_eq(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
            json_eq(x, y) for x, y in zip(a, b))
    return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
        json_eq(a[k], b[k]) for k in a)


def op_holds(v, op: str, x, field: str) -> bool:
    if field in ("time", "expires_at") and op not in ("exists",):
        x = [None if y is None else ms_of(y) for y in x] if op in ("in", "nin") else (
            None if x is None else ms_of(x))
    if op == "eq":
        return (not present(v)) if x is None else (present(v) and json_eq(v, x))
    if op == "ne":
        return not op_holds(v, "eq", x, "")
    if op == "in":
        return any(op_holds(v, "eq", y, "") for y in x)
    if op == "nin":
        return not op_holds(v, "in", x, "")
    if op == "exists":
        return present(v) == x
    if op == "contains":
        return (isinstance(v, list) and any(json_eq(e, x) for e in v)) or (
            isinstance(v, str) and isinstance(x, str) and x in v)
    if op == "icontains":
        return (isinstance(v, list) and any(isinstance(e, str) and e.lower() == x.lower() for e in v)) or (
            isinstance(v, str) and x.lower() in v.lower())
    # ranges: present, of the same kind
    if not present(v) or isinstance(v, bool):
        return False
    num = isinstance(v, (int, float)) and isinstance(x, (int, float))
    if not (num or (isinstance(v, str) and isinstance(x, str))):
        return False
    return {"gt": v > x, "gte": v >= x, "lt": v < x, "lte": v <= x}[op]


def matches(rec: dict, where: dict) -> bool:
    for k, c in where.items():
        if k == "$and":
            ok = all(matches(rec, w) for w in c)
        elif k == "$or":
            ok = any(matches(rec, w) for w in c)
        elif k == "$not":
            ok = not matches(rec, c)
        elif k == "metadata":
            ok = all(matches(rec, {f"metadata.{mk}": mc}) for mk, mc in c.items())
        else:
            ops = c if isinstance(c, dict) and c and all(str(o).lstrip("$") in OPS for o in c) else {"eq": c}
            v = field_value(rec, k)
            ok = all(op_holds(v, str(o).lstrip("$"), x, k) for o, x in ops.items())
        if not ok:
            return False
    return True


OPS = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "contains", "icontains", "exists")

# --------------------------------------------------------------------------- random filters

META = ["metadata.s", "metadata.n", "metadata.flag", "metadata.tags", "metadata.mixed", "metadata.obj",
        "metadata.obj.k", "metadata.obj.deep.z", "metadata.nope"]


def pool(field: str, rng) -> list:
    """Values to compare ``field`` with (mostly ones the records hold, so that filters match)."""
    if field == "id":
        return [f"r{i:03d}" for i in range(0, 40, 3)] + ["r0", "zz"]
    if field == "text":
        return ["common apple", "apple", "an", "common"]
    if field == "role":
        return ["user", "assistant", "tool", "system"]
    if field in FIELDS_STR:
        return ["a", "b", "ab", "zz"]
    if field in ("time", "expires_at"):
        return [iso(T0_MS + d * DAY + s * 1000) for d in range(-1, 7) for s in (0, 1)]
    if field == "importance":
        return [0.0, 0.5, 1, 2.25, 3]
    return ["x", "y", "xy", "Y", 0, 1, 2, 2.5, -1, 1.0, True, False, "travel", "food", "u", "v",
            ["x"], {"k": 1}, ["travel"], {"z": 0}, [], 2.25]


def random_cond(rng, field: str):
    p = pool(field, rng)
    pick = (lambda: p[int(rng.integers(0, len(p)))])
    kinds = ["eq", "ne", "in", "nin", "exists"]
    if field != "role":
        kinds += ["gt", "gte", "lt", "lte"]
    if field not in ("role", "time", "expires_at", "importance"):
        kinds += ["contains", "icontains"]
    op = kinds[int(rng.integers(0, len(kinds)))]
    if op == "exists":
        if field in ("id", "text"):
            op = "eq"
        else:
            return {"exists": bool(rng.random() < 0.5)}
    if op in ("in", "nin"):
        vals = [pick() for _ in range(int(rng.integers(0, 4)))]
        if field not in ("id", "text") and rng.random() < 0.2:
            vals.append(None)
        return {op: vals}
    x = pick()
    if op in ("gt", "gte", "lt", "lte"):
        while isinstance(x, (bool, list, dict)) or x is None:
            x = pick()
        if field in ("session", "agent", "type", "id", "text") and not isinstance(x, str):
            x = "b"
        if field == "importance" and not isinstance(x, (int, float)):
            x = 1
    if op == "contains" and (x is None or (field in ("id", "text", *FIELDS_STR) and not isinstance(x, str))):
        x = "a"
    if op == "icontains":
        x = x if isinstance(x, str) else "A"
        x = x.upper() if rng.random() < 0.5 else x
    if op in ("eq", "ne") and rng.random() < 0.1 and field not in ("id", "text"):
        x = None
    if op == "eq" and rng.random() < 0.4 and not isinstance(x, (list, dict)):
        return x  # the shorthand
    return {op: x}


def random_where(rng, depth: int = 0) -> dict:
    w: dict = {}
    for _ in range(int(rng.integers(1, 3))):
        r = rng.random()
        if depth < 2 and r < 0.15:
            w["$or"] = [random_where(rng, depth + 1) for _ in range(int(rng.integers(1, 4)))]
        elif depth < 2 and r < 0.25:
            w["$not"] = random_where(rng, depth + 1)
        elif depth < 2 and r < 0.3:
            w["$and"] = [random_where(rng, depth + 1) for _ in range(int(rng.integers(1, 3)))]
        else:
            fields = ["id", "text", "role", *FIELDS_STR, "time", "expires_at", "importance", *META]
            f = fields[int(rng.integers(0, len(fields)))]
            w[f] = random_cond(rng, f)
    return w


@pytest.fixture(scope="module")
def memory_and_records():
    rng = np.random.default_rng(2024)
    recs = [random_record(rng, i) for i in range(240)]
    m = Memory(partition_days=1, merge_factor=3, merge_min=8)
    for s in range(0, len(recs), 17):  # many segments and partitions
        m.add(recs[s: s + 17])
    m.delete([r["id"] for r in recs[::11]])
    live = [r for r in recs if r["id"] not in {x["id"] for x in recs[::11]}]
    return m, live


@pytest.mark.parametrize("seed", range(6))
def test_every_operator_matches_a_brute_force_evaluation(memory_and_records, seed):
    m, live = memory_and_records
    rng = np.random.default_rng([7, seed])
    nonempty = total = 0
    ops_seen: set[str] = set()
    for _ in range(120):
        w = random_where(rng)
        if rng.random() < 0.3:
            w["tenant"] = str(rng.choice(["acme", "globex"]))
        want = sorted(r["id"] for r in live if matches(r, w))
        got = sorted(r["id"] for r in m.list(where=w, limit=1000).records)
        assert got == want, f"where={w}"
        assert m.count(where=w) == len(want)
        cw = compile_where(w, time_unit="ms")
        snap = m.snapshot()
        for expire in (None, T_EXPIRE):  # rows() (a tenant's rows first) against mask(), also hiding expired records
            for v in snap.views:
                rows = cw.at(expire).rows(v, snap.dicts)
                assert rows.dtype == np.int64
                np.testing.assert_array_equal(rows, np.flatnonzero(cw.at(expire).mask(v, snap.dicts)),
                                              err_msg=f"where={w} expire={expire}")
        if rng.random() < 0.25:  # the same filter in a search (partition pruning included)
            res = m.search("common", k=1000, where=w, mode=str(rng.choice(["exhaustive", "newest"])))
            assert sorted(res.ids(0)) == want, f"search where={w}"
        nonempty += bool(want)
        total += 1
        for token in str(w).replace("'", " ").split():
            if token.rstrip(":") in OPS or token.rstrip(":") in ("$or", "$not", "$and"):
                ops_seen.add(token.rstrip(":"))
    assert nonempty > total // 3, "the filters must not be vacuous"
    assert {"ne", "in", "nin", "gt", "lte", "contains", "exists", "$or", "$not"} <= ops_seen


def test_list_valued_and_nested_metadata_match_as_documented():
    m = Memory()
    m.add([
        {"id": "a", "text": "t", "metadata": {"tags": ["travel", "food"], "place": {"city": "Paris", "n": 2}}},
        {"id": "b", "text": "t", "metadata": {"tags": ["work"], "place": {"city": "Rome"}, "note": "travel plans"}},
        {"id": "c", "text": "t", "metadata": {"tags": "travel", "place": ["Paris"]}},
        {"id": "d", "text": "t", "metadata": {"tags": [1, True, None]}},
    ])
    ids = (lambda w: sorted(r["id"] for r in m.list(where=w).records))
    assert ids({"metadata.tags": {"contains": "travel"}}) == ["a", "c"]  # an element, or a substring
    assert ids({"metadata.note": {"contains": "travel"}}) == ["b"]
    assert ids({"metadata.tags": {"eq": ["travel", "food"]}}) == ["a"]  # the whole list
    assert ids({"metadata.tags": "travel"}) == ["c"]  # eq compares the whole value: not an element
    assert ids({"metadata.tags": {"contains": 1}}) == ["d"] and ids({"metadata.tags": {"contains": True}}) == ["d"]
    assert ids({"metadata.tags": {"contains": 1.0}}) == ["d"], "JSON numbers: 1 and 1.0 are one value"
    assert ids({"metadata.tags": {"eq": [1.0, True, None]}}) == ["d"]
    assert ids({"metadata.tags": {"eq": [True, True, None]}}) == [], "a bool is not the number 1"
    assert ids({"metadata.place.city": "Paris"}) == ["a"]  # a path walks objects only, never lists
    assert ids({"metadata": {"place.city": {"in": ["Rome", "Oslo"]}}}) == ["b"]
    assert ids({"metadata.place.n": {"gte": 2}}) == ["a"]
    assert ids({"metadata.place": {"eq": {"n": 2, "city": "Paris"}}}) == ["a"]
    assert ids({"metadata.place.city": {"exists": False}}) == ["c", "d"]
    assert ids({"$or": [{"metadata.tags": {"contains": "work"}}, {"metadata.place": {"contains": "Paris"}}]}) == [
        "b", "c"]
    assert ids({"$not": {"metadata.tags": {"contains": "travel"}}}) == ["b", "d"]


@pytest.mark.parametrize("where, message", [
    ({"metadata.tags": ["a"]}, "a list is ambiguous"),
    ({"metadata.n": {"gt": True}}, "a range needs a number or a string"),
    ({"metadata.n": {"gt": [1]}}, "a range needs a number or a string"),
    ({"metadata.n": {"contains": None}}, "'contains' needs a value"),
    ({"metadata.n": {"in": 3}}, '"in" takes a list'),
    ({"metadata.n": {"between": [1, 2]}}, "unknown operator 'between'"),
    ({"metadata.n": {"gt": float("nan")}}, "numbers must be finite"),
    ({"time": {"gt": 1714521600}}, "give its unit"),
    ({"session": {"contains": 3}}, "session values are strings"),
    ({"$or": [{"tenant": "acme"}, {"role": "user"}]}, "cannot stand under $or or $not"),
    ({"$not": {"tenant": "acme"}}, "cannot stand under $or or $not"),
    ({"tenant": "acme", "$and": [{"tenant": "globex"}]}, "names two tenants"),
    ({"tenant": {"ne": "acme"}}, "tenant is a hard boundary"),
    ({"metadata.\u0000expires_at": 1}, "filter on the field 'expires_at'"),
])
def test_unsupported_shapes_are_errors(where, message):
    m = Memory()
    m.add([{"id": "a", "text": "t", "tenant": "acme"}])
    for call in (lambda: m.list(where=where), lambda: m.count(where=where), lambda: m.search("t", where=where)):
        with pytest.raises(WhereError) as ei:
            call()
        assert message in str(ei.value)


def test_tenant_inside_top_level_and_is_the_boundary():
    m = Memory()
    m.add([{"id": "a", "text": "t", "tenant": "acme", "role": "user"},
           {"id": "b", "text": "t", "tenant": "globex", "role": "user"}])
    w = {"$and": [{"tenant": "acme"}, {"$or": [{"role": "user"}, {"role": "tool"}]}]}
    assert [h["id"] for h in m.search("t", where=w).hits(0)] == ["a"]
    assert compile_where(w).tenant == "acme"
    # a $not can never reach another tenant: it only narrows the tenant's rows
    assert m.search("t", where={"tenant": "acme", "$not": {"role": "tool"}}).ids(0) == ["a"]


def test_a_filter_is_compiled_once():
    w = {"$or": [{"role": "user"}, {"metadata.tags": {"contains": "x"}}], "time": {"gte": "2024-01-01"}}
    a = compile_where(w)
    b = compile_where({"time": {"gte": "2024-01-01"}, "$or": [{"role": "user"}, {"metadata.tags": {"contains": "x"}}]})
    assert a is b, "the same filter (in any key order) compiles once"
    assert compile_where(w, time_unit="ms") is not a  # another time unit is another filter


def test_partition_bounds_come_only_from_top_level_time_clauses():
    m = Memory(partition_days=1)
    m.add([{"id": "old", "text": "t", "time": "2024-01-01"}, {"id": "new", "text": "t", "time": "2024-06-01"},
           {"id": "none", "text": "t"}])
    w = {"$or": [{"time": {"lt": "2024-02-01"}}, {"time": {"exists": False}}]}
    assert sorted(m.search("t", where=w).ids(0)) == ["none", "old"]
    res = m.search("t", where={"time": {"gte": "2024-05-01"}})
    assert res.ids(0) == ["new"] and res.meta["partitions_scanned"][0] == 1
    assert sorted(m.search("t", where={"$not": {"time": {"gte": "2024-05-01"}}}).ids(0)) == ["none", "old"]


# --------------------------------------------------------------------------- issue 37: mem0's words


def test_icontains_ignores_case_on_strings_lists_and_fields():
    m = Memory()
    m.add([{"id": "a", "text": "Trip to PARIS", "agent": "Planner", "metadata": {"tags": ["Travel"], "note": "Big Day"}},
           {"id": "b", "text": "trip to rome", "agent": "coder", "metadata": {"tags": ["work"], "note": "small"}}])
    assert m.count({"text": {"icontains": "paris"}}) == 1
    assert m.count({"text": {"contains": "paris"}}) == 0  # contains stays case-sensitive
    assert m.count({"agent": {"icontains": "PLAN"}}) == 1
    assert m.count({"metadata.tags": {"icontains": "travel"}}) == 1
    assert m.count({"metadata.tags": {"icontains": "trav"}}) == 0  # a list element is matched whole
    assert m.count({"metadata.note": {"icontains": "big d"}}) == 1
    with pytest.raises(WhereError, match="icontains.*takes a string"):
        m.count({"metadata.note": {"icontains": 3}})
    with pytest.raises(WhereError, match="icontains"):
        m.count({"importance": {"icontains": "x"}})


def test_a_star_is_refused_not_silently_empty():
    m = Memory()
    m.add([{"id": "a", "text": "x", "agent": "bot"}, {"id": "b", "text": "y"}])
    for fld in ("agent", "session", "type"):
        with pytest.raises(WhereError, match="not a wildcard here.*exists"):
            m.count({fld: "*"})
    assert m.count({"agent": {"exists": True}}) == 1  # what the error tells to write
    assert m.count({"agent": {"in": ["*"]}}) == 0  # the literal value, asked on purpose


def test_metadata_keys_holding_a_dot_can_be_named():
    m = Memory()
    m.add([{"id": "a", "text": "x", "metadata": {"app.version": "1.2", "a": {"b.c": 1}}},
           {"id": "b", "text": "y", "metadata": {"app": {"version": "2.0"}}},
           {"id": "c", "text": "z", "metadata": {"app.version": "3", "app": {"version": "4"}}}])
    assert m.count({"metadata.app.version": "1.2"}) == 1
    assert m.count({"metadata": {"app.version": "2.0"}}) == 1
    assert m.count({"metadata.a.b.c": 1}) == 1
    # the nested object wins where both exist
    assert m.count({"metadata.app.version": "4"}) == 1 and m.count({"metadata.app.version": "3"}) == 0
