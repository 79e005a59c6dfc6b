"""A memory on a directory logs every write before the call returns (issue 36, item 1).

* replay: every kind of write (adds with vectors and given sequence numbers, merging and replacing
  updates, upserts, deletes with and without history) comes back bit for bit after a reopen, for
  the writer and for a reader that opens before any save;
* kill tests: a process streaming ``add``/``update``/``delete`` calls is SIGKILLed at random points,
  50 times; every returned write is there after reopening at each level that promises it;
* a power cut, simulated under the log's file operations (SQLite's crash layer is the model: what
  was written but not fsynced is lost): "fsync" keeps every acknowledged write, "flush" loses some
  (so the fsync is what keeps them);
* checkpoints off the writer's path, group commit, a failed fsync, damage and torn tails, writes
  after ``close``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gpuir import Memory
from gpuir import wal as walmod
from gpuir.memory import durable
from gpuir.memory.durable import MemoryClosedError
from gpuir.wal import WALCorruptError, segments

TESTS = Path(__file__).resolve().parent


def _recs(n, start=0, tenant="t"):
    return [{"id": f"r{i}", "text": f"record number {i} about topic{i % 3} and w{i % 7}", "tenant": tenant,
             "time": f"2023-11-{i % 28 + 1:02d}T{i % 24:02d}:00:00Z", "metadata": {"i": i}, "importance": (i % 4) / 4}
            for i in range(start, start + n)]


def _state(m: Memory):
    """Everything a user can see: records, histories, and a search's ids and float32 scores."""
    ids = sorted(m._writer._ids)
    res = m.search(["record topic1", "w3 number", "topic2 w5 w5"], k=20)
    return (ids, m.get(ids), {i: m.history(i) for i in ids}, [res.ids(i) for i in range(3)], res.scores.tobytes(),
            m.next_seq)


def _logs(d):
    return [p for _, p in segments(d, "memory")]


# ---------------------------------------------------------------------- replay
def test_every_kind_of_write_is_replayed_bit_for_bit(tmp_path):
    d = tmp_path / "mem"
    m = Memory(partition_days=2, merge_factor=3, merge_min=4, background_merges=False)
    m.add(_recs(10))
    m.save(d)
    m.add(_recs(5, 10))
    m.add(_recs(3, 40), seqs=[100, 101, 105])  # given sequence numbers (a shard's)
    m.update([{"id": "r1", "text": "changed text about topic1", "metadata": {"j": 2}}])
    m.replace([{"id": "r2", "text": "whole new record w3", "tenant": "t"}])
    m.upsert([{"id": "r3", "importance": 0.9}, {"id": "new1", "text": "upserted w5 number", "tenant": "t"}])
    m.update([{"id": "r4", "text": m.get(["r4"])[0]["text"]}])  # changes nothing
    m.delete(["r5"], keep_history=True)
    m.delete(["r6", "r7"])
    want = _state(m)
    assert m.unsaved > 0
    r = Memory.open(d, writer=False)
    assert _state(r) == want, "a reader opened before any save sees every acknowledged write"
    m._writer._log.close()  # simulate the process ending without close(): the lock file stays, the log is as written
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    m2 = Memory.open(d)
    assert _state(m2) == want
    assert m2.history("r5")[-1]["text"].startswith("record number 5")
    m2.add(_recs(2, 60))
    m2.close()
    m3 = Memory.open(d)
    assert len(m3) == len(want[0]) + 2
    m3.close()


def _frame_kinds(path):
    """The first bytes of each frame's payload in a log segment (b"{" JSON, b"\\x00" binary)."""
    data, pos, out = path.read_bytes(), 0, []
    while pos < len(data):
        n = int.from_bytes(data[pos + 12:pos + 16], "little")
        out.append(data[pos + 24:pos + 25])
        pos += 24 + n
    return out


