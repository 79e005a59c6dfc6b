"""The memory service under faults (issue 23): damaged logs, a missing CURRENT, a full disk, SIGTERM,
one tenant's bad records, and file modes.

Each case was reproduced on the code before this change first (the test
failed there), then fixed. Most run a real ``gpuir serve`` on loopback
(:class:`gpuir.service.testing.ServerProcess`); the service's writes are logged
by its memory (``memory-wal-*.log``); the log-format cases also run in-process
against :class:`gpuir.wal.WriteAheadLog`, and an older gpuir's own service log
(``service-wal-*.log``) is folded once at start. Frames are located
by parsing the file with the layout it was written in (format version 2:
magic, sequence number, length at byte 12, two checksums; version 1: length at
byte 0), so the same test reads a log of either version.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from gpuir.memory import Memory, MemoryFormatError, RecordError
from gpuir.service.keys import KeyStore
from gpuir.service.store import ServiceStore
from gpuir.service.wal import WALCorruptError, WriteAheadLog
from gpuir.storage.dirlock import claim_dir

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- helpers
def _frames(data: bytes) -> list[tuple[int, int, int]]:
    """(start, end, offset of the length field) of every frame, in the layout the segment was written in."""
    out, pos = [], 0
    v2 = data[:4] == b"gWAL"
    while pos < len(data):
        if v2:
            lo = pos + 12
            end = pos + 24 + int.from_bytes(data[lo:lo + 4], "little")
        else:
            lo = pos
            end = pos + 8 + int.from_bytes(data[lo:lo + 4], "little")
        out.append((pos, min(end, len(data)), lo))
        pos = end
    return out


def _wal_files(root: Path) -> list[Path]:
    """The memory's log segments (where the service's writes are logged)."""
    return sorted(root.glob("memory-wal-*.log"))


def _old_files(root: Path) -> list[Path]:
    """An older gpuir's own service log (``tests`` write them by hand; folded at start)."""
    return sorted(root.glob("service-wal-*.log"))


def _ops(n, start=0):
    return [{"op": "add", "records": [{"id": f"t/r{i}", "text": f"word{i} common", "tenant": "t"}]}
            for i in range(start, start + n)]


def _wal(tmp_path: Path, n: int) -> Path:
    w = WriteAheadLog(tmp_path)
    w.recover(1)
    for op in _ops(n):
        w.append([op])  # one frame per operation
    w.close()
    (path,) = _old_files(tmp_path)
    return path


def _v1_segment(path: Path, base: int, ops: list[dict]) -> None:
    """A log segment in format version 1 (length, CRC-32 of the payload, payload), written by hand."""
    out = b""
    for p in [{"format": "gpuir-service-wal", "version": 1, "base_generation": base}, *ops]:
        data = json.dumps(p, separators=(",", ":")).encode()
        out += struct.pack("<II", len(data), zlib.crc32(data)) + data
    path.write_bytes(out)


@pytest.fixture
def served(tmp_path):
    pytest.importorskip("fastapi")
    root = tmp_path / "mem"
    claim_dir(root, "memory")
    keys = {t: KeyStore(root).add(t) for t in ("alice", "bob")}
    keys["operator"] = KeyStore(root).add_operator()  # /healthz counts
    return root, keys


_NO_CHECKPOINT = ["--checkpoint-every", "1000000", "--checkpoint-seconds", "3600"]


def _server(root, *options, **kw):
    from gpuir.service.testing import ServerProcess

    return ServerProcess(root, [*_NO_CHECKPOINT, *options], **kw)


def _fill(root: Path, key: str, n: int = 10) -> None:
    """``n`` acknowledged adds of one record each, then kill -9: they are in the log only."""
    from gpuir.service.client import MemoryClient

    srv = _server(root).start()
    try:
        c = MemoryClient(srv.url, key)
        for i in range(n):
            assert c.add([{"id": f"a{i}", "text": f"uniq{i} payload words"}]) == 1
    finally:
        srv.kill9()


def _serve_fails(root: Path, *options: str) -> tuple[int, str]:
    """Start ``gpuir serve`` expecting it to refuse: (exit status, its output)."""
    from gpuir.service.testing import free_port

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "gpuir.service", "serve", str(root), "--port", str(free_port()),
                        *options], check=False, capture_output=True, text=True, timeout=120, env=env)
    return p.returncode, p.stdout + p.stderr


