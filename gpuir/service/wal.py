"""Write-ahead log of the memory service: nothing acknowledged is lost.

Layout (inside the memory directory, beside the memory's own files; the
memory's garbage collection never touches these names)::

    service-wal-00000007.log   the log segments, numbered; replayed in order

A log segment starts with a header frame ``{"format": "gpuir-service-wal",
"version": 1, "base_generation": G}``: its operations apply on top of the
memory saved at generation ``G`` (``Memory.save`` numbers its commits 1, 2, ...).
Every frame is::

    4 bytes  payload length L (little-endian uint32)
    4 bytes  CRC-32 of the payload (little-endian uint32)
    L bytes  payload: UTF-8 JSON, {"op": "add", "records": [...]} or {"op": "delete", "ids": [...]}

Protocol (:class:`WriteAheadLog` with :class:`gpuir.service.store.ServiceStore`):

1. **Write**: the operation is validated, appended, ``fsync``-ed, then applied to
   the in-memory :class:`~gpuir.memory.Memory`, then acknowledged.
2. **Checkpoint**: with writes paused, a new segment is started whose header
   names generation ``G+1`` (fsynced, directory fsynced); then ``Memory.save``
   commits generation ``G+1`` (which holds exactly the operations of every
   older segment); then the older segments are deleted.
3. **Start**: open the memory (generation ``g``); delete the segments whose base
   generation is below ``g`` (they are folded into the save); replay the others
   in order. A crash between 2's steps leaves either ``g = G`` (the old segment
   and the new, empty one are both replayed) or ``g = G+1`` (the old one is
   dropped): either way the state is the acknowledged state.

**Torn tail.** A process killed (or a machine losing power) while appending can
leave the newest segment ending in a partial frame: a header shorter than 8
bytes, a length running past the end of the file, or a last frame whose CRC does
not match (or zeros to the end of the file: its size grew before its data
reached the disk). That frame was never acknowledged (acknowledgement follows the
fsync), so it is dropped and the file truncated to the last good frame. A bad
frame that is *not* the last one, or any damage in an older segment, is damage
to acknowledged data: :class:`WALCorruptError` names the file and offset and
the service refuses to start rather than silently lose records.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..index.files import fsync_dir

FORMAT = "gpuir-service-wal"
VERSION = 1
_FRAME = struct.Struct("<II")
_NAME = re.compile(r"^service-wal-(\d{8})\.log$")
#: A single frame larger than this is refused (and read as damage).
MAX_FRAME = 1 << 30


class WALCorruptError(ValueError):
    """Damage to acknowledged data in the log (not a torn tail); the message names file and offset."""


def frame(payload: dict[str, Any]) -> bytes:
    """One framed record (length, CRC-32, JSON payload)."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    if len(data) > MAX_FRAME:
        raise ValueError(f"a log record of {len(data)} bytes is over the limit of {MAX_FRAME}")
    return _FRAME.pack(len(data), zlib.crc32(data)) + data


@dataclass
class ReadResult:
    """What :func:`read_segment` found: the header, the operations, and where the good frames end."""

    header: dict[str, Any]
    ops: list[dict[str, Any]]
    good_end: int
    torn_bytes: int


def read_segment(path: Path, allow_torn_tail: bool) -> ReadResult:
    """Parse one log segment.

    Parameters
    ----------
    path : the segment file
    allow_torn_tail : bool
        True for the newest segment: a damaged last frame is a torn (never
        acknowledged) append and is reported in ``torn_bytes``, not raised.

    Raises
    ------
    WALCorruptError
        A bad frame followed by more data, a bad frame in an older segment, or a bad header.
    """
    data = path.read_bytes()
    pos, size = 0, len(data)
    frames: list[dict[str, Any]] = []
    torn = 0
    while pos < size:
        bad = None
        if size - pos < _FRAME.size:
            bad, end = "a partial frame header", size
        else:
            n, crc = _FRAME.unpack_from(data, pos)
            end = pos + _FRAME.size + n
            if n > MAX_FRAME or end > size:
                bad, end = "a frame running past the end of the file", size
            else:
                body = data[pos + _FRAME.size:end]
                if zlib.crc32(body) != crc:
                    bad = "a checksum mismatch"
                else:
                    try:
                        frames.append(json.loads(body.decode("utf-8")))
                    except (UnicodeDecodeError, ValueError):
                        bad = "a frame that is not JSON"
        if bad is not None:
            if allow_torn_tail and (end >= size or not any(data[pos:])):  # last frame, or zeros to the end
                torn = size - pos
                break
            raise WALCorruptError(f"{path}: {bad} at byte {pos} of {size}, before the end of the log: this is "
                                  "damage to acknowledged writes, not a torn append; restore the file or move "
                                  "it away (its operations are then lost)")
        pos = end
    good_end = size - torn
    if not frames:
        if torn and good_end == 0:  # the header itself was torn: the segment was never used
            return ReadResult({}, [], 0, torn)
        raise WALCorruptError(f"{path}: empty log segment (no header)")
    header = frames[0]
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise WALCorruptError(f"{path}: not a {FORMAT} version {VERSION} log (header {header!r})")
    return ReadResult(header, frames[1:], good_end, torn)


