"""Measured latency (gpuir.eval.latency) with a fake retriever: bookkeeping, never timing values."""

from __future__ import annotations

import numpy as np
import pytest

from gpuir.eval.latency import latency_stats, measure_latency


def test_latency_stats():
    s = latency_stats([0.001, 0.002, 0.003, 0.004])
    assert s["n"] == 4 and s["p50_ms"] == pytest.approx(2.5) and s["mean_ms"] == pytest.approx(2.5)
    assert s["p99_ms"] == pytest.approx(3.97)
    assert latency_stats([])["p50_ms"] is None
    with pytest.raises(ValueError):
        latency_stats([-1.0])


class FakeRetriever:
    """Escalates questions whose text contains '?'; reports per-stage timings."""

    def __init__(self):
        self.calls = []

    def search(self, queries, k=10, where=None, unit="session", backend="auto", at=None):
        self.calls.append((list(queries), where, at))

        class R:
            pass

        r = R()
        r.meta = {"escalated": np.array(["?" in q for q in queries]),
                  "timings": {"bm25": 0.001, "fusion": 0.0005, "total": 0.002}}
        return r


def test_measure_latency_paths_and_batches():
    qs = ["a?", "b", "c", "d?", "e"]
    fr = FakeRetriever()
    out = measure_latency(fr, qs, where=[{"tenant": str(i)} for i in range(5)], at=[1, 2, 3, 4, 5], batch_size=2)
    b1 = out["batch1"]
    assert b1["all"]["n"] == 5 and b1["skip"]["n"] == 3 and b1["escalate"]["n"] == 2
    assert out["skip_rate"] == pytest.approx(0.6)
    assert set(b1["stages"]) == {"bm25", "fusion", "total"} and b1["stages"]["bm25"]["p50_ms"] == pytest.approx(1.0)
    # warm-up + 5 single calls + 3 batches (2, 2, 1)
    sizes = [len(c[0]) for c in fr.calls]
    assert sizes == [1, 1, 1, 1, 1, 1, 2, 2, 1]
    assert fr.calls[1] == (["a?"], [{"tenant": "0"}], [1])  # each question with its own where and time
    assert out["batched"]["per_query"]["n"] == 5 and out["batched"]["batch_size"] == 2


def test_measure_latency_sample_and_no_paths():
    class Plain:
        def search(self, queries, **kw):
            r = type("R", (), {})()
            r.meta = {}
            return r

    out = measure_latency(Plain(), ["x", "y", "z"], single=[0, 2])
    assert out["batch1"]["all"]["n"] == 2 and "skip" not in out["batch1"] and out["skip_rate"] is None
    with pytest.raises(ValueError, match="no questions"):
        measure_latency(Plain(), [])


def test_measure_latency_batched_path_split():
    qs = ["a?", "b", "c", "d?", "e"]
    fr = FakeRetriever()
    out = measure_latency(fr, qs, batch_size=2, paths=True)
    bt = out["batched"]
    # the batched pass's escalations split the questions: 3 skip (b, c, e), 2 escalate (a?, d?)
    assert bt["skip"]["n"] == 3 and bt["escalate"]["n"] == 2 and bt["skip_rate"] == pytest.approx(0.6)
    # after warm-up, 5 single calls and the 3 mixed batches: the skip questions in batches of 2, then the escalating
    tail = [c[0] for c in fr.calls[9:]]
    assert tail == [["b", "c"], ["e"], ["a?", "d?"]]


def test_measure_latency_paths_false_reports_no_split():
    out = measure_latency(FakeRetriever(), ["a?", "b"], paths=False)
    assert "skip" not in out["batch1"] and out["skip_rate"] is None and "skip" not in out["batched"]
