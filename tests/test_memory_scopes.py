"""Scopes are walls (issue 36 §2): a scope confines every read and write to its tenant, agent and session,
ids are unique per tenant (stored as the service stores them), a memory made with require_scope=True
refuses unscoped use (and remembers it), the service serves what scopes wrote and scopes read what the
service wrote, and the MCP server refuses a where naming another tenant."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import without_times

from gpuir.memory import Memory, RecordError, Scope, ScopeError, UnknownIdError, WhereError


def _two_tenants() -> tuple[Memory, Scope, Scope]:
    m = Memory()
    ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    ann.add([{"id": "n1", "text": "Rex likes the park", "time": "2024-01-01"},
             {"id": "n2", "text": "Ann bought a red bike", "time": "2024-01-02"}])
    bob.add([{"id": "n1", "text": "Bob walks in the park", "time": "2024-01-03"}])
    return m, ann, bob


def test_two_tenants_hold_the_same_id_and_see_only_their_own():
    m, ann, bob = _two_tenants()
    assert len(m) == 3
    assert sorted(m.get(["ann/n1", "bob/n1"], missing_ok=True)[i]["text"] for i in range(2)) == [
        "Bob walks in the park", "Rex likes the park"], "stored under tenant/id, as the service stores them"
    assert [h["id"] for h in ann.search("park", k=5).hits(0)] == ["n1"]
    assert ann.search("park", k=5).hits(0)[0]["text"] == "Rex likes the park"
    assert bob.search("park", k=5).ids(0) == ["n1"] and bob.search("park").hits(0)[0]["tenant"] == "bob"
    assert bob.search("bike", k=5).hits(0) == [], "another tenant's record is invisible to search"
    assert without_times(ann.get(["n1"])[0]) == {"id": "n1", "text": "Rex likes the park", "tenant": "ann",
                                  "time": "2024-01-01T00:00:00+00:00"}
    with pytest.raises(UnknownIdError):
        bob.get(["n2"])
    assert bob.get(["n2"], missing_ok=True) == [None]
    assert [r["id"] for r in ann.list().records] == ["n1", "n2"] and ann.count() == 2 and len(bob) == 1
    assert [r["id"] for r in ann.list(where={"id": "n2"}).records] == ["n2"], "id conditions name the scope's ids"
    assert "n2" in ann and "n2" not in bob


def test_a_where_naming_another_tenant_is_refused_its_own_is_fine():
    _, ann, _ = _two_tenants()
    for w in ({"tenant": "bob"}, {"tenant": {"eq": "bob"}}, {"$and": [{"tenant": "bob"}]}):
        with pytest.raises(ScopeError, match="another tenant"):
            ann.search("park", where=w)
        with pytest.raises(ScopeError):
            ann.list(where=w)
        with pytest.raises(ScopeError):
            ann.count(where=w)
    with pytest.raises(ScopeError):
        ann.search(["park", "bike"], where=[None, {"tenant": "bob"}])
    assert ann.search("park", where={"tenant": "ann"}).ids(0) == ["n1"]
    assert ann.count(where={"tenant": {"eq": "ann"}, "time": {"gte": "2024-01-02"}}) == 1
    with pytest.raises(WhereError):  # a tenant under $or stays refused by the filter language
        ann.search("park", where={"$or": [{"tenant": "bob"}, {"text": {"contains": "x"}}]})


def test_writes_fill_in_or_check_the_scope_and_reach_only_its_records():
    m, ann, bob = _two_tenants()
    with pytest.raises(ScopeError, match="tenant is 'bob'"):
        ann.add([{"id": "n3", "text": "ok"}, {"id": "n4", "text": "sneaky", "tenant": "bob"}])
    assert len(m) == 3, "nothing of a refused batch is added"
    with pytest.raises(RecordError, match="already exists in tenant 'ann'"):
        ann.add([{"id": "n1", "text": "again"}])
    # update / delete of an id of another tenant: unknown, nothing changes
    with pytest.raises(UnknownIdError):
        bob.update([{"id": "n2", "text": "mine now"}])
    with pytest.raises(UnknownIdError):
        bob.delete(["n2"])
    assert bob.delete(["n2"], missing_ok=True) == 0
    assert ann.get(["n2"])[0]["text"] == "Ann bought a red bike"
    with pytest.raises(ScopeError):
        ann.update([{"id": "n1", "tenant": "bob"}])
    assert ann.update([{"id": "n1", "text": "Rex loves the park"}]) == 1
    assert bob.get(["n1"])[0]["text"] == "Bob walks in the park", "bob's n1 is another record"
    assert [v["text"] for v in ann.history("n1")] == ["Rex likes the park"]
    assert ann.history("n1")[0]["id"] == "n1" and bob.history("n1") == []
    assert ann.upsert([{"id": "n5", "text": "made by upsert"}]) == 1
    assert m.get(["ann/n5"])[0]["tenant"] == "ann"
    assert ann.replace([{"id": "n5", "text": "replaced"}]) == 1
    assert without_times(ann.get(["n5"])[0]) == {"id": "n5", "text": "replaced", "tenant": "ann"}, \
        "replace keeps the scope"
    assert bob.delete(["n1"]) == 1 and ann.get(["n1"])[0]["text"] == "Rex loves the park"


def test_agent_and_session_scopes():
    m = Memory()
    t = m.scope(tenant="acme")
    a1, a2 = t.scope(agent="a1"), m.scope(tenant="acme", agent="a2", session="s9")
    a1.add([{"id": "x", "text": "the deploy failed on friday"}])
    a2.add([{"id": "y", "text": "the deploy worked on monday"}])
    assert without_times(m.get(["acme/y"])[0]) == {"id": "acme/y", "text": "the deploy worked on monday",
                                                   "session": "s9",
                                    "agent": "a2", "tenant": "acme"}, "every scope field is filled in"
    assert a1.search("deploy").ids(0) == ["x"] and a2.search("deploy").ids(0) == ["y"]
    assert sorted(t.search("deploy").ids(0)) == ["x", "y"], "the tenant's scope sees both agents"
    assert a1.search("deploy", where={"agent": "a2"}).ids(0) == [], "another agent in where matches nothing"
    assert a1.get(["y"], missing_ok=True) == [None]
    with pytest.raises(UnknownIdError):
        a1.update([{"id": "y", "text": "nope"}])
    with pytest.raises(ScopeError):
        a2.update([{"id": "y", "agent": None}])  # would move the record out of the scope
    with pytest.raises(ScopeError):
        a1.scope(agent="a2")
    assert a1.scope(session="s1").fields == {"tenant": "acme", "agent": "a1", "session": "s1"}
    with pytest.raises(ValueError, match="tenant"):
        m.scope(tenant="a/b")
    with pytest.raises(ValueError, match="at least one"):
        m.scope()
    no_tenant = m.scope(agent="a2")
    assert no_tenant.get(["acme/y"])[0]["agent"] == "a2", "without a tenant, ids are the memory's own"


def test_scoped_vector_search():
    m = Memory(embeddings={"v": None})
    ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    ann.add([{"id": "a", "text": "one"}], vectors={"v": np.array([[1.0, 0.0]], np.float32)})
    bob.add([{"id": "b", "text": "two"}], vectors={"v": np.array([[1.0, 0.1]], np.float32)})
    res = bob.search_vectors(np.array([1.0, 0.0], np.float32), k=5)
    assert res.ids(0) == ["b"] and res.hits(0)[0]["id"] == "b"
    with pytest.raises(ScopeError):
        ann.search_vectors(np.array([1.0, 0.0], np.float32), where={"tenant": "bob"})


def test_a_record_added_without_a_scope_is_found_by_its_id():
    m = Memory()
    m.add([{"id": "old", "text": "added before scopes", "tenant": "ann"},
           {"id": "bob/z", "text": "a slash id of another tenant", "tenant": "ann"}])
    ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    assert ann.get(["old"])[0]["id"] == "old"
    with pytest.raises(RecordError, match="already exists"):
        ann.add([{"id": "old", "text": "twice"}])
    assert bob.get(["z"], missing_ok=True) == [None], "an id that looks like bob's but is ann's record"
    assert ann.update([{"id": "old", "importance": 1.0}]) == 1 and m.get(["old"])[0]["importance"] == 1.0
    assert ann.delete(["old"], keep_history=True) == 1 and "old" not in m
    assert [v["text"] for v in ann.history("old")] == ["added before scopes", "added before scopes"]


def test_require_scope_refuses_unscoped_use_and_is_saved(tmp_path):
    m = Memory(require_scope=True)
    m.scope(tenant="ann").add([{"id": "n1", "text": "Rex likes the park"}])
    calls = {
        "search": lambda: m.search("park"), "get": lambda: m.get(["ann/n1"]), "list": lambda: m.list(),
        "count": lambda: m.count(), "history": lambda: m.history("ann/n1"),
        "add": lambda: m.add([{"id": "x", "text": "y", "tenant": "ann"}]),
        "update": lambda: m.update([{"id": "ann/n1", "text": "z"}]),
        "upsert": lambda: m.upsert([{"id": "ann/n1", "text": "z"}]), "delete": lambda: m.delete(["ann/n1"]),
        "delete where": lambda: m.delete(where={"tenant": "ann"}),
    }
    for name, call in calls.items():
        with pytest.raises(ScopeError, match="require_scope"):
            call()
            pytest.fail(f"unscoped {name} was allowed")
    assert len(m) == 1 and m.get is not None
    m.save(tmp_path / "m")
    m.close()
    with Memory.open(tmp_path / "m") as again:
        assert again.require_scope and again.config()["require_scope"] is True
        with pytest.raises(ScopeError):
            again.search("park")
        assert again.scope(tenant="ann").search("park").ids(0) == ["n1"]
        assert again.export(tmp_path / "all.jsonl") == 1, "whole-memory operations stay on the memory"
    with pytest.raises(TypeError):
        Memory(require_scope="yes")


def test_the_service_and_scopes_agree_on_ids(tmp_path):
    pytest.importorskip("fastapi")
    from gpuir.service.store import ServiceStore

    # the service writes; a scope of the opened directory reads the same records with the same ids
    root = tmp_path / "svc"
    st = ServiceStore(root, statistics="pooled")
    st.add("ann", [{"id": "n1", "text": "Rex likes the park"}]).result()
    st.add("bob", [{"id": "n1", "text": "Bob walks in the park"}]).result()
    st.close()
    with Memory.open(root, writer=False) as m:
        assert without_times(m.scope(tenant="ann").get(["n1"])[0]) == {"id": "n1", "text": "Rex likes the park",
                                                                       "tenant": "ann"}
        assert m.scope(tenant="bob").search("park").ids(0) == ["n1"]
    # scopes write (require_scope=True); the service serves it and its tenants see the scopes' ids
    root2 = tmp_path / "scoped"
    m = Memory(require_scope=True)
    m.scope(tenant="ann").add([{"id": "n7", "text": "written through a scope"}])
    m.save(root2)
    m.close()
    st = ServiceStore(root2)
    try:
        assert st.get("ann", "n7")["text"] == "written through a scope"
        assert st.get("bob", "n7") is None
        assert st.add("bob", [{"id": "n7", "text": "bob's n7"}]).result() == 1
    finally:
        st.close()
    with Memory.open(root2, writer=False) as m:
        assert m.scope(tenant="bob").get(["n7"])[0]["text"] == "bob's n7"


def test_mcp_refuses_a_where_naming_another_tenant_and_forgets_only_its_own():
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from gpuir.adapters.mcp_server import build_server

    m = Memory()
    m.scope(tenant="bob").add([{"id": "b1", "text": "Bob's secret park plan"}])

    async def go():
        async with Client(build_server(m, tenant="ann")) as c:
            r = await c.call_tool("remember", {"text": "Ann's park note", "id": "b1"})
            assert not r.is_error and r.structured_content["id"] == "b1", "ids are per tenant: ann may use b1"
            r = await c.call_tool("recall", {"query": "park", "where": {"tenant": "bob"}})
            assert r.is_error and "another tenant" in r.content[0].text
            r = await c.call_tool("recall", {"query": "park"})
            assert [h["text"] for h in r.structured_content["hits"]] == ["Ann's park note"]
            r = await c.call_tool("forget", {"ids": ["b1"]})
            assert r.structured_content == {"deleted": 1}

    anyio.run(go)
    assert m.scope(tenant="bob").get(["b1"])[0]["text"] == "Bob's secret park plan", "forget stayed in its tenant"
    assert m.scope(tenant="ann").get(["b1"], missing_ok=True) == [None]
