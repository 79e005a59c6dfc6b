"""Issue 36's small defects, each with the test that shows it fixed.

The service's are checked in process (FastAPI's TestClient over the real app: the
same routes, store and log as ``gpuir serve``, without a subprocess); the command
line's through ``gpuir.cli.main``.
"""

from __future__ import annotations

import json

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


# ---------------------------------------------------------------------- the command line


def _cli(*args, stdin: bytes | None = None, monkeypatch=None):
    """``gpuir ARGS`` in this process: (exit status, stdout, stderr); ``stdin`` is what '-' reads."""
    import contextlib
    import io
    import sys

    from gpuir.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in args])
            except SystemExit as e:
                rc = e.code
    finally:
        sys.stdin = old
    return rc, out.getvalue(), err.getvalue()


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


RECS = [{"id": "m1", "text": "Caroline went to the support group", "session": "s1"},
        {"id": "m2", "text": "Melanie painted a sunrise", "session": "s1"},
        {"id": "m3", "text": "the support group met on Sunday", "session": "s2"}]


def test_every_file_argument_of_the_memory_cli_reads_dash_as_stdin(tmp_path):
    """Before: '-' was a file name ('-: no such file')."""
    mem = tmp_path / "mem"
    rc, _, err = _cli("memory", "add", mem, "-", stdin=_jsonl(RECS))
    assert rc == 0 and "added 3 records" in err, err
    rc, out, err = _cli("memory", "search", mem, "--queries", "-", "-k", "2",
                        stdin=_jsonl([{"id": "q1", "text": "support group"}, {"id": "q2", "text": "sunrise"}]))
    assert rc == 0, err
    assert [[h["id"] for h in json.loads(x)["hits"]] for x in out.splitlines()] == [["m1", "m3"], ["m2"]]
    rc, _, err = _cli("memory", "update", mem, "-", stdin=_jsonl([{"id": "m2", "text": "Melanie painted a sunset"}]))
    assert rc == 0 and "updated 1 records" in err, err
    rc, _, err = _cli("memory", "delete", mem, "--ids", "-", stdin=b"m3\n")
    assert rc == 0 and "deleted 1 records" in err, err
    rc, out, err = _cli("memory", "export", mem, "-")
    assert rc == 0 and "<stdout>" in err, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [r.get("id") for r in lines[1:3]] == ["m1", "m2"] and lines[2]["text"] == "Melanie painted a sunset"
    rc, _, err = _cli("memory", "import", tmp_path / "copy", "-", stdin=out.encode())
    assert rc == 0 and "imported 2 records" in err and "created" in err, err
    rc, out, _ = _cli("memory", "get", tmp_path / "copy", "m1", "m2")
    assert [json.loads(x)["text"] for x in out.splitlines()] == ["Caroline went to the support group",
                                                                  "Melanie painted a sunset"]
    cfg = json.dumps({"channels": [{"kind": "bm25", "depth": 10}], "fusion": None}).encode()
    rc, out, err = _cli("memory", "search", mem, "--query", "support group", "--config", "-", stdin=cfg)
    assert rc == 0 and [h["id"] for h in json.loads(out)["hits"]] == ["m1"], err


def test_errors_in_standard_input_name_stdin_and_its_line(tmp_path):
    mem = tmp_path / "mem"
    rc, _, err = _cli("memory", "add", mem, "-", stdin=_jsonl(RECS[:1]) + b"{not json\n")
    assert rc == 2 and "<stdin>, line 2: invalid JSON" in err, err
    assert not mem.exists(), "nothing was created"
    _cli("memory", "add", mem, "-", stdin=_jsonl(RECS))
    rc, _, err = _cli("memory", "import", tmp_path / "copy", "-", stdin=b'{"format": "nonsense"}\n')
    assert rc == 2 and "<stdin>" in err and "gpuir-stdin-" not in err, err
    rc, _, err = _cli("memory", "search", mem, "--queries", "-", "--config", "-", stdin=b"")
    assert rc == 2 and "--queries and --config both read standard input" in err, err


def test_memory_get_suggests_the_option_not_the_python_argument(tmp_path):
    """Before: 'pass missing_ok=True to skip unknown ids' from the command line."""
    mem = tmp_path / "mem"
    _cli("memory", "add", mem, "-", stdin=_jsonl(RECS))
    rc, out, err = _cli("memory", "get", mem, "m1", "nope")
    assert rc == 2 and "--missing-ok" in err and "missing_ok=True" not in err and "'nope'" in err, err
    assert out == ""
    rc, out, err = _cli("memory", "get", mem, "m1", "nope", "--missing-ok")
    assert rc == 0 and [json.loads(x)["id"] for x in out.splitlines()] == ["m1"]


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_v_and_vv_say_what_search_and_update_do(tmp_path, verbose):
    """Before: -v and -vv printed nothing for memory search and memory update."""
    mem = tmp_path / "mem"
    _cli("memory", "add", mem, "-", stdin=_jsonl(RECS))
    flags = ["-v"] * verbose
    rc, out, err = _cli("memory", "search", mem, "--query", "support group", "-k", "2", *flags)
    assert rc == 0 and len(out.splitlines()) == 1
    info = "searching 1 query, k=2" in err and "answered 1 query with 2 hits" in err
    debug = "query 0: 2 hit(s), best 'm1'" in err
    assert (info, debug) == (verbose >= 1, verbose >= 2), err
    rc, _, err = _cli("memory", "update", mem, "-", *flags, stdin=_jsonl([{"id": "m1", "session": "s9"}]))
    assert rc == 0, err
    info = "update of 1 record(s) from <stdin>" in err and "changed 1 record(s)" in err
    debug = "ids: 'm1' (1 known, 0 new)" in err
    assert (info, debug) == (verbose >= 1, verbose >= 2), err


def test_mcp_tells_a_duplicate_from_other_refusals_for_every_backend():
    """A Memory's DuplicateIdError and the service's 409 (MCP over MemoryClient) are duplicates; nothing else."""
    pytest.importorskip("httpx")
    from gpuir.adapters.mcp_server import _is_duplicate
    from gpuir.service.client import ServiceError

    assert _is_duplicate(DuplicateIdError("x", ["a"])) and _is_duplicate(ServiceError(409, "exists", "POST", "u"))
    assert not _is_duplicate(ServiceError(404, "no", "GET", "u")) and not _is_duplicate(RecordError("bad time"))
