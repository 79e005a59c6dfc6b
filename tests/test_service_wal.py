"""The write-ahead log (:mod:`gpuir.wal`: framing, torn tails) and the service's durability through its
memory's log (checkpoints at every crash point, group commit, kill -9).

Damage that must not pass for a torn tail, salvage, ENOSPC, SIGTERM and the
door's validation are in ``tests/test_service_faults.py``.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib

import pytest

from gpuir.memory import Memory
from gpuir.service.store import ServiceStore
from gpuir.service.wal import WALCorruptError, WriteAheadLog, frame, segment_name, segments


def _ops(n, start=0):
    return [{"op": "add", "records": [{"id": f"t/r{i}", "text": f"word{i} common", "tenant": "t"}]}
            for i in range(start, start + n)]


def _log(tmp_path, n=5):
    w = WriteAheadLog(tmp_path)
    assert w.recover(1).ops == []
    w.append(_ops(n))
    w.close()
    (_, path), = segments(tmp_path)
    return path


def test_frame_layout_magic_seq_length_and_two_checksums():
    f = frame({"op": "delete", "ids": ["a"]}, seq=7)
    body = b'{"op":"delete","ids":["a"]}'
    magic, seq, n, fcrc, hcrc = struct.unpack_from("<4sQIII", f)
    assert (magic, seq, n, f[24:]) == (b"gWAL", 7, len(body), body)
    assert fcrc == zlib.crc32(f[:16] + body)  # header and body, the length included
    assert hcrc == zlib.crc32(f[:20])  # the header alone: a length is checked before it is used


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 9, 20, 23, 24, 25, 40])
def test_torn_tail_is_dropped_and_truncated(tmp_path, cut):
    path = _log(tmp_path, 5)
    full = path.read_bytes()
    last = len(frame(_ops(1, 4)[0]))
    assert cut < last
    path.write_bytes(full[: len(full) - last + cut])  # the last frame only partly written
    w = WriteAheadLog(tmp_path)
    rec = w.recover(1)
    assert rec.ops == _ops(4)
    assert [(t.start, t.end) for t in rec.torn] == [(len(full) - last, len(full) - last + cut)]
    assert path.stat().st_size == len(full) - last  # truncated to the last good frame
    w.append(_ops(1, 10))  # appends continue after the good frames
    w.close()
    assert WriteAheadLog(tmp_path).recover(1).ops == _ops(4) + _ops(1, 10)


def test_zero_filled_last_frame_is_a_torn_tail(tmp_path):
    path = _log(tmp_path, 3)
    data = bytearray(path.read_bytes())
    last = len(frame(_ops(1, 2)[0]))
    data[-10:] = b"\0" * 10  # the last frame's end never reached the disk (its size did)
    path.write_bytes(bytes(data))
    rec = WriteAheadLog(tmp_path).recover(1)
    assert rec.ops == _ops(2) and rec.torn[0].start == len(data) - last


def test_zeroed_tail_is_dropped(tmp_path):
    path = _log(tmp_path, 3)
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 100)  # size grew, data never written
    assert WriteAheadLog(tmp_path).recover(1).ops == _ops(3)


def test_damage_before_the_end_is_an_error_not_a_silent_loss(tmp_path):
    path = _log(tmp_path, 4)
    data = bytearray(path.read_bytes())
    hdr = len(frame({"format": "gpuir-service-wal", "version": 1, "base_generation": 1}))
    data[hdr + 30] ^= 0xFF  # the first operation's payload
    path.write_bytes(bytes(data))
    with pytest.raises(WALCorruptError, match=f"checksum fails at byte {hdr} of"):
        WriteAheadLog(tmp_path).recover(1)
    assert path.read_bytes() == bytes(data)  # nothing truncated


def test_damage_in_an_older_segment_is_an_error(tmp_path):
    w = WriteAheadLog(tmp_path)
    w.recover(1)
    w.append(_ops(2))
    w.rotate(2)
    w.append(_ops(1, 5))
    w.close()
    old = tmp_path / segment_name(1)
    old.write_bytes(old.read_bytes()[:-2])
    with pytest.raises(WALCorruptError, match="older log segment"):
        WriteAheadLog(tmp_path).recover(1)


def test_segments_older_than_the_saved_generation_are_skipped_and_removed(tmp_path):
    w = WriteAheadLog(tmp_path)
    w.recover(3)
    w.append(_ops(2))
    w.rotate(4)
    w.append(_ops(1, 9))
    w.close()
    assert WriteAheadLog(tmp_path).recover(3).ops == _ops(2) + _ops(1, 9)
    w2 = WriteAheadLog(tmp_path)
    assert w2.recover(4).ops == _ops(1, 9)
    w2.close()
    assert [n for n, _ in segments(tmp_path)] == [2]


# ---------------------------------------------------------------------- the store at each crash point
def _add(store, ids, tenant="t"):
    return store.add(tenant, [{"id": i, "text": f"{i} shared"} for i in ids]).result(10)


def _state(root):
    m = Memory.open(root, writer=False)
    return sorted(m._writer._ids)


def _crash(store):
    """What a kill leaves of a store whose writer is stopped: no close, no save, the lock released."""
    mem = store.memory
    mem._writer._stop_merges()
    mem._writer._log.close()
    mem._writer._log = None
    mem._writer._release_lock(discard_unsaved=True)


@pytest.mark.parametrize("crash", ["rotated_before_save", "after_save_before_drop", "none"])
def test_checkpoint_crash_points_replay_to_the_acknowledged_state(tmp_path, crash, monkeypatch):
    root = tmp_path / "mem"
    s = ServiceStore(root, checkpoint_every=10_000)
    _add(s, ["a", "b"])
    assert s.delete("t", ["a"]).result(10) == 1
    _add(s, ["a"])  # re-added after its delete
    s._q.put(None)
    s._thread.join()  # stop the writer; run the checkpoint here, crashing where asked
    assert not list(root.glob("service-wal-*")) and list(root.glob("memory-wal-*"))  # the memory's log only
    if crash == "rotated_before_save":  # the memory's log rotated for the save, the save never committed
        s.memory.begin_save()
    elif crash == "after_save_before_drop":
        monkeypatch.setattr(s.memory._writer._log, "drop", lambda paths: None)
        s.checkpoint()
    else:
        s.checkpoint()
    _crash(s)  # the process is gone: no further save
    s2 = ServiceStore(root)
    assert sorted(s2.memory._writer._ids) == ["t/a", "t/b"]
    assert s2.get("t", "a")["text"] == "a shared"
    _add(s2, ["c"])
    s2.close()
    assert _state(root) == ["t/a", "t/b", "t/c"]


def test_group_commit_acknowledges_each_request(tmp_path):
    s = ServiceStore(tmp_path / "mem", checkpoint_every=7)
    groups = []
    s.on_group = lambda n, sec: groups.append(n)
    futs = [s.add(f"t{i % 3}", [{"id": f"r{i}", "text": f"text {i}"}]) for i in range(60)]
    futs.append(s.add("t0", [{"id": "r0", "text": "clash"}]))
    assert [f.result(10) for f in futs[:60]] == [1] * 60
    with pytest.raises(ValueError, match="already exist"):
        futs[60].result(10)
    assert sum(groups) == 60
    t0 = time.monotonic()
    while s.checkpoints < 1 and time.monotonic() - t0 < 10:  # the writer checkpoints after acknowledging
        time.sleep(0.01)
    assert s.checkpoints >= 1
    s.close()
    assert len(_state(tmp_path / "mem")) == 60


def test_group_commit_one_fsync_and_one_memory_add_per_group(tmp_path, monkeypatch):
    """Adds that wait while the writer is busy go out as one group: one append + fsync, one Memory.add.

    Counted, not timed: the writer is held inside its first append until all the
    other adds are queued.
    """
    import os

    s = ServiceStore(tmp_path / "mem", checkpoint_every=10_000, checkpoint_seconds=3600)
    entered, release = threading.Event(), threading.Event()
    appends, fsyncs, mem_adds = [], [], []
    real_append, real_fsync, real_add = s.memory._writer._log.write, os.fsync, s.memory.add

    def append(op, n_records):  # the memory's log append (one frame per Memory.add)
        appends.append(n_records)
        if len(appends) == 1:
            entered.set()
            assert release.wait(60)
        return real_append(op, n_records)

    def fsync(fd):
        fsyncs.append(fd)
        return real_fsync(fd)

    def mem_add(records):
        mem_adds.append(len(records))
        return real_add(records)

    monkeypatch.setattr(s.memory._writer._log, "write", append)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(s.memory, "add", mem_add)
    first = s.add("t0", [{"id": "r0", "text": "first"}])
    assert entered.wait(60)
    n = 50
    futs = [s.add(f"t{i % 4}", [{"id": f"r{i}", "text": f"word{i} common"}, {"id": f"q{i}", "text": "two"}])
            for i in range(1, n + 1)]
    release.set()
    assert first.result(60) == 1 and [f.result(60) for f in futs] == [2] * n
    assert appends == [1, 2 * n]  # records per append: the first alone, then every waiting one together
    assert len(fsyncs) == 2  # one fsync per group, not per request
    assert mem_adds == [1, 2 * n]  # one Memory.add per group, with every record of the group
    hits = s.memory.search([f"word{i}" for i in range(1, n + 1)], k=1,
                           where=[{"tenant": f"t{i % 4}"} for i in range(1, n + 1)])
    assert [hits.hits(j)[0]["id"] for j in range(n)] == [f"t{i % 4}/r{i}" for i in range(1, n + 1)]
    s.close()


def test_group_commit_keeps_the_order_of_deletes_and_adds(tmp_path):
    """A group holding add, delete, re-add of one id applies them in order (runs of adds are joined)."""
    s = ServiceStore(tmp_path / "mem", checkpoint_every=10_000, checkpoint_seconds=3600)
    hold = threading.Event()
    real_append = s.memory._writer._log.write
    s.memory._writer._log.write = lambda op, n: (hold.wait(60), real_append(op, n))[1]
    f0 = s.add("t", [{"id": "warm", "text": "x"}])
    f1 = s.add("t", [{"id": "a", "text": "old version"}])
    f2 = s.delete("t", ["a"])
    f3 = s.add("t", [{"id": "a", "text": "new version"}, {"id": "b", "text": "other"}])
    f4 = s.add("t", [{"id": "c", "text": "third"}])
    hold.set()
    assert [f.result(60) for f in (f0, f1, f2, f3, f4)] == [1, 1, 1, 2, 1]
    assert s.get("t", "a")["text"] == "new version"
    assert sorted(r for r in ("warm", "a", "b", "c") if s.get("t", r)) == ["a", "b", "c", "warm"]
    s.close()
    m = Memory.open(tmp_path / "mem", writer=False)
    assert m.get(["t/a"])[0]["text"] == "new version" and len(m) == 4


def test_replay_joins_consecutive_adds_and_keeps_deletes_in_place(tmp_path, monkeypatch):
    root = tmp_path / "mem"
    s = ServiceStore(root, checkpoint_every=10_000, checkpoint_seconds=3600)
    for i in range(30):
        s.add("t", [{"id": f"r{i}", "text": f"word{i}"}]).result(60)
    s.delete("t", ["r3"]).result(60)
    s.add("t", [{"id": "r3", "text": "replaced"}]).result(60)
    for i in range(30, 40):
        s.add("t", [{"id": f"r{i}", "text": f"word{i}"}]).result(60)
    s.close(checkpoint=False)  # as after a crash: everything is in the memory's log only
    calls = []
    real = Memory.add

    def add(self, records, *a, **k):
        calls.append(len(records))
        return real(self, records, *a, **k)

    monkeypatch.setattr(Memory, "add", add)
    s2 = ServiceStore(root)
    assert s2.replayed == 42  # one logged operation per acknowledged request, replayed by the memory
    assert calls[:2] == [30, 11]  # two runs of adds around the delete (then the tenants' and warm-up's adds)
    assert len(s2.memory) == 40 and s2.get("t", "r3")["text"] == "replaced"
    s2.close()


# ---------------------------------------------------------------------- kill -9 on a real server
@pytest.mark.slow
@pytest.mark.parametrize("options", [["--checkpoint-every", "40"],
                                     ["--checkpoint-every", "1000000", "--checkpoint-seconds", "3600"]],
                         ids=["checkpoints", "log-only"])
def test_kill9_during_acknowledged_writes_loses_nothing(tmp_path, options):
    """Every add answered 2xx before SIGKILL of the server is there after the restart. With no checkpoint
    ("log-only") every one of them was in the memory's own log only (``memory-wal-*.log``): the service
    keeps no log of its own."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from gpuir.service.client import MemoryClient, ServiceError
    from gpuir.service.keys import KeyStore
    from gpuir.service.testing import ServerProcess
    from gpuir.storage.dirlock import claim_dir

    root = tmp_path / "mem"
    claim_dir(root, "memory")
    keys = {t: KeyStore(root).add(t) for t in ("w0", "w1", "w2", "w3")}
    srv = ServerProcess(root, options).start()
    acked: dict[str, list[str]] = {t: [] for t in keys}
    stop = threading.Event()

    def writer(t):
        c = MemoryClient(srv.url, keys[t], timeout=60)
        i = 0
        while not stop.is_set():
            rid = f"{t}-{i}"
            try:
                c.add([{"id": rid, "text": f"uniq{t}x{i} payload"}])
            except (ServiceError, httpx.HTTPError):  # the server died mid-request: not acknowledged
                return
            acked[t].append(rid)
            i += 1

    threads = [threading.Thread(target=writer, args=(t,)) for t in keys]
    for th in threads:
        th.start()
    t0 = time.monotonic()
    while sum(map(len, acked.values())) < 150 and time.monotonic() - t0 < 120:  # generous: slow CI machines
        time.sleep(0.02)
    srv.kill9()
    stop.set()
    for th in threads:
        th.join()
    n_acked = sum(map(len, acked.values()))
    assert n_acked >= 150
    from gpuir.memory.durable import op_records
    from gpuir.wal import FORMATS, read_segment, segments

    assert not segments(root, "service")  # no second log
    if "3600" in options:  # nothing was saved after the first commit: the memory's log holds every add
        assert Memory.open(root, writer=False).info()["generation"] == 1
        logged = [op for _, p in segments(root, "memory")
                  for op in read_segment(p, True, fmt=FORMATS["memory"]).ops]
        assert sum(op_records(op) for op in logged if op["op"] == "add") >= n_acked
    srv2 = ServerProcess(root, log=srv.log).start()
    try:
        health = MemoryClient(srv2.url, KeyStore(root).add_operator()).health()
        assert health["records"] >= n_acked
        for t, ids in acked.items():
            c = MemoryClient(srv2.url, keys[t])
            for rid in ids:
                assert c.get(rid) is not None, rid
            i = int(ids[-1].rsplit("-", 1)[1])
            assert [h["id"] for h in c.search([f"uniq{t}x{i}"], k=1)[0]] == [ids[-1]]
            hits = c.search([f"uniq{t}x{j}" for j in range(i + 1)], k=1)
            assert [h[0]["id"] for h in hits] == ids
    finally:
        srv2.stop()


@pytest.mark.parametrize("level", ["fsync", "flush", "none"])
def test_the_services_durability_is_its_memorys(tmp_path, level):
    root = tmp_path / "mem"
    s = ServiceStore(root, durability=level, checkpoint_seconds=3600)
    assert s.memory.durability == level
    _add(s, ["a", "b"])
    assert bool(segments(root, "memory")) == (level != "none") and not segments(root, "service")
    assert s.pending_records == 2
    s.close()
    s = ServiceStore(root, durability=level)
    assert sorted(s.memory._writer._ids) == ["t/a", "t/b"]
    s.close()
    with pytest.raises(ValueError, match="durability"):
        ServiceStore(root, durability="sometimes")
