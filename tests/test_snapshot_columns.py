"""Columns by sequence number: Snapshot.locate / strings / times and Memory.seqs_of read what Snapshot.record reads.

Random adds, deletes, updates and merges across time partitions; after each step every
sequence number ever given (live, deleted, replaced) and some never given are read in a
shuffled order and compared with the records of ``live_records`` / ``record``.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from gpuir import Memory
from gpuir.memory.records import MISSING_TIME
from gpuir.memory.stamps import STAMP_FIELDS

DAY = 86_400_000


def test_columns_by_seq_equal_the_records():
    rng = random.Random(3)
    m = Memory(partition_days=7, merge_factor=3, merge_min=4)
    ids: list[str] = []
    n = 0
    try:
        for step in range(40):
            op = rng.random()
            if op < 0.5 or not ids:
                recs = []
                for _ in range(rng.randint(1, 6)):
                    r = {"id": f"r{n}", "text": f"text {n} é{rng.randint(0, 9)}"}
                    if rng.random() < 0.7:
                        r["time"] = rng.randint(0, 60) * DAY
                    if rng.random() < 0.6:
                        r["session"] = f"s{rng.randint(0, 3)}"
                    if rng.random() < 0.5:
                        r["tenant"] = rng.choice(["a", "b"])
                    if rng.random() < 0.5:
                        r["metadata"] = {"speaker": rng.choice(["Jo", "Al"])}
                    recs.append(r)
                    ids.append(r["id"])
                    n += 1
                m.add(recs, time_unit="ms")
            elif op < 0.7:
                gone = rng.sample(ids, min(len(ids), 2))
                m.delete(gone)
                ids = [i for i in ids if i not in gone]
            elif op < 0.9:
                m.update([{"id": rng.choice(ids), "text": f"updated {step}", "time": step * DAY}], time_unit="ms")
            else:
                m.merge()
            snap = m.snapshot()
            live = {s: snap.record(vi, r) for s, vi, r in snap.live_records()}
            asked = np.asarray(rng.sample(range(-2, m.next_seq + 3), m.next_seq + 5), dtype=np.int64)
            recs = [live.get(int(s)) for s in asked]
            vi, rows = snap.locate(asked)
            assert ((vi >= 0) == np.asarray([r is not None for r in recs])).all()
            assert all(snap.views[v].seg.seqs[r] == s for v, r, s in zip(vi.tolist(), rows.tolist(), asked.tolist())
                       if v >= 0)
            assert snap.strings("id", asked) == [None if r is None else r["id"] for r in recs]
            assert snap.strings("text", asked) == [None if r is None else r["text"] for r in recs]
            for f in ("session", "tenant"):
                assert snap.strings(f, asked) == [None if r is None else r.get(f) for r in recs]
            meta = [None if s is None else (json.loads(s) if s else {}) for s in snap.strings("metadata", asked)]
            # (the stored metadata text also holds the record's created_at / updated_at, under reserved keys)
            stamps = [None if d is None else {k: d.pop(v) for k, v in STAMP_FIELDS.items()} for d in meta]
            assert meta == [None if r is None else r.get("metadata", {}) for r in recs]
            assert stamps == [None if r is None else {k: r[k] for k in STAMP_FIELDS} for r in recs]
            want_t = [MISSING_TIME if r is None else r.get("time", MISSING_TIME) for r in recs]
            assert snap.times(asked).tolist() == want_t
            # ids -> seqs, at the current snapshot and at an older one
            by_id = {r["id"]: s for s, r in live.items()}
            probe = ids[:5] + ["nope"]
            assert m.seqs_of(probe) == [by_id.get(i) for i in probe]
            assert m.seqs_of(probe, snapshot=snap) == [by_id.get(i) for i in probe]
        old = m.snapshot()
        rid = ids[0]
        m.update([{"id": rid, "text": "changed once more"}])
        assert m.seqs_of([rid], snapshot=old) == [None]  # its live version is not in the old snapshot
        assert m.seqs_of([rid]) != [None]
    finally:
        m.close()


def test_strings_refuses_an_unknown_column():
    m = Memory()
    m.add([{"id": "a", "text": "x"}])
    with pytest.raises(ValueError, match="no string column 'importance'"):
        m.snapshot().strings("importance", np.zeros(1, np.int64))
    assert m.snapshot().strings("id", np.zeros(0, np.int64)) == []
    assert m.snapshot().times(np.zeros(0, np.int64)).shape == (0,)
    m.close()
