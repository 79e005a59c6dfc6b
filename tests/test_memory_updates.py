"""Updates that keep what they do not name (merge, replace, upsert), the bounded per-record history
(kept across save/open, removed on delete unless asked), and the update example of docs/memory.md."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import without_times
from _memory_oracle import Model, assert_same, random_query, random_record

from gpuir import Memory
from gpuir.memory import RecordError, UnknownIdError

FULL = {"id": "t2", "text": "Melanie painted a sunrise over the lake", "tenant": "conv-26", "session": "S1",
        "role": "user", "agent": "bot", "time": "2023-05-08T13:57:00Z", "importance": 0.5, "type": "event",
        "metadata": {"speaker": "Melanie", "mood": "calm", "tags": ["art"]}}


def _mem():
    m = Memory()
    m.add([FULL, {"id": "other", "text": "Caroline went to the support group", "tenant": "conv-26"}])
    return m


def test_update_keeps_every_field_and_metadata_key_it_does_not_name():
    m = _mem()
    before = m.get(["t2"])[0]
    assert m.update([{"id": "t2", "text": "Melanie painted a sunset"}]) == 1
    after = m.get(["t2"])[0]
    assert without_times(after) == {**without_times(before), "text": "Melanie painted a sunset"}, "only the text changed"
    assert after["created_at"] == before["created_at"] and after["updated_at"] >= before["updated_at"]
    # the record is still found by its tenant, session and metadata, with its new text
    w = {"tenant": "conv-26", "session": "S1", "metadata.speaker": "Melanie"}
    assert m.search("sunset", where=w).ids(0) == ["t2"]
    assert m.search("sunrise", where=w).ids(0) == [], "the old text is no longer indexed"
    # metadata merges key by key: a key given is set, a key given as None removed, the others kept
    m.update([{"id": "t2", "metadata": {"mood": None, "year": 2023}}])
    assert m.get(["t2"])[0]["metadata"] == {"speaker": "Melanie", "tags": ["art"], "year": 2023}
    # a field given as None is removed; metadata-only and time-only updates work
    m.update([{"id": "t2", "agent": None, "time": "2023-05-09T10:00:00+02:00"}])
    got = m.get(["t2"])[0]
    assert "agent" not in got and got["time"] == "2023-05-09T08:00:00+00:00" and got["role"] == "user"
    assert m.update([{"id": "t2", "metadata": None}]) == 1 and "metadata" not in m.get(["t2"])[0]


def test_replace_and_update_replace_true_replace_whole_records():
    m = _mem()
    m.replace([{"id": "t2", "text": "only text now"}])
    assert without_times(m.get(["t2"])[0]) == {"id": "t2", "text": "only text now"}
    m.update([{"id": "t2", "text": "again", "tenant": "x"}], replace=True)
    assert without_times(m.get(["t2"])[0]) == {"id": "t2", "text": "again", "tenant": "x"}
    with pytest.raises(RecordError, match="'text' must be a string, got missing"):
        m.replace([{"id": "t2", "session": "S9"}])


def test_upsert_updates_existing_ids_and_adds_new_ones_atomically():
    m = _mem()
    assert m.upsert([{"id": "t2", "importance": 0.9}, {"id": "new", "text": "a new note", "tenant": "conv-26"}]) == 2
    assert m.get(["t2"])[0]["importance"] == 0.9 and m.get(["t2"])[0]["session"] == "S1"
    assert without_times(m.get(["new"])[0]) == {"id": "new", "text": "a new note", "tenant": "conv-26"}
    with pytest.raises(RecordError, match="'text' must be a string, got missing"):  # a new id needs text
        m.upsert([{"id": "t2", "importance": 0.1}, {"id": "new2", "session": "S1"}])
    assert m.get(["t2"])[0]["importance"] == 0.9 and "new2" not in m, "nothing of a bad batch is applied"


def test_update_errors_change_nothing():
    m = _mem()
    with pytest.raises(UnknownIdError, match="update: 1 unknown id"):
        m.update([{"id": "t2", "text": "x"}, {"id": "nope", "text": "y"}])
    with pytest.raises(RecordError, match="'text' cannot be removed"):
        m.update([{"id": "t2", "text": None}])
    with pytest.raises(RecordError, match="record 1 \\(id 't2'\\): 'importance' must be a number"):
        m.update([{"id": "other", "text": "changed"}, {"id": "t2", "importance": "high"}])
    with pytest.raises(RecordError, match="the id occurs twice"):
        m.update([{"id": "t2", "text": "a"}, {"id": "t2", "text": "b"}])
    with pytest.raises(RecordError, match="'id' must be a non-empty string"):
        m.update([{"text": "no id"}])
    with pytest.raises(RecordError, match="bare number"):
        m.update([{"id": "t2", "time": 1683554220}])
    assert m.update([{"id": "t2", "time": 1683554220}], time_unit="s") == 0, "t2's own time: nothing changes"
    assert m.update([{"id": "t2", "time": 1683554221}], time_unit="s") == 1
    assert m.get(["other"])[0]["text"] == "Caroline went to the support group"
    assert m.history("other") == []


def test_an_update_that_changes_nothing_is_not_rewritten():
    m = _mem()
    snap = m.snapshot()
    assert m.update([{"id": "t2", "session": "S1", "metadata": {"speaker": "Melanie"}}]) == 0
    assert m.snapshot() is snap and m.history("t2") == [] and m.unsaved == 2  # the add's 2 only


def test_history_keeps_earlier_versions_bounded_and_goes_with_delete_when_asked(tmp_path):
    m = Memory(history_limit=3)
    m.add([{"id": "n", "text": "v0", "metadata": {"k": 0}}])
    for i in range(1, 6):
        m.update([{"id": "n", "text": f"v{i}", "metadata": {"k": i}}])
    hist = m.history("n")
    assert [h["text"] for h in hist] == ["v2", "v3", "v4"], "oldest first, at most history_limit"
    assert without_times({k: v for k, v in hist[-1].items() if k != "event_time"}) == {
        "id": "n", "text": "v4", "metadata": {"k": 4}, "event": "update"}
    hist[0]["metadata"]["k"] = 99  # a copy: changing it changes nothing stored
    assert m.history("n")[0]["metadata"]["k"] == 2
    m.save(tmp_path / "m")
    m.close()
    m = Memory.open(tmp_path / "m")
    assert [h["text"] for h in m.history("n")] == ["v2", "v3", "v4"], "saved with the memory"
    assert any(p.name.startswith("history-") for p in (tmp_path / "m").iterdir())
    m.delete(["n"], keep_history=True)
    assert [h["text"] for h in m.history("n")] == ["v3", "v4", "v5"], "the deleted version is kept last"
    m.add([{"id": "n", "text": "reborn"}])
    m.update([{"id": "n", "text": "reborn twice"}])
    assert [h["text"] for h in m.history("n")] == ["v4", "v5", "reborn"]
    m.delete(["n"], keep_history=False)
    assert m.history("n") == [], "a delete removes the history when asked"
    m.save()
    m.save()  # files of the commit before the last are collected (a reader may still load the last one)
    m.close()
    assert Memory.open(tmp_path / "m", writer=False).history("n") == []
    assert not any(p.name.startswith("history-") for p in (tmp_path / "m").iterdir()), "no history: no file"
    assert Memory(history_limit=0).history("x") == []
    with pytest.raises(ValueError, match="history_limit"):
        Memory(history_limit=-1)


def test_merged_updates_equal_a_fresh_build_after_random_interleavings(tmp_path):
    """The exact-BM25 property through merge-updates: each merged version is what the model computes."""
    rng = np.random.default_rng(31)
    m = Memory(partition_days=1, merge_factor=2, merge_min=3)
    model = Model(analyzer="default", method="lucene", k1=1.2, b=0.75)
    recs = [random_record(rng, f"r{i}") for i in range(60)]
    m.add(recs)
    model.add(recs)
    for step in range(25):
        ids = list(rng.choice(list(model.live), size=3, replace=False))
        patches = []
        for rid in ids:
            p = {"id": rid}
            if rng.random() < 0.5:
                p["text"] = random_record(rng, rid)["text"]
            if rng.random() < 0.4:
                p["session"] = None if rng.random() < 0.3 else f"s{int(rng.integers(0, 5))}"
            if rng.random() < 0.4:
                p["metadata"] = {"speaker": None if rng.random() < 0.3 else "Zed", "extra": step}
            patches.append(p)
        m.update(patches)
        for p in patches:  # the model merges by the documented rules
            cur = dict(model.live[p["id"]])
            for k, v in p.items():
                if k == "metadata":
                    meta = {**cur.get("metadata", {})}
                    meta.update({mk: mv for mk, mv in v.items() if mv is not None})
                    for mk in [mk for mk, mv in v.items() if mv is None]:
                        meta.pop(mk, None)
                    cur["metadata"] = meta
                elif v is None:
                    cur.pop(k, None)
                else:
                    cur[k] = v
            if "metadata" in cur and not cur["metadata"]:
                del cur["metadata"]
            if cur != model.live[p["id"]]:
                model.update([cur])
        if step % 6 == 5:
            m.save(tmp_path / "m")
            m.close()
            m = Memory.open(tmp_path / "m")
        queries = [random_query(rng) for _ in range(6)]
        ids_, scores = model.search(queries, 10, where={"tenant": "acme"})
        assert_same(m.search(queries, k=10, where={"tenant": "acme"}, ties="oldest"), ids_, scores, f"step {step}")
    m.close(discard_unsaved=True)


def test_the_update_example_of_docs_memory_md():
    from gpuir import Memory

    m = Memory()
    m.add([{"id": "t2", "text": "Melanie painted a sunrise over the lake", "tenant": "conv-26", "session": "S1",
            "role": "user", "time": "2023-05-08T13:57:00Z", "metadata": {"speaker": "Melanie"}}])
    m.update([{"id": "t2", "text": "Melanie painted a sunset"}])  # as docs/memory.md shows it
    assert m.search("sunset", where={"tenant": "conv-26", "metadata.speaker": "Melanie"}).ids(0) == ["t2"]
    assert m.history("t2")[0]["text"] == "Melanie painted a sunrise over the lake"