def test_old_json_frames_still_replay_beside_binary_ones(tmp_path, monkeypatch):
    """Adds and puts are binary frames now; a log holding the JSON frames of the version before (``"cols"``)
    replays to the same records, numbers, histories and float32 scores."""
    d = tmp_path / "mem"
    rng = np.random.default_rng(1)
    m = Memory(partition_days=2, background_merges=False)
    m.add(_recs(6), vectors={"e": rng.standard_normal((6, 4)).astype(np.float32)})
    m.save(d)
    real = durable.encode_op
    monkeypatch.setattr(durable, "encode_op", lambda op: walmod.encode_payload(durable._json_form(op))
                        if "batch" in op else real(op))  # what the version before wrote
    m.add(_recs(4, 10), vectors={"e": rng.standard_normal((4, 4)).astype(np.float32)})
    m.update([{"id": "r1", "metadata": {"j": 2}, "time": "2023-12-01T00:00:00Z"}])
    monkeypatch.undo()
    m.add(_recs(3, 20), seqs=[40, 41, 45], vectors={"e": rng.standard_normal((3, 4)).astype(np.float32)})
    m.upsert([{"id": "r2", "importance": 0.125, "role": "user"}])
    m.delete(["r3"], keep_history=True)
    want, vecs = _state(m), m.vectors(sorted(m._writer._ids), embedding="e")
    assert _frame_kinds(_logs(d)[-1]) == [b"{", b"{", b"{", b"\x00", b"\x00", b"{"]  # header, 2 JSON, 2 binary, delete
    m._writer._log.close()  # a crash
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    m2 = Memory.open(d)
    assert _state(m2) == want
    assert np.array_equal(m2.vectors(sorted(m2._writer._ids), embedding="e"), vecs)
    m2.close()


@pytest.mark.parametrize("vals", [[], [""], ["", ""], ["a\x00b", "c"], [None, "x", None], ["é☃𝄞", "", "z"],
                                  [None], ["\x00"], ["a", "b\x00", None, ""]])
def test_a_text_column_round_trips_whatever_its_values(vals):
    kind, sections = durable._text_column(vals)
    assert durable._text_values(kind, sections, len(vals)) == vals
    assert kind == ("s" if None not in vals and not any("\x00" in v for v in vals) else "l")
    if vals:  # (no values and one empty value are the same text: the frame's count tells them apart)
        with pytest.raises(ValueError):
            durable._text_values(kind, sections, len(vals) + 1)


@pytest.mark.parametrize("cut", [30, 60, -40, -1, "zeros"])
def test_a_binary_frame_cut_short_is_a_torn_tail(tmp_path, cut):
    d, p = _two_writes(tmp_path)
    data = p.read_bytes()
    assert _frame_kinds(p)[-1] == b"\x00"
    size = len(data)
    from gpuir.memory.intake import to_batch

    body = durable.encode_op({"op": "add", "batch": to_batch(_recs(3, 10), None), "seqs": np.arange(4, 7)})
    assert body[:4] == walmod.BINARY
    tail = walmod.frame_bytes(4, body)  # the next frame (sequence number 4), only partly on disk
    with open(p, "ab") as f:
        if cut == "zeros":  # the file grew before the frame's data reached the disk
            f.write(tail[:24] + bytes(len(tail) - 24))
        else:
            f.write(tail[:cut] if cut > 0 else tail[:len(tail) + cut])
    m = Memory.open(d)
    assert sorted(m._writer._ids) == ["r0", "r1", "r2", "r3"]
    assert p.stat().st_size == size
    m.close()


def test_a_flipped_byte_in_a_binary_column_is_damage(tmp_path):
    d, p = _two_writes(tmp_path)
    data = bytearray(p.read_bytes())
    i = data.rindex(b"record number 3")  # inside the last frame's text column
    data[i] ^= 0x20
    p.write_bytes(bytes(data))
    with pytest.raises(WALCorruptError, match=p.name):
        Memory.open(d)
    assert p.read_bytes() == bytes(data)


