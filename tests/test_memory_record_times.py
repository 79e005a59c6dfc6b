"""Record times by default (issue 36 §3): ``Memory()`` keeps each record's ``created_at`` / ``updated_at``
(as mem0 returns on every memory), ``record_times=False`` opts out, and a directory saved without them opens
as it was saved (no times, none stamped on its new writes)."""

from __future__ import annotations

import json
import time

import pytest

from gpuir.memory import Memory, persist
from gpuir.memory.records import format_time


def test_a_default_memory_keeps_times_that_move_on_update():
    m = Memory()
    assert m.config()["record_times"] is True and m.stamp == "add"
    m.add([{"id": "a", "text": "Rex likes the park"}])
    time.sleep(0.005)
    m.add([{"id": "b", "text": "Ann bought a bike"}])
    a = m.get(["a"])[0]
    assert a["created_at"] == a["updated_at"] and a["created_at"].endswith("+00:00")
    assert m.search("park").hits(0)[0]["created_at"] == a["created_at"], "hits carry them"
    assert m.list().records[0]["created_at"] == a["created_at"], "so does list"
    time.sleep(0.005)
    assert m.update([{"id": "a", "text": "Rex loves the park"}]) == 1
    a2 = m.get(["a"])[0]
    assert a2["created_at"] == a["created_at"], "created_at stays"
    assert a2["updated_at"] > a["updated_at"], "updated_at moves"
    b = m.get(["b"])[0]
    # where and order_by, by default
    assert [r["id"] for r in m.list(order_by="created_at").records] == ["a", "b"]
    assert [r["id"] for r in m.list(order_by="updated_at").records] == ["b", "a"]
    assert m.count(where={"updated_at": {"gt": b["updated_at"]}}) == 1
    assert m.count(where={"created_at": {"gt": a["created_at"]}}) == 1
    assert [h["id"] for h in m.search("park bike", where={"created_at": {"gte": b["created_at"]}}).hits(0)] == ["b"]


def test_record_times_false_keeps_none():
    m = Memory(record_times=False)
    assert m.config()["record_times"] is False and m.stamp == "id"
    m.add([{"id": "a", "text": "plain"}])
    assert m.get(["a"])[0] == {"id": "a", "text": "plain"}
    assert m.update([{"id": "a", "text": "changed"}]) == 1
    assert m.get(["a"])[0] == {"id": "a", "text": "changed"}
    assert "created_at" not in m.search("changed").hits(0)[0]
    assert m.count(where={"created_at": {"exists": True}}) == 0


def test_the_setting_is_saved_and_reopened(tmp_path):
    for setting in (True, False):
        d = tmp_path / str(setting)
        with Memory(record_times=setting) as m:
            m.add([{"id": "a", "text": "saved"}])
            m.save(d)
        with Memory.open(d) as again:
            assert again.config()["record_times"] is setting
            again.add([{"id": "b", "text": "after the reopen"}])
            assert ("created_at" in again.get(["b"])[0]) is setting


def _drop_record_times_from_manifest(root):
    """Make ``root`` look as a directory saved before the option existed: no ``record_times`` in its manifest."""
    name, manifest = persist.read_manifest(root)
    manifest["config"].pop("record_times")
    manifest["sha256"] = persist._body_sha(manifest)
    (root / name).write_text(json.dumps(manifest))
    return manifest


def test_an_old_directory_without_times_opens_and_stays_without_times(tmp_path):
    """A directory saved before times were the default (``record_times`` absent from its manifest, or False)
    opens as it was saved: its records have no times, and its new writes get none either (stamping only the
    new ones would give it records whose times say "added now" beside records with none)."""
    d = tmp_path / "old"
    with Memory(record_times=False) as m:
        m.add([{"id": "a", "text": "an old record"}])
        m.save(d)
    try:
        _drop_record_times_from_manifest(d)
    except (OSError, ValueError, KeyError) as e:  # pragma: no cover - the manifest's form changed
        pytest.fail(f"could not rewrite the manifest as an older gpuir wrote it: {e}")
    with Memory.open(d) as old:
        assert old.config()["record_times"] is False and old.stamp == "id"
        assert old.get(["a"])[0] == {"id": "a", "text": "an old record"}
        old.add([{"id": "b", "text": "a new record"}])
        assert old.update([{"id": "a", "text": "changed"}]) == 1
        assert old.get(["a", "b"]) == [{"id": "a", "text": "changed"}, {"id": "b", "text": "a new record"}]
        assert [r["id"] for r in old.list(order_by="created_at").records] == ["b", "a"], "no times: the add order"
    with Memory.open(d, writer=False) as again:  # the log replayed: the same records, still without times
        assert again.get(["a", "b"]) == [{"id": "a", "text": "changed"}, {"id": "b", "text": "a new record"}]
        again.export(tmp_path / "old.jsonl")
    # the way to times, documented: import the export into a new memory (created_at: when imported)
    t0 = format_time(int(time.time() * 1000))
    new = Memory()
    assert new.import_(tmp_path / "old.jsonl") == 2
    a = new.get(["a"])[0]
    assert a["text"] == "changed" and a["created_at"] == a["updated_at"] and a["created_at"] >= t0


def test_replaying_the_log_of_a_default_memory_never_restamps(tmp_path):
    d = tmp_path / "m"
    m = Memory()
    m.save(d)
    m.add([{"id": "a", "text": "one"}, {"text": "no id"}])
    time.sleep(0.005)
    m.update([{"id": "a", "text": "two"}])
    before, hist = m.list().records, m.history("a")
    assert all("created_at" in r for r in before)
    time.sleep(0.01)
    with Memory.open(d, writer=False) as reader:  # replays the log in memory, later
        assert reader.list().records == before, "the replayed writes keep the times they were logged with"
    m._writer._log.close()  # the process ends without close(): only the log holds the writes
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    time.sleep(0.01)
    with Memory.open(d) as again:
        assert again.list().records == before and again.history("a") == hist
