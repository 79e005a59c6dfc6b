"""One interface (gpuir.memory.protocol.MemoryAPI): the same API test bodies on a ``Memory`` and on a
``ShardedMemory`` over Ray (2 shards, route "tenant", loopback only, small data), so a feature of the
memory that the sharded memory lacks fails here. One Ray runtime for the module (its start is slow):
4 logical CPUs and one *pretend* GPU (``num_gpus=1`` on a machine without one), which the last test uses to check
that a shard per GPU asks Ray for one GPU of its own.
"""

from __future__ import annotations

import os
import time

# read by Ray when it is imported: set before the import below, so this process's runtime stays on loopback
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import numpy as np
import pytest
from _helpers import without_times

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gpuir[ray]')")

from gpuir import Memory
from gpuir.cluster import ShardedMemory, runtime
from gpuir.memory import RecordError, ScopeError, UnknownIdError, WhereError
from gpuir.memory.protocol import MemoryAPI, shard_list

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rt():
    # 4 logical CPUs: two 2-shard memories at once (a shard asks for one); the machine may have fewer cores
    started = runtime.connect(None, num_cpus=4, num_gpus=1)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(params=["memory", "sharded"])
def make(request, tmp_path, rt):
    """A factory of empty memories of one kind (closed at the end of the test)."""
    made = []

    def new(**opts):
        n = len(made)
        if request.param == "memory":
            m = Memory(**opts)
        else:
            m = ShardedMemory.create(tmp_path / f"sm{n}", shards=2, route="tenant", device="cpu", **opts)
        made.append(m)
        return m

    def reopen(m):
        """``m`` closed, then opened again from its directory (a Memory is saved to one first)."""
        if request.param == "memory":
            path = tmp_path / f"saved{len(made)}"
            m.save(path)
            m.close()
            again = Memory.open(path)
        else:
            m.close()
            again = ShardedMemory.open(m.path)
        made.append(again)
        return again

    new.kind = request.param
    new.reopen = reopen
    yield new
    for m in made:
        m.close()


RECS = [
    {"id": "a1", "text": "Caroline went to the support group on Tuesday", "tenant": "t1",
     "time": "2023-05-08T10:00:00Z", "metadata": {"speaker": "Caroline"}},
    {"id": "a2", "text": "Melanie painted a sunrise over the lake", "tenant": "t1", "time": "2023-05-09T10:00:00Z",
     "metadata": {"speaker": "Melanie"}},
    {"id": "b1", "text": "The support group met again", "tenant": "t2", "time": "2023-06-01T10:00:00Z"},
    {"id": "b2", "text": "a walk by the lake with the dog", "tenant": "t2"},
    {"id": "b3", "text": "a walk by the lake with the dog", "tenant": "t2", "time": "2023-07-01T10:00:00Z"},
    {"id": "c1", "text": "camping trip with the kids, lake and stars", "tenant": "t3", "time": "2023-04-01T00:00:00Z"},
]


def test_both_implement_the_protocol(make):
    m = make()
    assert isinstance(m, MemoryAPI)
    assert m.sharded == (make.kind == "sharded")
    shards = shard_list(m)
    assert (shards is None) == (make.kind == "memory")
    if shards is not None:
        assert [s["shard"] for s in shards] == [0, 1]


def test_add_get_count_and_refusals(make):
    m = make()
    assert m.add(RECS) == len(RECS) == len(m)
    assert "a1" in m and "zz" not in m
    got = m.get(["b1", "a1"])
    assert [r["id"] for r in got] == ["b1", "a1"] and got[1]["metadata"] == {"speaker": "Caroline"}
    assert got[1]["time"].startswith("2023-05-08T10:00:00")
    with pytest.raises(UnknownIdError):
        m.get(["nope"])
    assert m.get(["nope", "a2"], missing_ok=True)[0] is None
    with pytest.raises(RecordError):  # an id that exists: nothing of the batch is added
        m.add([{"id": "new1", "text": "x", "tenant": "t1"}, {"id": "a1", "text": "again", "tenant": "t1"}])
    assert "new1" not in m and len(m) == len(RECS)
    assert m.count({"tenant": "t2"}) == 3 and m.count({"tenant": "t1"}) == 2