def _present(srv, key: str, n: int) -> list[str]:
    from gpuir.service.client import MemoryClient

    c = MemoryClient(srv.url, key)
    return [f"a{i}" for i in range(n) if c.get(f"a{i}") is not None]


# ---------------------------------------------------------------------- 1. a log that never hides damage
def test_a_flipped_length_bit_in_an_earlier_frame_is_refused_not_read_as_a_torn_tail(served):
    """Before: the server started, served 2 of 10 records and truncated the log silently."""
    root, keys = served
    _fill(root, keys["alice"])
    (seg,) = _wal_files(root)
    data = bytearray(seg.read_bytes())
    start, _, lo = _frames(bytes(data))[3]  # frame 0 is the header: this is the third add
    data[lo + 2] ^= 0x01  # +65,536 bytes: the frame now seems to run past the end of the file
    seg.write_bytes(bytes(data))
    code, out = _serve_fails(root)
    assert code == 2, out
    assert str(seg) in out and f"at byte {start} of {len(data)}" in out, out
    assert seg.read_bytes() == bytes(data)  # nothing truncated
    # --salvage keeps every intact frame, says what it skipped, sets the file aside
    srv = _server(root, "--salvage").start()
    try:
        assert _present(srv, keys["alice"], 10) == [f"a{i}" for i in range(10) if i != 2]
    finally:
        assert srv.stop() == 0
    out = srv.output()
    assert f"bytes {start}.." in out and "sequence number 4 lost" in out, out
    assert (root / (seg.name + ".damaged")).read_bytes() == bytes(data)
    srv = _server(root).start()  # and the directory starts normally again
    try:
        assert len(_present(srv, keys["alice"], 10)) == 9
    finally:
        srv.stop()


def test_a_flipped_byte_in_the_last_complete_frame_is_refused(served):
    """Before: the record was dropped and the file truncated, silently."""
    root, keys = served
    _fill(root, keys["alice"])
    (seg,) = _wal_files(root)
    data = bytearray(seg.read_bytes())
    start, end, _ = _frames(bytes(data))[-1]
    data[end - 5] ^= 0x20  # inside the payload of the last, complete, acknowledged frame
    seg.write_bytes(bytes(data))
    code, out = _serve_fails(root)
    assert code == 2, out
    assert str(seg) in out and f"at byte {start}" in out and "--salvage" in out, out
    assert seg.read_bytes() == bytes(data)
    srv = _server(root, "--salvage").start()
    try:
        assert _present(srv, keys["alice"], 10) == [f"a{i}" for i in range(9)]
    finally:
        srv.stop()
    assert f"bytes {start}..{end}" in srv.output()


def test_a_torn_tail_is_truncated_and_reported_with_its_byte_range(served):
    """Before: the tail was cut (955 -> 871 bytes) with no log line saying what was dropped."""
    root, keys = served
    _fill(root, keys["alice"])
    (seg,) = _wal_files(root)
    data = seg.read_bytes()
    start, end, _ = _frames(data)[-1]
    cut = data[: end - 7]  # the last append only partly on disk
    seg.write_bytes(cut)
    srv = _server(root).start()
    try:
        assert _present(srv, keys["alice"], 10) == [f"a{i}" for i in range(9)]
    finally:
        srv.stop()
    out = srv.output()
    assert f"{seg}: bytes {start}..{len(cut)}" in out and "torn tail" in out, out


# ---------------------------------------------------------------------- 2. a directory that never silently empties
def test_a_deleted_current_is_refused_and_nothing_is_collected(served):
    """Before: the server started an empty memory and its first save deleted the old segments."""
    root, keys = served
    _fill(root, keys["alice"])
    srv = _server(root).start()
    srv.stop()  # a checkpoint: the records are in the memory's segments now
    manifest = (root / "CURRENT").read_text().strip()
    (root / "CURRENT").unlink()
    before = sorted(p.name for p in root.iterdir())
    assert any(n.startswith("seg-") for n in before)
    code, out = _serve_fails(root)
    assert code == 2, out
    assert "CURRENT is missing" in out and "damaged, not empty" in out and manifest in out, out
    assert sorted(p.name for p in root.iterdir()) == before  # nothing deleted, nothing created
    (root / "CURRENT").write_text(manifest + "\n")  # what the message says to do
    srv = _server(root).start()
    try:
        assert len(_present(srv, keys["alice"], 10)) == 10
    finally:
        srv.stop()


