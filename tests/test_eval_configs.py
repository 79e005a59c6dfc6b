"""Named configurations (gpuir/data/configs) and the --method config / default evaluation."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone

import numpy as np
import pytest

from gpuir.eval import config_methods as cm
from gpuir.retrieve import RetrieverConfig, default_config

ISSUE13 = ("cascade", "router", "temporal", "entity", "type_filter", "enrich", "all")


def test_shipped_names():
    names = cm.named_configs()
    for n in ("current_best", "dense_hybrid", *ISSUE13):
        assert n in names


def test_current_best_is_the_default():
    assert cm.load_named_config("current_best").to_config() == default_config().to_config()
    assert cm.load_named_config("default").to_config() == default_config().to_config()
    assert cm.load_named_config(None).to_config() == default_config().to_config()
    dh = cm.load_named_config("dense_hybrid")
    assert dh.needs_encoder and [c.kind for c in dh.channels] == ["bm25_session", "bm25_pool", "late"]


def test_every_shipped_config_loads_or_says_why():
    known = {f.name for f in dataclasses.fields(RetrieverConfig)}
    for name in cm.named_configs():
        raw = json.loads((cm.CONFIG_DIR / f"{name}.json").read_text())
        if set(raw) <= known and all(c["kind"] in ("bm25", "bm25_session", "bm25_pool", "dense", "late")
                                     for c in raw["channels"]):
            cm.load_named_config(name)  # today's fields: must load
        else:
            try:
                cm.load_named_config(name)  # loads once the issue-13 retriever is merged
            except ValueError as e:
                assert f"{name}.json" in str(e) and "issue 13" in str(e)


def test_load_by_path_and_errors(tmp_path):
    p = tmp_path / "mine.json"
    default_config().save(p)
    assert cm.load_named_config(str(p)).to_config() == default_config().to_config()
    with pytest.raises(ValueError, match="choose one of .*current_best"):
        cm.load_named_config("no_such_config")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="not JSON"):
        cm.load_named_config(str(bad))
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"channels": [{"kind": "bm25"}], "bogus": 1}))
    with pytest.raises(ValueError, match="odd.json.*bogus"):
        cm.load_named_config(str(odd))


def test_set_path_and_parse_tune():
    d = default_config().to_config()
    e = cm.set_path(d, "channels.1.weight", 0.5)
    assert e["channels"][1]["weight"] == 0.5 and d["channels"][1]["weight"] == 0.25  # a copy
    assert cm.set_path(d, "cascade.tau", 0.1)["cascade"] == {"tau": 0.1}
    with pytest.raises(ValueError, match="item number"):
        cm.set_path(d, "channels.7.weight", 1)
    assert cm.parse_tune(["cascade.tau=0,0.1", "fusion=z,rrf"]) == {"cascade.tau": [0, 0.1], "fusion": ["z", "rrf"]}
    with pytest.raises(ValueError, match="PATH=V1"):
        cm.parse_tune(["cascade.tau"])


def test_question_times():
    from types import SimpleNamespace

    d1, d2 = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1)
    ds = SimpleNamespace(doc_index={"s1": 0, "s2": 1}, doc_dates=[d1, d2])
    qs = [SimpleNamespace(date=None, candidates=("s1", "s2"), meta={}),
          SimpleNamespace(date=datetime(2024, 1, 1, tzinfo=timezone.utc), candidates=("s1",), meta={}),
          SimpleNamespace(date=None, candidates=None, meta={})]
    t = cm.question_times(ds, qs)
    assert t[0] == int(d2.replace(tzinfo=timezone.utc).timestamp() * 1000)  # the last session's date
    assert t[1] == 1704067200000 and t[2] is None


@pytest.mark.slow
def test_method_default_ranks_as_the_fusion_method(locomo):
    from gpuir.eval.runner import evaluate

    ds = dataclasses.replace(locomo, queries=[q for q in locomo.queries if q.group == "conv-26"])
    a = evaluate(ds, "default", n_boot=100)
    b = evaluate(ds, "fusion", alpha=0.75, n_boot=100)  # the default configuration's weights, by the other path
    np.testing.assert_array_equal(a.run.ranked, b.run.ranked)
    assert a.run.meta["retriever_config"] == default_config().to_config()
    c = evaluate(ds, "config", config="current_best", n_boot=100)
    np.testing.assert_array_equal(a.run.ranked, c.run.ranked)
    # a tuned weight: held-out, one choice per fold, and only grid values chosen
    t = evaluate(ds, "config", config="current_best", tune=["channels.0.weight=0.5,0.75"], cv="stratified",
                 n_boot=100)
    tuned = t.run.meta["tuned"]
    assert tuned["n_settings"] == 2 and len(tuned["chosen_per_fold"]) == 5
    assert all(v["channels.0.weight"] in (0.5, 0.75) for v in tuned["chosen_per_fold"].values())


def test_decision_summary_rates_and_skip_rate_by_category():
    dec = {"escalated": np.array([True, False, False, True]), "route": ["t", "t", "m", "m"],
           "widened": np.array([False, False, False, True])}
    s = cm._decision_summary(dec, ["a", "a", "b", "b"])
    assert s["escalated_rate"] == 0.5 and s["skip_rate"] == 0.5 and s["widened_rate"] == 0.25
    assert s["skip_rate_by_category"] == {"a": 0.5, "b": 0.5}
    assert s["routes"] == {"m": 2, "t": 2}
    assert cm._decision_summary({}) == {}