def test_vectors_are_logged_not_reencoded(tmp_path):
    d = tmp_path / "mem"
    m = Memory()
    rng = np.random.default_rng(0)
    v = rng.standard_normal((4, 8)).astype(np.float32)
    m.add(_recs(4), vectors={"e": v})
    m.save(d)
    w = rng.standard_normal((2, 8)).astype(np.float32)
    m.add(_recs(2, 4), vectors={"e": w})
    m._writer._log.close()  # a crash: the vectors are in the log only
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    m2 = Memory.open(d)  # no encoder: replay needs none
    got = m2.vectors(["r4", "r5", "r0"], embedding="e")
    assert np.array_equal(got[:2], m.vectors(["r4", "r5"], embedding="e"))
    assert got.shape == (3, 8)
    m2.close()


def test_after_close_every_write_raises_and_the_directory_opens_at_once(tmp_path):
    d = tmp_path / "mem"
    m = Memory()
    m.add(_recs(3))
    m.save(d)
    m.close()
    for call in (lambda: m.add(_recs(1, 9)), lambda: m.update([{"id": "r0", "text": "x"}]),
                 lambda: m.delete(["r0"]), lambda: m.save(), lambda: m.upsert(_recs(1, 9))):
        with pytest.raises(MemoryClosedError, match="was closed"):
            call()
    assert m.search("record", k=2).ids(0)  # reads of the last snapshot still work
    t0 = time.monotonic()
    Memory.open(d, lock_timeout=30).close()
    assert time.monotonic() - t0 < 5, "close released the writer lock"


# ---------------------------------------------------------------------- checkpoints
def test_a_checkpoint_never_holds_the_writer(tmp_path, monkeypatch):
    from gpuir.memory import persist

    d = tmp_path / "mem"
    m = Memory()
    m.add(_recs(50))
    m.save(d)
    m.add(_recs(50, 50))
    entered, release = threading.Event(), threading.Event()
    real = persist.write_segment

    def slow_write(*a, **k):
        entered.set()
        assert release.wait(30)
        return real(*a, **k)

    monkeypatch.setattr(persist, "write_segment", slow_write)
    saver = threading.Thread(target=m.save)
    saver.start()
    assert entered.wait(30)
    t0 = time.monotonic()
    m.add(_recs(5, 200))  # while the save is stuck writing its files
    m.delete(["r0"])
    assert time.monotonic() - t0 < 2, "a write waited for the checkpoint"
    release.set()
    saver.join()
    want = _state(m)
    m.close()
    m2 = Memory.open(d)
    assert _state(m2) == want
    assert len(_logs(d)) == 1, "the segments folded into the save were deleted"
    m2.close()


@pytest.mark.parametrize("crash_in", ["write_segment", "commit"])
def test_a_checkpoint_that_fails_after_the_log_rotated_loses_nothing(tmp_path, monkeypatch, crash_in):
    from gpuir.memory import persist

    d = tmp_path / "mem"
    m = Memory()
    m.add(_recs(10))
    m.save(d)
    m.add(_recs(10, 10))

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist, crash_in, boom)
    with pytest.raises(OSError, match="No space"):
        m.save()
    monkeypatch.undo()
    m.add(_recs(3, 30))  # into the rotated segment, whose save never committed
    with pytest.raises(OSError, match="No space"):
        monkeypatch.setattr(persist, crash_in, boom)
        m.save()  # a second failed attempt: another number
    monkeypatch.undo()
    m.delete(["r1"])
    want = _state(m)
    m._writer._log.close()  # a crash: no close, no save
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    m2 = Memory.open(d)
    assert _state(m2) == want
    m2.save()  # and a later save succeeds, folding everything
    m2.close()
    m3 = Memory.open(d)
    assert _state(m3) == want
    assert len(_logs(d)) == 1
    m3.close()