def test_a_missing_current_with_only_a_log_is_refused(tmp_path):
    root = tmp_path / "mem"
    s = ServiceStore(root, checkpoint_seconds=3600)
    s.add("t", [{"id": "a", "text": "x"}]).result(30)
    s.close(checkpoint=False)
    for p in root.glob("manifest-*"):
        p.unlink()
    (root / "CURRENT").unlink()
    with pytest.raises(MemoryFormatError, match="memory-wal-"):
        ServiceStore(root)
    assert len(_wal_files(root)) == 1


def test_a_log_ahead_of_the_memory_is_refused(tmp_path):
    """CURRENT pointed back at an older manifest: the log's operations would apply to the wrong state."""
    root = tmp_path / "mem"
    s = ServiceStore(root, checkpoint_seconds=3600)
    s.add("t", [{"id": "a", "text": "x"}]).result(30)
    s.close()  # a checkpoint: generation 2, the log now starts at 2
    (root / "CURRENT").write_text("manifest-00000001.json\n")
    if not (root / "manifest-00000001.json").exists():
        pytest.skip("the previous manifest was collected")
    with pytest.raises(WALCorruptError, match="generation 2.*committed generation is 1"):
        ServiceStore(root)


@pytest.mark.parametrize("mode", ["fsync", "write"])
def test_enospc_rolls_the_log_back_and_acknowledged_records_survive_kill9(served, mode):
    """Before (mode "fsync"): a failed append stayed in the log file, so after the retries and a kill -9
    the log held an id twice and the restart refused (exit 2): none of the acknowledged records could be
    served. Mode "write" (a short write, then ENOSPC, part of a frame on disk) reaches the log's
    ``os.pwrite``; the code before wrote through a buffered file, which this injection does not reach."""
    import httpx

    from gpuir.service.client import MemoryClient, ServiceError

    root, keys = served
    flag = root.with_name("disk-full")
    srv = _server(root, launcher=[sys.executable, str(REPO / "tests" / "_fault_server.py")],
                  env={"GPUIR_TEST_ENOSPC_FLAG": str(flag), "GPUIR_TEST_ENOSPC_MODE": mode}).start()
    acked, while_full, sizes = [], [], []
    try:
        c = MemoryClient(srv.url, keys["alice"], timeout=60)
        for i in range(4):
            assert c.add([{"id": f"a{i}", "text": f"uniq{i} before"}]) == 1
            acked.append(f"a{i}")
        sizes.append(_wal_files(root)[-1].stat().st_size)
        flag.write_text("full")
        for i in range(4, 8):
            try:
                c.add([{"id": f"a{i}", "text": f"uniq{i} retried"}])
                while_full.append((200, ""))
            except ServiceError as e:
                while_full.append((e.status, str(e)))
            except httpx.HTTPError as e:  # the code before: a 500 whose connection was then reset
                while_full.append((0, str(e)))
        sizes.append(_wal_files(root)[-1].stat().st_size)
        flag.unlink()  # space returns; the same adds are retried and acknowledged
        for i in range(4, 8):
            assert c.add([{"id": f"a{i}", "text": f"uniq{i} retried"}]) == 1
            acked.append(f"a{i}")
        assert c.add([{"id": "a8", "text": "uniq8 after"}]) == 1
        acked.append("a8")
    finally:
        srv.kill9()
    srv2 = _server(root, log=srv.log).start()  # before: exit 2, "id 'alice/a4' occurs twice in this batch"
    try:
        c = MemoryClient(srv2.url, keys["alice"])
        assert MemoryClient(srv2.url, keys["operator"]).health()["records"] == len(acked) == 9
        for i, rid in enumerate(acked):
            assert c.get(rid)["text"].startswith(f"uniq{i} ")
    finally:
        srv2.stop()
    assert [st for st, _ in while_full] == [507] * 4, while_full  # was 500
    assert all("nothing of this request was stored" in msg for _, msg in while_full)
    assert sizes[0] == sizes[1]  # rolled back: no partial frame, no failed frame left in the log


