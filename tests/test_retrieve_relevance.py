"""The Retriever's 0-1 relevance (issue 37): the default configuration's sessions, calibrated on LoCoMo.

Expected values are the logistic map written out here, not read from the code under test.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpuir import Memory, Retriever, RetrieverConfig
from gpuir.retrieve import relevance
from gpuir.retrieve.config import default_config

ROOT = Path(__file__).resolve().parents[1]

TURNS = [("s1", "Alice: I adopted a puppy named Rex"), ("s1", "Bob: what breed is the puppy?"),
         ("s2", "Alice: I moved to Berlin in spring"), ("s2", "Bob: how is the new flat in Berlin?"),
         ("s3", "Alice: my guitar lessons start Monday"), ("s3", "Bob: which guitar did you buy?"),
         ("s4", "Alice: the puppy chewed my guitar strap"), ("s5", "Bob: coffee or tea this morning?")]


@pytest.fixture(scope="module")
def retriever():
    m = Memory()
    m.add([{"id": f"t{i}", "text": t, "session": s, "tenant": "alice", "time": f"2024-01-{i + 1:02d}T10:00:00Z"}
           for i, (s, t) in enumerate(TURNS)])
    return Retriever(m)


def _by_hand(score: float, n: int = len(TURNS)) -> float:
    b0, b1, b2 = relevance.CALIBRATED["session"]
    lo, hi = relevance.N_RANGE["session"]
    n = min(max(n, lo), hi)  # the sizes calibrated
    return 1.0 / (1.0 + math.exp(-(b0 + b1 * score + b2 * math.log(n))))


def test_default_sessions_carry_relevance_and_min_score_keeps_the_relevant(retriever):
    qs = ["puppy guitar", "Berlin flat", "coffee"]
    full = retriever.search(qs, k=5, where={"tenant": "alice"}, unit="session")
    rel = full.meta["relevance"]
    for i in range(len(qs)):
        hits = full.hits(i)
        assert hits
        for j, h in enumerate(hits):
            assert rel[i, j] == pytest.approx(_by_hand(h["score"]), rel=1e-6)
        assert np.isnan(rel[i, len(hits):]).all()
        assert all(a >= b for a, b in itertools.pairwise(rel[i, : len(hits)].tolist()))
    t = float(np.nanmedian(rel))
    cut = retriever.search(qs, k=5, where={"tenant": "alice"}, unit="session", min_score=t)
    for i in range(len(qs)):
        want = [h["id"] for h in full.hits(i) if np.float32(_by_hand(h["score"])) >= t]
        assert cut.ids(i) == want
        assert [h["id"] for h in cut.hits(i)] == want
        assert np.isneginf(cut.scores[i, len(want):]).all() and (cut.numbers[i, len(want):] == -1).all()


def test_min_score_refused_where_not_calibrated(retriever):
    with pytest.raises(ValueError, match="between 0 and 1"):
        retriever.search("puppy", unit="session", min_score=2.0)
    with pytest.raises(ValueError, match="has none at unit='record'") as e:
        retriever.search("puppy", unit="record", min_score=0.5)
    assert "ChannelConfig(min_score=...)" in str(e.value) and "ranking='hybrid'" in str(e.value)  # what to do
    other = Retriever(retriever.memory, RetrieverConfig.from_config(
        {"channels": [{"kind": "bm25_session"}], "fusion": "z"}))
    with pytest.raises(ValueError, match="has none"):
        other.search("puppy", unit="session", min_score=0.5)
    assert "relevance" not in other.search("puppy", unit="session").meta


def test_shipped_coefficients_are_the_fitted_ones():
    res = json.loads((ROOT / "bench" / "results" / "retriever_calibrate_locomo.json").read_text())
    np.testing.assert_allclose(relevance.CALIBRATED["session"], res["coefficients_all_ten_conversations"],
                               rtol=0, atol=5e-4)
    key = next(k for k in res if k.startswith("n_range"))
    np.testing.assert_allclose(relevance.N_RANGE["session"], res[key], rtol=1e-6)
    fitted = {k: v for k, v in res["configuration"].items() if k != "parallel"}
    shipped = {k: v for k, v in default_config().to_config().items() if k != "parallel"}
    assert fitted == shipped  # calibrated on the configuration that is the default now