def test_the_memory_checkpoints_itself_when_the_log_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(durable, "CHECKPOINT_EVERY", 20)
    d = tmp_path / "mem"
    m = Memory()
    m.save(d)
    for i in range(60):
        m.add(_recs(1, i))
    deadline = time.monotonic() + 30
    while m.info()["generation"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m.info()["generation"] >= 2, "no background checkpoint happened"
    want = _state(m)
    m.close()
    m2 = Memory.open(d)
    assert _state(m2) == want
    m2.close()


# ---------------------------------------------------------------------- group commit and fsync failures
class CountingIO(walmod.FileOps):
    def __init__(self, delay=0.0):
        self.fsyncs = 0
        self.delay = delay

    def fsync(self, fd):
        self.fsyncs += 1
        time.sleep(self.delay)
        super().fsync(fd)


def test_concurrent_writers_share_fsyncs(tmp_path, monkeypatch):
    d = tmp_path / "mem"
    m = Memory()
    m.save(d)
    io = CountingIO(delay=0.02)
    monkeypatch.setattr(walmod, "io", io)

    def writer(t):
        for i in range(10):
            m.add([{"id": f"w{t}-{i}", "text": f"thread {t} write {i}"}])

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(m) == 80
    assert io.fsyncs < 80, f"{io.fsyncs} fsyncs for 80 writes: no group commit"
    m.close()
    assert len(Memory.open(d, writer=False)) == 80


def test_flush_never_fsyncs_a_write_and_fsync_always_does(tmp_path, monkeypatch):
    for level, want in (("flush", 0), ("fsync", 5)):
        d = tmp_path / level
        m = Memory(durability=level)
        m.save(d)
        io = CountingIO()
        monkeypatch.setattr(walmod, "io", io)
        for i in range(5):
            m.add(_recs(1, i))
        assert io.fsyncs == want, level
        monkeypatch.undo()
        m.close()


def test_a_failed_fsync_refuses_further_writes(tmp_path, monkeypatch):
    d = tmp_path / "mem"
    m = Memory()
    m.save(d)

    class FailingIO(walmod.FileOps):
        def fsync(self, fd):
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(walmod, "io", FailingIO())
    with pytest.raises(OSError, match="could not be synced"):
        m.add(_recs(1))
    monkeypatch.undo()
    with pytest.raises(OSError, match="refuses further writes"):
        m.add(_recs(1, 5))


# ---------------------------------------------------------------------- damage
def _two_writes(tmp_path):
    d = tmp_path / "mem"
    m = Memory()
    m.save(d)
    m.add(_recs(2))
    m.add(_recs(2, 2))
    m._writer._log.close()
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    return d, _logs(d)[-1]


def test_a_flipped_byte_in_the_last_complete_frame_is_damage_not_a_torn_tail(tmp_path):
    d, p = _two_writes(tmp_path)
    data = bytearray(p.read_bytes())
    data[-5] ^= 0x01  # inside the last frame's payload
    p.write_bytes(bytes(data))
    with pytest.raises(WALCorruptError, match=p.name):
        Memory.open(d)
    assert p.read_bytes() == bytes(data), "a refusal changes nothing"
    m = Memory.open(d, salvage=True)  # keeps the intact frames
    assert sorted(m._writer._ids) == ["r0", "r1"]
    m.close()


def test_a_torn_tail_is_dropped_with_a_warning(tmp_path, caplog):
    d, p = _two_writes(tmp_path)
    size = p.stat().st_size
    with open(p, "ab") as f:
        f.write(walmod.frame_bytes(99, b'{"op":"add"}')[:30])  # an append cut short
    m = Memory.open(d)
    assert sorted(m._writer._ids) == ["r0", "r1", "r2", "r3"]
    assert "torn tail" in caplog.text
    assert p.stat().st_size == size
    m.close()


# ---------------------------------------------------------------------- power cut
class PowerCutIO(walmod.FileOps):
    """What a disk holds after a power cut: each file as of its last fsync, then (SQLite's crash layer)
    possibly part of what was written after it -- a prefix of the unsynced bytes (a write cut short) or
    zeros (the size grew before the data reached the disk). Garbage is out of the model: the log refuses
    a tail it cannot read as an interrupted append (damage) rather than guess."""

    def __init__(self):
        self.synced: dict[str, int] = {}

    @staticmethod
    def _path(fd):
        return os.readlink(f"/proc/self/fd/{fd}")

    def fsync(self, fd):
        super().fsync(fd)
        self.synced[self._path(fd)] = os.fstat(fd).st_size

    def cut(self, rng):
        for path, synced in self.synced.items():
            if not os.path.exists(path):
                continue
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                how = rng.integers(0, 3)
                if how == 0 or size == synced:
                    f.truncate(synced)  # every unsynced byte lost
                elif how == 1:
                    f.truncate(int(rng.integers(synced, size)))  # a prefix of them reached the disk
                else:
                    f.truncate(synced)
                    f.truncate(synced + int(rng.integers(1, 64)))  # the size did, the data did not: zeros


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
@pytest.mark.parametrize("level", ["fsync", "flush"])
def test_a_power_cut_keeps_every_write_that_fsync_acknowledged(tmp_path, monkeypatch, level):
    rng = np.random.default_rng(7)
    lost_somewhere = 0
    for trial in range(6):
        d = tmp_path / f"mem{trial}"
        m = Memory(durability=level)
        m.add(_recs(3))
        m.save(d)
        io = PowerCutIO()
        monkeypatch.setattr(walmod, "io", io)
        acked = set(m._writer._ids)
        for i in range(int(rng.integers(3, 12))):
            m.add(_recs(1, 100 + i))
            acked.add(f"r{100 + i}")
        monkeypatch.undo()
        if level == "flush":  # nothing was fsynced since the log's header: record where it stood
            io.synced.update({str(p): len(walmod.frame_bytes(1, walmod.encode_payload(
                {"format": walmod.FORMATS["memory"], "version": 2, "base_generation": 1}))) for p in _logs(d)})
        io.cut(rng)  # the power goes: the process is gone, the disk holds what was synced
        m._writer._log.wal._fd = None  # (the process is gone: nothing more is written or closed)
        m._writer._log = None
        m._writer._release_lock(discard_unsaved=True)
        r = Memory.open(d)
        missing = acked - set(r._writer._ids)
        r.close()
        if level == "fsync":
            assert not missing, f"trial {trial}: acknowledged writes lost: {sorted(missing)}"
        lost_somewhere += len(missing)
    if level == "flush":
        assert lost_somewhere > 0, "a power cut must cost 'flush' writes: otherwise the simulation tests nothing"


# ---------------------------------------------------------------------- kill -9
KILL_STREAM = r"""
import json, sys
import numpy as np
from gpuir import Memory
path, level, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
def say(*words):  # one write per line: a kill never leaves half a "begin" line (unbuffered runs write per piece)
    sys.stdout.write(" ".join(words) + "\n")
    sys.stdout.flush()
m = Memory.open(path, durability=level)
live = [r["id"] for r in m.list(limit=1_000_000)]
say("ready")
n = 0
while True:
    n += 1
    kind = "add" if len(live) < 5 else ["add", "update", "delete"][int(rng.integers(0, 3))]
    if kind == "add":
        rid = f"s{seed}-{n}"
        op = {"kind": "add", "id": rid, "text": f"added {n} w{n % 5}"}
        say("begin", json.dumps(op))
        m.add([{"id": rid, "text": op["text"]}])
        live.append(rid)
    elif kind == "update":
        rid = live[int(rng.integers(0, len(live)))]
        op = {"kind": "update", "id": rid, "text": f"updated {n} w{n % 5}"}
        say("begin", json.dumps(op))
        m.update([{"id": rid, "text": op["text"]}])
    else:
        rid = live.pop(int(rng.integers(0, len(live))))
        op = {"kind": "delete", "id": rid}
        say("begin", json.dumps(op))
        m.delete([rid])
    say("ack")
"""


def _apply(model, op):
    if op["kind"] == "delete":
        model.pop(op["id"], None)
    else:
        model[op["id"]] = op["text"]


@pytest.mark.parametrize(("level", "kills"), [("fsync", 20), ("flush", 20), ("none", 10)])
def test_kill9_at_random_points_loses_no_acknowledged_write(tmp_path, level, kills):
    """50 SIGKILLs in all. "fsync" and "flush" keep every write that returned; "none" keeps exactly the
    state it opened (it promises nothing before a save)."""
    script = tmp_path / "stream.py"
    script.write_text(KILL_STREAM)
    d = tmp_path / "mem"
    m = Memory()
    m.add([{"id": "seed", "text": "the first record"}])
    m.save(d)
    m.close()
    model = {"seed": "the first record"}
    rng = np.random.default_rng({"fsync": 1, "flush": 2, "none": 3}[level])
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    acked_total = 0
    for trial in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", KILL_STREAM, str(d), level, str(trial)],
                                stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.02, 0.4)))
        proc.send_signal(signal.SIGKILL)
        out = proc.communicate()[0].splitlines()
        pending, acked = None, []
        for j, line in enumerate(out):
            if line.startswith("begin "):
                try:
                    pending = json.loads(line[6:])
                except json.JSONDecodeError:  # (only a last line cut by the kill: its write never began)
                    assert j == len(out) - 1, f"a damaged line before the last: {line!r}"
                    pending = None
            elif line == "ack" and pending is not None:
                acked.append(pending)
                pending = None
        acked_total += len(acked)
        before = dict(model)
        for op in acked:
            _apply(model, op)
        with_pending = dict(model)
        if pending is not None:
            _apply(with_pending, pending)
        r = Memory.open(d, writer=False)
        got = {x["id"]: x["text"] for x in r.list(limit=1_000_000)}
        if level == "none":
            assert got == before, f"trial {trial}: 'none' changed the directory without a save"
            model = before
        else:
            assert got in (model, with_pending), (
                f"trial {trial} ({level}): {len(acked)} acknowledged writes; missing "
                f"{sorted(set(model) - set(got))[:5]}, differing "
                f"{sorted(k for k in model if k in got and got[k] != model[k])[:5]}")
            model = got
    if level != "none":
        assert acked_total > 50, f"only {acked_total} writes were acknowledged across the kills"


