"""The load benchmark's split of its requests (bench/bench_service.py): by the run's phases, and by
whether the inspector page was polling (``--page toggle``), on hand-made timelines whose answers are
worked out here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_service():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import bench_service
    finally:
        sys.path.pop(0)
    return bench_service


def _timeline(kill=100.0, verified=101.0):
    """Two agents; their first adds (the first wave, 9 s each) at 0.1 and 0.2 s; then one add every 0.5 s
    from 0.5 to 17.5 s, 0.2 s long while the page polls (0-5 s and 10-15 s) and 0.1 s otherwise; a
    search of 0.3 s at 1 s; an add of 5 s at 19 s, after the first agent was done (18 s)."""
    samples = [(0.1, "add", 9.0), (0.2, "add", 9.0), (1.0, "search", 0.3), (19.0, "add", 5.0),
               (30.0, "verify", 50.0)]
    polling = [(0.0, 5.0), (10.0, 15.0)]
    for i in range(1, 36):
        t = i * 0.5
        samples.append((t, "add", 0.2 if any(a <= t < b for a, b in polling) else 0.1))
    marks = {"start": 0.0, "kill": kill, "verified": verified, "end": 20.0, "first_agent_done": 18.0}
    flips = [(0.0, True), (5.0, False), (10.0, True), (15.0, False)]
    return {"marks": marks, "samples": samples, "n_agents": 2}, flips


def test_requests_are_counted_under_the_polling_state_at_their_start(bench_service):
    tl, flips = _timeline()
    out = bench_service.by_polling(tl, flips)
    # from the first wave's last start (0.2 s) to the first agent's end (18 s)
    assert out["seconds"]["polling"] == pytest.approx(4.8 + 5.0)
    assert out["seconds"]["not_polling"] == pytest.approx(5.0 + 3.0)
    add = out["add"]
    # polling: 0.5..4.5 (9 adds) and 10..14.5 (10 adds); not: 5..9.5 (10) and 15..17.5 (6)
    assert add["polling"]["n"] == 19 and add["not_polling"]["n"] == 16
    assert add["polling"]["p50_ms"] == pytest.approx(200.0) and add["not_polling"]["p99_ms"] == pytest.approx(100.0)
    assert add["ratio"]["p50_ms"] == pytest.approx(2.0)
    assert add["polling"]["per_s"] == pytest.approx(19 / 9.8)
    assert "search" not in out  # no search while the page was not polling: no ratio


def test_the_outage_is_left_out_of_both_states(bench_service):
    tl, flips = _timeline(kill=12.0, verified=13.0)
    out = bench_service.by_polling(tl, flips)
    assert out["seconds"]["polling"] == pytest.approx(4.8 + 2.0 + 2.0)
    assert out["seconds"]["not_polling"] == pytest.approx(8.0)
    assert out["add"]["polling"]["n"] == 19 - 2  # 12.0 and 12.5 started during the outage


def test_phases_set_the_first_wave_apart(bench_service):
    tl, _ = _timeline(kill=8.0, verified=9.0)
    out = bench_service.phases(tl, slowest=3)
    assert out["add_first_wave_ms"] == {"p50": pytest.approx(9000.0), "max": pytest.approx(9000.0), "n": 2}
    assert out["add_after_first_wave_ms"]["n"] == 36  # the 35 regular adds and the late one
    assert out["add_before_kill_ms"]["n"] == 2 + 15  # the wave, and 0.5 .. 7.5
    assert [(s["op"], s["ms"]) for s in out["slowest"]] == [("add", 9000.0), ("add", 9000.0), ("add", 5000.0)]
    assert out["slowest"][2]["start_s_after_restart"] == pytest.approx(10.0)
