"""The central property: after any interleaving of add, delete, update, merge, save and open,
every Memory search equals a fresh BM25Index over the live records in add order -- ids and
float32 scores bit for bit, same tie rule -- for every BM25 variant, with and without ``where``,
in every partition-scan mode. Seeded random generator: failures replay exactly."""

import numpy as np
import pytest
from _helpers import without_times
from _memory_oracle import DAY, Model, assert_same, iso_out, ms, random_query, random_record, random_where

from gpuir import Memory
from gpuir.bm25 import METHODS

N_STEPS = 28


def _partition_ids(model: Model, K: int, days) -> set[str]:
    """Ids of the live records in the K newest 1-day partitions (records without a time last)."""
    if days is None:  # one partition
        return set(model.live)
    key = {rid: (None if ms(r.get("time")) is None else ms(r["time"]) // DAY) for rid, r in model.live.items()}
    keys = sorted({k for k in key.values() if k is not None}, reverse=True)
    if any(k is None for k in key.values()):
        keys.append(None)
    keep = set(keys[:K])
    return {rid for rid, k in key.items() if k in keep}


def _check(m: Memory, model: Model, rng, step: str, days, backend: str) -> None:
    assert len(m) == len(model.live)
    queries = [random_query(rng) for _ in range(5)] + [""]
    k = int(rng.choice([1, 3, 10]))
    wheres = [None, random_where(rng), [random_where(rng) if rng.random() < 0.7 else None for _ in queries]]
    for w in wheres:
        ids, scores = model.search(queries, k, where=w)
        for mode in ("exhaustive", "newest"):  # the same scan: identical under the same tie rule
            assert_same(m.search(queries, k=k, where=w, backend=backend, mode=mode, ties="oldest"), ids, scores,
                        f"{step} mode={mode} k={k} where={w}")
        ids, scores = model.search(queries, k, where=w, ties="newest")  # mode "newest": ties newest first
        for mode in ("newest", "exhaustive"):
            assert_same(m.search(queries, k=k, where=w, backend="numpy", mode=mode,
                                 ties=None if mode == "newest" else "newest"), ids, scores,
                        f"{step} mode={mode} ties=newest k={k} where={w}")
    # budgeted: exact over the K newest partitions (statistics stay global)
    K = int(rng.integers(1, 4))
    w = random_where(rng, timed=False)
    ids, scores = model.search(queries, k, where=w, allowed_ids=_partition_ids(model, K, days), ties="newest")
    assert_same(m.search(queries, k=k, where=w, mode="budgeted", max_partitions=K, backend=backend), ids, scores,
                f"{step} budgeted K={K} where={w}")


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("method", METHODS)
def test_interleavings_equal_fresh_build(method, backend, tmp_path):
    if backend == "numba":
        pytest.importorskip("numba")
    rng = np.random.default_rng([9, METHODS.index(method)])
    k1 = float(np.round(rng.uniform(0.5, 2.0), 2))
    b = float(rng.choice([0.0, 0.4, 0.75, 1.0]))
    days = 1 if METHODS.index(method) % 2 == 0 else None  # with and without time partitions
    m = Memory(method=method, k1=k1, b=b, partition_days=days, merge_factor=2, merge_min=3)
    model = Model(analyzer="default", method=method, k1=k1, b=b)
    nid = 0
    ops = ["add", "add", "add", "delete", "update", "merge", "save_open"]
    saved = False
    for step in range(N_STEPS):
        op = "add" if step < 2 else str(rng.choice(ops))
        live = list(model.live)
        if op == "add":
            recs = [random_record(rng, f"r{nid + i}") for i in range(int(rng.integers(1, 9)))]
            nid += len(recs)
            assert m.add(recs) == len(recs)
            model.add(recs)
        elif op == "delete" and live:
            ids = list(rng.choice(live, size=min(len(live), int(rng.integers(1, 4))), replace=False))
            assert m.delete(ids) == len(ids)
            model.delete(ids)
        elif op == "update" and live:
            ids = list(rng.choice(live, size=min(len(live), int(rng.integers(1, 4))), replace=False))
            recs = [random_record(rng, i) for i in ids]
            assert m.replace(recs) == len(recs)
            model.update(recs)
        elif op == "merge":
            m.merge()
            assert all(v.live is None for v in m.snapshot().views), "merges purge tombstones"
        elif op == "save_open":
            m.save(tmp_path / "mem")
            m.close()
            m = Memory.open(tmp_path / "mem")
            saved = True
        _check(m, model, rng, f"step {step} ({op})", days, backend)
    assert saved or N_STEPS < 10
    # every record reads back as given (times as ISO 8601 UTC strings of the same millisecond)
    got = m.get(list(model.live))
    for rec, back in zip(model.live.values(), got):
        want = {k: (iso_out(ms(v)) if k == "time" else v) for k, v in rec.items()}
        assert without_times(back) == want  # (and the memory's own times: test_memory_record_times)
    m.close(discard_unsaved=True)  # the writes since the last save_open step are not kept