def test_search_rules(make):
    m = make()
    m.add(RECS)
    res = m.search(["support group", "lake walk dog"], k=3)
    assert res.ids(0)[:2] == ["b1", "a1"]  # the shorter record scores higher
    assert res.scores.dtype == np.float32 and res.seqs.dtype == np.int64
    # equal scores: add order ("oldest"), or the later time first ("newest"; b2 has no time: after b3)
    assert res.ids(1)[:2] == ["b2", "b3"]
    assert m.search("lake walk dog", k=2, ties="newest").ids(0) == ["b3", "b2"]
    assert m.search("support group", k=5, where={"tenant": "t1"}).ids(0) == ["a1"]
    hits = m.search("lake", k=5, order_by="time").hits(0)  # oldest first, untimed last
    assert [h["id"] for h in hits] == ["c1", "a2", "b3", "b2"]
    assert all(h["score"] > 0 and h["text"] for h in hits)
    top = m.search("lake", k=5).scores[0]
    cut = float(top[1])
    assert all(h["score"] >= cut for h in m.search("lake", k=5, min_score=cut).hits(0))
    assert m.search("zzunknownword", k=3).ids(0) == []
    # ranking: "bm25" is the search above on both; "hybrid" needs stored vectors, which neither has here (a
    # sharded memory never has them, and says so); an unknown ranking is refused
    plain = m.search(["support group", "lake"], k=3)
    named = m.search(["support group", "lake"], k=3, ranking="bm25")
    assert np.array_equal(plain.seqs, named.seqs) and np.array_equal(plain.scores, named.scores)
    why = "shards store no vectors" if make.kind == "sharded" else "stores no vectors"
    with pytest.raises(ValueError, match=why):
        m.search("lake", ranking="hybrid")
    with pytest.raises(ValueError, match="ranking must be one of"):
        m.search("lake", ranking="semantic")


def test_update_replace_upsert_and_history(make):
    m = make()
    m.add(RECS)
    assert m.update([{"id": "a1", "text": "Caroline went to the LGBTQ support group"}]) == 1
    rec = m.get(["a1"])[0]
    assert rec["text"].endswith("LGBTQ support group") and rec["metadata"] == {"speaker": "Caroline"}  # merged
    assert [v["text"] for v in m.history("a1")] == [RECS[0]["text"]]
    assert m.replace([{"id": "a2", "text": "only this now", "tenant": "t1"}]) == 1
    assert "metadata" not in m.get(["a2"])[0] or not m.get(["a2"])[0].get("metadata")
    assert m.upsert([{"id": "a3", "text": "a new one", "tenant": "t1"}, {"id": "a1", "text": "third version"}]) == 2
    assert m.get(["a3"])[0]["text"] == "a new one" and len(m) == len(RECS) + 1
    assert len(m.history("a1")) == 2
    with pytest.raises(UnknownIdError):
        m.update([{"id": "nope", "text": "x"}])
    assert m.search("LGBTQ", k=3).ids(0) == []  # the old version is not searchable
    assert m.search("third version", k=1).ids(0) == ["a1"]


def test_delete_missing_ok_and_keep_history(make):
    m = make()
    m.add(RECS)
    m.update([{"id": "a1", "text": "changed once"}, {"id": "b1", "text": "changed too"}])
    with pytest.raises(UnknownIdError):
        m.delete(["a2", "nope"])
    assert "a2" in m  # nothing deleted
    assert m.delete(["a2", "nope"], missing_ok=True) == 1
    assert m.delete(["a1"]) == 1  # the default keeps the history (issue 36)
    assert "a1" not in m
    kept = m.history("a1")
    assert [v["text"] for v in kept] == [RECS[0]["text"], "changed once"]  # the deleted version last
    assert m.delete(["b1"], keep_history=False) == 1
    assert m.history("b1") == []  # keep_history=False: a deleted record's history goes with it
    assert len(m) == len(RECS) - 3 and m.search("support group", k=5).ids(0) == []


def test_list_pages_a_tenant(make):
    m = make()
    m.add(RECS)
    page = m.list({"tenant": "t2"}, limit=2)
    assert [r["id"] for r in page.records] == ["b1", "b2"] and page.cursor
    rest = m.list({"tenant": "t2"}, limit=2, cursor=page.cursor)
    assert [r["id"] for r in rest.records] == ["b3"] and rest.cursor is None


