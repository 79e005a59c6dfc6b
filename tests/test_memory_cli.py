"""`gpuir memory add|delete|search|info`, end to end, including bad input: exit 0, or 2 with a
message naming what to fix (malformed records, unknown ids, a second writer, a damaged segment)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuir import BM25Index, Memory
from gpuir.cli import main
from gpuir.storage.dirlock import WriterLock

RECORDS = [
    {"id": "c1", "text": "Caroline went to the LGBTQ support group", "tenant": "conv-26", "session": "S1",
     "role": "user", "time": "2023-05-08T13:56:00Z", "metadata": {"speaker": "Caroline"}},
    {"id": "c2", "text": "Melanie painted a sunrise over the lake", "tenant": "conv-26", "session": "S1",
     "role": "user", "time": "2023-05-08T13:57:00Z", "metadata": {"speaker": "Melanie"}},
    {"id": "j1", "text": "Jon lost his banking job and opened a dance studio with a support group", "tenant": "conv-30",
     "session": "S4", "time": "2023-01-20", "importance": 0.9},
    {"id": "j2", "text": "Gina sells clothes online", "tenant": "conv-30"},
]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _run(capsys, *argv):
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def mem_dir(tmp_path, capsys):
    d = tmp_path / "mem"
    code, _, err = _run(capsys, "memory", "add", d, _jsonl(tmp_path / "r.jsonl", RECORDS), "--method", "bm25l",
                        "--k1", 1.4, "--b", 0.6, "--analyzer", "porter", "--partition-days", 30)
    assert code == 0, err
    assert "added 4 records" in err and "created" in err
    return d


def test_add_creates_with_settings_and_search_returns_records(mem_dir, tmp_path, capsys):
    m = Memory.open(mem_dir, writer=False)
    assert m.params.method == "bm25l" and m.params.k1 == 1.4 and m.params.b == 0.6
    assert m.analyzer_config["stemmer"] == "porter" and m.window_ms == 30 * 86_400_000
    code, out, _ = _run(capsys, "memory", "search", mem_dir, "--query", "support group", "-k", 5)
    assert code == 0
    line = json.loads(out)
    assert line["query_id"] == "0" and [h["id"] for h in line["hits"]] == ["c1", "j1"]
    top = line["hits"][0]
    assert top["text"] == RECORDS[0]["text"] and top["tenant"] == "conv-26" and top["role"] == "user"
    assert top["metadata"] == {"speaker": "Caroline"} and top["time"] == "2023-05-08T13:56:00+00:00"
    fresh = BM25Index.build([r["text"] for r in RECORDS], ids=[r["id"] for r in RECORDS], analyzer="porter",
                            method="bm25l", k1=1.4, b=0.6)
    want = fresh.search("support group", k=5)
    assert [h["score"] for h in line["hits"]] == want.scores[0][:2].tolist()
    # --where, --queries with per-query where, trec format
    code, out, _ = _run(capsys, "memory", "search", mem_dir, "--query", "support group",
                        "--where", '{"tenant": "conv-30"}')
    assert [h["id"] for h in json.loads(out)["hits"]] == ["j1"]
    q = _jsonl(tmp_path / "q.jsonl", [{"id": "a", "text": "support"}, {"id": 7, "text": "support group",
                                                                       "where": {"metadata.speaker": "Caroline"}}])
    code, out, _ = _run(capsys, "memory", "search", mem_dir, "--queries", q, "--format", "trec",
                        "--where", '{"tenant": "conv-26"}', "--mode", "newest")
    assert code == 0
    rows = [r.split() for r in out.splitlines()]
    assert [r[:4] for r in rows] == [["a", "Q0", "c1", "1"], ["7", "Q0", "c1", "1"]]


def test_add_again_delete_and_info(mem_dir, tmp_path, capsys):
    more = _jsonl(tmp_path / "more.jsonl", [{"id": "n1", "text": "a new support memory", "tenant": "conv-99"}])
    assert _run(capsys, "memory", "add", mem_dir, more)[0] == 0
    ids = tmp_path / "ids.txt"
    ids.write_text("c1\n\nj2\n")
    code, _, err = _run(capsys, "memory", "delete", mem_dir, "--ids", ids)
    assert code == 0 and "deleted 2 records" in err
    m = Memory.open(mem_dir, writer=False)
    assert sorted(m._writer._ids) == ["c2", "j1", "n1"]
    code, out, _ = _run(capsys, "memory", "info", mem_dir)
    assert code == 0
    for want in ("records     3", "tenants     3", "segments", "partitions", "time span   2023-01-20T00:00:00+00:00",
                 "bm25l k1=1.4 b=0.6"):
        assert want in out
    code, out, _ = _run(capsys, "memory", "info", mem_dir, "--json")
    info = json.loads(out)
    assert info["records"] == 3 and info["tenants"] == 3 and info["partition_days"] == 30


def test_record_times_kept_by_default_and_no_record_times_on_creation(mem_dir, tmp_path, capsys):
    code, out, _ = _run(capsys, "memory", "info", mem_dir)
    assert code == 0 and "record times created_at / updated_at kept" in out
    code, out, _ = _run(capsys, "memory", "get", mem_dir, "c1")
    assert code == 0 and "created_at" in json.loads(out) and "updated_at" in json.loads(out)
    code, out, _ = _run(capsys, "memory", "list", mem_dir, "--order-by", "created_at", "--descending")
    assert code == 0 and len([json.loads(x) for x in out.splitlines() if x.strip()]) >= 1
    code, _, err = _run(capsys, "memory", "add", mem_dir, _jsonl(tmp_path / "x.jsonl", [{"id": "z", "text": "z"}]),
                        "--no-record-times")
    assert code == 2 and "--no-record-times (the memory keeps record times)" in err
    plain = tmp_path / "plain"
    assert _run(capsys, "memory", "add", plain, _jsonl(tmp_path / "p.jsonl", RECORDS), "--no-record-times")[0] == 0
    with Memory.open(plain, writer=False) as m:
        assert m.config()["record_times"] is False and "created_at" not in m.get(["c1"])[0]
    code, out, _ = _run(capsys, "memory", "info", plain)
    assert code == 0 and "record times none kept" in out
    assert _run(capsys, "memory", "add", plain, _jsonl(tmp_path / "q.jsonl", [{"id": "q", "text": "q"}]),
                "--no-record-times")[0] == 0, "naming the memory's own setting is no clash"


@pytest.mark.parametrize("rows, message", [
    (['{"id": "x1", "text": "ok"}', '{"id": "x2", "text": 5}'], "line 2 (id 'x2'): 'text' must be a string, got int"),
    (['{"id": "x1", "text": "ok"}', "{not json"], "line 2: invalid JSON"),
    (['["a", "list"]'], "line 1: expected a JSON object"),
    (['{"id": "x1", "text": "ok", "time": "soon"}'], "line 1 (id 'x1'): 'time' 'soon' is not an ISO 8601"),
    (['{"id": "x1", "text": "ok", "role": "bot"}'], "role 'bot' is not one of"),
    (['{"id": "x1", "text": "ok"}', '{"id": "x1", "text": "again"}'], "line 2 (id 'x1'): id 'x1' occurs twice"),
    (['{"id": "c1", "text": "exists"}'], "line 1 (id 'c1'): the id already exists"),
    (['{"id": 7, "text": "a number id"}'], "line 1: 'id' must be a non-empty string, got int 7"),
])
def test_malformed_records_exit_2_and_change_nothing(mem_dir, tmp_path, capsys, rows, message):
    before = (mem_dir / "CURRENT").read_text()
    code, _out, err = _run(capsys, "memory", "add", mem_dir, _jsonl(tmp_path / "bad.jsonl", rows))
    assert code == 2 and message in err and "bad.jsonl" in err and "Traceback" not in err
    assert (mem_dir / "CURRENT").read_text() == before, "a bad file adds nothing"


def test_bad_input_exits_2_naming_the_fix(mem_dir, tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("c1\nnope\n")
    cases = [
        (["memory", "delete", mem_dir, "--ids", ids], "1 id(s) name no record"),
        (["memory", "delete", mem_dir, "--ids", tmp_path / "missing.txt"], "missing.txt: no such file"),
        (["memory", "add", mem_dir, tmp_path / "missing.jsonl"], "missing.jsonl: no such file"),
        (["memory", "add", mem_dir, _jsonl(tmp_path / "ok.jsonl", [{"id": "z", "text": "z"}]), "--method", "atire"],
         "--method atire (the memory has bm25l): these options apply only when creating"),
        (["memory", "search", mem_dir, "--query", "x", "--where", "{tenant: 1}"], "--where is not valid JSON"),
        (["memory", "search", mem_dir, "--query", "x", "--where", "[1]"], "--where must be a JSON object"),
        (["memory", "search", mem_dir, "--query", "x", "--where", '{"tenant": {"in": ["conv-26", "conv-30"]}}'],
         "tenant is a hard boundary"),
        (["memory", "search", mem_dir, "--query", "x", "--where", '{"colour": "red"}'], "unknown field 'colour'"),
        (["memory", "search", mem_dir, "--query", "x", "-k", 0], "-k must be a positive integer"),
        (["memory", "search", mem_dir, "--query", "x", "--mode", "budgeted"], "needs max_partitions"),
        (["memory", "search", tmp_path / "nowhere", "--query", "x"], "no memory at"),
        (["memory", "info", tmp_path], "no memory at"),
        (["memory", "search", mem_dir, "--queries", _jsonl(tmp_path / "q.jsonl", ['{"id": 1}'])],
         'line 1: missing field "text"'),
        (["memory", "search", mem_dir, "--queries",
          _jsonl(tmp_path / "q2.jsonl", ['{"id": 1, "text": "x", "where": {"tenant": "a"}}']),
          "--where", '{"tenant": "b"}'], "both filter 'tenant'"),
    ]
    for argv, message in cases:
        code, _, err = _run(capsys, *argv)
        assert code == 2, (argv, err)
        assert message in err and "Traceback" not in err, (argv, err)
    assert len(Memory.open(mem_dir, writer=False)) == 4, "nothing was deleted"
    code, _, _ = _run(capsys, "memory", "delete", mem_dir, "--ids", ids, "--missing-ok")
    assert code == 0 and len(Memory.open(mem_dir, writer=False)) == 3


def test_foreign_directory_is_refused(tmp_path, capsys):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "cat.jpg").write_bytes(b"\xff\xd8")
    code, _, err = _run(capsys, "memory", "add", d, _jsonl(tmp_path / "r.jsonl", RECORDS))
    assert code == 2 and "not empty and was not created by gpuir" in err
    assert [p.name for p in d.iterdir()] == ["cat.jpg"]


def test_second_writer_is_refused(mem_dir, tmp_path, capsys):
    rec = _jsonl(tmp_path / "one.jsonl", [{"id": "w1", "text": "while locked"}])
    ids = tmp_path / "ids.txt"
    ids.write_text("c1\n")
    with WriterLock(mem_dir, timeout=0):  # another writer holds the directory
        for argv in (["memory", "add", mem_dir, rec, "--lock-timeout", 0.2],
                     ["memory", "delete", mem_dir, "--ids", ids, "--lock-timeout", 0.2]):
            code, _, err = _run(capsys, *argv)
            assert code == 2 and "locked by another writer" in err
        code, out, _ = _run(capsys, "memory", "search", mem_dir, "--query", "support")  # readers still read
        assert code == 0 and json.loads(out)["hits"]
    assert _run(capsys, "memory", "add", mem_dir, rec)[0] == 0


def test_damaged_segment_exits_2_naming_the_file(mem_dir, capsys):
    seg = max(mem_dir.glob("seg-*.npz"))
    raw = bytearray(seg.read_bytes())
    raw[-30] ^= 0x55
    seg.write_bytes(bytes(raw))
    for argv in (["memory", "search", mem_dir, "--query", "support"], ["memory", "info", mem_dir, "--json"]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and seg.name in err and "damaged" in err and "Traceback" not in err


def test_the_gpuir_command_runs_memory(tmp_path):
    """The installed entry point (a separate process): add, search, exit codes."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    d = tmp_path / "mem"
    r = _jsonl(tmp_path / "r.jsonl", RECORDS)
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuir", "memory", *map(str, a)],
                                    check=False, capture_output=True, text=True, env=env, timeout=120)
    p = run("add", d, r)
    assert p.returncode == 0, p.stderr
    p = run("search", d, "--query", "dance studio", "-k", 2)
    assert p.returncode == 0 and json.loads(p.stdout)["hits"][0]["id"] == "j1"
    p = run("search", d, "--query", "x", "--where", "{")
    assert p.returncode == 2 and "--where is not valid JSON" in p.stderr
    assert np.isfinite(json.loads(run("search", d, "--query", "gina").stdout)["hits"][0]["score"])
