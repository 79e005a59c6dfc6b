"""Type filter with widening, on hand-built memories (record types from the field or the rule)."""

from __future__ import annotations

import numpy as np
import pytest
from _retrieve_doubles import install

from gpuir import Memory, Retriever, RetrieverConfig

RECS = [
    {"id": "p1", "text": "I love hiking in the mountains", "session": "s1"},          # preference (rule)
    {"id": "p2", "text": "I prefer tea over coffee", "session": "s1"},                # preference (rule)
    {"id": "p3", "text": "My favourite hiking trail is Mount Tam", "session": "s2"},  # preference (rule)
    {"id": "e1", "text": "I went hiking last Sunday", "session": "s2"},               # event (rule)
    {"id": "f1", "text": "Hiking boots are in the garage", "session": "s3"},          # fact (rule)
    {"id": "t1", "text": "hiking club meets Mondays", "session": "s3", "type": "preference"},  # the field wins
    {"id": "f2", "text": "The hiking map went missing", "session": "s3", "type": "fact"},      # rule says event
]


def memory() -> Memory:
    m = Memory()
    m.add([{**r, "tenant": "x"} for r in RECS])
    m.add([{"id": "y1", "text": "I like hiking a lot", "session": "s9", "tenant": "y"}])
    return m


def cfg(min_results=None, **kw) -> RetrieverConfig:
    return RetrieverConfig.from_config({"channels": [{"kind": "bm25"}], "fusion": None,
                                        "type_filter": None if min_results is None else {"min_results": min_results},
                                        **kw})


PREF = ["p1", "p2", "p3", "t1"]


@pytest.fixture(autouse=True)
def doubles(monkeypatch):
    install(monkeypatch)


def test_types_from_field_or_rule():
    r = Retriever(memory(), cfg(2))
    assert {i: r.catalog.type_of[i] for i in [x["id"] for x in RECS]} == {
        "p1": "preference", "p2": "preference", "p3": "preference", "e1": "event", "f1": "fact",
        "t1": "preference", "f2": "fact"}


def test_filter_keeps_the_hinted_type_when_enough_survive():
    m = memory()
    q = "favourite hiking"
    res = Retriever(m, cfg(2)).search(q, k=10, where={"tenant": "x"}, backend="numpy")
    ref = m.search(q, k=10, where={"tenant": "x", "id": {"in": PREF}}, backend="numpy")
    assert sorted(ref.ids(0)) == ["p1", "p3", "t1"]
    assert res.ids(0) == ref.ids(0) and res.meta["widened"].tolist() == [False]
    assert res.meta["type_hints"] == ["preference"]
    np.testing.assert_allclose(res.scores[0, :3], ref.scores[0, :3], rtol=1e-6)
    # k below min_results: the filtered search still counts min_results survivors
    one = Retriever(m, cfg(3)).search(q, k=1, where={"tenant": "x"}, backend="numpy")
    assert one.ids(0) == ref.ids(0)[:1] and one.meta["widened"].tolist() == [False] and one.scores.shape == (1, 1)


def test_widening_when_too_few_survive():
    m = memory()
    plain = Retriever(m, cfg(None))
    qs = ["favourite hiking", "when did I go hiking", "hiking boots"]
    res = Retriever(m, cfg(4)).search(qs, k=5, where={"tenant": "x"}, backend="numpy")
    ref = plain.search(qs, k=5, where={"tenant": "x"}, backend="numpy")
    # 3 preference hits < 4: widened; the event hint finds e1 alone: widened; no hint: unfiltered
    assert res.meta["widened"].tolist() == [True, True, False]
    assert res.meta["type_hints"] == ["preference", "event", None]
    assert res.keys == ref.keys
    assert [h["id"] for h in res.hits(1)] == ref.ids(1)
    assert "widen" in res.meta["timings"]
    low = Retriever(m, cfg(1)).search(qs, k=5, where={"tenant": "x"}, backend="numpy")
    assert low.ids(1) == ["e1"] and low.meta["widened"].tolist() == [False, False, False]


def test_tenant_boundary_and_session_unit():
    m = memory()
    r = Retriever(m, cfg(1))
    assert "y1" not in r.search("like hiking", k=10, where={"tenant": "x"}, backend="numpy").ids(0)
    assert r.search("like hiking", k=10, where={"tenant": "y"}, backend="numpy").ids(0) == ["y1"]
    c = RetrieverConfig.from_config({"channels": [{"kind": "bm25_pool"}], "fusion": None,
                                     "type_filter": {"min_results": 1}})
    s = Retriever(m, c).search("favourite hiking", k=5, where={"tenant": "x"}, unit="session",
                               backend="numpy")
    # sessions holding a preference record that matches: s1 (p1), s2 (p3), s3 (t1); pooled from those records only
    assert sorted(s.ids(0)) == ["s1", "s2", "s3"] and not s.meta["widened"][0]
    for h in s.hits(0):
        assert all(x["id"] in PREF for x in h["records"]) or h["records"] == []


def test_type_filter_with_cascade():
    """Widening reruns through the cascade too; with trigger "always" it is the full configuration's filtered search."""
    from test_retrieve_cascade import Encoder

    m = memory()
    chans = [{"kind": "bm25", "weight": 0.6}, {"kind": "dense", "weight": 0.4}]
    full = RetrieverConfig.from_config({"channels": chans, "fusion": "rrf", "type_filter": {"min_results": 4}})
    casc = RetrieverConfig.from_config({**full.to_config(), "cascade": {"escalate": ["dense"], "trigger": "always"}})
    qs = ["favourite hiking", "hiking boots", "when did I go hiking"]
    a = Retriever(m, full, encoder=Encoder()).search(qs, k=5, where={"tenant": "x"}, backend="numpy")
    b = Retriever(m, casc, encoder=Encoder()).search(qs, k=5, where={"tenant": "x"}, backend="numpy")
    assert a.keys == b.keys and a.meta["widened"].tolist() == b.meta["widened"].tolist()
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    assert b.meta["escalated"].tolist() == [True, True, True]
