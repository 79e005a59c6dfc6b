"""8 searching threads and one writer (adds, deletes, updates, merges): no error, and every
result equals the serial search on the snapshot it saw; some snapshots also equal a fresh build."""

import threading

import numpy as np
import pytest
from _memory_oracle import Model, assert_same, random_query, random_record, random_where

from gpuir import Memory
from gpuir.memory import RecordError


def _model_of(snap, params) -> Model:
    """The live records of a snapshot, in add order, as an independent model."""
    model = Model(**params)
    model.add([snap.record(vi, row) for _, vi, row in snap.live_records()])
    return model


@pytest.mark.slow
@pytest.mark.parametrize("backend, other", [("numpy", "numba"), ("numba", "numpy")])
def test_eight_readers_one_writer(backend, other):
    if "numba" in (backend, other):
        pytest.importorskip("numba")
    params = {"analyzer": "default", "method": "bm25+", "k1": 1.1, "b": 0.6}
    m = Memory(method="bm25+", k1=1.1, b=0.6, partition_days=1, merge_factor=3, merge_min=6)
    rng0 = np.random.default_rng(0)
    m.add([random_record(rng0, f"r{i}") for i in range(150)])
    stop = threading.Event()
    seen: list[tuple] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def reader(i):
        rng = np.random.default_rng([1, i])
        try:
            while not stop.is_set():
                qs = [random_query(rng) for _ in range(int(rng.integers(1, 5)))]
                w = random_where(rng) if rng.random() < 0.5 else None
                mode = str(rng.choice(["exhaustive", "newest"]))
                k = int(rng.choice([1, 5, 20]))
                res = m.search(qs, k=k, where=w, mode=mode, backend=backend, ties="oldest")
                with lock:
                    seen.append((qs, w, mode, k, res))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def writer():
        rng = np.random.default_rng(2)
        n = 150
        try:
            for step in range(80):
                recs = [random_record(rng, f"r{n + j}") for j in range(int(rng.integers(1, 8)))]
                n += len(recs)
                m.add(recs)
                live = [x for x in (f"r{j}" for j in range(n)) if x in m]
                if step % 3 == 0:
                    m.delete(list(rng.choice(live, size=3, replace=False)))
                if step % 5 == 0:
                    ids = [x for x in rng.choice(live, size=2, replace=False) if x in m]
                    m.replace([random_record(rng, x) for x in ids])
                if step % 17 == 0:
                    m.merge()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    w = threading.Thread(target=writer)
    for t in readers:
        t.start()
    w.start()
    w.join(timeout=120)
    stop.set()
    for t in readers:
        t.join(timeout=60)
    assert not errors, errors[0]
    assert not w.is_alive() and not any(t.is_alive() for t in readers)
    versions = {res.snapshot.version for *_, res in seen}
    assert len(seen) > 50 and len(versions) > 10, "readers searched while the writer changed the memory"
    for qs, wh, mode, k, res in seen:  # each result equals a serial search on its own snapshot (other engine)
        again = m.search(qs, k=k, where=wh, mode=mode, snapshot=res.snapshot, backend=other, ties="oldest")
        np.testing.assert_array_equal(res.seqs, again.seqs)
        np.testing.assert_array_equal(res.scores, again.scores)
    # and the serial result on a snapshot is what a fresh index over its live records returns
    by_version = {res.snapshot.version: (qs, wh, k, res) for qs, wh, _, k, res in seen}
    for v in sorted(by_version)[:: max(1, len(by_version) // 6)]:
        qs, wh, k, res = by_version[v]
        ids, scores = _model_of(res.snapshot, params).search(qs, k, where=wh)
        assert_same(res, ids, scores, f"snapshot {v}")


def test_one_writer_thread_at_a_time():
    """Concurrent writer calls are serialised: no id is lost or duplicated."""
    m = Memory(partition_days=None, merge_factor=2, merge_min=4)
    errors = []

    def add(t):
        rng = np.random.default_rng(t)
        for j in range(30):
            try:
                m.add([random_record(rng, f"t{t}-{j}")])
            except RecordError as e:  # pragma: no cover - would be a lost update
                errors.append(e)

    threads = [threading.Thread(target=add, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(m) == 120
    assert sorted(r["id"] for r in m.get([f"t{t}-{j}" for t in range(4) for j in range(30)])) == sorted(
        f"t{t}-{j}" for t in range(4) for j in range(30))
