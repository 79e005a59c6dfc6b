"""The channel registry: a channel defined here, outside gpuir, registered by kind and used in a RetrieverConfig.

It keeps its own state (synced on add / delete, saved and opened with the retriever), ranks
records by ids, and the retriever numbers them, applies ``where`` (the tenant wall holds even
though the channel ignores it), fuses it with a built-in channel, and skips it where it says so.
Entry points of the group ``gpuir.channels`` load the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpuir import Memory, Retriever
from gpuir.retrieve import (
    CHANNELS,
    Channel,
    ChannelConfig,
    RetrieverConfig,
    register_channel,
    registry,
    unregister_channel,
)


class Substring(Channel):
    """Records whose text contains the query (case-insensitive), scored 1 / (1 + where it starts)."""

    unit = "record"

    def __init__(self, config, context):
        super().__init__(config, context)
        self.texts: dict[str, str] = {}  # its own state: record id -> lower-cased text
        self.added: list[list[str]] = []

    def sync(self, change):
        for rid in change.removed:
            self.texts.pop(rid, None)
        new = [rid for rid in change.added if rid not in self.texts]  # after open: all, most already held
        if new:
            self.added.append(new)
            for rec in self.context.memory.get(new):
                self.texts[rec["id"]] = rec["text"].lower()

    def save(self, folder: Path) -> None:
        (folder / "substring.json").write_text(json.dumps(self.texts), encoding="utf-8")

    def open(self, folder: Path) -> None:
        self.texts = json.loads((folder / "substring.json").read_text(encoding="utf-8"))

    def applies(self, request):
        return np.array([len(q) >= 3 for q in request.queries])  # too short: skipped for that query

    def search(self, queries, k, where, at, request):
        out = []
        for q in queries:
            q = q.lower()
            out.append([(rid, 1.0 / (1 + t.index(q))) for rid, t in self.texts.items() if q in t])
        return out


RECORDS = [
    {"id": "a1", "text": "I adopted a puppy named Biscuit", "tenant": "alice", "session": "s1"},
    {"id": "a2", "text": "Biscuit chewed my shoe", "tenant": "alice", "session": "s1"},
    {"id": "a3", "text": "We went hiking in the Alps", "tenant": "alice", "session": "s2"},
    {"id": "b1", "text": "Biscuits are my favourite snack", "tenant": "bob", "session": "s3"},
]


@pytest.fixture
def kind():
    register_channel("substring_test", Substring)
    yield "substring_test"
    unregister_channel("substring_test")


def test_unknown_kind_is_refused_until_registered():
    with pytest.raises(ValueError, match="unknown channel kind 'substring_test'"):
        ChannelConfig("substring_test")
    register_channel("substring_test", Substring)
    try:
        assert CHANNELS["substring_test"] == "record" and "substring_test" in CHANNELS
        assert ChannelConfig("substring_test").unit == "record"
        with pytest.raises(ValueError, match="already registered"):
            register_channel("substring_test", Channel)
    finally:
        unregister_channel("substring_test")
    assert "substring_test" not in CHANNELS
    assert {"bm25", "bm25_session", "bm25_pool", "dense", "late", "temporal", "entity"} <= set(CHANNELS)


def test_a_channel_from_outside_the_package_runs_in_a_config(kind):
    m = Memory()
    m.add(RECORDS)
    cfg = RetrieverConfig(channels=[ChannelConfig(kind, depth=10)], fusion=None)
    r = Retriever(m, cfg)
    # "ppy nam" is no word: BM25 finds nothing, the substring channel finds a1
    assert m.search("ppy nam", k=5).ids(0) == []
    res = r.search("ppy nam", k=5)
    assert res.ids(0) == ["a1"]
    assert res.hits(0)[0]["text"] == RECORDS[0]["text"] and res.hits(0)[0]["score"] == pytest.approx(1 / 15)
    # ranked by score, then by the memory's add order; the tenant wall holds although the channel ignores where
    assert r.search("biscuit", k=5).ids(0) == ["a2", "b1", "a1"]
    assert r.search("biscuit", k=5, where={"tenant": "alice"}).ids(0) == ["a2", "a1"]
    assert r.search("biscuit", k=5, where={"tenant": "bob"}).ids(0) == ["b1"]
    # skipped where it says so (applies), at session level too
    res = r.search(["bi", "biscuit"], k=5, unit="session")
    assert res.meta["ran"][:, 0].tolist() == [False, True] and res.ids(0) == [] and res.ids(1) == ["s1", "s3"]


def test_plugin_state_follows_the_memory_and_is_saved(kind, tmp_path):
    m = Memory()
    m.add(RECORDS)
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25", weight=0.5), ChannelConfig(kind, weight=0.5)], fusion="rrf")
    r = Retriever(m, cfg)
    chan = r.channels[1]
    assert isinstance(chan, Substring) and chan.added == [["a1", "a2", "a3", "b1"]]
    m.add([{"id": "a4", "text": "Biscuit learned to sit", "tenant": "alice"}])
    m.delete(["a2"])
    got = r.search("biscuit", k=5, where={"tenant": "alice"})
    assert chan.added[1:] == [["a4"]] and "a2" not in chan.texts  # only the change was read
    assert set(got.ids(0)) == {"a1", "a4"}
    m.save(tmp_path / "mem")
    r.save()
    assert (tmp_path / "mem.retriever" / "substring.json").exists()
    m.close()
    m2 = Memory.open(tmp_path / "mem")
    r2 = Retriever.open(m2)
    assert r2.channels[1].added == [] and r2.channels[1].texts == chan.texts  # from disk, nothing re-read
    assert r2.search("biscuit", k=5, where={"tenant": "alice"}).ids(0) == got.ids(0)
    m2.close()


class _EntryPoint:
    name = "substring_ep"
    value = "tests.test_retrieve_registry:Substring"

    def load(self):
        return Substring


def test_entry_points_load_third_party_channels(monkeypatch):
    monkeypatch.setattr(registry, "_ENTRY_POINTS_READ", False)
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [_EntryPoint()] if group == "gpuir.channels" else [])
    try:
        m = Memory()
        m.add(RECORDS)
        r = Retriever(m, {"channels": [{"kind": "substring_ep"}], "fusion": None})
        assert r.search("hiking", k=3).ids(0) == ["a3"]
    finally:
        unregister_channel("substring_ep")
