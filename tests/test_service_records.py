"""The service's record routes over a real server: PATCH keeps what it does not name, PUT replaces,
list pages with cursors, count, history, export -> import gives identical searches, tenants stay walls,
bare-number times need time_unit, min_score, and an acknowledged update survives kill -9 (the log
replays it, with its history)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from _helpers import without_times

from gpuir.memory import Memory
from gpuir.service.client import MemoryClient, ServiceError
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess
from gpuir.storage.dirlock import claim_dir

NO_CHECKPOINT = ["--checkpoint-every", "1000000", "--checkpoint-seconds", "3600"]
REC = {"id": "t2", "text": "Melanie painted a sunrise over the lake", "session": "S1", "role": "user",
       "time": "2023-05-08T13:57:00Z", "metadata": {"speaker": "Melanie", "mood": "calm"}}


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "mem"
    claim_dir(root, "memory")
    keys = {t: KeyStore(root).add(t) for t in ("alice", "bob")}
    return root, keys


def test_patch_put_list_count_history_export(served, tmp_path):
    root, keys = served
    with ServerProcess(root, NO_CHECKPOINT) as srv:
        a, b = MemoryClient(srv.url, keys["alice"]), MemoryClient(srv.url, keys["bob"])
        assert a.add([REC, {"id": "x1", "text": "Caroline went to the support group", "time": "2023-05-08"}]) == 2
        assert b.add([{"id": "t2", "text": "bob's own t2", "metadata": {"speaker": "Bob"}}]) == 1
        before = a.get("t2")
        # PATCH: only the text changes; the tenant, session, time and metadata stay
        assert a.update({"id": "t2", "text": "Melanie painted a sunset"}) == 1
        after = a.get("t2")
        assert without_times(after) == {**without_times(before), "text": "Melanie painted a sunset"}
        # the record's times (the memory keeps them by default): created_at stays, updated_at moves
        assert after["created_at"] == before["created_at"] and after["updated_at"] >= before["updated_at"]
        assert a.search("sunset")[0][0]["created_at"] == before["created_at"], "hits carry them"
        pages = [a.list(order_by=o).records for o in ("created_at", "updated_at")]
        assert sorted(r["id"] for r in pages[0]) == ["t2", "x1"] and [r["id"] for r in pages[1]][-1] == "t2"
        assert a.count(where={"created_at": {"lte": before["created_at"]}}) == 2, "both added by one request"
        assert a.count(where={"updated_at": {"gt": before["updated_at"]}}) == 1
        hits = a.search("sunset", where={"session": "S1", "metadata.speaker": "Melanie"})[0]
        assert [h["id"] for h in hits] == ["t2"] and hits[0]["tenant"] == "alice"
        r = httpx.patch(srv.url + "/v1/tenants/alice/records/t2", json={"metadata": {"mood": None, "year": 2023}},
                        headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 200 and r.json()["record"]["metadata"] == {"speaker": "Melanie", "year": 2023}
        assert b.get("t2")["text"] == "bob's own t2", "tenants are walls: bob's t2 is another record"
        # PUT replaces (or creates)
        assert a.update({"id": "t2", "text": "whole new"}, replace=True) == 1
        assert without_times(a.get("t2")) == {"id": "t2", "text": "whole new", "tenant": "alice"}
        assert a.get("t2")["created_at"] == before["created_at"], "a replace keeps created_at"
        assert a.upsert({"id": "n9", "text": "created by upsert"}) == 1 and a.get("n9")["text"] == "created by upsert"
        assert [h["text"] for h in a.history("t2")] == ["Melanie painted a sunrise over the lake",
                                                        "Melanie painted a sunset", "Melanie painted a sunset"]
        assert a.history("t2")[1]["metadata"] == {"speaker": "Melanie", "mood": "calm"}
        # errors: unknown id 404, another tenant 403, a bad field 422, a bare-number time without its unit 422
        with pytest.raises(ServiceError) as e:
            a.update({"id": "nope", "text": "x"})
        assert e.value.status == 404
        with pytest.raises(ServiceError) as e:
            a.update({"id": "x1", "tenant": "bob"})
        assert e.value.status == 403
        with pytest.raises(ServiceError) as e:
            a.update({"id": "x1", "text": None})
        assert e.value.status == 422 and "'text' cannot be removed" in str(e.value.detail)
        with pytest.raises(ServiceError) as e:
            a.update({"id": "x1", "time": 1683554220})
        assert e.value.status == 422 and "give its unit" in str(e.value.detail)
        assert a.update({"id": "x1", "time": 1683554220}, time_unit="s") == 1
        assert a.get("x1")["time"] == "2023-05-08T13:57:00+00:00"
        with pytest.raises(ServiceError) as e:
            a.add([{"id": "x2", "text": "t", "time": 1683554220}])
        assert e.value.status == 422 and "bare number" in str(e.value.detail)
        assert a.add([{"id": "x2", "text": "t", "time": 1683554220000}], time_unit="ms") == 1
        r = httpx.put(srv.url + "/v1/tenants/alice/records/x2", json={"session": "S"},
                      headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 422 and "give its text" in r.text
        # list with cursors, count
        for i in range(25):
            a.add([{"id": f"p{i:02d}", "text": f"page {i}", "metadata": {"i": i}}])
        page = a.list(limit=10, where={"metadata.i": {"gte": 5}})
        assert [r["id"] for r in page.records] == [f"p{i:02d}" for i in range(5, 15)] and page.cursor
        assert [r["id"] for r in a.list(limit=10, where={"metadata.i": {"gte": 5}}, cursor=page.cursor).records] == [
            f"p{i:02d}" for i in range(15, 25)]
        assert len(list(a.iter_records(page_size=7))) == a.count() == 29
        assert a.count({"metadata.i": {"lt": 5}}) == 5 and b.count() == 1
        with pytest.raises(ServiceError) as e:  # bob's cursor is bound to bob's filter (and tenant)
            b.list(limit=10, where={"metadata.i": {"gte": 5}}, cursor=page.cursor)
        assert e.value.status == 422 and "another where" in str(e.value.detail)
        with pytest.raises(ServiceError) as e:
            a.list(where={"tenant": "bob"})
        assert e.value.status == 403
        r = httpx.get(srv.url + "/v1/tenants/alice/records", params={"where": "{not json"},
                      headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 422 and "not valid JSON" in r.text
        with pytest.raises(ServiceError) as e:
            a.count({"$or": [{"tenant": "bob"}]})
        assert e.value.status == 422 and "hard boundary" in str(e.value.detail)
        # min_score and time_unit in a search
        top = a.search("page", k=30)[0]
        assert a.search("page", k=30, min_score=top[0]["score"])[0] == [h for h in top if h["score"] >= top[0]["score"]]
        assert [h["id"] for h in a.search("group", where={"time": {"lt": 1683504000}}, time_unit="s")[0]] == []
        # export -> import into a fresh memory: the same searches (the service's statistics are global,
        # so with alice's records alone in it)
        assert b.delete("t2") == 1
        path = tmp_path / "alice.jsonl"
        assert a.export(path) == 29
        lines = path.read_text().splitlines()
        assert json.loads(lines[0])["records"] == 29 and all("alice/" not in x for x in lines)
        assert any(json.loads(x).get("history") == "t2" for x in lines)
        m = Memory.from_export(path)
        assert m.get(["t2"])[0] == a.get("t2")
        for q in ("page 3", "support group", "sunset whole new"):
            want = a.search(q, k=10)[0]
            got = m.search(q, k=10, where={"tenant": "alice"}).hits(0)
            assert [(h["id"], h["score"]) for h in got] == [(h["id"], h["score"]) for h in want]


def test_an_acknowledged_update_survives_kill9(served):
    root, keys = served
    srv = ServerProcess(root, NO_CHECKPOINT).start()
    try:
        a = MemoryClient(srv.url, keys["alice"])
        a.add([REC])
        a.update({"id": "t2", "text": "Melanie painted a sunset", "metadata": {"mood": None}})
        a.update({"id": "t2", "importance": 0.5})
        want = a.get("t2")
    finally:
        srv.kill9()  # no checkpoint: the adds and updates are in the log only
    with ServerProcess(root, NO_CHECKPOINT) as srv:
        a = MemoryClient(srv.url, keys["alice"])
        assert a.get("t2") == want and want["metadata"] == {"speaker": "Melanie"} and want["session"] == "S1"
        assert [h["text"] for h in a.history("t2")] == ["Melanie painted a sunrise over the lake",
                                                        "Melanie painted a sunset"]


@pytest.mark.parametrize("statistics", ["tenant", "pooled"])
def test_id_filters_name_the_tenants_own_ids_in_both_statistics_modes(served, statistics):
    root, keys = served
    with ServerProcess(root, [*NO_CHECKPOINT, "--statistics", statistics]) as srv:
        a, b = MemoryClient(srv.url, keys["alice"]), MemoryClient(srv.url, keys["bob"])
        a.add([{"id": f"n{i}", "text": f"note {i}", "metadata": {"i": i}} for i in range(6)])
        b.add([{"id": "n1", "text": "bob's note 1"}])
        a.update({"id": "n2", "text": "note two, revised"})
        ids = (lambda page: [r["id"] for r in page.records])
        assert ids(a.list(where={"id": {"in": ["n1", "n2"]}})) == ["n1", "n2"]
        assert ids(a.list(where={"$or": [{"id": "n0"}, {"id": {"gte": "n4"}}]})) == ["n0", "n4", "n5"]
        assert ids(a.list(where={"$not": {"id": {"nin": ["n3"]}}})) == ["n3"]
        assert a.count({"id": {"ne": "n0"}}) == 5 and b.count({"id": "n1"}) == 1
        assert a.get("n2")["text"] == "note two, revised"
        assert [h["id"] for h in a.search("revised")[0]] == ["n2"]
        if statistics == "pooled":
            with pytest.raises(ServiceError) as e:
                a.count({"id": {"contains": "n"}})
            assert e.value.status == 422 and "pooled statistics" in str(e.value.detail)
        else:
            assert a.count({"id": {"contains": "n"}}) == 6
