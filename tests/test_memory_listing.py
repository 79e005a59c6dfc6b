"""Listing (pages, stable cursors, orders), counting, and export -> import: a fresh memory searches the
same (ids, float32 scores, ties), with ids, times, metadata, expiries, histories and vectors exact."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _memory_oracle import random_query, random_record, random_where

from gpuir import Memory
from gpuir.memory import RecordError


def _ids(page):
    return [r["id"] for r in page.records]


def _walk(m, **kw):
    out, cursor, pages = [], None, 0
    while True:
        page = m.list(cursor=cursor, **kw)
        out += _ids(page)
        pages += 1
        cursor = page.cursor
        if cursor is None:
            return out, pages


@pytest.fixture
def mem():
    rng = np.random.default_rng(12)
    m = Memory(partition_days=1, merge_factor=3, merge_min=4)
    recs = [random_record(rng, f"r{i:03d}") for i in range(150)]
    for s in range(0, 150, 20):
        m.add(recs[s: s + 20])
    m.delete([f"r{i:03d}" for i in range(0, 150, 7)], keep_history=False)
    return m, recs


def test_pages_in_add_order_and_in_time_order(mem):
    m, recs = mem
    live = [r for r in recs if r["id"] in m]
    got, pages = _walk(m, limit=17)
    assert got == [r["id"] for r in live] and pages == -(-len(live) // 17)
    assert _walk(m, limit=17, descending=True)[0] == [r["id"] for r in reversed(live)]
    # time order: timed records by time (then add order), records without a time after them
    from _memory_oracle import ms

    pos = {r["id"]: i for i, r in enumerate(live)}
    timed = sorted((r for r in live if "time" in r), key=lambda r: (ms(r["time"]), pos[r["id"]]))
    untimed = [r for r in live if "time" not in r]
    assert _walk(m, order_by="time", limit=9)[0] == [r["id"] for r in timed + untimed]
    desc = sorted((r for r in live if "time" in r), key=lambda r: (-ms(r["time"]), -pos[r["id"]]))
    assert _walk(m, order_by="time", descending=True, limit=9)[0] == [r["id"] for r in desc] + [
        r["id"] for r in reversed(untimed)]
    # filters and counts
    w = {"tenant": "acme", "role": {"in": ["user", "tool"]}}
    want = [r["id"] for r in live if r.get("tenant") == "acme" and r.get("role") in ("user", "tool")]
    assert _walk(m, where=w, limit=5)[0] == want and m.count(w) == len(want) and m.count() == len(live)
    assert m.list(where={"tenant": "nobody"}).records == [] and m.list(where={"tenant": "nobody"}).cursor is None


def test_cursors_are_stable_while_records_come_and_go(mem):
    m, _ = mem
    first = m.list(limit=30)
    seen = _ids(first)
    # records added and deleted between pages: no page shifts, nothing is repeated or skipped
    m.delete(seen[:10] + [_walk(m)[0][40]])
    m.add([{"id": "late-1", "text": "w1 w2"}, {"id": "late-2", "text": "w3"}])
    rest, cursor = [], first.cursor
    while cursor is not None:
        page = m.list(limit=30, cursor=cursor)
        rest += _ids(page)
        cursor = page.cursor
    now = _walk(m)[0]
    assert rest == [x for x in now if x not in seen], "the rest is exactly what came after the first page"
    assert rest[-2:] == ["late-1", "late-2"] and not set(rest) & set(seen)


def test_cursor_errors(mem):
    m, _ = mem
    c = m.list(limit=5, where={"tenant": "acme"}).cursor
    with pytest.raises(ValueError, match="another where, order_by or descending"):
        m.list(limit=5, where={"tenant": "globex"}, cursor=c)
    with pytest.raises(ValueError, match="another where, order_by or descending"):
        m.list(limit=5, where={"tenant": "acme"}, cursor=c, descending=True)
    with pytest.raises(ValueError, match="not one a page of this memory gave"):
        m.list(cursor="garbage!")
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        m.list(limit=0)
    with pytest.raises(ValueError, match="order_by must be one of"):
        m.list(order_by="score")


def test_listing_is_confined_to_a_tenant(mem, monkeypatch):
    m, recs = mem
    tenant_of = {r["id"]: r.get("tenant") for r in recs}
    for w in ({"tenant": "acme"}, {"tenant": "acme", "$or": [{"metadata.tenant": "globex"}, {"agent": "agent1"}]}):
        assert {tenant_of[i] for i in _walk(m, where=w, limit=7)[0]} == {"acme"}
    from gpuir.memory import where as where_mod  # defence in depth: a wrong mask is refused, not returned

    monkeypatch.setattr(where_mod.Where, "mask", lambda self, view, dicts: np.ones(view.seg.n_docs, bool))
    monkeypatch.setattr(where_mod.Where, "rows", lambda self, view, dicts: np.arange(view.seg.n_docs, dtype=np.int64))
    with pytest.raises(RuntimeError, match="refusing to return it"):
        _walk(m, where={"tenant": "acme"})


def test_export_then_import_gives_identical_searches(mem, tmp_path):
    m, _ = mem
    rng = np.random.default_rng(5)
    m.update([{"id": "r001", "metadata": {"x": 0.1 + 0.2, "big": 2 ** 53 + 1, "nested": {"a": [1, "b", None]}}},
              {"id": "r002", "expires_at": "2999-01-01T00:00:00.123Z", "time": "2024-02-29T23:59:59.999+05:30"}])
    m.update([{"id": "r001", "text": "w0 w0 w1 fresh words"}])
    vec = {"r001": np.array([0.1, -2.5, 3e-8], np.float32), "r003": np.array([1 / 3, 0, 7], np.float32)}
    path = tmp_path / "export.jsonl"
    n = m.export(path, vectors=vec)
    assert n == len(m)
    lines = path.read_text("utf-8").splitlines()
    assert json.loads(lines[0])["format"] == "gpuir-memory-export" and len(lines) == 1 + n + 2  # 2 histories
    got_vecs: dict = {}
    m2 = Memory.from_export(path, vectors=got_vecs)
    assert m2.config() == m.config()
    assert _walk(m2)[0] == _walk(m)[0], "the add order is kept"
    ids = _walk(m)[0]
    assert m2.get(ids) == m.get(ids), "every field exact: ids, times, expiries, metadata, importance"
    assert m2.get(["r001"])[0]["metadata"]["big"] == 2 ** 53 + 1 and m2.get(["r001"])[0]["metadata"]["x"] == 0.1 + 0.2
    assert m2.history("r001") == m.history("r001") and len(m2.history("r001")) == 2
    assert set(got_vecs) == set(vec) and all(np.array_equal(got_vecs[k], vec[k]) for k in vec)
    assert got_vecs["r001"].dtype == np.float32
    queries = [random_query(rng) for _ in range(40)]
    for w in (None, {"tenant": "acme"}, [random_where(rng) for _ in queries]):
        for mode in ("exhaustive", "newest"):
            a = m.search(queries, k=10, where=w, mode=mode)
            b = m2.search(queries, k=10, where=w, mode=mode)
            assert [a.ids(i) for i in range(len(queries))] == [b.ids(i) for i in range(len(queries))]
            np.testing.assert_array_equal(a.scores, b.scores)
    # into an existing memory with the same settings: the same again; ids that exist are refused
    m3 = Memory(partition_days=1, merge_factor=3, merge_min=4)
    assert m3.import_(path) == n and m3.get(ids) == m.get(ids)
    with pytest.raises(RecordError, match="the id already exists"):
        m3.import_(path)
    assert m3.import_(path, replace=True) == n and len(m3) == n


def test_import_refuses_other_settings_and_damaged_files(mem, tmp_path):
    m, _ = mem
    path = tmp_path / "e.jsonl"
    m.export(path, where={"tenant": "acme"}, history=False)
    with pytest.raises(ValueError, match="another bm25"):
        Memory(k1=0.9).import_(path)
    assert Memory(k1=0.9).import_(path, check_config=False) == m.count({"tenant": "acme"})
    lines = path.read_text().splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(RecordError, match="truncated or damaged"):
        Memory.from_export(tmp_path / "cut.jsonl")
    (tmp_path / "plain.jsonl").write_text(lines[1] + "\n")
    with pytest.raises(RecordError, match="not a gpuir memory export"):
        Memory().import_(tmp_path / "plain.jsonl")
    bad = json.loads(lines[1])
    bad["time"] = 1700000000000
    head = json.loads(lines[0])
    head["records"] = 1
    (tmp_path / "bad.jsonl").write_text(json.dumps(head) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match="line 2 .*bare number"):
        Memory.from_export(tmp_path / "bad.jsonl")


def test_cli_get_list_count_update_history_export_import(tmp_path, capsys):
    from types import SimpleNamespace

    from gpuir.cli import main

    def _gpuir(*args, cwd):
        code = main(["memory", *map(str, args)])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    recs = tmp_path / "r.jsonl"
    recs.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "text": "Caroline went to the support group", "tenant": "t", "time": "2023-05-08T13:56:00Z",
         "metadata": {"speaker": "Caroline", "tags": ["lgbtq", "support"]}},
        {"id": "b", "text": "Melanie painted a sunrise", "tenant": "t", "time": 1683554220,
         "metadata": {"speaker": "Melanie"}},
        {"id": "c", "text": "no time here", "tenant": "u"},
    ]) + "\n")
    d = tmp_path / "m"
    r = _gpuir("add", d, recs, cwd=tmp_path)
    assert r.returncode == 2 and "line 2 (id 'b'): 'time' is the bare number 1683554220: give its unit" in r.stderr
    assert _gpuir("add", d, recs, "--time-unit", "s", cwd=tmp_path).returncode == 0
    r = _gpuir("get", d, "b", cwd=tmp_path)
    assert json.loads(r.stdout)["time"] == "2023-05-08T13:57:00+00:00"
    assert _gpuir("get", d, "zz", cwd=tmp_path).returncode == 2
    r = _gpuir("list", d, "--limit", "2", cwd=tmp_path)
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["a", "b"] and "next: --cursor " in r.stderr
    cursor = r.stderr.split("next: --cursor ")[1].split()[0]
    r = _gpuir("list", d, "--limit", "2", "--cursor", cursor, cwd=tmp_path)
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["c"] and "next:" not in r.stderr
    r = _gpuir("list", d, "--all", "--limit", "1", "--order-by", "time", "--descending", cwd=tmp_path)
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["b", "a", "c"]
    r = _gpuir("count", d, "--where", '{"metadata.tags": {"contains": "support"}}', cwd=tmp_path)
    assert r.stdout.strip() == "1"
    patch = tmp_path / "p.jsonl"
    patch.write_text('{"id": "a", "metadata": {"speaker": null, "mood": "hopeful"}}\n')
    assert _gpuir("update", d, patch, cwd=tmp_path).returncode == 0
    a = json.loads(_gpuir("get", d, "a", cwd=tmp_path).stdout)
    assert a["metadata"] == {"tags": ["lgbtq", "support"], "mood": "hopeful"} and a["tenant"] == "t"
    hist = _gpuir("history", d, "a", cwd=tmp_path).stdout.splitlines()
    assert len(hist) == 1 and json.loads(hist[0])["metadata"]["speaker"] == "Caroline"
    patch.write_text('{"id": "nope", "text": "x"}\n')
    r = _gpuir("update", d, patch, cwd=tmp_path)
    assert r.returncode == 2 and "1 id(s) name no record" in r.stderr
    assert _gpuir("update", d, patch, "--upsert", cwd=tmp_path).returncode == 0
    out = tmp_path / "e.jsonl"
    assert _gpuir("export", d, out, cwd=tmp_path).returncode == 0
    assert _gpuir("import", tmp_path / "m2", out, cwd=tmp_path).returncode == 0
    r1 = _gpuir("search", d, "--query", "support group painted", cwd=tmp_path).stdout
    r2 = _gpuir("search", tmp_path / "m2", "--query", "support group painted", cwd=tmp_path).stdout
    assert r1 == r2 and json.loads(r1)["hits"]
    r = _gpuir("import", tmp_path / "m2", out, cwd=tmp_path)
    assert r.returncode == 2 and "already exists" in r.stderr