def test_enospc_in_process_leaves_no_partial_frame_and_no_duplicate(tmp_path, monkeypatch):
    import errno

    import gpuir.service.wal as walmod
    from gpuir.service.store import WriteFailedError

    root = tmp_path / "mem"
    s = ServiceStore(root, checkpoint_seconds=3600)
    s.add("t", [{"id": "a", "text": "first"}]).result(30)
    (seg,) = _wal_files(root)
    good = seg.read_bytes()
    real = os.pwrite
    calls = []

    def full(fd, data, offset):  # writes half, then the disk is full
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(walmod.os, "pwrite", full)
    with pytest.raises(WriteFailedError) as ei:
        s.add("t", [{"id": "b", "text": "second"}]).result(30)
    assert ei.value.no_space
    assert seg.read_bytes() == good  # the half-written frame is gone
    monkeypatch.setattr(walmod.os, "pwrite", real)
    s.add("t", [{"id": "b", "text": "second"}]).result(30)
    s.close(checkpoint=False)  # as a kill: the log only
    s2 = ServiceStore(root)
    assert sorted(s2.memory._writer._ids) == ["t/a", "t/b"]
    s2.close()


def test_a_failed_checkpoint_changes_nothing_and_a_crash_after_the_next_one_replays_right(tmp_path, monkeypatch):
    """Before: a checkpoint started its new log segment, then the save failed; writes went to that segment,
    and after the next checkpoint's save a crash before the old segments were deleted replayed them again
    over the save that holds them (an id twice: the restart refused)."""
    root = tmp_path / "mem"
    from gpuir.memory.store import PendingSave

    s = ServiceStore(root, checkpoint_every=1, checkpoint_seconds=3600)
    real = PendingSave.finish
    calls = []

    def finish(self, *a, **k):  # the save's files and commit (written outside the writer's path)
        calls.append(1)
        if len(calls) == 1:
            self.mem._save_lock.release()  # (as finish does on any failure)
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(PendingSave, "finish", finish)
    monkeypatch.setattr(s.memory._writer._log, "drop", lambda paths: None)  # the crash comes before the old log is deleted
    s.add("t", [{"id": "a", "text": "x"}]).result(30)  # acknowledged; the checkpoint after it fails
    s.add("t", [{"id": "b", "text": "y"}]).result(30)  # its checkpoint succeeds
    t0 = time.monotonic()
    while s.checkpoints < 1 and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    assert s.checkpoints == 1 and len(calls) == 2
    s.close(checkpoint=False)  # the process dies here
    monkeypatch.setattr(PendingSave, "finish", real)
    s2 = ServiceStore(root)
    assert sorted(s2.memory._writer._ids) == ["t/a", "t/b"] and s2.replayed == 0
    s2.close()


def test_sigterm_checkpoints_and_exits_0(served):
    """Before: the checkpoint was made but the process ended by the signal (status -15)."""
    from gpuir.service.client import MemoryClient
    from gpuir.wal import FORMATS, read_segment

    root, keys = served
    srv = _server(root).start()
    c = MemoryClient(srv.url, keys["alice"])
    for i in range(5):
        c.add([{"id": f"a{i}", "text": f"t{i}"}])
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()
    assert [read_segment(p, True, fmt=FORMATS["memory"]).ops for p in _wal_files(root)] == [[]]  # folded
    assert len(Memory.open(root, writer=False)) == 5


# ---------------------------------------------------------------------- 3. one tenant's bad record fails only its own request
_BAD = [
    {"id": "s1", "text": "lone \ud800 surrogate"},
    {"id": "s2", "text": "ok", "metadata": {"note": "lone \udc00"}},
    {"id": "s3\ud800", "text": "ok"},
    {"id": "big", "text": "ok", "metadata": {"n": 10 ** 400}},
    {"id": "deep", "text": "ok", "metadata": json.loads('{"a":' * 300 + "1" + "}" * 300)},
]


