"""The catalog follows the memory incrementally: only new rows are read, nothing re-sorts every live record.

A random mix of adds, deletes, updates and merges; after each sync the catalog's
record maps equal those read from the snapshot's live records, and the sync itself
never calls ``Snapshot.live_records`` (the O(N) read-and-sort of every live record).
"""

from __future__ import annotations

import random

import pytest

from gpuir import Memory
from gpuir.memory.snapshot import Snapshot
from gpuir.retrieve.catalog import Catalog


def test_catalog_reads_only_what_changed(monkeypatch):
    rng = random.Random(0)
    m = Memory(partition_days=None, merge_factor=3, merge_min=4)
    cat = Catalog(m, with_sessions=True)
    real = Snapshot.live_records
    ids: list[str] = []
    n = 0
    try:
        for step in range(80):
            op = rng.random()
            if op < 0.5 or not ids:
                recs = []
                for _ in range(rng.randint(1, 5)):
                    recs.append({"id": f"r{n}", "text": f"word{rng.randint(0, 9)} text {n}",
                                 "session": f"s{rng.randint(0, 4)}"})
                    ids.append(f"r{n}")
                    n += 1
                m.add(recs)
            elif op < 0.75:
                gone = rng.sample(ids, min(len(ids), rng.randint(1, 3)))
                m.delete(gone)
                ids = [i for i in ids if i not in gone]
            elif op < 0.9:
                m.update([{"id": rng.choice(ids), "text": f"updated {step}"}])
            else:
                m.merge()
            if rng.random() < 0.7:
                monkeypatch.setattr(Snapshot, "live_records", lambda self: pytest.fail("sync read every record"))
                before = dict(cat.seq_of)
                snap = cat.sync()
                monkeypatch.setattr(Snapshot, "live_records", real)
                live = snap.live_records()
                want = {snap.record(vi, r)["id"]: s for s, vi, r in live}
                assert cat.seq_of == want, step
                assert cat.text_of == {snap.record(vi, r)["id"]: snap.record(vi, r)["text"] for _, vi, r in live}
                assert sorted(cat.added) == sorted(k for k, s in want.items() if before.get(k) != s)  # new or updated
                assert sorted(cat.removed) == sorted(k for k, s in before.items() if want.get(k) != s)
                sessions = {cat.session_of[k] for k in want}
                assert {s for s, mem in cat.members.items() if mem} == sessions
                assert set(cat.sessions.get(sorted(sessions), missing_ok=True)[0]) >= {"id", "text"}
    finally:
        m.close()
