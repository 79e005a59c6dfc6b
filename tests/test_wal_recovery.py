"""Recovery of the write-ahead log (gpuir/wal.py), as unit tests: no server, milliseconds each.

A flipped byte anywhere in the last *complete* frame is damage to an acknowledged
write: recovery refuses it with :class:`~gpuir.wal.WALCorruptError` naming the file
and the frame's byte offset, changes nothing on disk, and does not mistake it for
a torn tail (an incomplete last frame, never acknowledged, which is dropped).
Before issue 36 only a server test (up to 120 s) checked this.
"""

from __future__ import annotations

import pytest

from gpuir.wal import HEADER_BYTES, WALCorruptError, WriteAheadLog, frame, segments


def _ops(n, start=0):
    return [{"op": "add", "records": [{"id": f"t/r{i}", "text": f"word{i} common", "tenant": "t"}]}
            for i in range(start, start + n)]


def _logged(root, n):
    """A log of ``n`` acknowledged operations (one frame each); returns the segment and its last frame's start."""
    w = WriteAheadLog(root)
    assert w.recover(1).ops == []
    w.append(_ops(n))
    w.close()
    ((_, path),) = segments(root)
    last = len(frame(_ops(1, n - 1)[0], seq=n))
    return path, path.stat().st_size - last


#: Bytes of the last frame to flip: its magic, sequence number, length, frame checksum, header checksum,
#: and its payload's first, middle and last bytes.
WHERE = {"magic": 1, "seq": 6, "length": 13, "frame crc": 17, "header crc": 21, "payload first": HEADER_BYTES,
         "payload middle": HEADER_BYTES + 20, "payload last": -1}


@pytest.mark.parametrize("where", WHERE)
def test_a_flipped_byte_in_the_last_complete_frame_is_damage_not_a_torn_tail(tmp_path, where):
    path, start = _logged(tmp_path, 5)
    data = bytearray(path.read_bytes())
    off = WHERE[where]
    pos = len(data) + off if off < 0 else start + off
    data[pos] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(WALCorruptError) as e:
        WriteAheadLog(tmp_path).recover(1)
    msg = str(e.value)
    assert str(path) in msg and f"at byte {start} of {len(data)}" in msg, msg
    assert "torn" not in msg.replace("not a torn append", ""), msg
    assert path.read_bytes() == bytes(data), "nothing truncated or rewritten"
    # salvage keeps the four intact frames and reports the damaged one's byte range
    rec = WriteAheadLog(tmp_path).recover(1, salvage=True)
    assert rec.ops == _ops(4) and [(s.start, s.end) for s in rec.skipped] == [(start, len(data))]


def test_the_same_frame_cut_short_is_a_torn_tail(tmp_path):
    """The control: the last frame incomplete (never acknowledged) is dropped, not refused."""
    path, start = _logged(tmp_path, 5)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    rec = WriteAheadLog(tmp_path).recover(1)
    assert rec.ops == _ops(4) and [(t.start, t.end) for t in rec.torn] == [(start, len(data) - 3)]
    assert path.stat().st_size == start