def _post_raw(url: str, key: str, tenant: str, records: list[dict]):
    import httpx

    body = json.dumps({"records": records}).encode()  # ASCII JSON: "\ud800" escaped, as any client may send it
    return httpx.post(f"{url}/v1/tenants/{tenant}/records", content=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def test_bad_records_fail_only_their_own_request_and_never_a_shared_group(served):
    """Before: alice's lone surrogates answered 500 and failed bob's concurrent valid adds (500) too."""
    import httpx

    from gpuir.service.client import MemoryClient

    root, keys = served
    srv = _server(root).start()
    try:
        results: dict[str, list[int]] = {"alice": [], "bob": []}
        lock = threading.Lock()

        def send(tenant, records):
            r = _post_raw(srv.url, keys[tenant], tenant, records)
            with lock:
                results[tenant].append(r.status_code)

        jobs = []
        for i in range(30):
            bad = dict(_BAD[i % 3], id=_BAD[i % 3]["id"] + f"-{i}")
            jobs.append(threading.Thread(target=send, args=("alice", [bad])))
            jobs.append(threading.Thread(target=send, args=("bob", [
                {"id": f"b{i}", "text": f"bob note {i}", "metadata": {"n": i}}])))
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
        assert results["alice"] == [422] * 30
        assert results["bob"] == [200] * 30
        for rec in _BAD[3:]:  # a 400-digit integer, metadata nested 300 deep
            r = _post_raw(srv.url, keys["alice"], "alice", [rec])
            assert r.status_code == 422, r.text
            assert "records" in json.dumps(r.json()["detail"])
        r = httpx.delete(f"{srv.url}/v1/tenants/alice/records/x%ED%A0%80", timeout=30,
                         headers={"Authorization": f"Bearer {keys['alice']}"})
        assert r.status_code in (404, 422), r.text
    finally:
        srv.kill9()  # the restart replays the log: it must hold only what replays
    srv = _server(root, log=srv.log).start()
    try:
        c = MemoryClient(srv.url, keys["bob"])
        assert all(c.get(f"b{i}")["metadata"] == {"n": i} for i in range(30))
        hits = c.search(["bob note"], k=5, where={"metadata.n": 7})
        assert [h["id"] for h in hits[0]] == ["b7"]
        assert MemoryClient(srv.url, keys["operator"]).health()["records"] == 30
    finally:
        srv.stop()


def test_a_bad_record_never_joins_a_group_commit(tmp_path):
    """Deterministic: the writer is held while a bad add and good adds of another tenant queue."""
    s = ServiceStore(tmp_path / "mem", checkpoint_seconds=3600)
    hold, entered = threading.Event(), threading.Event()
    real = s.memory._writer._log.write

    def held(op, n):  # the memory's log append, in the service's writer thread
        entered.set()
        assert hold.wait(60)
        return real(op, n)

    s.memory._writer._log.write = held
    first = s.add("bob", [{"id": "warm", "text": "x"}])
    assert entered.wait(60)
    good = [s.add("bob", [{"id": f"b{i}", "text": f"ok {i}"}]) for i in range(5)]
    bad_futures = []
    for rec in _BAD:
        try:
            bad_futures.append(s.add("alice", [rec]))
        except RecordError:
            pass
    good += [s.add("bob", [{"id": f"c{i}", "text": f"ok {i}"}]) for i in range(5)]
    hold.set()
    assert first.result(60) == 1 and [f.result(60) for f in good] == [1] * 10
    for f in bad_futures:  # refused at the door, or failing alone
        with pytest.raises(RecordError):
            f.result(60)
    s.close(checkpoint=False)
    s2 = ServiceStore(tmp_path / "mem")
    assert len(s2.memory) == 11
    s2.close()


def test_a_failed_append_in_a_group_fails_only_it_and_what_follows(tmp_path):
    """In-process: a group of add, delete, add is three memory writes; the third one's log append fails (a
    full disk): the first two are durable and acknowledged, the third answers 507 and is not stored."""
    import errno

    from gpuir.service.store import WriteFailedError

    s = ServiceStore(tmp_path / "mem", checkpoint_seconds=3600)
    hold, entered = threading.Event(), threading.Event()
    real = s.memory._writer._log.write
    calls = []

    def write(op, n):
        calls.append(op["op"])
        if len(calls) == 1:
            entered.set()
            assert hold.wait(60)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(op, n)

    s.memory._writer._log.write = write
    warm = s.add("t", [{"id": "warm", "text": "x"}])
    assert entered.wait(60)
    x = s.add("t", [{"id": "x", "text": "first"}])
    d = s.delete("t", ["warm"])
    y = s.add("t", [{"id": "y", "text": "third"}])
    hold.set()
    assert warm.result(60) == 1 and x.result(60) == 1 and d.result(60) == 1
    with pytest.raises(WriteFailedError) as ei:
        y.result(60)
    assert ei.value.no_space
    assert calls == ["add", "add", "delete", "add"]
    assert s.get("t", "y") is None and s.get("t", "x") is not None
    s.close(checkpoint=False)  # a crash: the memory's log only
    s2 = ServiceStore(tmp_path / "mem")
    assert sorted(s2.memory._writer._ids) == ["t/x"]
    s2.close()


# ---------------------------------------------------------------------- log format: sequence numbers, salvage, version 1
def test_a_repeated_frame_is_refused_although_every_checksum_holds(tmp_path):
    path = _wal(tmp_path, 4)
    data = path.read_bytes()
    fr = _frames(data)
    a, b, _ = fr[2]
    path.write_bytes(data[:fr[3][0]] + data[a:b] + data[fr[3][0]:])  # frame 2 twice
    with pytest.raises(WALCorruptError, match="sequence number"):
        WriteAheadLog(tmp_path).recover(1)


def test_salvage_keeps_every_intact_frame_and_reports_the_gap(tmp_path, caplog):
    path = _wal(tmp_path, 6)
    data = bytearray(path.read_bytes())
    fr = _frames(bytes(data))
    data[fr[2][2]] ^= 0x10  # frame 2's length (the second operation)
    data[fr[4][1] - 3] ^= 0x01  # frame 4's payload
    path.write_bytes(bytes(data))
    with pytest.raises(WALCorruptError):
        WriteAheadLog(tmp_path).recover(1)
    w = WriteAheadLog(tmp_path)
    with caplog.at_level("WARNING", logger="gpuir"):
        rec = w.recover(1, salvage=True)
    assert rec.ops == [_ops(6)[i] for i in (0, 2, 4, 5)]
    assert [(s.start, s.end, s.seqs) for s in rec.skipped] == [(fr[2][0], fr[3][0], (3, 3)),
                                                                (fr[4][0], fr[5][0], (5, 5))]
    assert rec.needs_checkpoint
    assert sum("salvage: skipped" in r.getMessage() for r in caplog.records) == 2


def test_a_version_1_log_is_upgraded_and_folded(tmp_path):
    root = tmp_path / "mem"
    ServiceStore(root).close()  # generation 1, the memory's log empty
    ops = [{"op": "add", "records": [{"id": f"t/r{i}", "text": f"w{i}", "tenant": "t"}]} for i in range(3)]
    _v1_segment(root / "service-wal-00000005.log", 1, ops + [{"op": "delete", "ids": ["t/r1"]}])
    s = ServiceStore(root)
    assert sorted(s.memory._writer._ids) == ["t/r0", "t/r2"] and s.replayed == 4
    assert _old_files(root) == []  # folded into a save, then deleted: the memory's log is the one log now
    assert [p.read_bytes()[:4] for p in _wal_files(root)] == [b"gWAL"]
    s.add("t", [{"id": "x", "text": "new"}]).result(30)
    s.close(checkpoint=False)
    s2 = ServiceStore(root)
    assert sorted(s2.memory._writer._ids) == ["t/r0", "t/r2", "t/x"]
    s2.close()


def test_an_older_service_log_is_replayed_once_then_retired(tmp_path, monkeypatch):
    """A directory an older gpuir's service wrote: the memory saved without a log, the service's own log
    (format 2, a torn tail after its last acknowledged frame). The first start applies it, saves, deletes it;
    a crash before that save applies it again (nothing was logged twice); an acknowledged write is never lost."""
    from gpuir.memory.store import PendingSave

    root = tmp_path / "mem"
    ServiceStore(root, durability="none").close()  # generation 1, no log at all (as the service kept its memory)
    assert _wal_files(root) == []
    w = WriteAheadLog(root)
    w.recover(1)
    w.append(_ops(3) + [{"op": "delete", "ids": ["t/r1"]}] + [{"op": "put", "records": [
        {"id": "t/r2", "text": "changed words", "tenant": "t", "time": 86_400_000}]}])
    w.close()
    (old,) = _old_files(root)
    with open(old, "ab") as f:
        f.write(b"gWAL\x07\x00\x00")  # an append cut short: never acknowledged
    data = old.read_bytes()
    real = PendingSave.finish

    def boom(self, *a, **k):
        self.mem._save_lock.release()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PendingSave, "finish", boom)
    with pytest.raises(OSError):
        ServiceStore(root)
    assert old.read_bytes() == data  # untouched until a save holds its operations
    monkeypatch.setattr(PendingSave, "finish", real)
    s = ServiceStore(root)
    assert s.replayed == 5 and sorted(s.memory._writer._ids) == ["t/r0", "t/r2"]
    assert s.get("t", "r2")["text"] == "changed words"
    assert _old_files(root) == [] and len(_wal_files(root)) == 1
    s.add("t", [{"id": "r9", "text": "after the upgrade"}]).result(30)
    s.close(checkpoint=False)  # a crash: the new write is in the memory's log only
    s2 = ServiceStore(root)
    assert sorted(s2.memory._writer._ids) == ["t/r0", "t/r2", "t/r9"] and s2.replayed == 1
    assert s2.search(["changed"], k=5, wheres=[{"tenant": "t"}])[0][0]["id"] == "r2"
    s2.close()