def test_export_then_import(make, tmp_path):
    m = make()
    m.add(RECS)
    m.update([{"id": "c1", "text": "camping trip, then home"}])
    path = tmp_path / "t3.jsonl"
    assert m.export(path, where={"tenant": "t3"}) == 1
    want, want_history = m.get(["c1"]), m.history("c1")
    m.close()  # (the runtime's CPUs hold two sharded memories at once)
    m2 = make()
    assert m2.import_(path) == 1
    assert m2.get(["c1"]) == want
    assert m2.history("c1") == want_history and len(want_history) == 1
    with pytest.raises(RecordError):
        m2.import_(path)  # the id exists: nothing added
    assert m2.import_(path, replace=True) == 1 and len(m2) == 1
    other = make(method="bm25l")
    with pytest.raises(ValueError, match="bm25"):
        other.import_(path)
    assert len(other) == 0


def test_merge_keeps_every_answer(make):
    m = make(partition_days=None, merge_min=10**6)  # no merges but the ones asked for
    for r in RECS:
        m.add([r])
    m.delete(["a2"])
    qs = ["support group", "lake", "walk dog", "camping stars"]
    before = m.search(qs, k=4)
    assert m.merge() >= 1
    after = m.search(qs, k=4)
    assert np.array_equal(before.seqs, after.seqs) and np.array_equal(before.scores, after.scores)
    assert [after.hits(i) for i in range(4)] == [before.hits(i) for i in range(4)]


def test_sharded_answers_equal_one_memory(rt, tmp_path):
    rng = np.random.default_rng(38)
    words = ["lake", "walk", "dog", "support", "group", "paint", "trip", "stars", "kids", "music"]
    recs = [{"id": f"r{i}", "text": " ".join(rng.choice(words, size=int(rng.integers(1, 5)))),
             "tenant": f"t{i % 5}", **({"time": f"2023-0{1 + i % 9}-01T00:00:00Z"} if i % 4 else {})}
            for i in range(300)]
    one = Memory(record_times=False)
    with ShardedMemory.create(tmp_path / "sm", shards=2, route="id", device="cpu") as sm:
        for i in range(0, 300, 100):
            assert one.add(recs[i:i + 100]) == sm.add(recs[i:i + 100])
        qs = ["lake walk", "support group paint", "dog", "trip stars kids music"]
        for kw in ({}, {"where": {"tenant": "t2"}}, {"ties": "newest"}, {"order_by": "time", "k": 4}):
            a, b = one.search(qs, **kw), sm.search(qs, **kw)
            assert np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores), kw
            assert [a.hits(i) for i in range(len(qs))] == [b.hits(i) for i in range(len(qs))], kw
            assert b.meta["fetch_calls"] >= 1 or kw  # route "id": several shards asked, the final k fetched


def test_a_gpu_shard_asks_ray_for_a_gpu_of_its_own(rt, tmp_path):
    """device="gpu": each shard actor holds one GPU (num_gpus=1) and serves with the CuPy engine. This
    runtime has one pretend GPU: a second GPU shard is refused, and the GPU is Ray's again after close."""
    assert runtime.shard_options(True, 0.5, -1)["num_gpus"] == 1
    assert runtime.shard_options(False, 0.5, -1)["num_gpus"] == 0
    with pytest.raises(ValueError, match="one GPU per shard"):
        ShardedMemory.create(tmp_path / "two", shards=2, device="gpu")
    sm = ShardedMemory.create(tmp_path / "one", shards=1, device="gpu")
    try:
        assert sm.device == "gpu"
        assert ray.available_resources().get("GPU", 0) == 0  # the shard holds the runtime's one GPU
        sm.add(RECS)  # writes need no device
        (info,) = shard_list(sm)
        assert info["device"] == "cuda:0"  # Ray gave the actor its GPU
        # the CuPy engine ("unavailable" without a device: the shard does not fall back to the CPU engine)
        assert info["backend"] in ("cupy", "unavailable")
    finally:
        sm.close()
    deadline = time.monotonic() + 30  # Ray frees a killed actor's resources a moment later
    while ray.available_resources().get("GPU", 0) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("GPU", 0) == 1


# --------------------------------------------------------------------------- scopes, bulk deletes (issue 36 §2, §4)


