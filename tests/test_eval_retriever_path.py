"""Evaluation runs every retrieval method through gpuir.Retriever (issue 19): no second implementation."""

from __future__ import annotations

import importlib.util
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from gpuir.eval.datasets import EvalDataset, EvalQuery

EVAL = Path(__file__).resolve().parents[1] / "gpuir" / "eval"

SESSIONS = [
    ["Alice: I adopted a puppy named Biscuit.", "Bob: What a lovely dog."],
    ["Alice: My sister is moving to Berlin in June.", "Bob: Will you visit her?"],
    ["Alice: We hiked up the volcano on Saturday.", "Bob: Iceland has many volcanoes."],
    ["Bob: I started a pottery class on Tuesdays.", "Alice: That sounds relaxing."],
    ["Bob: My dog chewed the pottery I made.", "Alice: Oh no, the puppy again."],
    ["Alice: Berlin was cold this week.", "Bob: Take a coat next time."],
]
DATES = [datetime(2023, 5, 1, 12) + timedelta(days=7 * i) for i in range(6)]


def _at(group: str) -> int:
    """When a group's questions are asked: its last session (epoch ms, UTC)."""
    last = DATES[2] if group == "c0" else DATES[5]
    return round(last.replace(tzinfo=timezone.utc).timestamp() * 1000)


def _dataset() -> tuple[list[str], list[EvalQuery], EvalDataset]:
    ids = [f"c{i // 3}:S{i}" for i in range(6)]
    qs = [
        EvalQuery("c0:q0", "what is the name of the puppy", {ids[0]: 1}, "c0", "single-hop", tuple(ids[:3])),
        EvalQuery("c0:q1", "where is the sister moving", {ids[1]: 1}, "c0", "single-hop", tuple(ids[:3])),
        EvalQuery("c0:q2", "what did we hike last week", {ids[2]: 1}, "c0", "temporal", tuple(ids[:3])),
        EvalQuery("c1:q0", "which class did Bob start", {ids[3]: 1}, "c1", "single-hop", tuple(ids[3:])),
        EvalQuery("c1:q1", "what did the dog chew", {ids[4]: 1}, "c1", "multi-hop", tuple(ids[3:])),
        EvalQuery("c1:q2", "how was Berlin last week", {ids[5]: 1}, "c1", "temporal", tuple(ids[3:])),
    ]
    return ids, qs, EvalDataset("locomo", "session", ids, ["\n".join(s) for s in SESSIONS], list(DATES), qs)


def test_no_second_implementation_in_the_harness():
    """The dense-row module is gone and no evaluation module scores, pools or fuses by itself."""
    assert importlib.util.find_spec("gpuir.eval.hybrid_methods") is None
    banned = re.compile(r"DenseIndex|late_interaction|segment_reduce|score_matrix|encode_passages|"
                        r"from \.\.fusion import|gpuir\.fusion import|import gpuir\.fusion")
    hits = [f"{p.name}:{n}" for p in sorted(EVAL.glob("*.py"))
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if banned.search(line)]
    assert hits == []


@pytest.fixture
def spy(monkeypatch):
    """Counts of the Retriever's public search calls made while a method runs."""
    from gpuir.retrieve import Retriever

    calls = {"search": 0, "search_channels": 0, "fuse_channels": 0}
    for name in calls:
        orig = getattr(Retriever, name)

        def wrapped(self, *a, _orig=orig, _name=name, **kw):
            calls[_name] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(Retriever, name, wrapped)
    return calls


def test_fusion_runs_through_the_retriever(spy):
    from gpuir.eval.runner import evaluate

    ids, qs, ds = _dataset()
    r = evaluate(ds, "fusion", k=3, n_boot=10, backend="numpy", alpha=0.75)
    assert spy["search_channels"] == 1 and spy["fuse_channels"] == 1
    for i, q in enumerate(qs):  # haystacks honoured
        assert {ids[d] for d in r.run.ranked[i] if d >= 0} <= set(q.candidates)