def segments(root: Path) -> list[tuple[int, Path]]:
    """The log segments in ``root``, oldest first: (number, path)."""
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def segment_name(number: int) -> str:
    return f"service-wal-{number:08d}.log"


class WriteAheadLog:
    """The appending side of the log (one writer; not thread-safe: the store serialises calls).

    Parameters
    ----------
    root : the memory directory
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self._f = None
        self.number = 0
        self.bytes = 0
        self.ops = 0  # operations in the current segment

    def recover(self, generation: int) -> Iterator[dict[str, Any]]:
        """Operations to replay over the memory saved at ``generation``, oldest first.

        Deletes the segments already folded into that save, truncates a torn
        tail, and leaves the newest segment open for appending (or starts one).
        Consume the iterator completely before appending.
        """
        segs = segments(self.root)
        live = []
        for i, (num, path) in enumerate(segs):
            r = read_segment(path, allow_torn_tail=(i == len(segs) - 1))
            if r.header and int(r.header.get("base_generation", -1)) < generation:
                continue  # folded into the save; removed below once replay succeeded
            live.append((num, path, r))
        for num, path, r in live:
            yield from r.ops
        for num, path in segs:
            if not any(num == n for n, _, _ in live):
                path.unlink()
        if live and live[-1][2].header:
            num, path, r = live[-1]
            if r.torn_bytes:
                with open(path, "r+b") as f:
                    f.truncate(r.good_end)
                    f.flush()
                    os.fsync(f.fileno())
            self._f = open(path, "ab")  # noqa: SIM115 - held open for appends
            self.number, self.bytes = num, r.good_end
            self.ops = sum(_op_size(op) for _, _, rr in live for op in rr.ops)
        else:
            if live:  # a torn header only: the segment was never used
                live[-1][1].unlink()
            last = segs[-1][0] if segs else 0
            self._start(last + 1, generation)
        fsync_dir(self.root)

    def _start(self, number: int, generation: int) -> None:
        path = self.root / segment_name(number)
        f = open(path, "xb")  # noqa: SIM115
        f.write(frame({"format": FORMAT, "version": VERSION, "base_generation": int(generation)}))
        f.flush()
        os.fsync(f.fileno())
        fsync_dir(self.root)
        old = self._f
        self._f = f
        if old is not None:
            old.close()
        self.number, self.bytes, self.ops = number, f.tell(), 0

    def append(self, ops: list[dict[str, Any]]) -> None:
        """Append operations and fsync them (group commit: one fsync for the list)."""
        if self._f is None:
            raise RuntimeError("the log is not open (call recover first)")
        data = b"".join(frame(op) for op in ops)
        self._f.write(data)
        self._f.flush()
        os.fsync(self._f.fileno())
        self.bytes += len(data)
        self.ops += sum(_op_size(op) for op in ops)

    def rotate(self, next_generation: int) -> list[Path]:
        """Start a new segment for the generation the coming save will commit; returns the older segments."""
        older = [p for _, p in segments(self.root)]
        self._start(self.number + 1, next_generation)
        return older

    @staticmethod
    def drop(paths: list[Path]) -> None:
        """Delete segments folded into a committed save."""
        for p in paths:
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _op_size(op: dict[str, Any]) -> int:
    return len(op.get("records") or op.get("ids") or ())