def _two_tenants(m):
    ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    assert ann.add([{"id": "n1", "text": "Rex likes the park", "time": "2024-01-01"},
                    {"id": "n2", "text": "Ann bought a red bike", "time": "2024-01-02"}]) == 2
    assert bob.add([{"id": "n1", "text": "Bob walks in the park", "time": "2024-01-03"}]) == 1
    return ann, bob


def test_scopes_are_walls(make):
    m = make()
    ann, bob = _two_tenants(m)
    assert len(m) == 3 and "ann/n1" in m and "n1" not in m, "stored under tenant/id, as the service stores them"
    assert ann.search("park", k=5).ids(0) == ["n1"] and ann.search("park").hits(0)[0]["text"] == "Rex likes the park"
    assert bob.search("park").hits(0)[0]["tenant"] == "bob" and bob.search("bike", k=5).ids(0) == []
    assert without_times(ann.get(["n1"])[0], False) == {"id": "n1", "text": "Rex likes the park", "tenant": "ann",
                                  "time": "2024-01-01T00:00:00+00:00"}
    with pytest.raises(UnknownIdError):
        bob.get(["n2"])
    assert bob.get(["n2"], missing_ok=True) == [None] and "n2" in ann and "n2" not in bob
    assert [r["id"] for r in ann.list().records] == ["n1", "n2"] and ann.count() == 2 and len(bob) == 1
    assert [r["id"] for r in ann.list(where={"id": "n2"}).records] == ["n2"], "id conditions name the scope's ids"
    for w in ({"tenant": "bob"}, {"tenant": {"eq": "bob"}}, {"$and": [{"tenant": "bob"}]}):
        for call in (ann.search, ann.count, ann.list, ann.delete):
            with pytest.raises(ScopeError, match="another tenant"):
                call("park", where=w) if call == ann.search else call(where=w)
    assert ann.count(where={"tenant": {"eq": "ann"}, "time": {"gte": "2024-01-02"}}) == 1
    # writes: filled in or checked, reaching only the scope's records
    with pytest.raises(ScopeError, match="tenant is 'bob'"):
        ann.add([{"id": "n3", "text": "ok"}, {"id": "n4", "text": "sneaky", "tenant": "bob"}])
    with pytest.raises(RecordError, match="already exists in tenant 'ann'"):
        ann.add([{"id": "n1", "text": "again"}])
    assert len(m) == 3, "nothing of a refused batch is added"
    with pytest.raises(UnknownIdError):
        bob.update([{"id": "n2", "text": "mine now"}])
    with pytest.raises(UnknownIdError):
        bob.delete(["n2"])
    assert bob.delete(["n2"], missing_ok=True) == 0 and ann.get(["n2"])[0]["text"] == "Ann bought a red bike"
    with pytest.raises(ScopeError):
        ann.update([{"id": "n1", "tenant": "bob"}])
    assert ann.update([{"id": "n1", "text": "Rex loves the park"}]) == 1
    assert bob.get(["n1"])[0]["text"] == "Bob walks in the park", "bob's n1 is another record"
    assert [v["text"] for v in ann.history("n1")] == ["Rex likes the park"] and bob.history("n1") == []
    assert ann.upsert([{"id": "n5", "text": "made by upsert"}]) == 1 and m.get(["ann/n5"])[0]["tenant"] == "ann"
    assert ann.replace([{"id": "n5", "text": "replaced"}]) == 1
    assert without_times(ann.get(["n5"])[0], False) == {"id": "n5", "text": "replaced", "tenant": "ann"}, \
        "replace keeps the scope"
    assert bob.delete(["n1"]) == 1 and ann.get(["n1"])[0]["text"] == "Rex loves the park"
    auto = ann.add([{"text": "no id given"}])  # a generated id, stored as ann/<uuid7>
    assert auto == 1 and len([r for r in ann.list().records if r["text"] == "no id given"]) == 1


