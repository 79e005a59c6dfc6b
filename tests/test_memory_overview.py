"""gpuir.memory.overview (what the memory inspector page draws) against counts made by hand from the records."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

import numpy as np
import pytest

from gpuir import Memory
from gpuir.memory.overview import overview


def _records(rng, n, tenants=("t1", "t2")):
    out = []
    for i in range(n):
        r = {"id": f"r{i}", "text": f"word{i % 7} note {i}", "tenant": str(rng.choice(tenants))}
        if rng.random() < 0.8:
            r["session"] = f"s{int(rng.integers(0, 6))}"
        if rng.random() < 0.9:
            r["time"] = f"2024-0{int(rng.integers(1, 4))}-{int(rng.integers(1, 28)):02d}T{int(rng.integers(0, 24)):02d}:00:00Z"
        out.append(r)
    return out


def _ms(iso):
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp() * 1000)


@pytest.mark.parametrize("tenant", [None, "t1", "nobody"])
def test_counts_match_the_live_records(tenant):
    rng = np.random.default_rng(5)
    recs = _records(rng, 300)
    m = Memory(partition_days=30)
    for i in range(0, 300, 50):  # several segments
        m.add(recs[i:i + 50])
    m.delete([f"r{i}" for i in range(0, 300, 9)])
    live = [r for i, r in enumerate(recs) if i % 9 and (tenant is None or r["tenant"] == tenant)]
    o = overview(m, tenant, bins=12, top_sessions=4)
    assert o["records"] == len(live) and sum(s["records"] for s in o["segments"]) == len(live)
    assert o["untimed"] == sum("time" not in r for r in live)
    assert o["no_session"] == sum("session" not in r for r in live)
    sess = Counter(r["session"] for r in live if "session" in r)
    assert o["session_count"] == len(sess)
    assert [(s["session"], s["records"]) for s in o["sessions"]] == sorted(sess.items(), key=lambda x: (-x[1], x[0]))[:4]
    times = sorted(_ms(r["time"]) for r in live if "time" in r)
    assert sum(b["records"] for b in o["over_time"]) == len(times)
    if times:
        assert len(o["over_time"]) == 12
        for b in o["over_time"]:  # each span holds the records whose time falls in it
            lo, hi = _ms(b["start"]), _ms(b["end"])
            assert b["records"] == sum(lo <= t < hi for t in times)
        assert _ms(o["time_span"]["min"]) == times[0] and _ms(o["time_span"]["max"]) == times[-1]
    else:
        assert o["over_time"] == [] and o["time_span"] is None
    assert sum(s["stored"] for s in o["segments"]) >= sum(s["live"] for s in o["segments"]) >= o["records"]


def test_one_time_and_bad_arguments():
    m = Memory()
    m.add([{"id": "a", "text": "x", "time": "2024-01-01T00:00:00Z"}, {"id": "b", "text": "y",
                                                                      "time": "2024-01-01T00:00:00Z"}])
    o = overview(m)
    assert [b["records"] for b in o["over_time"]] == [2] and o["session_count"] == 0 and o["no_session"] == 2
    assert overview(Memory())["records"] == 0
    for bad in (0, 1001, 2.5, True):
        with pytest.raises(ValueError, match="bins"):
            overview(m, bins=bad)
    with pytest.raises(ValueError, match="top_sessions"):
        overview(m, top_sessions=0)


def test_expired_records_are_not_counted():
    m = Memory()
    m.add([{"id": "old", "text": "x", "session": "a", "expires_at": "2001-01-01T00:00:00Z"},
           {"id": "new", "text": "y", "session": "b", "expires_at": "2999-01-01T00:00:00Z"}, {"id": "z", "text": "z"}])
    o = overview(m)
    assert o["records"] == m.count() == 2 and [s["session"] for s in o["sessions"]] == ["b"]