def test_default_runs_through_the_retriever(spy):
    from gpuir.eval.runner import evaluate
    from gpuir.retrieve import default_config

    _, _, ds = _dataset()
    r = evaluate(ds, "default", k=3, n_boot=10, backend="numpy")
    assert spy["search"] >= 1
    assert r.run.meta["retriever_config"] == default_config().to_config()


def test_full_selection_covers_the_temporal_weight(spy):
    """--loco-grid full: analyzer x pooling x alpha x temporal weight, each held-out group chosen on the others;
    the held-out rows are the Retriever's fusion of the chosen setting (re-run at depth k)."""
    from gpuir.analysis import ANALYZERS
    from gpuir.eval import retriever_methods as R
    from gpuir.eval.runner import evaluate
    from gpuir.retrieve import default_config

    _, qs, ds = _dataset()
    res = evaluate(ds, "fusion", k=3, n_boot=10, backend="numpy", grid="full")
    meta = res.run.meta
    assert meta["grid"] == "full" and meta["temporal_weights"] == list(R.TEMPORAL_WEIGHTS)
    assert meta["n_settings"] == len(ANALYZERS) * len(R.POOLING_GRID) * len(R.ALPHAS) * len(R.TEMPORAL_WEIGHTS)
    assert set(meta["alpha_per_group"]) == {"c0", "c1"}
    for g, s in meta["alpha_per_group"].items():
        assert set(s) == {"analyzer", "pooling", "alpha", "temporal_weight"}
        # the chosen setting, run by hand through the Retriever, gives the held-out group's rows
        cfg = R._with(default_config(), s["analyzer"], tuple(s["pooling"]), temporal=s["temporal_weight"] > 0)
        rows = [i for i, q in enumerate(qs) if q.group == g]
        r = R.build_retriever(ds, cfg)
        ran = r.search_channels([qs[i].text for i in rows], where=R.haystack_wheres(ds, [qs[i] for i in rows]),
                                unit="session", backend="numpy",
                                at=[_at(g)] * len(rows))
        w = [s["alpha"], 1 - s["alpha"]] + ([s["temporal_weight"]] if s["temporal_weight"] > 0 else [])
        ranked, _ = R.ranked_from_results(ds, r.results(ran, r.fuse_channels(ran, 3, weights=w)), 3)
        np.testing.assert_array_equal(res.run.ranked[rows], ranked)
    assert spy["fuse_channels"] > 0


def test_temporal_subset_fusion_is_exact():
    """The selection fuses only the questions the temporal channel ran for; that equals fusing the whole batch."""
    from gpuir.eval import retriever_methods as R
    from gpuir.retrieve import default_config

    _, qs, ds = _dataset()
    cfg = R._with(default_config(), "default", ("max", 2, 1.0), temporal=True)
    r = R.build_retriever(ds, cfg)
    at = [_at(q.group) for q in qs]
    ran = r.search_channels([q.text for q in qs], where=R.haystack_wheres(ds, qs), unit="session", backend="numpy",
                            at=at)
    rows = np.flatnonzero(ran["ran"][:, 2])
    assert 0 < rows.size < len(qs)  # the "last week" questions only
    for w in (0.25, 1.0):
        whole = R._fused(ds, r, ran, 3, [0.6, 0.4, w])
        part = R._fused(ds, r, R._row_subset(ran, rows), 3, [0.6, 0.4, w])
        np.testing.assert_array_equal(whole[0][rows], part[0])
        np.testing.assert_array_equal(whole[1][rows], part[1])
        rest = np.setdiff1d(np.arange(len(qs)), rows)
        two = R._fused(ds, r, R._without_extra(ran), 3, [0.6, 0.4])
        np.testing.assert_array_equal(whole[0][rest], two[0][rest])


def test_removed_methods_are_refused_with_a_clear_error(capsys):
    from gpuir.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", "locomo", "--method", "agent_rrf"])
    assert e.value.code == 2
    assert "agent_rrf" in capsys.readouterr().err