def test_agent_and_session_scopes(make):
    m = make()
    t = m.scope(tenant="acme")
    a1, a2 = t.scope(agent="a1"), m.scope(tenant="acme", agent="a2", session="s9")
    a1.add([{"id": "x", "text": "the deploy failed on friday"}])
    a2.add([{"id": "y", "text": "the deploy worked on monday"}])
    assert without_times(m.get(["acme/y"])[0], False) == {"id": "acme/y", "text": "the deploy worked on monday",
                                                          "session": "s9",
                                    "agent": "a2", "tenant": "acme"}, "every scope field is filled in"
    assert a1.search("deploy").ids(0) == ["x"] and a2.search("deploy").ids(0) == ["y"]
    assert sorted(t.search("deploy").ids(0)) == ["x", "y"] and a1.search("deploy", where={"agent": "a2"}).ids(0) == []
    assert a1.get(["y"], missing_ok=True) == [None]
    with pytest.raises(UnknownIdError):
        a1.update([{"id": "y", "text": "nope"}])
    with pytest.raises(ScopeError):
        a2.update([{"id": "y", "agent": None}])  # would move the record out of the scope
    assert m.scope(agent="a2").get(["acme/y"])[0]["agent"] == "a2", "without a tenant, ids are the memory's own"


def test_require_scope_refuses_unscoped_use_and_is_saved(make, tmp_path):
    m = make(require_scope=True)
    assert m.require_scope and m.config()["require_scope"] is True
    m.scope(tenant="ann").add([{"id": "n1", "text": "Rex likes the park"}])
    calls = {
        "search": lambda: m.search("park"), "get": lambda: m.get(["ann/n1"]), "list": lambda: m.list(),
        "count": lambda: m.count(), "history": lambda: m.history("ann/n1"), "match_ids": lambda: m.match_ids(),
        "add": lambda: m.add([{"id": "x", "text": "y", "tenant": "ann"}]),
        "update": lambda: m.update([{"id": "ann/n1", "text": "z"}]),
        "upsert": lambda: m.upsert([{"id": "ann/n1", "text": "z"}]), "delete": lambda: m.delete(["ann/n1"]),
        "delete where": lambda: m.delete(where={"tenant": "ann"}),
    }
    for name, call in calls.items():
        with pytest.raises(ScopeError, match="require_scope"):
            call()
            pytest.fail(f"unscoped {name} was allowed")
    assert len(m) == 1
    assert m.export(tmp_path / "ann.jsonl", where={"tenant": "ann"}) == 1, "export stays on the memory itself"
    again = make.reopen(m)
    assert again.require_scope and again.config()["require_scope"] is True
    with pytest.raises(ScopeError):
        again.search("park")
    assert again.scope(tenant="ann").search("park").ids(0) == ["n1"]
    again.allow_unscoped()
    assert again.search("park").ids(0) == ["ann/n1"], "a server confining each request itself lifts the guard"
    assert again.reset(confirm=True) == 1 and len(again) == 0


def _bulk(m):
    m.add([{"id": f"a{i}", "text": f"note {i}", "tenant": "ann", "session": "s1" if i < 3 else "s2"}
           for i in range(5)])
    m.add([{"id": f"b{i}", "text": f"note {i}", "tenant": "bob", "session": "s1"} for i in range(3)])


def test_delete_where_and_reset(make):
    m = make()
    _bulk(m)
    assert m.match_ids({"session": "s1"}) == ["a0", "a1", "a2", "b0", "b1", "b2"], "add order, across shards"
    assert m.delete(where={"session": "s1", "tenant": "ann"}) == 3
    assert m.match_ids() == ["a3", "a4", "b0", "b1", "b2"] and len(m) == 5
    assert [h["event"] for h in m.history("a1")] == ["delete"], "a bulk delete keeps histories as delete(ids) does"
    assert m.delete(where={"session": "nobody"}) == 0
    assert m.delete(where={"tenant": "bob"}, keep_history=False) == 3 and m.history("b1") == []
    assert m.search("note", k=10).ids(0) == ["a3", "a4"]
    with pytest.raises(ValueError, match="confirm=True"):
        m.reset()
    assert len(m) == 2
    assert m.reset(confirm=True) == 2 and len(m) == 0 and m.count() == 0 and m.search("note").ids(0) == []
    assert m.history("a1") == [] and m.history("a3") == [], "a reset forgets the kept histories too"
    assert m.add([{"id": "a1", "text": "after the reset", "tenant": "ann"}]) == 1 and m.get(["a1"])[0]["text"]


