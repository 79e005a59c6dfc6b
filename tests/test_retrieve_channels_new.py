"""New retrieval paths of issue 13: configuration fields and at=, the temporal and entity channels,
the entity graph kept in step, enrichment of the lexical index, and the router runtime.

The other helpers' modules (temporal, entity_graph, query_types, enrich) are replaced by the
contract-following doubles of tests/_retrieve_doubles.py, so expected values are computed by hand.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import numpy as np
import pytest
from _retrieve_doubles import DAY, ROWS, T0, install

from gpuir import Memory, Retriever, RetrieverConfig
from gpuir.retrieve import ChannelConfig, MissingExtra
from gpuir.retrieve.anchors import resolve_at


def records(rows=ROWS):
    return [{"id": i, "session": s, "tenant": t, "time": tm, "metadata": {"speaker": sp}, "text": x}
            for i, s, t, tm, sp, x in rows]


def memory(rows=ROWS) -> Memory:
    m = Memory()
    m.add(records(rows), time_unit="ms")
    return m


@pytest.fixture
def calls(monkeypatch):
    return install(monkeypatch)


def one(kind, **kw) -> RetrieverConfig:
    return RetrieverConfig(channels=[ChannelConfig(kind, **kw)], fusion=None)


# --------------------------------------------------------------------------- configuration and at=


FULL = {
    "channels": [{"kind": "bm25", "depth": 50}, {"kind": "temporal"}, {"kind": "entity", "weight": 0.5},
                 {"kind": "dense", "weight": 0.7}],
    "fusion": "score_rrf",
    "cascade": {"escalate": ["dense"], "trigger": "per_type", "tau": 0.2, "per_type": {"temporal": 0.5},
                "classifier": "regex"},
    "type_filter": {"min_results": 3},
    "enrich": "bridges",
    "parallel": False,
}


def test_new_fields_round_trip(tmp_path):
    cfg = RetrieverConfig.from_config(FULL)
    d = cfg.to_config()
    assert json.loads(json.dumps(d)) == d
    assert RetrieverConfig.from_config(d) == cfg
    assert RetrieverConfig.load(cfg.save(tmp_path / "c.json")) == cfg
    assert d["cascade"] == FULL["cascade"] and d["type_filter"] == {"min_results": 3}
    assert d["enrich"] == "bridges" and d["parallel"] is False and d["fusion"] == "score_rrf"
    # defaults: all off, parallel on; a cascade dict gets its defaults filled in
    plain = RetrieverConfig(channels=[ChannelConfig("bm25")])
    assert (plain.cascade, plain.router, plain.type_filter, plain.enrich, plain.parallel) == (
        None, None, None, None, True)
    c = RetrieverConfig(channels=[ChannelConfig("bm25"), ChannelConfig("dense")], cascade={"escalate": ["dense"]})
    assert c.cascade == {"escalate": ["dense"], "trigger": "margin", "tau": 0.0, "per_type": {},
                         "classifier": "regex"}
    router = {"channels": [], "router": {"mode": "soft", "routes": {"temporal": {"channels": [{"kind": "temporal"}],
                                                                                 "fusion": None}},
                                         "default": {"channels": [{"kind": "bm25"}], "fusion": None}}}
    r = RetrieverConfig.from_config(router)
    assert RetrieverConfig.from_config(json.loads(json.dumps(r.to_config()))) == r
    assert r.router["routes"]["temporal"]["channels"][0]["kind"] == "temporal"
    assert not r.needs_encoder
    router["router"]["default"] = {"channels": [{"kind": "late"}], "fusion": None}
    assert RetrieverConfig.from_config(router).needs_encoder


BM = [{"kind": "bm25"}, {"kind": "dense"}]


@pytest.mark.parametrize("bad, err, msg", [
    ({"cascade": {"escalate": ["dense"], "trigger": "sometimes"}}, ValueError, "trigger"),
    ({"cascade": {"escalate": ["nope"]}}, ValueError, "unknown channel kind"),
    ({"cascade": {"escalate": ["late"]}}, ValueError, "none of the escalation kinds"),
    ({"cascade": {"escalate": ["bm25", "dense"]}}, ValueError, "cheap channel"),
    ({"cascade": {"escalate": ["dense"], "tau": float("nan")}}, ValueError, "tau"),
    ({"cascade": {"escalate": ["dense"], "trigger": "per_type"}}, ValueError, "per_type"),
    ({"cascade": {"escalate": ["dense"], "taus": 1}}, ValueError, "unknown key"),
    ({"cascade": ["dense"]}, TypeError, "cascade must be a dict"),
    ({"type_filter": {"min_results": 0}}, ValueError, "min_results"),
    ({"type_filter": {"min": 3}}, ValueError, "unknown key"),
    ({"enrich": "thesaurus"}, ValueError, "enrich"),
    ({"parallel": "yes"}, ValueError, "parallel"),
    ({"fusion": "borda"}, ValueError, "unknown fusion"),
    ({"router": {"mode": "fuzzy", "routes": {"t": {"channels": [{"kind": "bm25"}]}}}}, ValueError, "mode"),
    ({"router": {"routes": {}}}, ValueError, "routes"),
    ({"router": {"routes": {"t": {"channels": [{"kind": "bm26"}]}}}}, ValueError, "route 't'"),
    ({"router": {"routes": {"t": {"channels": [{"kind": "bm25"}], "router": {"routes": {"u": {}}}}}}},
     ValueError, "do not nest"),
    ({"router": {"routes": {"t": {"channels": [{"kind": "bm25"}]}}, "classifier": 3}}, ValueError, "classifier"),
])
def test_new_field_errors(bad, err, msg):
    with pytest.raises(err, match=msg):
        RetrieverConfig.from_config({"channels": BM, **bad})


def test_router_without_channels_needs_a_default():
    with pytest.raises(ValueError, match="default"):
        RetrieverConfig.from_config({"channels": [], "router": {"routes": {"t": {"channels": [{"kind": "bm25"}]}}}})


def test_at_forms_and_errors():
    want = np.array([T0, T0], np.int64)
    assert np.array_equal(resolve_at(T0, 2), want)
    assert np.array_equal(resolve_at("2024-05-01T00:00:00Z", 2), want)
    assert np.array_equal(resolve_at(datetime(2024, 5, 1, tzinfo=timezone.utc), 2), want)
    assert np.array_equal(resolve_at(["2024-05-01", T0 + 5], 2), [T0, T0 + 5])
    assert np.array_equal(resolve_at(None, 3, now_ms=7), [7, 7, 7])
    with pytest.raises(ValueError, match="2 queries"):
        resolve_at([T0], 2)
    with pytest.raises(ValueError, match="float"):
        resolve_at(1.7e12, 1)
    with pytest.raises(ValueError, match="ISO"):
        resolve_at("yesterday-ish", 1)
    with pytest.raises(TypeError, match="epoch milliseconds"):
        resolve_at(True, 1)
    r = Retriever(memory())
    with pytest.raises(ValueError, match="3 queries"):
        r.search(["a", "b", "c"], at=[T0, T0])


def test_missing_extra_message():
    e = MissingExtra("routing", "the TF-IDF query classifier")
    assert isinstance(e, ImportError)
    assert str(e) == "the TF-IDF query classifier needs the routing extra: pip install 'gpuir[routing]'"


# --------------------------------------------------------------------------- temporal channel


def test_temporal_channel_window_bm25_first_then_newest(calls):
    m = memory()
    r = Retriever(m, one("temporal"))
    res = r.search(["what did Caroline do last week", "tell me about Biscuit"], k=10, where={"tenant": "x"},
                   at=T0, backend="numpy")
    window = {"tenant": "x", "time": {"gte": T0 - 7 * DAY, "lt": T0}}
    bm = m.search("what did Caroline do last week", k=10, where=window, backend="numpy", time_unit="ms")
    assert sorted(bm.ids(0)) == ["a3", "a5"]  # the records of the window with a query term
    assert res.ids(0) == bm.ids(0) + ["a6", "a4"]  # then the rest of the window, newest first
    np.testing.assert_allclose(res.scores[0, :4], list(bm.scores[0, :2]) + [0.0, 0.0], rtol=1e-6)
    # no time expression: the channel is skipped for that query
    assert res.ids(1) == [] and res.meta["ran"][:, 0].tolist() == [True, False]
    assert res.meta["windows"][0].expression == "last week" and res.meta["windows"][1] is None
    assert calls["parse"][0][1] == T0


def test_since_we_last_talked_sees_the_tenants_past_sessions(calls):
    r = Retriever(memory(), one("temporal"))
    q = "what happened since we last talked"
    res = r.search(q, k=10, where={"tenant": "x"}, at=T0, backend="numpy")
    assert calls["parse"][-1][2] == [T0 - 20 * DAY, T0 - 5 * DAY, T0 - 2 * DAY]  # session starts of x only
    assert sorted(res.ids(0)) == ["a5", "a6"]
    res = r.search(q, k=10, where={"tenant": "x"}, at=T0 - 3 * DAY, backend="numpy")  # before s3 began
    assert calls["parse"][-1][2] == [T0 - 20 * DAY, T0 - 5 * DAY]
    assert sorted(res.ids(0)) == ["a3", "a4"]
    # per-query anchors, and the tenant boundary holds inside a window
    res = r.search([q, "what happened last week", q], k=10, where={"tenant": "y"},
                   at=[T0, "2024-05-01", T0 - 2 * DAY], backend="numpy")
    assert res.ids(0) == ["b1"] and res.ids(1) == ["b1"]  # y's only session began at T0 - 1 day
    assert res.ids(2) == [] and calls["parse"][-1][2] == []  # no session of y before T0 - 2 days: no window


def test_fusion_over_what_ran_skipped_temporal_does_not_penalise(calls):
    m = memory()
    both = RetrieverConfig(channels=[ChannelConfig("bm25", weight=0.5), ChannelConfig("temporal", weight=0.5)],
                           fusion="z")
    alone = RetrieverConfig(channels=[ChannelConfig("bm25")], fusion=None)
    qs = ["Biscuit puppy Melanie", "Caroline last week"]
    got = Retriever(m, both).search(qs, k=10, where={"tenant": "x"}, at=T0, backend="numpy")
    ref = Retriever(m, alone).search(qs, k=10, where={"tenant": "x"}, at=T0, backend="numpy")
    assert got.meta["ran"].tolist() == [[True, False], [True, True]]
    assert got.ids(0) == ref.ids(0)  # no window: fused over bm25 alone
    assert set(got.ids(1)) == set(ref.ids(1)) | {"a3", "a4", "a5", "a6"}  # the window's records join bm25's
    assert got.ids(1) != ref.ids(1)


# --------------------------------------------------------------------------- entity channel and graph


def test_entity_channel_hop_scores(calls):
    m = memory()
    r = Retriever(m, one("entity"))
    res = r.search(["What about Biscuit?", "what is the weather"], k=10, where={"tenant": "x"}, backend="numpy")
    # hop 0: records naming Biscuit (b1 is another tenant's); hop 1: records sharing Caroline or Melanie
    assert res.ids(0) == ["a3", "a4", "a1", "a2", "a5", "a6"]
    np.testing.assert_allclose(res.scores[0, :6], [1.0, 1.0, 0.6, 0.6, 0.6, 0.6])
    assert res.ids(1) == [] and res.meta["ran"][:, 0].tolist() == [True, False]
    # no where: b1 is reachable at hop 0
    assert res.ids(0)[:1] == ["a3"] and "b1" in r.search("What about Biscuit?", k=10).ids(0)[:3]


def test_entity_graph_updated_incrementally_and_saved(calls, tmp_path):
    m = memory()
    r = Retriever(m, one("entity"))
    seq = r.catalog.seq_of
    assert calls["add"] == [sorted(seq.values())] and calls["remove"] == []
    m.add([{"id": "n1", "text": "Caroline: Jon and I went kayaking", "tenant": "x", "session": "s4",
            "time": T0 - DAY}], time_unit="ms")
    assert "n1" in r.search("Jon kayaking", k=10, where={"tenant": "x"}).ids(0)
    assert calls["add"][1:] == [[seq["n1"]]]  # only the new record was added
    gone = seq["a3"]
    m.delete(["a3"])
    assert "a3" not in r.search("What about Biscuit?", k=10, where={"tenant": "x"}).ids(0)
    assert calls["remove"] == [[gone]] and len(calls["add"]) == 2
    before = r.search("What about Biscuit?", k=10, where={"tenant": "x"})
    m.save(tmp_path / "mem")
    r.save()
    m.close()
    m2 = Memory.open(tmp_path / "mem")
    n_add = len(calls["add"])
    r2 = Retriever.open(m2)
    assert len(calls["add"]) == n_add  # the graph came from disk: nothing re-added
    assert r2.graph.n_records == r.graph.n_records
    assert r2.search("What about Biscuit?", k=10, where={"tenant": "x"}).ids(0) == before.ids(0)
    m2.close()


# --------------------------------------------------------------------------- enrichment


class RecordingEncoder:
    dim = 64

    def __init__(self):
        self.passages: list[str] = []

    def _enc(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, hash(w) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_passages(self, texts):
        self.passages.extend(texts)
        return self._enc(texts)

    def encode_queries(self, texts):
        return self._enc(texts)


def test_enrich_lexical_only(calls):
    m = memory()
    plain = Retriever(m, one("bm25"))
    assert plain.search("dog", k=5, backend="numpy").ids(0) == ["a4"]  # "dogs" stems to dog; no puppy
    enc = RecordingEncoder()
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25"), ChannelConfig("dense")], fusion="rrf", enrich="bridges")
    r = Retriever(m, cfg, encoder=enc)
    res = r.search("dog", k=5, where={"tenant": "x"}, backend="numpy")
    assert "a3" in res.meta["channels"]["bm25"].ids[0].tolist() or "a3" in res.ids(0)
    bm = res.meta["channels"]["bm25"]
    assert r.catalog.seq_of["a3"] in bm.ids[0].tolist()  # found through the bridge puppy -> dog
    assert sorted(enc.passages) == sorted(x[-1] for x in ROWS)  # the encoder saw the raw texts
    assert {h["text"] for h in res.hits(0)} <= {x[-1] for x in ROWS}  # hits carry raw texts
    sess = Retriever(m, RetrieverConfig(channels=[ChannelConfig("bm25_session")], fusion=None, enrich="bridges"))
    got = sess.search("pet", k=3, unit="session", where={"tenant": "x"}, backend="numpy")
    assert got.ids(0) == ["s2"]
    assert all(h["text"] in {x[-1] for x in ROWS} for s in got.hits(0) for h in s["records"])


# --------------------------------------------------------------------------- router


ROUTED = {"channels": [], "router": {
    "classifier": "regex", "mode": "discrete",
    "routes": {"temporal": {"channels": [{"kind": "temporal"}], "fusion": None}},
    "default": {"channels": [{"kind": "bm25"}], "fusion": None}}}


def test_discrete_router_routes_by_regex_type(calls):
    m = memory()
    r = Retriever(m, ROUTED)
    qs = ["what did Caroline do last week", "Biscuit puppy", "when did Melanie paint"]
    res = r.search(qs, k=10, where={"tenant": "x"}, at=T0, backend="numpy")
    assert res.meta["route"] == ["temporal", "default", "temporal"]
    t = Retriever(m, one("temporal")).search([qs[0], qs[2]], k=10, where={"tenant": "x"}, at=T0, backend="numpy")
    b = Retriever(m, one("bm25")).search([qs[1]], k=10, where={"tenant": "x"}, backend="numpy")
    assert res.ids(0) == t.ids(0) and res.ids(2) == t.ids(1) == [] and res.ids(1) == b.ids(0)
    assert res.hits(1) == b.hits(0)
    assert "route" in res.meta["timings"] and "total" in res.meta["timings"]


def test_soft_router_weights_rankings_by_posterior(calls):
    m = memory()
    clf = {"weights": {"temporal": {"week": 2.0, "last": 1.0}, "single_hop": {"biscuit": 1.0}}}
    cfg = {"channels": [], "router": {**ROUTED["router"], "mode": "soft", "classifier": clf}}
    r = Retriever(m, cfg)
    q = "Caroline Biscuit last week"
    res = r.search(q, k=10, where={"tenant": "x"}, at=T0, backend="numpy")
    z = np.array([2.0 + 1.0, 1.0])  # temporal, single_hop (-> default route)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    t = Retriever(m, one("temporal")).search(q, k=50, where={"tenant": "x"}, at=T0, backend="numpy").ids(0)
    b = Retriever(m, one("bm25")).search(q, k=50, where={"tenant": "x"}, backend="numpy").ids(0)
    want: dict[str, float] = {}
    for w, ids in ((p[0], t), (p[1], b)):
        for rank, x in enumerate(ids, start=1):
            want[x] = want.get(x, 0.0) + w / (60.0 + rank)
    seq = r.router.routes["default"].catalog.seq_of
    order = sorted(want, key=lambda x: (-want[x], seq[x]))
    assert res.ids(0) == order
    np.testing.assert_allclose(res.scores[0, : len(order)], [want[x] for x in order], rtol=1e-5)
    assert res.meta["route"] == ["temporal"]
    assert [h["id"] for h in res.hits(0)] == order
    assert math.isclose(res.hits(0)[0]["score"], want[order[0]], rel_tol=1e-5)


def test_router_save_and_open(calls, tmp_path):
    m = memory()
    r = Retriever(m, ROUTED)
    m.save(tmp_path / "mem")
    r.save()
    r2 = Retriever.open(m)
    q = ["what did Caroline do last week", "Biscuit"]
    a = r.search(q, k=5, where={"tenant": "x"}, at=T0, backend="numpy")
    b = r2.search(q, k=5, where={"tenant": "x"}, at=T0, backend="numpy")
    assert a.keys == b.keys and a.meta["route"] == b.meta["route"]
    m.close()


def test_router_default_is_the_outer_channels_encoded_once(calls):
    enc = RecordingEncoder()
    cfg = {"channels": [{"kind": "dense"}], "fusion": None,
           "router": {"routes": {"temporal": {"channels": [{"kind": "temporal"}], "fusion": None}}}}
    r = Retriever(memory(), cfg, encoder=enc)
    assert sorted(enc.passages) == sorted(x[-1] for x in ROWS)  # the default route alone encoded the records
    res = r.search(["Biscuit the puppy", "what happened last week"], k=3, where={"tenant": "x"}, at=T0)
    assert res.meta["route"] == ["default", "temporal"]
    ref = Retriever(memory(), one("dense"), encoder=RecordingEncoder()).search("Biscuit the puppy", k=3,
                                                                                where={"tenant": "x"})
    assert res.ids(0) == ref.ids(0)
    with pytest.raises(ValueError, match="router"):
        r.search_channels("x")


def test_questions_without_a_time_word_skip_the_session_scan_and_the_parser(monkeypatch):
    """The real parser's pre-check: only time-ish questions read the session log."""
    pytest.importorskip("dateparser")
    r = Retriever(memory(), RetrieverConfig.from_config({"channels": [{"kind": "bm25"}, {"kind": "temporal"}],
                                                        "fusion": "z"}))
    calls = []
    real = r.catalog.session_times
    monkeypatch.setattr(r.catalog, "session_times", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    at = np.array([resolve_at("2023-05-25T12:00:00Z", 1)[0]] * 2)
    wins = r.windows(["who adopted the puppy", "what happened since we last talked"], None, at)
    assert wins[0] is None and len(calls) == 1