def test_a_torn_version_1_log_is_refused_and_salvaged(tmp_path):
    root = tmp_path / "mem"
    ServiceStore(root).close()
    seg = root / "service-wal-00000002.log"
    ops = [{"op": "add", "records": [{"id": f"t/r{i}", "text": f"w{i}", "tenant": "t"}]} for i in range(3)]
    _v1_segment(seg, 1, ops)
    seg.write_bytes(seg.read_bytes()[:-5])
    with pytest.raises(WALCorruptError, match="version-1 log"):
        ServiceStore(root)
    s = ServiceStore(root, salvage=True)
    assert sorted(s.memory._writer._ids) == ["t/r0", "t/r1"]
    s.close()
    assert (root / "service-wal-00000002.log.damaged").exists()


# ---------------------------------------------------------------------- 6. files at rest
@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_log_segments_and_keys_are_0600_and_the_directory_0700_whatever_the_umask(tmp_path, umask, capsys):
    """Before: the log (tenants' records in clear), segments and manifests were 0644 under the usual umask."""
    from gpuir.service import cli

    old = os.umask(umask)
    try:
        root = tmp_path / "mem"
        assert cli.main(["serve-keys", str(root), "add", "t"]) == 0  # creates the directory, as users do
        s = ServiceStore(root, checkpoint_seconds=3600)
        s.add("t", [{"id": f"r{i}", "text": f"x{i}"} for i in range(10)]).result(30)
        s.delete("t", ["r0"]).result(30)  # a deletions file at the checkpoint (1 of 10: no merge)
        s.close()
        s = ServiceStore(root)
        s.add("t", [{"id": "c", "text": "z"}]).result(30)
        s.close(checkpoint=False)
    finally:
        os.umask(old)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in root.iterdir()}
    private = [n for n in mode if n.startswith(("memory-wal-", "seg-", "del-", "manifest-", "CURRENT",
                                                 "service-keys.json"))]
    assert {n.split("-")[0] for n in private} >= {"memory", "seg", "del", "manifest", "CURRENT"}
    assert {n: mode[n] for n in private} == {n: 0o600 for n in private}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_writer_thread_that_dies_fails_the_waiting_writes_instead_of_hanging(tmp_path):
    """Before: an unexpected error in the writer thread (the sharded store's first checkpoint read an
    attribute it lacked) ended the thread, and every later write waited for ever. Now the store stops
    accepting writes and answers each waiting or new one with StoreFailedError (HTTP 503), saying why."""
    import concurrent.futures as cf

    from gpuir.service.errors import StoreFailedError

    s = ServiceStore(tmp_path / "mem", checkpoint_every=1, checkpoint_seconds=3600)
    gate = threading.Event()

    def broken():  # the bug: raised outside _checkpoint_safely's own try
        gate.wait(30)
        raise AttributeError("'ShardedStore' object has no attribute '_ckpt'")

    s._checkpoint_safely = broken
    try:
        assert s.add("t", [{"id": "a", "text": "acknowledged before the failure"}]).result(30) == 1
        waiting = s.add("t", [{"id": "b", "text": "queued while the writer fails"}])  # queued behind it
        gate.set()
        with pytest.raises(StoreFailedError, match="internal error in its writer thread.*AttributeError"):
            waiting.result(30)
        s._thread.join(30)
        assert not s._thread.is_alive()
        with pytest.raises(StoreFailedError, match="restart it"):
            s.add("t", [{"id": "c", "text": "after"}]).result(30)
    except cf.TimeoutError:  # pragma: no cover - the failure this test is about
        pytest.fail("a write waited for a writer thread that had died")
    finally:
        s.close(checkpoint=False)
    s2 = ServiceStore(tmp_path / "mem")
    try:
        assert sorted(s2.memory._writer._ids) == ["t/a"], "the acknowledged write survived; the refused ones are not there"
    finally:
        s2.close()