def test_bad_bulk_deletes_are_refused_and_change_nothing(make):
    m = make()
    _bulk(m)
    with pytest.raises(WhereError, match="reset"):
        m.delete(where={})
    with pytest.raises(TypeError, match="give the ids to delete, or where="):
        m.delete()
    with pytest.raises(TypeError, match="not both"):
        m.delete(["a0"], where={"session": "s1"})
    with pytest.raises(WhereError):
        m.delete(where={"nosuchfield": 1})
    with pytest.raises(WhereError, match="must be a dict"):
        m.delete(where=[{"session": "s1"}])
    with pytest.raises(ValueError, match="confirm=True"):
        m.reset(confirm="yes")
    assert len(m) == 8, "nothing was deleted"


def test_scoped_bulk_deletes_stay_in_the_scope(make):
    m = make()
    ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    ann.add([{"id": "x", "text": "one", "session": "s1"}, {"id": "y", "text": "two", "session": "s2"}])
    bob.add([{"id": "x", "text": "one", "session": "s1"}])
    assert ann.delete(where={"session": "s1"}) == 1 and bob.get(["x"])[0]["text"] == "one"
    assert ann.match_ids() == ["y"] and bob.match_ids() == ["x"]
    assert ann.delete_all() == 1 and len(ann) == 0 and len(bob) == 1 and len(m) == 1
    assert [h["event"] for h in ann.history("y")] == ["delete"], "delete_all keeps histories by default"
    with pytest.raises(UnknownIdError):
        bob.delete(["y"])
    assert bob.delete_all(keep_history=False) == 1 and bob.history("x") == [] and len(m) == 0


def test_unknown_ids_are_named_the_same(make):
    m = make()
    m.add(RECS)
    cases = [
        (lambda: m.get(["nope", "a1", "nope", "zz"]), ["nope", "nope", "zz"], "get: 3 unknown id(s)"),
        (lambda: m.delete(["zz", "a1", "nope", "zz"]), ["zz", "nope"], "delete: 2 unknown id(s)"),
        (lambda: m.update([{"id": "a1", "text": "x"}, {"id": "nope", "text": "y"}]), ["nope"], "update: 1 unknown"),
        (lambda: m.replace([{"id": "nope", "text": "y", "tenant": "t1"}]), ["nope"], "replace: 1 unknown"),
        (lambda: m.scope(tenant="t1").get(["a1", "b1"]), ["b1"], "get: 1 unknown"),
        (lambda: m.scope(tenant="t2").delete(["b1", "a1"]), ["a1"], "delete: 1 unknown"),
    ]
    for call, ids, msg in cases:
        with pytest.raises(UnknownIdError) as e:
            call()
        assert e.value.ids == ids and str(e.value).startswith(msg), str(e.value)
        assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    assert len(m) == len(RECS) and m.get(["a1"])[0]["text"] == RECS[0]["text"], "nothing changed"
    assert m.get(["nope", "a1"], missing_ok=True)[0] is None and m.history("nope") == []
    assert m.delete(["nope"], missing_ok=True) == 0 and m.upsert([{"id": "nope", "text": "now", "tenant": "t1"}]) == 1


def _pages(m, **kw):
    """Every page of a listing, as (records, cursor) pairs."""
    out, cursor = [], None
    while True:
        page = m.list(limit=9, cursor=cursor, **kw)
        out.append((page.records, page.cursor))
        if page.cursor is None:
            return out
        cursor = page.cursor


