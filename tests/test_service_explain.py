"""gpuir.service.explain: each channel's rank and contribution to a fused hit add up to the hit's score."""

from __future__ import annotations

import numpy as np
import pytest

from gpuir import Memory
from gpuir.retrieve import Retriever
from gpuir.service.explain import channel_contributions


@pytest.fixture(scope="module")
def memory():
    m = Memory()
    m.add([{"id": f"r{i}", "text": f"Caroline talked about the support group and painting {i % 5} with Melanie "
                                   f"{'camping ' * (i % 4)}{i % 3}", "session": f"s{i % 6}",
            "time": f"2023-05-{1 + i % 28:02d}T10:00:00Z"} for i in range(60)])
    return m


@pytest.mark.parametrize("fusion", ["z", "minmax", "rrf", "weighted_rrf", "score_rrf"])
def test_contributions_add_up_to_the_fused_score_and_ranks_are_the_channels_own(memory, fusion):
    cfg = {"channels": [{"kind": "bm25", "depth": 50, "weight": 1.0}, {"kind": "temporal", "depth": 50, "weight": 0.5},
                        {"kind": "entity", "depth": 50, "weight": 0.3}], "fusion": fusion}
    r = Retriever(memory, cfg)
    res = r.search(["What did Caroline paint on 8 May 2023?", "support group camping 3", "Melanie camping"], k=10)
    ran = np.asarray(res.meta["ran"])
    assert ran[0].sum() >= 2  # a question with a date: at least bm25 and temporal ran
    for i in range(3):
        parts = channel_contributions(r, res, i)
        hits = res.hits(i)
        assert hits and set(parts) >= {h["id"] for h in hits}
        for h in hits:
            c = parts[h["id"]]
            assert set(c) == {"bm25", "temporal", "entity"}
            total = sum(v["contribution"] for v in c.values() if v["contribution"] is not None)
            assert total == pytest.approx(h["score"], rel=1e-5, abs=1e-6)
            for kind, v in c.items():
                ch = res.meta["channels"][kind]
                own = [int(x) for x in np.asarray(ch.ids[i]).tolist() if x >= 0]
                n = int(res.numbers[i][res.keys[i].index(h["id"])])
                want = own.index(n) + 1 if n in own and ran[i][["bm25", "temporal", "entity"].index(kind)] else None
                assert v["rank"] == want, (kind, v, want)
                if not ran[i][["bm25", "temporal", "entity"].index(kind)]:
                    assert v["contribution"] is None


def test_configurations_that_cannot_be_split_are_not_explained(memory):
    one = Retriever(memory, {"channels": [{"kind": "bm25", "depth": 50, "weight": 1.0}], "fusion": None})
    assert channel_contributions(one, one.search(["support group"], k=3), 0) is None
