"""Issue 19 item 4: the catalog keeps no copy of the records, and the channels read the memory's columns.

* The catalog's own Python containers do not grow with the number of records
  (only the session maps do, with the number of sessions), and none holds a record's text.
* An update that changes a record's text or time, and a deletion, are seen by the
  temporal and entity channels and by the sessions' start times (read again from the memory).
* ``hits()`` of a session search never searches the memory: the best records of each
  session are searched during the search.

The temporal parser and entity graph are the predictable doubles of tests/_retrieve_doubles.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from _retrieve_doubles import DAY, MIN, ROWS, T0, install

from gpuir import Memory, Retriever, RetrieverConfig
from gpuir.memory.snapshot import Snapshot
from gpuir.retrieve import ChannelConfig
from gpuir.retrieve.catalog import Catalog


def memory() -> Memory:
    m = Memory()
    m.add([{"id": i, "session": s, "tenant": t, "time": tm, "metadata": {"speaker": sp}, "text": x}
           for i, s, t, tm, sp, x in ROWS], time_unit="ms")
    return m


def one(kind, **kw) -> RetrieverConfig:
    return RetrieverConfig(channels=[ChannelConfig(kind, **kw)], fusion=None)


def _containers(obj, seen=None):
    """Every Python container reachable from ``obj``'s attributes, not entering memories or snapshots."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (Memory, Snapshot, np.ndarray, str, bytes)):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        yield obj
        for k, v in obj.items():
            yield from _containers(k, seen)
            yield from _containers(v, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield obj
        for v in obj:
            yield from _containers(v, seen)


def _own_state(cat: Catalog) -> dict[str, object]:
    return {k: v for k, v in vars(cat).items() if k not in ("memory", "records", "sessions", "snapshot")}


def _catalog_after(n: int, with_types: bool) -> tuple[Catalog, Memory, list[str]]:
    m = Memory(partition_days=None, merge_factor=3, merge_min=4)
    texts = [f"record number {i} about topic{i % 7}" for i in range(n)]
    recs = [{"id": f"r{i}", "text": t, "session": f"s{i % 5}", "time": T0 + i * MIN, "tenant": "x",
             "metadata": {"speaker": f"p{i % 3}"}} for i, t in enumerate(texts)]
    cat = Catalog(m, with_sessions=True, with_types=with_types)
    for a in range(0, n, 40):  # several syncs, merges between them
        m.add(recs[a: a + 40], time_unit="ms")
        cat.sync()
    m.delete([f"r{i}" for i in range(0, n, 11)])
    m.update([{"id": "r1", "text": "an updated text of record one", "time": T0 - DAY}], time_unit="ms")
    cat.sync()
    cat.sync()  # nothing changed: the last change lists are empty
    return cat, m, texts


@pytest.mark.parametrize("with_types", [False, True])
def test_catalog_state_does_not_grow_with_the_records(with_types):
    sizes = []
    for n in (60, 600):
        cat, m, texts = _catalog_after(n, with_types)
        try:
            state = _own_state(cat)
            boxes = [c for v in state.values() for c in _containers(v)]
            sizes.append(sorted(len(c) for c in boxes))
            # no container holds a record's text or id (strings are the session names, type names, ...)
            held = {x for c in boxes for x in (c.keys() if isinstance(c, dict) else c) if isinstance(x, str)}
            assert not held & (set(texts) | {"an updated text of record one"}), held
            assert not held & {f"r{i}" for i in range(n)}
            # every NumPy array is indexed by sequence number (or session): no per-record strings
            for name, v in state.items():
                if isinstance(v, np.ndarray):
                    assert v.dtype.kind in "iub", name
            # and the views still answer from the memory's columns
            snap = m.snapshot()
            live = snap.live_records()
            assert len(live) == len(cat.seq_of) and cat.text_of["r1"] == "an updated text of record one"
            assert cat.text_of == {snap.record(vi, r)["id"]: snap.record(vi, r)["text"] for _, vi, r in live}
            assert cat.speaker_of["r2"] == "p2" and cat.session_of["r7"] == "s2"
            assert {cat.id_of_seq[s]: s for s, _, _ in live} == dict(cat.seq_of)
        finally:
            m.close()
    assert sizes[0] == sizes[1], sizes  # the same containers of the same sizes for 60 and 600 records


def test_updates_of_text_and_time_are_seen_by_the_channels(monkeypatch):
    install(monkeypatch)
    m = memory()
    r = Retriever(m, RetrieverConfig(channels=[ChannelConfig("temporal"), ChannelConfig("entity")],
                                     fusion="rrf"))
    tx = {"tenant": "x"}

    def temporal():
        ran = r.search_channels("what happened last week", where=tx, at=T0)
        res = ran["results"][0]
        return [r.catalog.id_of_seq[n] for n in res.ids[0].tolist() if n >= 0]

    def entity(q):
        return r.search(q, k=10, where=tx).ids(0)

    assert temporal() == ["a6", "a5", "a4", "a3"]  # the window, newest first (no BM25 hit)
    assert r.catalog.session_times("x") == [T0 - 20 * DAY, T0 - 5 * DAY, T0 - 2 * DAY]
    assert "a3" not in entity("What about Tofu?")
    m.update([{"id": "a1", "time": T0 - 3 * DAY}], time_unit="ms")  # into the window
    m.update([{"id": "a6", "time": T0 - 30 * DAY}], time_unit="ms")  # out of it
    m.update([{"id": "a3", "text": "Caroline: I adopted a kitten named Tofu"}])
    assert temporal() == ["a5", "a1", "a4", "a3"]
    # a session's start is its earliest live record's time: s1 now starts at a2, s3 at a6
    assert r.catalog.session_times("x") == [T0 - 30 * DAY, T0 - 20 * DAY + MIN, T0 - 5 * DAY]
    assert entity("What about Tofu?")[:1] == ["a3"]
    assert r.catalog.text_of["a3"] == "Caroline: I adopted a kitten named Tofu"
    m.delete(["a5", "a3"])
    assert temporal() == ["a1", "a4"]
    assert "a3" not in entity("What about Tofu?")
    assert r.catalog.session_times("x") == [T0 - 30 * DAY, T0 - 20 * DAY + MIN, T0 - 5 * DAY + MIN]
    # a session emptied, then given a record again, is that record's (tenant and start)
    m.delete(["b1"])
    assert r.search("Paris", k=5, where={"tenant": "y"}).ids(0) == [] and r.catalog.session_times("y") == []
    m.add([{"id": "b2", "session": "s9", "tenant": "y", "time": T0, "text": "Jon: back from Rome"}], time_unit="ms")
    r.sync()
    assert r.catalog.session_times("y") == [T0] and r.catalog.members["s9"] == [r.catalog.seq_of["b2"]]
    m.close()


def test_session_hits_never_search(monkeypatch):
    m = memory()
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_session")], fusion=None, session_records=2)
    r = Retriever(m, cfg)
    q, tx = "Caroline Biscuit puppy", {"tenant": "x"}
    # the reference: the memory's own record hits at depth 100, grouped by session, best first
    want: dict[str, list[str]] = {}
    for h in m.search(q, k=100, where=tx).hits(0):
        got = want.setdefault(h["session"], [])
        if len(got) < 2:
            got.append(h["id"])
    calls = []
    real = Memory.search
    monkeypatch.setattr(Memory, "search", lambda self, *a, **kw: calls.append(self) or real(self, *a, **kw))
    res = r.search(q, k=3, where=tx, unit="session")
    during = len(calls)
    assert during >= 1
    hits = res.hits(0)
    assert len(calls) == during, "hits() searched the memory"
    assert [h["session"] for h in hits] == res.ids(0) and len(hits) == 3
    assert {h["session"]: [x["id"] for x in h["records"]] for h in hits} == {s: want.get(s, []) for s in res.ids(0)}
    assert any(h["records"] for h in hits)
    m.close()
