"""Records keep their own history (issue 36 §3): generated time-ordered ids (UUIDv7), created/updated times
decided before the record is applied (so applying the same canonical dicts again gives the same state),
history entries with their event and time that outlive a delete, and updates that change nothing."""

from __future__ import annotations

import time
import uuid

import pytest

from gpuir.memory import Memory, RecordError, WhereError, stamps
from gpuir.memory.intake import canonical_records, to_batch
from gpuir.memory.records import format_time
from gpuir.memory.stamps import uuid7


def test_uuid7_is_a_version_7_uuid_of_the_time_and_ordered(monkeypatch):
    # a fresh clock state: an id made earlier in this process (at today's time) would hold the 2024 ms below back
    monkeypatch.setattr(stamps, "_last", [0, 0])
    ms = 1_717_171_717_171
    u = uuid.UUID(uuid7(ms))
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert u.int >> 80 == ms, "the first 48 bits are the epoch milliseconds"
    made = [uuid7() for _ in range(5000)]  # several per millisecond: the counter keeps them ordered
    assert made == sorted(made) and len(set(made)) == 5000
    assert uuid7(ms - 10_000) > made[-1], "a clock that steps back never makes an id sorting earlier"


def test_a_record_without_an_id_gets_a_time_ordered_one():
    m = Memory()
    assert m.add([{"text": "first"}, {"text": "second"}]) == 2
    ids = [r["id"] for r in m.list().records]
    assert len(ids) == 2 and ids == sorted(ids) and all(uuid.UUID(i).version == 7 for i in ids)
    sc = m.scope(tenant="ann")
    sc.add([{"text": "scoped"}])
    rid = sc.list().records[0]["id"]
    assert uuid.UUID(rid).version == 7 and m.get([f"ann/{rid}"])[0]["text"] == "scoped"
    with pytest.raises(RecordError, match="'id' must be a non-empty string"):
        m.add([{"id": "", "text": "an empty id is still an error"}])
    with pytest.raises(RecordError, match="'id' must be a non-empty string"):
        m.update([{"text": "an update names its record"}])


def test_created_and_updated_times_come_back_and_an_update_moves_only_updated_at():
    m = Memory(record_times=True)
    t0 = int(time.time() * 1000)
    m.add([{"id": "a", "text": "Rex likes the park"}])
    time.sleep(0.005)
    m.add([{"id": "b", "text": "Ann bought a bike"}])
    a = m.get(["a"])[0]
    assert a["created_at"] == a["updated_at"] and a["created_at"] >= format_time(t0)[:19]
    assert m.search("park").hits(0)[0]["created_at"] == a["created_at"], "hits carry them too"
    time.sleep(0.005)
    assert m.update([{"id": "a", "text": "Rex loves the park"}]) == 1
    a2 = m.get(["a"])[0]
    assert a2["created_at"] == a["created_at"] and a2["updated_at"] > a["updated_at"]
    # an update that changes nothing changes nothing: 0, no write, no version, no new updated_at
    unsaved, snap = m.unsaved, m.snapshot()
    assert m.update([{"id": "a", "text": "Rex loves the park"}]) == 0
    assert m.replace([{"id": "a", "text": "Rex loves the park"}]) == 0, "a replace keeps created_at: same record"
    assert m.unsaved == unsaved and m.snapshot() is snap and len(m.history("a")) == 1
    assert m.get(["a"])[0] == a2
    # where and order_by
    assert [r["id"] for r in m.list().records] == ["b", "a"], "the add order: an update re-adds"
    assert [r["id"] for r in m.list(order_by="created_at").records] == ["a", "b"], "created_at keeps the place"
    assert [r["id"] for r in m.list(order_by="updated_at", descending=True).records] == ["a", "b"]
    assert m.count(where={"updated_at": {"gt": m.get(["b"])[0]["updated_at"]}}) == 1, "only a changed after b"
    assert m.count(where={"created_at": {"lte": a["created_at"]}}) == 1, "b was added after a"
    assert m.search("park", where={"updated_at": {"lt": a2["updated_at"]}}).hits(0) == [], "a's new version is later"
    with pytest.raises(WhereError, match="storage key"):
        m.count(where={"metadata.\u0000created_at": 1})
    with pytest.raises(RecordError, match="reserved"):
        m.add([{"id": "x", "text": "y", "metadata": {"\u0000updated_at": 5}}])


def test_without_record_times_records_are_as_before():
    m = Memory(record_times=False)
    m.add([{"id": "a", "text": "plain"}])
    assert m.get(["a"])[0] == {"id": "a", "text": "plain"}
    assert m.update([{"id": "a", "text": "plain"}]) == 0 and m.update([{"id": "a", "text": "new"}]) == 1
    assert m.history("a")[0]["event"] == "update" and m.history("a")[0]["event_time"] is not None


def test_reapplying_the_canonical_records_reproduces_the_same_state():
    """What the write-ahead log relies on: ids and times are in the canonical dicts, not decided when applied."""
    recs = [{"text": "no id given", "session": "s"}, {"id": "k", "text": "given id", "time": "2024-05-01T10:00:00Z"}]
    canon = canonical_records(recs, None, stamp="add")
    assert canon[0]["id"] and canon[0]["created_at"] == canon[0]["updated_at"] == canon[1]["created_at"]
    first, again = Memory(record_times=True), Memory(record_times=True)
    first.add(canon, time_unit="ms")
    time.sleep(0.01)
    again.add([dict(r) for r in canon], time_unit="ms")  # a replay, later
    ids = [canon[0]["id"], "k"]
    assert first.get(ids) == again.get(ids)
    patch = canonical_records([{"id": "k", "text": "changed"}], None, stamp="update")
    first.update(patch, time_unit="ms")
    time.sleep(0.01)
    again.update([dict(p) for p in patch], time_unit="ms")
    assert first.get(ids) == again.get(ids) and first.history("k") == again.history("k")
    with pytest.raises(RecordError):
        to_batch([{"text": "no id, no stamp"}], None, stamp=None)


def test_history_entries_carry_event_time_and_outlive_a_delete(tmp_path):
    m = Memory(record_times=True)
    m.add([{"id": "n", "text": "v0"}])
    m.update([{"id": "n", "text": "v1"}])
    v1 = m.get(["n"])[0]
    assert m.delete(["n"]) == 1 and "n" not in m
    hist = m.history("n")
    assert [(h["event"], h["text"]) for h in hist] == [("update", "v0"), ("delete", "v1")]
    assert hist[0]["event_time"] == v1["updated_at"], "an update's time is its new version's updated_at"
    assert hist[1]["event_time"] >= hist[0]["event_time"]
    assert hist[0]["created_at"] == v1["created_at"], "the add: the oldest version's created_at"
    m.save(tmp_path / "m")
    m.close()
    with Memory.open(tmp_path / "m") as again:
        assert again.history("n") == hist, "saved with the memory"
        assert again.config()["record_times"] is True
        again.add([{"id": "n2", "text": "x"}])
        assert "created_at" in again.get(["n2"])[0]
        again.export(tmp_path / "e.jsonl")
    imported = Memory.from_export(tmp_path / "e.jsonl")
    assert imported.history("n") == hist, "export and import keep the events"
    assert imported.get(["n2"])[0]["created_at"] == Memory.open(tmp_path / "m", writer=False).get(["n2"])[0][
        "created_at"], "an import keeps the records' times"
    m2 = Memory()
    m2.add([{"id": "z", "text": "gone"}])
    m2.delete(["z"], keep_history=False)
    assert m2.history("z") == []
