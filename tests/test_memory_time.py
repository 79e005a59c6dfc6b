"""Time done once (accepted forms, units, ISO 8601 out, newest-first ties, order_by time), expiry (hidden
from search, get, list, count, export and every retriever channel at once; purged by writes and merges,
after which the statistics equal a fresh build), and score thresholds (Memory.search, Retriever channels)."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pytest
from _helpers import without_times
from _memory_oracle import Model, assert_same, random_query, random_record

from gpuir import Memory
from gpuir.memory import RecordError
from gpuir.memory import expiry as expiry_mod
from gpuir.memory.timeutil import parse_time


@pytest.mark.parametrize("value, unit, want", [
    ("2024-05-08T13:56:00Z", None, 1715176560000),
    ("2024-05-08T15:56:00.250+02:00", None, 1715176560250),
    ("2024-05-08", None, 1715126400000),
    ("2024-05-08 13:56", None, 1715176560000),  # no offset: UTC
    (datetime(2024, 5, 8, 13, 56, tzinfo=timezone(timedelta(hours=-4))), None, 1715190960000),
    (date(2024, 5, 8), None, 1715126400000),
    (1715176560, "s", 1715176560000),
    (1715176560.25, "s", 1715176560250),
    (1715176560123, "ms", 1715176560123),
    (1715176560123456, "us", 1715176560123),
    (1715176560123456789, "ns", 1715176560123),
    (np.int64(1715176560), "s", 1715176560000),
])
def test_accepted_times(value, unit, want):
    assert parse_time(value, time_unit=unit) == want


@pytest.mark.parametrize("value, unit, message", [
    (1715176560, None, "is the bare number 1715176560: give its unit"),
    (1715176560.5, None, "bare number"),
    (datetime(2024, 5, 8, 13, 56), None, "is a naive datetime"),
    ("May 8", None, "is not an ISO 8601 date or time"),
    (True, "s", "got True"),
    (float("nan"), "s", "must be a finite number"),
    (1715176560123, "s", "lies outside years 1..9999 as s: is the unit right?"),
    ("9999-12-31T23:00:00-05:00", None, "lies outside years 1..9999"),
    ([2024], None, "got list"),
])
def test_refused_times_say_what_to_do(value, unit, message):
    with pytest.raises(RecordError) as ei:
        parse_time(value, time_unit=unit)
    assert message in str(ei.value)
    with pytest.raises(ValueError, match="time_unit must be one of"):
        parse_time(5, time_unit="minutes")


def test_times_come_back_as_iso_8601_everywhere(tmp_path):
    m = Memory()
    m.add([{"id": "a", "text": "alpha", "time": 1715176560.123, "expires_at": 4102444800}], time_unit="s")
    want = {"id": "a", "text": "alpha", "time": "2024-05-08T13:56:00.123+00:00", "expires_at": "2100-01-01T00:00:00+00:00"}
    assert without_times(m.get(["a"])[0]) == want
    want = m.get(["a"])[0]  # with created_at and updated_at, the memory's own times: ISO 8601 too
    assert want["created_at"].endswith("+00:00") and want["updated_at"] == want["created_at"]
    hit = m.search("alpha").hits(0)[0]
    assert hit["time"] == want["time"] and hit["expires_at"] == want["expires_at"]
    assert hit["created_at"] == want["created_at"]
    assert m.list().records == [want]
    # what comes back goes back in unchanged (no unit needed): the same instant, to the millisecond
    m2 = Memory()
    m2.add(m.get(["a"]))
    assert m2.get(["a"]) == [want]
    assert m.search("alpha", where={"time": {"gte": 1715176560123}}, time_unit="ms").ids(0) == ["a"]
    assert m.search("alpha", where={"time": {"gt": "2024-05-08T13:56:00.123Z"}}).ids(0) == []


def test_newest_first_ties_and_order_by_time():
    m = Memory(partition_days=1)
    m.add([{"id": "old", "text": "same words", "time": "2024-01-01"},
           {"id": "untimed", "text": "same words"},
           {"id": "new", "text": "same words", "time": "2024-03-01"},
           {"id": "mid", "text": "same words", "time": "2024-02-01"},
           {"id": "better", "text": "same words words", "time": "2023-01-01"}])
    top = m.search("words", k=5).ids(0)
    assert top[0] == "better" and top[1:] == ["old", "untimed", "new", "mid"], "exhaustive: add order"
    assert m.search("words", k=5, mode="newest").ids(0) == ["better", "new", "mid", "old", "untimed"]
    # at the k-th place too: k=2 keeps the newest of the tied records, not the first found
    assert m.search("words", k=2, mode="newest").ids(0) == ["better", "new"]
    assert m.search("words", k=2, mode="budgeted", max_partitions=9).ids(0) == ["better", "new"]
    assert m.search("words", k=2, ties="newest").ids(0) == ["better", "new"]
    assert m.search("words", k=2, mode="newest", ties="oldest").ids(0) == ["better", "old"]
    # order_by="time": the same top k, oldest first (records without a time last)
    res = m.search("words", k=3, mode="newest", order_by="time")
    assert res.ids(0) == ["better", "mid", "new"]
    with pytest.raises(ValueError, match="ties must be one of"):
        m.search("words", ties="random")
    with pytest.raises(ValueError, match="order_by must be one of"):
        m.search("words", order_by="id")


def test_min_score_drops_weak_hits():
    m = Memory()
    m.add([{"id": "dog", "text": "the dog barked at the dog park"}, {"id": "jazz", "text": "jazz and a dog"},
           {"id": "cat", "text": "a cat"}])
    res = m.search(["dog", "cat"], k=3)
    s = res.scores
    cut = float(s[0, 0] + s[0, 1]) / 2
    got = m.search(["dog", "cat"], k=3, min_score=cut)
    assert got.ids(0) == ["dog"] and got.ids(1) == (["cat"] if s[1, 0] >= cut else [])
    assert got.seqs[0, 1:].tolist() == [-1, -1] and np.isneginf(got.scores[0, 1:]).all()
    assert m.search("dog", k=3, min_score=float(s[0, 1])).ids(0) == ["dog", "jazz"], "a score equal to it is kept"
    for bad in (float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="min_score must be a finite number"):
            m.search("dog", min_score=bad)


def test_expired_records_are_hidden_at_once_and_purged_by_writes(monkeypatch, tmp_path):
    now = [1_800_000_000_000]
    monkeypatch.setattr(expiry_mod, "now_ms", lambda: now[0])
    monkeypatch.setattr("gpuir.memory.writer.now_ms", lambda: now[0])
    monkeypatch.setattr("gpuir.memory.searcher.now_ms", lambda: now[0])
    rng = np.random.default_rng(8)
    m = Memory(partition_days=1, merge_factor=2, merge_min=3)
    model = Model(analyzer="default", method="lucene", k1=1.2, b=0.75)
    recs = [random_record(rng, f"r{i}") for i in range(80)]
    for i, r in enumerate(recs):
        if i % 4 == 0:
            r["expires_at"] = (datetime.fromtimestamp((now[0] + 1000 * (i + 1)) / 1000, tz=timezone.utc)).isoformat()
    m.add(recs)
    model.add([{k: v for k, v in r.items() if k != "expires_at"} for r in recs])
    expiring = [r["id"] for r in recs if "expires_at" in r]
    queries = [random_query(rng) for _ in range(20)]
    assert m.count() == 80
    now[0] += 40_500  # the first 10 expiring records (i = 0, 4, ..., 36: expiring at 1 .. 37 s) are past
    gone = expiring[:10]
    assert m.get(gone, missing_ok=True) == [None] * 10 and m.get([expiring[10]])[0]["id"] == expiring[10]
    with pytest.raises(KeyError, match="unknown id"):
        m.get(gone[:1])
    assert m.count() == 70 and not set(gone) & {r["id"] for r in m.list(limit=1000).records}
    assert m.count({"expires_at": {"exists": True}}) == 10
    hidden = m.search(queries, k=80)
    assert not set(gone) & {x for i in range(len(queries)) for x in hidden.ids(i)}
    again = m.search(queries, k=80, where={"$or": [{"expires_at": {"exists": True}}, {"id": {"in": gone}}]})
    assert not set(gone) & {x for i in range(len(queries)) for x in again.ids(i)}, "no filter brings them back"
    assert len(m) == 80, "not yet purged: a search never changes the memory"
    path = tmp_path / "e.jsonl"
    assert m.export(path) == 70
    # the next write purges them: afterwards every search equals a fresh build without them
    m.add([{"id": "fresh", "text": "w1 w2 w3"}])
    model.delete(gone)
    model.add([{"id": "fresh", "text": "w1 w2 w3"}])
    assert len(m) == 71
    ids, scores = model.search(queries, 10)
    assert_same(m.search(queries, k=10, ties="oldest"), ids, scores, "after the purge")
    m.add([{"id": gone[0], "text": "the id is free again"}])  # an expired id can be added anew
    model.add([{"id": gone[0], "text": "the id is free again"}])
    now[0] += 1000 * 1000  # all the others are past now; merge() purges them too
    m.merge()
    model.delete(expiring[10:])
    assert len(m) == len(model.live) and all(v.live is None for v in m.snapshot().views)
    ids, scores = model.search(queries, 10)
    assert_same(m.search(queries, k=10, ties="oldest"), ids, scores, "after merge")
    with pytest.raises(RecordError, match="bare number"):
        m.add([{"id": "z", "text": "t", "expires_at": 5}])


def test_expired_records_are_hidden_from_retriever_channels(monkeypatch):
    from gpuir.retrieve import Retriever, RetrieverConfig
    from gpuir.retrieve.config import ChannelConfig

    now = [1_800_000_000_000]
    monkeypatch.setattr(expiry_mod, "now_ms", lambda: now[0])
    m = Memory()
    m.add([{"id": "keep", "text": "dog park", "session": "s1", "time": "2026-01-01"},
           {"id": "gone", "text": "dog park dog", "session": "s2", "time": "2026-01-02",
            "expires_at": "2027-01-15T08:00:01Z"}])
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25", depth=10), ChannelConfig("bm25_pool", depth=10)],
                          fusion="rrf")
    r = Retriever(m, cfg)
    assert set(r.search("dog", k=5, unit="record").ids(0)) == {"keep", "gone"}
    now[0] = 1_900_000_000_000
    assert r.search("dog", k=5, unit="record").ids(0) == ["keep"]
    assert Memory.search(m, "dog").ids(0) == ["keep"]


def test_retriever_channel_min_score():
    from gpuir.retrieve import Retriever, RetrieverConfig
    from gpuir.retrieve.config import ChannelConfig

    m = Memory()
    m.add([{"id": "a", "text": "dog dog dog park"}, {"id": "b", "text": "a dog among many other words here"},
           {"id": "c", "text": "cats"}])
    plain = m.search("dog park", k=3)
    cut = float(plain.scores[0, 0] + plain.scores[0, 1]) / 2
    one = RetrieverConfig(channels=[ChannelConfig("bm25", depth=10, min_score=cut)], fusion=None)
    assert Retriever(m, one).search("dog park", k=3, unit="record").ids(0) == ["a"]
    with pytest.raises(ValueError, match="min_score must be a finite number"):
        ChannelConfig("bm25", min_score=float("inf"))
    assert RetrieverConfig.from_config(one.to_config()).channels[0].min_score == cut


def test_expiry_survives_save_and_open_and_costs_nothing_when_unused(monkeypatch, tmp_path):
    m = Memory()
    m.add([{"id": "a", "text": "plain words"}])
    calls = []
    monkeypatch.setattr(expiry_mod, "expiry_column", lambda seg: calls.append(seg) or None)
    m.search("plain")
    m.add([{"id": "b", "text": "more words"}])
    assert calls == [], "a memory never given an expires_at never looks for expired rows"
    monkeypatch.undo()
    m.add([{"id": "c", "text": "plain soon gone", "expires_at": "2100-01-01"}])
    m.save(tmp_path / "m")
    m.close()
    now = [4_102_444_800_000 + 1]  # just after 2100-01-01
    monkeypatch.setattr(expiry_mod, "now_ms", lambda: now[0])
    monkeypatch.setattr("gpuir.memory.writer.now_ms", lambda: now[0])
    monkeypatch.setattr("gpuir.memory.searcher.now_ms", lambda: now[0])
    m = Memory.open(tmp_path / "m")
    assert m.search("plain").ids(0) == ["a"] and m.count() == 2
    assert m.purge_expired() == 1 and len(m) == 2
    m.close(discard_unsaved=True)


def _backends():
    import importlib.util

    return ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("opened", [False, True], ids=["in-memory", "opened"])
def test_expires_at_equal_to_now_is_expired_in_search_count_list_get_and_export(monkeypatch, tmp_path, backend,
                                                                                 opened):
    """The boundary (issue 36's audit: ``expires_at == now`` treated as live in search and count while get
    hid it survived a mutation): at ``now == expires_at`` the record is gone from every read, at
    ``now == expires_at - 1 ms`` it is in every one."""
    import time as time_mod

    t = 1_800_000_000_123
    clock = [t - 1]
    monkeypatch.setattr(time_mod, "time_ns", lambda: clock[0] * 1_000_000 + 999_999)  # ms floor: clock[0]
    iso = lambda ms: datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    m = Memory()
    m.add([{"id": "a", "text": "the red fox", "tenant": "t", "expires_at": iso(t)},
           {"id": "b", "text": "the quick fox", "tenant": "t", "expires_at": iso(t + 1)},
           {"id": "c", "text": "a fox that stays", "tenant": "t"}])
    if opened:
        m.save(tmp_path / "m")
        m.close()
        m = Memory.open(tmp_path / "m", writer=False)

    def reads():
        seen = {}
        for name, where in (("search", None), ("search tenant", {"tenant": "t"}),
                            ("search filtered", {"text": {"contains": "fox"}})):
            seen[name] = sorted(m.search(["fox"], k=10, where=where, backend=backend).ids(0))
        seen["count"] = m.count()
        seen["count tenant"] = m.count({"tenant": "t"})
        seen["list"] = sorted(r["id"] for r in m.list(limit=10).records)
        seen["list by time"] = sorted(r["id"] for r in m.list(order_by="time", limit=10).records)
        seen["get"] = [r and r["id"] for r in m.get(["a", "b", "c"], missing_ok=True)]
        path = tmp_path / f"e{clock[0]}.jsonl"
        m.export(path, history=False)
        seen["export"] = sorted(json.loads(x)["id"] for x in path.read_text().splitlines()[1:])
        return seen

    def expect(ids):
        return {"search": ids, "search tenant": ids, "search filtered": ids, "count": len(ids),
                "count tenant": len(ids), "list": ids, "list by time": ids,
                "get": [i if i in ids else None for i in ("a", "b", "c")], "export": ids}

    assert reads() == expect(["a", "b", "c"]), "1 ms before: live everywhere"
    clock[0] = t
    assert reads() == expect(["b", "c"]), "expires_at == now: expired everywhere"
    clock[0] = t + 1
    assert reads() == expect(["c"])


def test_searches_of_a_memory_with_expiring_records_add_nothing_per_search_to_its_snapshot(monkeypatch):
    """Before: each search at a new millisecond kept one more 'passes every record' decision in the
    snapshot's cache (304 entries after 300 searches), for as long as no write replaced the snapshot."""
    import time as time_mod

    clock = [1_800_000_000_000]
    monkeypatch.setattr(time_mod, "time_ns", lambda: clock[0] * 1_000_000)
    m = Memory()
    m.add([{"id": f"r{i}", "text": f"fox {i}", "tenant": "t", "expires_at": "2099-01-01T00:00:00Z"}
           for i in range(50)] + [{"id": "x", "text": "fox soon gone", "tenant": "t",
                                    "expires_at": clock[0] + 5_000}], time_unit="ms")
    snap = m.snapshot()
    for _ in range(3):
        m.search(["fox"], k=5)
        m.search(["fox"], k=5, where={"tenant": "t"})
    before = len(snap._cache)
    for _ in range(40):
        clock[0] += 1
        assert "x" in m.search(["fox soon"], k=1).ids(0) and "x" in m.search(["fox soon"], k=1, where={"tenant": "t"}).ids(0)
    assert len(snap._cache) == before
    clock[0] += 5_000  # x expires: the same snapshot now hides it (nothing cached from before says otherwise)
    assert "x" not in m.search(["fox soon"], k=3).ids(0) and "x" not in m.search(["fox soon"], k=3,
                                                                                  where={"tenant": "t"}).ids(0)
