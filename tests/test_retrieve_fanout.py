"""Fan-out: channels in threads give the serial result; timings per stage; the optimiser's mask;
fusion over the channels that ran; score_rrf."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _retrieve_doubles import DAY, install
from test_retrieve_cascade import Encoder
from test_retrieve_channels_new import T0, memory

from gpuir import Retriever, RetrieverConfig
from gpuir.fusion import fuse
from gpuir.results import SearchResults
from gpuir.retrieve.optimiser import applies, fuse_ran
from gpuir.retrieve.registry import ChannelRequest

ALL = [{"kind": "bm25", "weight": 0.3}, {"kind": "bm25_session", "weight": 0.3}, {"kind": "bm25_pool", "weight": 0.2},
       {"kind": "dense", "weight": 0.2}, {"kind": "late", "weight": 0.1}, {"kind": "temporal", "weight": 1.0},
       {"kind": "entity", "weight": 0.5}]
QS = ["what did Caroline do last week", "Biscuit puppy", "painting class", "what happened since we last talked"]


class ThreadEncoder(Encoder):
    def __init__(self):
        super().__init__()
        self.threads: list[str] = []

    def encode_queries(self, texts):
        self.threads.append(threading.current_thread().name)
        return super().encode_queries(texts)


@pytest.mark.parametrize("unit", ["record", "session"])
@pytest.mark.parametrize("fusion", ["z", "rrf"])
def test_parallel_equals_serial(monkeypatch, unit, fusion):
    install(monkeypatch)
    m = memory()
    out = {}
    for par in (True, False):
        enc = ThreadEncoder()
        r = Retriever(m, RetrieverConfig.from_config({"channels": ALL, "fusion": fusion, "parallel": par}),
                      encoder=enc)
        out[par] = r.search(QS, k=6, where={"tenant": "x"}, unit=unit, at=T0, backend="numpy")
        # queries are encoded in the calling thread, never in a channel's: the encoder's SQLite cache may be
        # used only by the thread that opened it (a parallel dense search failed with ProgrammingError)
        assert enc.threads and not any(t.startswith("gpuir-channel") for t in enc.threads)
    a, b = out[True], out[False]
    assert a.keys == b.keys and a.keys[0]
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.meta["ran"], b.meta["ran"])
    for kind in a.meta["channels"]:
        np.testing.assert_array_equal(a.meta["channels"][kind].ids, b.meta["channels"][kind].ids)
    chans = [c["kind"] for c in ALL] if unit == "session" else ["bm25", "dense", "temporal", "entity"]
    assert set(chans) | {"fusion", "total", "encode_queries", "time_parse"} <= set(a.meta["timings"])
    assert all(v >= 0 for v in a.meta["timings"].values())


def test_optimiser_mask(monkeypatch):
    install(monkeypatch)
    r = Retriever(memory(), RetrieverConfig.from_config({"channels": ALL, "fusion": "rrf"}), encoder=Encoder())
    res = r.search(QS + ["the weather today"], k=3, where={"tenant": "x"}, unit="session", at=T0, backend="numpy")
    ran = res.meta["ran"]
    # temporal: a window for "last week" and "since we last talked"; entity: Caroline, Biscuit, none, none, none
    assert ran[:, 5].tolist() == [True, False, False, True, False]
    assert ran[:, 6].tolist() == [True, True, False, False, False]
    assert ran[:, :5].all()
    w = [None, "w", None]  # each channel says itself whether it runs (Channel.applies)
    req = ChannelRequest(["a", "b", "c"], None, np.zeros(3, np.int64), "numpy", r.sync(), r.catalog, windows=w)
    got = applies(r.channels, req)
    assert got[:, 5].tolist() == [False, True, False] and not got[:, 6].any() and got[:, :5].all()
    assert r.search("x", at=T0 + DAY).meta["timings"]["total"] >= 0


def test_fuse_ran_ignores_channels_that_did_not_run():
    a = SearchResults(np.array([[1, 2, 3], [4, 5, -1]]), np.array([[3, 2, 1], [2, 1, -np.inf]], np.float32))
    b = SearchResults(np.array([[3, 9, -1], [5, 4, 7]]), np.array([[5, 4, -np.inf], [9, 8, 7]], np.float32))
    ran = np.array([[True, True], [True, False]])
    for method in ("z", "minmax", "rrf", "weighted_rrf"):
        got = fuse_ran([a, b], ran, 3, method, [0.5, 0.5], "min", 60.0)
        # row 0: both ran, as gpuir.fusion fuses them; row 1: b did not run (its stale row is ignored)
        ref = fuse([SearchResults(a.ids[:1], a.scores[:1]), SearchResults(b.ids[:1], b.scores[:1])], 3,
                   method=method, weights=[0.5, 0.5], **({"missing": "min"} if method in ("z", "minmax") else {}))
        np.testing.assert_array_equal(got.ids[0], ref.ids[0])
        np.testing.assert_allclose(got.scores[0], ref.scores[0], rtol=1e-6)
        assert got.ids[1].tolist() == [4, 5, -1] and got.scores[1].tolist()[:2] == [2.0, 1.0]
    # nothing ran: an empty row
    got = fuse_ran([a, b], np.array([[False, False], [True, True]]), 2, "z", [1, 1])
    assert got.ids[0].tolist() == [-1, -1]


def test_score_rrf_is_the_fusion_module_s(monkeypatch):
    install(monkeypatch)
    m = memory()
    chans = [{"kind": "bm25", "weight": 0.6}, {"kind": "bm25_pool", "weight": 0.4}]
    r = Retriever(m, RetrieverConfig.from_config({"channels": chans, "fusion": "score_rrf"}))
    res = r.search(["Biscuit puppy Caroline"], k=5, unit="session", backend="numpy")
    ch = [res.meta["channels"]["bm25"], res.meta["channels"]["bm25_pool"]]
    ref = fuse(ch, 5, method="score_rrf", weights=[0.6, 0.4], k_rrf=60.0)
    np.testing.assert_array_equal(res.numbers, ref.ids)
    assert res.meta["notes"] == []


def test_parallel_dense_encodes_in_calling_thread_with_a_thread_bound_encoder(monkeypatch):
    """An encoder that, like the SQLite-cached one, fails when called from another thread than its first."""
    install(monkeypatch)

    class Bound(Encoder):
        owner = None

        def encode_queries(self, texts):
            me = threading.get_ident()
            Bound.owner = Bound.owner or me
            if me != Bound.owner:
                raise RuntimeError("used from another thread")
            return super().encode_queries(texts)

    r = Retriever(memory(), RetrieverConfig.from_config({"channels": ALL, "parallel": True}), encoder=Bound())
    for _ in range(2):
        res = r.search(QS, k=6, where={"tenant": "x"}, unit="session", at=T0, backend="numpy")
        assert res.keys[0]