@pytest.mark.parametrize("route", ["id", "tenant"])
def test_scoped_and_bulk_answers_equal_one_memory(rt, tmp_path, route):
    """The same calls on one Memory and on a 3-shard memory: every answer (ids, float32 scores, counts,
    records) and every error (type, message, ids) equal."""
    rng = np.random.default_rng(36)
    words = ["lake", "walk", "dog", "support", "group", "paint", "trip", "stars", "kids", "music"]

    def recs(lo, hi):
        return [{"id": f"r{i}", "text": " ".join(rng.choice(words, size=int(rng.integers(1, 5)))),
                 "session": f"s{i % 3}", **({"time": f"2023-0{1 + i % 9}-01T00:00:00Z"} if i % 4 else {})}
                for i in range(lo, hi)]

    batches = [(t, recs(i, i + 40)) for i, t in zip(range(0, 160, 40), ["ann", "bob", "ann", "cy"])]
    qs = ["lake walk", "support group paint", "dog", "trip stars kids music"]

    def script(m):
        out = []

        def do(f):
            try:
                r = f()
            except Exception as e:  # noqa: BLE001 - compared below
                r = ("error", type(e).__name__, str(e), getattr(e, "ids", None))
            if hasattr(r, "seqs"):
                r = (r.seqs.tolist(), r.scores.tobytes(), [r.hits(i) for i in range(len(r))])
            out.append(r)

        for t, b in batches:
            do(lambda t=t, b=b: m.scope(tenant=t).add(b))
        ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
        do(lambda: ann.search(qs, k=7))
        do(lambda: ann.search(qs, k=5, where={"session": "s1"}, ties="newest"))
        do(lambda: m.search(qs, k=9))
        do(lambda: ann.count(where={"session": "s2"}))
        do(lambda: _pages(ann, order_by="time", descending=True))  # every page and cursor (route "id": 3 shards)
        do(lambda: _pages(m, where={"session": "s1"}))
        do(lambda: ann.match_ids({"session": "s0"}))
        do(lambda: ann.delete(where={"session": "s0"}))
        do(lambda: bob.delete(["r40", "r1", "r41"]))
        do(lambda: bob.delete(["r40", "r1", "r41"], missing_ok=True))
        do(lambda: ann.update([{"id": "r2", "text": "lake lake dog"}, {"id": "r5", "importance": 0.5}]))
        do(lambda: ann.get(["r2", "r5", "r0", "r40"], missing_ok=True))
        do(lambda: [{k: v for k, v in h.items() if k != "event_time"} for h in ann.history("r0")])  # (a clock)
        do(lambda: m.search(qs, k=9))
        do(lambda: m.match_ids({"session": "s1"}))
        do(lambda: bob.delete_all())
        do(lambda: m.delete(where={"time": {"lt": "2023-04-01T00:00:00Z"}}))
        do(lambda: m.count())
        do(lambda: m.search(qs, k=12, order_by="time"))
        do(lambda: m.reset(confirm=True))
        do(lambda: (len(m), m.history("ann/r2"), m.search(qs).seqs.tolist()))
        return out

    one = script(Memory(record_times=False))
    with ShardedMemory.create(tmp_path / "sm", shards=3, route=route, device="cpu") as sm:
        got = script(sm)
    assert len(got) == len(one)
    for i, (a, b) in enumerate(zip(one, got)):
        assert a == b, f"call {i}: {a!r} != {b!r}"


def test_reads_take_the_direct_channel_and_survive_a_killed_shard(rt, tmp_path):
    """Searches and fetches go over each shard's direct channel (gpuir.cluster.fastpath) and answer exactly as
    over Ray; a shard SIGKILLed between two searches breaks its channel, the search asks over Ray (which
    restarts the shard) and answers the same, and the next search opens the new shard's channel."""
    from gpuir.cluster.fastpath import FastClient

    one = Memory(record_times=False)
    one.add(RECS)
    with ShardedMemory.create(tmp_path / "sm", shards=2, route="id", device="cpu") as sm:
        sm.add(RECS)
        qs = ["support group", "lake walk dog", "camping stars"]

        def same(**kw):
            a, b = one.search(qs, k=4, **kw), sm.search(qs, k=4, **kw)
            assert np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores), kw
            assert [a.hits(i) for i in range(3)] == [b.hits(i) for i in range(3)], kw
            return b

        assert same().meta["fetch_calls"] >= 1  # several shards asked: the final k fetched
        chans = dict(sm._fast)
        assert sorted(chans) == [0, 1] and all(isinstance(c, FastClient) for c in chans.values())
        sm.fast_path = False
        same(order_by="time")
        same(ties="newest")
        sm.fast_path = True
        old = chans[1]
        assert os.path.exists(old.path)
        sm.kill_shard(1)
        same(order_by="time")  # the channel breaks; asked over Ray, which waits for the restart
        assert old.broken
        same()
        assert isinstance(sm._fast[1], FastClient) and sm._fast[1] is not old and not sm._fast[1].broken
        # the killed shard closed nothing; the restarted shard's new channel swept its directory
        assert not os.path.exists(os.path.dirname(old.path)) and os.path.exists(sm._fast[1].path)
        assert os.path.exists(chans[0].path), "the live shard's channel stays"
