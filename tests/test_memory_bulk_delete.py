"""Deletes at scale (issue 36 §4): delete(where=), a scope's delete_all and a guarded reset, all resolved to
ids and deleted through Memory.delete(ids); in Python, the CLI, over HTTP and in both clients, with unknown
ids treated the same everywhere (UnknownIdError / 404 unless missing_ok)."""

from __future__ import annotations

import json

import pytest

from gpuir.cli import main
from gpuir.memory import Memory, ScopeError, UnknownIdError, WhereError


def _mem() -> Memory:
    m = Memory()
    m.add([{"id": f"a{i}", "text": f"note {i}", "tenant": "ann", "session": "s1" if i < 3 else "s2"}
           for i in range(5)])
    m.add([{"id": f"b{i}", "text": f"note {i}", "tenant": "bob", "session": "s1"} for i in range(3)])
    return m


class _Spy(Memory):
    """A memory recording each call of its delete, to show bulk deletes go through delete(ids)."""

    def delete(self, ids=None, *args, **kwargs):
        if ids is not None:
            self.calls.append(list(ids))
        return super().delete(ids, *args, **kwargs)


def test_delete_where_resolves_to_ids_and_deletes_them_as_ids():
    m = _Spy()
    m.calls = []
    m.add([{"id": f"a{i}", "text": f"note {i}", "session": "s1" if i < 3 else "s2"} for i in range(5)])
    assert m.delete(where={"session": "s1"}) == 3
    assert m.calls == [["a0", "a1", "a2"]], "one delete of the matching ids, in add order"
    assert sorted(r["id"] for r in m.list().records) == ["a3", "a4"]
    assert m.history("a1")[-1]["event"] == "delete", "a bulk delete keeps histories as delete(ids) does"
    assert m.delete(where={"session": "nobody"}) == 0
    m.calls.clear()
    assert m.reset(confirm=True) == 2 and m.calls == [["a3", "a4"]] and len(m) == 0
    assert m.history("a1") == [], "a reset forgets the kept histories too"


def test_bad_bulk_deletes_are_refused_and_change_nothing():
    m = _mem()
    with pytest.raises(WhereError, match="reset"):
        m.delete(where={})
    with pytest.raises(TypeError, match="give the ids to delete, or where="):
        m.delete()
    with pytest.raises(TypeError, match="not both"):
        m.delete(["a0"], where={"session": "s1"})
    with pytest.raises(WhereError):
        m.delete(where={"nosuchfield": 1})
    with pytest.raises(ValueError, match="confirm=True"):
        m.reset()
    with pytest.raises(UnknownIdError, match="'zz'"):
        m.delete(["a0", "zz"])
    assert len(m) == 8, "nothing was deleted"
    assert m.delete(["a0", "zz"], missing_ok=True) == 1


def test_scoped_bulk_deletes_stay_in_the_scope():
    m = Memory()
    ann, bob = m.scope(tenant="ann"), m.scope(tenant="bob")
    ann.add([{"id": "x", "text": "one", "session": "s1"}, {"id": "y", "text": "two", "session": "s2"}])
    bob.add([{"id": "x", "text": "one", "session": "s1"}])
    assert ann.delete(where={"session": "s1"}) == 1 and bob.get(["x"])[0]["text"] == "one"
    with pytest.raises(ScopeError):
        ann.delete(where={"tenant": "bob"})
    assert ann.match_ids() == ["y"]
    assert ann.delete_all() == 1 and len(ann) == 0 and len(bob) == 1
    with pytest.raises(UnknownIdError):
        bob.delete(["y"])


def _run(capsys, *argv):
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_delete_by_where_a_tenants_all_and_reset(tmp_path, capsys):
    d = tmp_path / "mem"
    _mem().save(d)
    code, _, err = _run(capsys, "memory", "delete", d, "--where", '{"session": "s2"}')
    assert code == 0 and "deleted 2 records" in err, err
    code, _, err = _run(capsys, "memory", "delete", d, "--all")
    assert code == 2 and "--tenant" in err
    code, _, err = _run(capsys, "memory", "delete", d, "--tenant", "bob", "--all")
    assert code == 0 and "deleted 3 records" in err, err
    code, _, err = _run(capsys, "memory", "delete", d, "--where", "{}")
    assert code == 2 and "every record" in err
    code, _, err = _run(capsys, "memory", "reset", d)
    assert code == 2 and "--yes" in err
    assert len(Memory.open(d, writer=False)) == 3
    code, _, err = _run(capsys, "memory", "reset", d, "--yes")
    assert code == 0 and "deleted 3 records" in err
    assert len(Memory.open(d, writer=False)) == 0


def test_http_bulk_delete_and_both_clients(tmp_path):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import asyncio

    from gpuir.service.client import AsyncMemoryClient, MemoryClient, ServiceError
    from gpuir.service.keys import KeyStore
    from gpuir.service.testing import ServerProcess
    from gpuir.storage.dirlock import claim_dir

    root = tmp_path / "mem"
    claim_dir(root, "memory")
    keys = {t: KeyStore(root).add(t) for t in ("alice", "bob")}
    with ServerProcess(root, ["--checkpoint-every", "1000000", "--checkpoint-seconds", "3600"]) as srv:
        a, b = MemoryClient(srv.url, keys["alice"]), MemoryClient(srv.url, keys["bob"])
        a.add([{"id": f"n{i}", "text": f"note {i}", "session": "s1" if i < 4 else "s2"} for i in range(6)])
        b.add([{"id": "n0", "text": "bob's n0", "session": "s1"}])
        # an update that changes nothing changes nothing, as Memory.update: 0
        assert a.update({"id": "n5", "text": "note 5"}) == 0 and a.history("n5") == []
        assert a.update({"id": "n5", "importance": 0.5}) == 1 and len(a.history("n5")) == 1
        # unknown ids: as Memory.delete, refused whole unless missing_ok
        with pytest.raises(UnknownIdError, match="'nope'"):
            a.delete(["n0", "nope"])
        assert a.count() == 6
        assert a.delete(["n0", "nope"], missing_ok=True) == 1
        r = httpx.post(srv.url + "/v1/tenants/alice/delete", json={"ids": ["gone"]},
                       headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 404 and r.json()["detail"]["unknown_ids"] == ["gone"]
        assert httpx.delete(srv.url + "/v1/tenants/alice/records/gone",
                            headers={"Authorization": f"Bearer {keys['alice']}"}).status_code == 404
        # by where: only the tenant's records; another tenant's where is 403
        assert a.delete(where={"session": "s1"}) == 3 and b.get("n0")["text"] == "bob's n0"
        with pytest.raises(ServiceError) as e:
            a.delete(where={"tenant": "bob"})
        assert e.value.status == 403
        r = httpx.post(srv.url + "/v1/tenants/alice/delete", json={"where": {}},
                       headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 422
        r = httpx.post(srv.url + "/v1/tenants/alice/delete", json={"ids": ["n4"], "all": True},
                       headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code == 422, "exactly one of ids, where, all"

        async def go():
            ac = AsyncMemoryClient(srv.url, keys["alice"])
            try:
                with pytest.raises(UnknownIdError):
                    await ac.delete(["n0"])
                assert await ac.delete(where={"session": "s2"}) == 2
                await ac.add([{"id": "late", "text": "added late"}])
                return await ac.delete_all()
            finally:
                await ac.aclose()

        assert asyncio.run(go()) == 1
        assert a.count() == 0 and b.count() == 1
        assert b.delete_all() == 1 and b.count() == 0
        hist = a.history("n0")
        assert [h["event"] for h in hist] == ["delete"], json.dumps(hist)