def test_scoped_writes_times_and_history_events_replay_exactly(tmp_path):
    """Issue 36's scopes, generated ids, record times and history events through the log: what the
    writer decided before applying (ids, times, the event time of an update or a delete) comes back
    as it was, not re-decided at replay."""
    d = tmp_path / "mem"
    m = Memory(require_scope=True, record_times=True)
    m.save(d)
    a, b = m.scope(tenant="alice"), m.scope(tenant="bob")
    a.add([{"text": "alice moved to Berlin"}, {"id": "x", "text": "alice likes tea"}])
    b.add([{"id": "x", "text": "bob likes coffee"}])  # ids are per tenant
    time.sleep(0.01)
    a.update([{"id": "x", "text": "alice likes green tea"}])
    b.delete(["x"])
    want_a = (a.get(["x"]), a.history("x"), [r for r in a.list(limit=10).records])
    want_b = b.history("x")
    m._writer._log.close()
    m._writer._log = None
    m._writer._release_lock(discard_unsaved=True)
    time.sleep(0.01)
    m2 = Memory.open(d)
    a2, b2 = m2.scope(tenant="alice"), m2.scope(tenant="bob")
    assert (a2.get(["x"]), a2.history("x"), [r for r in a2.list(limit=10).records]) == want_a
    assert b2.history("x") == want_b and want_b[-1]["event"] == "delete"
    m2.close()
