"""Issue 36's small defects, each with the test that shows it fixed.

The service's are checked in process (FastAPI's TestClient over the real app: the
same routes, store and log as ``gpuir serve``, without a subprocess); the command
line's through ``gpuir.cli.main``.
"""

from __future__ import annotations

import pytest

from gpuir.memory import DuplicateIdError, Memory, RecordError


@pytest.fixture
def app_client(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gpuir.service.app import create_app
    from gpuir.service.keys import KeyStore
    from gpuir.storage.dirlock import claim_dir

    root = tmp_path / "mem"
    claim_dir(root, "memory")
    key = KeyStore(root).add("alice")
    with TestClient(create_app(root)) as c:
        c.headers["Authorization"] = f"Bearer {key}"
        yield c


def test_patch_of_an_unknown_id_is_404_with_both_quotes(app_client):
    """Before: ``no record 'zz' in tenant 'alice`` (the closing quote stripped with KeyError's)."""
    r = app_client.patch("/v1/tenants/alice/records/zz", json={"text": "q"})
    assert r.status_code == 404 and r.json()["detail"] == "no record 'zz' in tenant 'alice'"


def test_a_bare_epoch_time_names_the_records_time(app_client):
    """Before: loc ["body", "records"] for the second record's bare-number time."""
    r = app_client.post("/v1/tenants/alice/records",
                        json={"records": [{"id": "a", "text": "x"}, {"id": "b", "text": "t", "time": 1683554220}]})
    assert r.status_code == 422
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "records", 1, "time"] and "give its unit" in d["msg"]
    r = app_client.post("/v1/tenants/alice/records",
                        json={"records": [{"id": "c", "text": "t", "expires_at": 17e8}]})
    assert r.json()["detail"][0]["loc"] == ["body", "records", 0, "expires_at"]
    r = app_client.patch("/v1/tenants/alice/records/a", json={"time": 1683554220})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "time"]
    assert app_client.get("/v1/tenants/alice/records/b").status_code == 404, "nothing of the failed add is stored"


def test_put_says_created_when_it_created_the_record(app_client):
    """Before: ``{"updated": 1}`` for a PUT that created the record."""
    r = app_client.put("/v1/tenants/alice/records/n1", json={"text": "new"})
    assert r.status_code == 200
    assert (r.json()["updated"], r.json()["created"]) == (0, 1) and r.json()["record"]["text"] == "new"
    r = app_client.put("/v1/tenants/alice/records/n1", json={"text": "replaced"})
    assert (r.json()["updated"], r.json()["created"]) == (1, 0) and r.json()["record"]["text"] == "replaced"
    r = app_client.patch("/v1/tenants/alice/records/n1", json={"session": "s"})
    assert r.json()["updated"] == 1 and "created" not in r.json()


def test_the_service_store_and_records_carry_the_field_of_a_bad_time():
    """The location travels with the error (RecordError.loc), through the tenant's renaming of ids."""
    from gpuir.memory.intake import canonical_records
    from gpuir.service.errors import tenants_own

    with pytest.raises(RecordError) as e:
        canonical_records([{"id": "t/a", "text": "x"}, {"id": "t/b", "text": "x", "expires_at": 5}])
    assert e.value.loc == (1, "expires_at")
    again = tenants_own(e.value, "t")
    assert again.loc == (1, "expires_at") and "'t/b'" not in str(again) and "'b'" in str(again)


def test_mcp_duplicate_id_names_the_revise_tool():
    """Before: the memory's message said ``use update()``, a method the agent cannot call."""
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from gpuir.adapters.mcp_server import build_server

    m = Memory()
    m.add([{"id": "r1", "text": "Rex likes the park"}])
    with pytest.raises(DuplicateIdError) as e:
        m.add([{"id": "r1", "text": "again"}])
    assert e.value.ids == ["r1"]

    async def go():
        async with Client(build_server(m)) as c:
            r = await c.call_tool("remember", {"text": "duplicate id", "id": "r1"})
            text = " ".join(getattr(x, "text", "") for x in r.content)
            assert r.is_error and "revise" in text and "update()" not in text, text
            r = await c.call_tool("revise", {"id": "nope", "text": "x"})  # revise carries the memory's message
            text = " ".join(getattr(x, "text", "") for x in r.content)
            assert r.is_error and "nope" in text, text

    anyio.run(go)
    assert m.get(["r1"])[0]["text"] == "Rex likes the park"
