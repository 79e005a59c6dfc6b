"""Merges off the writer's path: adds never wait for a merge, deletes and updates that race a merge are
kept, searches keep their snapshot, a crash during a merge loses nothing, close() stops the merger, and
small merges run beside a large one. Races are made deterministic with the merger's hook (events the
test controls), never with sleeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from _memory_oracle import Model, assert_same, random_query, random_record

from gpuir import Memory
from gpuir.memory.durable import MemoryClosedError

TESTS = Path(__file__).resolve().parent
TIMEOUT = 60


class Gate:
    """A hook that stops merge workers at one event until the test opens the gate."""

    def __init__(self, event: str, when=lambda task: True):
        self.event, self.when = event, when
        self.arrived = threading.Event()
        self.open = threading.Event()
        self.tasks = []

    def __call__(self, event, task):
        if event == self.event and self.when(task):
            self.tasks.append(task)
            self.arrived.set()
            assert self.open.wait(TIMEOUT), "the test never opened the gate"


def _check(m: Memory, model: Model, rng, what: str, n_queries=25):
    qs = [random_query(rng) for _ in range(n_queries)]
    ids, scores = model.search(qs, 10)
    assert_same(m.search(qs, k=10), ids, scores, what)


def _grow(m: Memory, model: Model, rng, start: int, batches: int, size: int) -> int:
    for _ in range(batches):
        recs = [random_record(rng, f"r{start + i}") for i in range(size)]
        start += size
        m.add(recs)
        model.add(recs)
    return start


def test_adds_and_searches_never_wait_for_a_merge():
    m = Memory(partition_days=None, merge_factor=2, merge_min=4)
    model = Model()
    rng = np.random.default_rng(1)
    gate = Gate("start")
    m._writer._merger.hook = gate
    nid = _grow(m, model, rng, 0, 2, 3)  # two tier-0 segments: a merge is chosen
    assert gate.arrived.wait(TIMEOUT), "the merge started in the background"
    blocked = gate.tasks[0]
    # the merge is held: every add returns, and searches answer, meanwhile
    for _ in range(6):
        nid = _grow(m, model, rng, nid, 1, 3)
        _check(m, model, rng, "while a merge is held")
    assert m.merge_status()["pending"] >= 1 and not m.merge_log, "nothing merged while the gate is shut"
    assert all(uid in m._writer._merging for uid in blocked.uids)
    gate.open.set()
    assert m.wait_merges(TIMEOUT)
    assert m.merge_log, "the held merge and the ones it made possible ran"
    assert len(m.snapshot().views) <= 3, "merged down to one segment per tier"
    _check(m, model, rng, "after the merges")
    m.close()


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_deletes_and_updates_racing_a_merge_are_not_lost(method):
    m = Memory(method=method, partition_days=None, merge_factor=4, merge_min=100)
    model = Model(method=method)
    rng = np.random.default_rng(2)
    gate = Gate("merged")  # the merged segment is computed, not yet committed
    m._writer._merger.hook = gate
    nid = _grow(m, model, rng, 0, 4, 10)
    assert gate.arrived.wait(TIMEOUT)
    task = gate.tasks[0]
    inputs = {r for v in task.views for r in v.seg.ids.tolist()}
    dead = sorted(inputs)[::6]
    changed = sorted(inputs - set(dead))[::8]  # (together under a third: no purge merge follows)
    m.delete(dead)
    model.delete(dead)
    recs = [random_record(rng, rid) for rid in changed]
    m.update(recs)
    model.update(recs)
    nid = _grow(m, model, rng, nid, 1, 5)
    _check(m, model, rng, "before the commit")
    gate.open.set()
    assert m.wait_merges(TIMEOUT)
    merged = [v for v in m.snapshot().views if v.seg.uid == task.uid]
    assert merged, "the merge was committed"
    assert merged[0].live is not None and merged[0].n_live == 40 - len(dead) - len(changed), \
        "rows deleted or replaced during the merge are tombstones in the merged segment"
    assert m.get(dead, missing_ok=True) == [None] * len(dead)
    assert [r["text"] for r in m.get(changed)] == [r["text"] for r in recs], "the updates won"
    assert len(m) == len(model.live)
    _check(m, model, rng, "after the commit")
    m.merge()  # an explicit merge purges them
    assert all(v.live is None for v in m.snapshot().views)
    _check(m, model, rng, "after purging")
    m.close()


def test_a_record_wholly_deleted_segment_during_a_merge():
    """Every row of a merge input deleted (the segment leaves the writer's state) before the commit."""
    m = Memory(partition_days=None, merge_factor=2, merge_min=50)
    model = Model()
    rng = np.random.default_rng(3)
    gate = Gate("merged")
    m._writer._merger.hook = gate
    _grow(m, model, rng, 0, 2, 6)
    assert gate.arrived.wait(TIMEOUT)
    first = gate.tasks[0].views[0].seg.ids.tolist()
    m.delete(first)
    model.delete(first)
    gate.open.set()
    assert m.wait_merges(TIMEOUT)
    assert len(m) == 6 and m.get(first, missing_ok=True) == [None] * 6
    _check(m, model, rng, "after the commit")
    m.close()


def test_a_search_keeps_its_snapshot_across_a_merge_commit():
    m = Memory(partition_days=None, merge_factor=2, merge_min=50)
    model = Model()
    rng = np.random.default_rng(4)
    gate = Gate("merged")
    m._writer._merger.hook = gate
    _grow(m, model, rng, 0, 2, 8)
    assert gate.arrived.wait(TIMEOUT)
    qs = [random_query(rng) for _ in range(20)]
    before = m.search(qs, k=5)
    snap = before.snapshot
    gate.open.set()
    assert m.wait_merges(TIMEOUT)
    after = m.search(qs, k=5)
    assert after.snapshot is not snap and len(after.snapshot.views) < len(snap.views)
    again = m.search(qs, k=5, snapshot=snap)  # the old snapshot still answers, unchanged
    np.testing.assert_array_equal(again.seqs, before.seqs)
    np.testing.assert_array_equal(again.scores, before.scores)
    np.testing.assert_array_equal(after.scores, before.scores)  # a merge never changes a result
    assert [again.ids(i) for i in range(len(qs))] == [before.ids(i) for i in range(len(qs))]
    m.close()


def test_close_stops_the_merger_cleanly():
    m = Memory(partition_days=None, merge_factor=2, merge_min=4)
    model = Model()
    rng = np.random.default_rng(5)
    gate = Gate("start")
    m._writer._merger.hook = gate
    nid = _grow(m, model, rng, 0, 2, 3)
    assert gate.arrived.wait(TIMEOUT)
    nid = _grow(m, model, rng, nid, 2, 3)  # a second merge queued behind the held one
    views_before = [v.seg.uid for v in m.snapshot().views]
    closer = threading.Thread(target=m.close)
    closer.start()
    assert m._writer._merger.stop_requested.wait(TIMEOUT), "close() cancelled the merges"
    gate.open.set()  # the held merge goes on, sees it was cancelled, abandons its result
    closer.join(TIMEOUT)
    assert not closer.is_alive(), "close() returned"
    st = m.merge_status()
    assert st["threads"] == 0 and st["pending"] == 0, "no merge thread is left"
    assert not m.merge_log and [v.seg.uid for v in m.snapshot().views] == views_before, "nothing was published"
    assert not m._writer._merging
    assert not any(t.name == "gpuir-merge" and t.is_alive() for t in threading.enumerate())
    _check(m, model, rng, "after close")
    m._writer._merger.hook = None
    with pytest.raises(MemoryClosedError):  # after close every write is refused (issue 36); reads go on
        _grow(m, model, rng, nid, 1, 3)
    _check(m, model, rng, "after a refused write")
    m.close()


def test_small_merges_run_beside_a_large_one():
    """A large merge (seconds on big memories) never holds back the small ones: segments stay bounded."""
    m = Memory(partition_days=None, merge_factor=2, merge_min=2)  # small: up to 2 * 2**2 = 8 records
    model = Model()
    rng = np.random.default_rng(6)
    gate = Gate("start", when=lambda task: task.n_records > 8)
    changed = threading.Condition()
    small_after_gate = []

    def hook(event, task):
        gate(event, task)
        if event == "released":
            with changed:
                if gate.arrived.is_set() and task.n_records <= 8:
                    small_after_gate.append(task)
                changed.notify_all()

    def only_large_left():
        mg = m._writer._merger
        with mg._cv:
            tasks = [t for t in mg._workers.values() if t is not None] + [e[2] for e in mg._heap]
        return all(t.n_records > 8 for t in tasks)

    m._writer._merger.hook = hook
    nid = _grow(m, model, rng, 0, 8, 2)  # 16 records: merges up to a large one (16 > 8)
    assert gate.arrived.wait(TIMEOUT), "a large merge started"
    for _ in range(12):
        nid = _grow(m, model, rng, nid, 1, 2)
    with changed:
        assert changed.wait_for(only_large_left, TIMEOUT), "the small merges finished beside the held one"
    assert small_after_gate, "small merges ran while the large one was held"
    assert m.merge_status()["threads"] <= 2
    # what is left unmerged: the held merge's inputs, large tasks waiting their turn, and at most one
    # segment per small tier
    n_large_inputs = 2 * (m._writer._merger.pending())
    assert len(m.snapshot().views) <= n_large_inputs + 3
    _check(m, model, rng, "while the large merge is held")
    gate.open.set()
    assert m.wait_merges(TIMEOUT)
    assert len(m.snapshot().views) <= 6
    _check(m, model, rng, "after")
    m.close()


def test_a_failing_merge_is_logged_and_its_segments_stay(caplog):
    m = Memory(partition_days=None, merge_factor=2, merge_min=4)
    model = Model()
    rng = np.random.default_rng(7)

    def boom(event, task):
        if event == "start":
            raise MemoryError("simulated")

    m._writer._merger.hook = boom
    with caplog.at_level("ERROR", logger="gpuir.memory"):
        _grow(m, model, rng, 0, 2, 3)
        assert m.wait_merges(TIMEOUT)
    st = m.merge_status()
    assert st["failed"] == 1 and "MemoryError: simulated" in st["errors"][0]
    assert "background merge failed" in caplog.text
    assert len(m.snapshot().views) == 2 and not m._writer._merging, "the inputs stay; not retried automatically"
    _grow(m, model, rng, 6, 1, 3)
    assert m.wait_merges(TIMEOUT) and m.merge_status()["failed"] == 1
    _check(m, model, rng, "after a failed merge")
    m._writer._merger.hook = None
    assert m.merge() == 1  # an explicit merge still works
    _check(m, model, rng, "after an explicit merge")
    m.close()


def test_a_save_while_a_merge_runs_commits_the_state_without_it(tmp_path):
    m = Memory(partition_days=None, merge_factor=2, merge_min=50)
    model = Model()
    rng = np.random.default_rng(8)
    gate = Gate("merged")
    m._writer._merger.hook = gate
    nid = _grow(m, model, rng, 0, 2, 7)
    assert gate.arrived.wait(TIMEOUT)
    m.save(tmp_path / "mem")  # the merge's output is not part of this commit
    r = Memory.open(tmp_path / "mem", writer=False)
    assert len(r.snapshot().views) == 2
    _check(r, model, rng, "the commit made during the merge")
    gate.open.set()
    assert m.wait_merges(TIMEOUT)
    _grow(m, model, rng, nid, 1, 3)
    m.wait_merges(TIMEOUT)
    m.save()
    r = Memory.open(tmp_path / "mem", writer=False)
    _check(r, model, rng, "the next commit, with the merge")
    m.close()


CRASH = r"""
import json, os, sys
sys.path.insert(0, {tests!r})
import numpy as np
from _memory_oracle import random_record
from gpuir import Memory
m = Memory(partition_days=None, merge_factor=2, merge_min=50)
rng = np.random.default_rng(11)
recs = [random_record(rng, f"r{{i}}") for i in range(24)]
m.add(recs[:8])
m.wait_merges()
m.save({d!r})
def die(event, task):
    if event == {event!r}:
        os._exit(17)  # killed in the middle of the merge: no cleanup, nothing flushed
m._writer._merger.hook = die
m.add(recs[8:16])  # starts a merge in the background; the add itself returns
m.save()
print(json.dumps(recs[:16]), flush=True)
m.add(recs[16:])
m.wait_merges()
m.save()
os._exit(0)
"""


@pytest.mark.parametrize("event", ["start", "merged"])
def test_a_crash_during_a_merge_loses_nothing(tmp_path, event):
    d = tmp_path / "mem"
    proc = subprocess.run([sys.executable, "-c", CRASH.format(tests=str(TESTS), d=str(d), event=event)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 17, proc.stderr[-2000:]
    acked = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    r = Memory.open(d)
    n = len(r)
    # the process died during the merge that the second add started: the directory holds the last
    # commit, complete (the second save may or may not have run before the kill)
    assert n in (8, 16)
    if acked is not None:
        assert n == 16, "the commit acknowledged before the crash is there"
    model = Model()
    model.add(json.loads(json.dumps(acked))[:n] if acked else [])
    if acked is None:
        rng = np.random.default_rng(11)
        model.add([random_record(rng, f"r{i}") for i in range(24)][:n])
    _check(r, model, np.random.default_rng(1), "reopened after the crash")
    r.close()


def test_a_dropped_memory_is_freed_at_once_and_releases_its_lock(tmp_path):
    """No reference cycle (the merger and the id map hold their memory weakly): dropping the last
    reference frees the memory by reference counting, so its directory's writer lock is released then."""
    import gc
    import weakref

    m = Memory(partition_days=None, merge_factor=2, merge_min=4)
    m.add([random_record(np.random.default_rng(9), f"r{i}") for i in range(3)])
    m.add([random_record(np.random.default_rng(10), f"s{i}") for i in range(3)])
    assert m.wait_merges(TIMEOUT)
    m.save(tmp_path / "mem")
    ref = weakref.ref(m)
    was = gc.isenabled()
    gc.disable()
    try:
        del m
        assert ref() is None, "freed without the cyclic garbage collector"
        Memory.open(tmp_path / "mem", lock_timeout=0.5).close()  # the lock is free
    finally:
        if was:
            gc.enable()


def test_a_script_that_never_closes_its_memory_exits(tmp_path):
    """Background merges never keep the interpreter alive: a script that adds, deletes, updates and merges
    without close() ends (it hung at exit: the garbage-collected memory's finaliser waited for the merger's
    lock, held by a daemon merge thread frozen by the interpreter's shutdown)."""
    script = tmp_path / "no_close.py"
    script.write_text(textwrap.dedent("""
        import random
        from gpuir import Memory
        rng = random.Random(0)
        m = Memory(partition_days=None, merge_factor=3, merge_min=4)
        ids, n = [], 0
        for step in range(60):
            op = rng.random()
            if op < 0.5 or not ids:
                recs = [{"id": f"r{n + j}", "text": f"word{rng.randint(0, 9)} text {n + j}",
                         "session": f"s{rng.randint(0, 4)}"} for j in range(rng.randint(1, 5))]
                n += len(recs)
                ids += [r["id"] for r in recs]
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
                m.snapshot().live_records()
        print("done", len(m))
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                             env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the script printed its result but the interpreter did not exit")
    assert out.returncode == 0 and out.stdout.startswith("done"), out.stderr[-2000:]
