"""Write-ahead log frames, segments and recovery: nothing acknowledged is lost, and no damage is hidden.

One log is written: a :class:`~gpuir.memory.Memory`'s own (:mod:`gpuir.memory.durable`, kind
"memory"), through which the memory service (:mod:`gpuir.service.store`) and each shard of a sharded
memory (:mod:`gpuir.cluster.shard`) write too. The logs they kept of their own before (kind
"service") are only read, to be folded into the memory once
(:func:`gpuir.memory.durable.fold_service_log`). It imports only :mod:`gpuir.storage.files`;
:mod:`gpuir.service.wal` is the same module under its former name.

Layout (inside the memory directory, beside the memory's own files; the
memory's garbage collection never touches these names)::

    memory-wal-00000007.log    the log segments, numbered; replayed in order (mode 0600)
    service-wal-00000007.log   (an older service's or shard's own log, until it is folded)

A log segment starts with a header frame ``{"format": "gpuir-memory-wal"`` (or
``"gpuir-service-wal"``) ``, "version": 2, "base_generation": G}``: its operations apply on top of the
memory saved at generation ``G`` (``Memory.save`` numbers its commits 1, 2, ...).
Every frame (format version 2) is::

    4 bytes  magic b"gWAL"
    8 bytes  sequence number (little-endian uint64): +1 per frame, across segments
    4 bytes  payload length L (little-endian uint32)
    4 bytes  frame checksum: CRC-32 of the 16 bytes above and the payload
    4 bytes  header checksum: CRC-32 of the 20 bytes above
    L bytes  payload: a binary payload (:func:`encode_binary`: a memory's adds and updates), or UTF-8
             JSON (a memory's deletes, ``{"op": "delete", "ids": [...]}``; a memory's adds and
             updates before binary frames, ``{"op": "add" | "put", "cols": ...}``; an older
             service's ``{"op": "add" | "put", "records": [...]}``)

A binary payload is ``b"\\x00gB1"`` (never the ``{`` a JSON payload starts with), the
length H of a small JSON header (little-endian uint32), the header (its
``"_blobs"`` lists the byte length of each raw section), the raw sections in
order (a memory's columns as NumPy bytes and UTF-8 text), and the byte ``}``:
like a JSON payload it never ends in a zero byte, so the torn-tail rule below
holds for both.

The header checksum makes the length trustworthy before it is used: a flipped
bit in a length is damage to that frame's header, never a frame that seems to
run past the end of the file.

Protocol (:class:`WriteAheadLog` under :class:`gpuir.memory.durable.MemoryLog`; the memory's
module docstring has the full argument):

1. **Write**: the operation is encoded and appended with ``pwrite`` (no
   user-space buffer) under the memory's writer lock, applied, then ``fsync``-ed
   (group commit: writers waiting at once share one) before the call returns.
   An append that fails (``ENOSPC``, ``EIO``, a short write) is rolled back:
   the file is truncated to the end of the last good frame and the sequence
   number restored. A failed ``fsync`` refuses every later write
   (:meth:`WriteAheadLog.cut_to_synced` removes what no writer was told is durable).
2. **Checkpoint**: under the writer's lock a new segment is started whose header
   names the generation ``G'`` the save will commit (:meth:`WriteAheadLog.rotate`);
   the save writes and commits outside the lock; then the older segments are
   deleted. A save that fails leaves them, and the next one commits another number.
3. **Start**: open the memory (generation ``g``); delete the segments whose base
   generation is below ``g`` (they are folded into the save); replay the others
   in order. Every crash point leaves either ``g = G`` with the old segments and
   the new one (replayed in order) or ``g = G'`` (the old ones are dropped, the
   new one replayed): either way the state is the acknowledged state.

**What replay accepts.** A *torn tail* is an incomplete last frame of the newest
segment: the file ends inside its header, or its (checksummed) header declares
more bytes than the file holds, or it is zeros to the end of the file (the
file's size grew before its data reached the disk), or a complete frame whose
payload ends in a zero byte (a payload always ends in ``}``). Such a frame
was never acknowledged (acknowledgement follows the fsync); it is dropped, the
file truncated to the last good frame, and a warning names the file and the
byte range. Anything else -- a damaged header (a flipped length bit), a
complete frame whose checksum fails (also the last one), a sequence number out
of order, damage in an older segment, a log whose base generation does not
meet the memory's -- is damage to acknowledged writes: :class:`WALCorruptError`
names the file and byte offset and the open (or ``gpuir serve``) refuses.
``gpuir serve --salvage`` (``recover(..., salvage=True)``) instead keeps every
intact frame (resynchronising on the magic after damage), logs each skipped
byte range and the sequence numbers lost, and sets the damaged segment aside
as ``service-wal-NNNNNNNN.log.damaged`` once a checkpoint has folded what was
kept.

**Older logs.** A log of format version 1 (written by gpuir before this
version: length, CRC-32 of the payload, payload; no header checksum, no
sequence numbers) is read and folded into the memory at start (upgrade). Its
frames carry no header checksum, so a torn tail cannot be told from a damaged
length there: any incomplete or damaged version-1 frame is refused (naming the
file and offset), and ``--salvage`` keeps its intact frames.

Every drop -- a torn tail, a skipped range, a segment set aside, a segment
folded into a save -- is logged through ``logging.getLogger("gpuir.wal")``.
"""

from __future__ import annotations

import errno as _errno
import itertools
import json
import logging
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .storage.files import fsync_dir

log = logging.getLogger("gpuir.wal")

FORMAT = "gpuir-service-wal"
#: Formats by kind of log: the service's and a shard's ("service"), a :class:`~gpuir.memory.Memory`'s own ("memory").
FORMATS = {"service": FORMAT, "memory": "gpuir-memory-wal"}
VERSION = 2
MAGIC = b"gWAL"
_HEAD = struct.Struct("<4sQII")  # magic, seq, length, frame crc
_HCRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _HCRC.size  # 24
_V1 = struct.Struct("<II")  # version 1: length, crc32(payload)
_NAMES = {kind: re.compile(rf"^{kind}-wal-(\d{{8}})\.log$") for kind in FORMATS}
#: A single frame larger than this is refused (and read as damage).
MAX_FRAME = 1 << 30
#: Mode of every log segment (owner read and write only), whatever the umask.
FILE_MODE = 0o600
#: Suffix of a segment set aside by ``--salvage`` (never deleted by gpuir).
DAMAGED_SUFFIX = ".damaged"


class FileOps:
    """The system calls the log makes on its segment files: one seam, so a test can stand in a disk that
    loses what was not synced when the power goes (``tests/test_memory_wal.py``'s power-cut layer)."""

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


#: The file operations in use (replaced by tests only).
io = FileOps()


class WALCorruptError(ValueError):
    """Damage to acknowledged data in the log (not a torn tail); the message names file and offset."""


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The JSON bytes of one log operation (strict JSON, UTF-8).

    Raises
    ------
    ValueError
        Not encodable: a lone surrogate (UnicodeEncodeError), NaN, a value that is not JSON.
    """
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    if len(data) > MAX_FRAME:
        raise ValueError(f"a log record of {len(data)} bytes is over the limit of {MAX_FRAME}")
    return data


#: First bytes of a binary payload (a JSON payload starts with "{").
BINARY = b"\x00gB1"
_BHEAD = struct.Struct("<4sI")  # magic, header length


def encode_binary(meta: dict[str, Any], blobs: list[Any]) -> bytes:
    """A binary payload: ``meta`` (JSON values) and raw byte sections ``blobs`` (bytes-like), in order.

    Raises
    ------
    ValueError
        ``meta`` is not strict JSON, or the payload is over :data:`MAX_FRAME`.
    """
    views = [memoryview(b).cast("B") for b in blobs]
    head = json.dumps({**meta, "_blobs": [v.nbytes for v in views]}, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")
    data = b"".join([_BHEAD.pack(BINARY, len(head)), head, *views, b"}"])
    if len(data) > MAX_FRAME:
        raise ValueError(f"a log record of {len(data)} bytes is over the limit of {MAX_FRAME}")
    return data


def decode_binary(body: bytes) -> dict[str, Any]:
    """The header of a binary payload, its raw sections (bytes) under ``"_blobs"``.

    Raises
    ------
    ValueError
        Not a well-formed binary payload.
    """
    magic, hl = _BHEAD.unpack_from(body, 0)
    if magic != BINARY:
        raise ValueError("not a binary payload")
    meta = json.loads(body[_BHEAD.size:_BHEAD.size + hl].decode("utf-8"))
    sizes = meta.pop("_blobs", None) if isinstance(meta, dict) else None
    if not isinstance(sizes, list):
        raise ValueError("a binary payload without its sections")  # noqa: TRY004 - damage, read as ValueError
    pos, blobs = _BHEAD.size + hl, []
    for n in sizes:
        if not isinstance(n, int) or n < 0:
            raise ValueError("a bad section length")
        blobs.append(body[pos:pos + n])
        pos += n
    if pos + 1 != len(body) or body[-1:] != b"}":
        raise ValueError("a binary payload whose sections do not fill it")
    meta["_blobs"] = blobs
    return meta


def _payload(body: bytes) -> Any:
    """A frame's payload read: JSON, or a binary payload (:func:`decode_binary`)."""
    if body[:4] == BINARY:
        return decode_binary(body)
    return json.loads(body.decode("utf-8"))


def frame_bytes(seq: int, data: bytes) -> bytes:
    """One framed payload (format version 2: see the module docstring)."""
    head = _HEAD.pack(MAGIC, seq, len(data), 0)[:16]
    fcrc = zlib.crc32(data, zlib.crc32(head))
    head20 = head + struct.pack("<I", fcrc)
    return head20 + _HCRC.pack(zlib.crc32(head20)) + data


def frame(payload: dict[str, Any], seq: int = 1) -> bytes:
    """One framed operation (magic, sequence number, length, checksums, JSON payload)."""
    return frame_bytes(seq, encode_payload(payload))


@dataclass
class Skipped:
    """A byte range replay did not use: [start, end) of ``path``, why, and what it held if known."""

    path: Path
    start: int
    end: int
    reason: str
    seqs: tuple[int, int] | None = None  # first, last sequence number lost (when known)

    def describe(self) -> str:
        lost = ""
        if self.seqs is not None:
            a, b = self.seqs
            lost = f"; sequence numbers {a} to {b} lost" if b > a else f"; sequence number {a} lost"
        return f"{self.path}: bytes {self.start}..{self.end} ({self.end - self.start} bytes): {self.reason}{lost}"


@dataclass
class ReadResult:
    """What :func:`read_segment` found: the header, the operations, and where the good frames end.

    Attributes
    ----------
    header : the header frame's payload ({} when the header itself was torn)
    ops : the operations, in order
    good_end : byte offset after the last frame kept
    torn_bytes : bytes of a torn tail after ``good_end`` (0: none)
    version : the segment's format version (1 or 2)
    first_seq, last_seq : sequence numbers of the first and last frame kept (version 2; None otherwise)
    skipped : byte ranges skipped by a salvage (damage), in order
    """

    header: dict[str, Any]
    ops: list[dict[str, Any]]
    good_end: int
    torn_bytes: int
    version: int = VERSION
    first_seq: int | None = None
    last_seq: int | None = None
    skipped: list[Skipped] = field(default_factory=list)


def _damage(path: Path, pos: int, size: int, what: str) -> WALCorruptError:
    return WALCorruptError(
        f"{path}: {what} at byte {pos} of {size}: this is damage to acknowledged writes, not a torn "
        "append. Nothing was changed. Restore the file from a backup, or start with `gpuir serve --salvage`, "
        "which keeps every intact frame, logs each byte range it skips, and sets the file aside "
        f"as {path.name}{DAMAGED_SUFFIX}")


def _parse_v2(data: bytes, pos: int, size: int) -> tuple[str, int, int, Any] | None:
    """The frame at ``pos``: None when valid-and-complete is impossible to tell (see callers).

    Returns (status, seq, end, payload) with status one of "ok", "short-header",
    "bad-header", "too-large", "incomplete", "bad-checksum", "zero-filled", "not-json".
    """
    if size - pos < HEADER_BYTES:
        return "short-header", -1, size, None
    magic, seq, n, fcrc = _HEAD.unpack_from(data, pos)
    (hcrc,) = _HCRC.unpack_from(data, pos + _HEAD.size)
    if magic != MAGIC or zlib.crc32(data[pos:pos + _HEAD.size]) != hcrc:
        return "bad-header", -1, size, None
    if n > MAX_FRAME:
        return "too-large", seq, size, None
    end = pos + HEADER_BYTES + n
    if end > size:
        return "incomplete", seq, end, None
    body = data[pos + HEADER_BYTES:end]
    if zlib.crc32(body, zlib.crc32(data[pos:pos + 16])) != fcrc:
        return ("zero-filled" if n and body[-1] == 0 else "bad-checksum"), seq, end, None
    try:
        obj = _payload(body)
    except (UnicodeDecodeError, ValueError, RecursionError, struct.error, TypeError):
        return "not-json", seq, end, None
    return "ok", seq, end, obj


_WHAT = {
    "short-header": "a partial frame header",
    "bad-header": "a damaged frame header (its checksum fails: the length cannot be trusted)",
    "too-large": "a frame longer than the limit",
    "incomplete": "a frame running past the end of the file",
    "bad-checksum": "a complete frame whose checksum fails",
    "zero-filled": "a complete frame whose checksum fails",
    "not-json": "a frame whose payload cannot be read (neither JSON nor a well-formed binary payload)",
}


def _resync(data: bytes, pos: int, size: int, after_seq: int | None) -> int:
    """Offset of the next intact frame after ``pos`` (``size`` when none)."""
    p = data.find(MAGIC, pos + 1)
    while p >= 0:
        st, seq, _, _ = _parse_v2(data, p, size)
        if st == "ok" and (after_seq is None or seq > after_seq):
            return p
        p = data.find(MAGIC, p + 1)
    return size


def read_segment(path: Path, allow_torn_tail: bool, salvage: bool = False, fmt: str = FORMAT) -> ReadResult:
    """Parse one log segment.

    Parameters
    ----------
    path : the segment file
    allow_torn_tail : bool
        True for the newest segment: an incomplete last frame is a torn (never
        acknowledged) append and is reported in ``torn_bytes``, not raised.
    salvage : bool
        Keep every intact frame: damage is skipped (reported in ``skipped``), not raised.
    fmt : str
        The format its header must name (:data:`FORMATS`).

    Raises
    ------
    WALCorruptError
        Damage (see the module docstring), unless ``salvage``.
    """
    data = path.read_bytes()
    size = len(data)
    if size >= _V1.size and data[:4] != MAGIC and _V1.unpack_from(data, 0)[0] < (1 << 20):
        return _read_v1(path, data, salvage)
    pos = 0
    frames: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    torn = 0
    first = last = None
    while pos < size:
        st, seq, end, obj = _parse_v2(data, pos, size)
        if st == "ok" and last is not None and seq != last + 1:
            if not salvage:
                raise _damage(path, pos, size, f"sequence number {seq} after {last} (frames missing or repeated)")
            if seq <= last:  # a repeated frame: skip it
                skipped.append(Skipped(path, pos, end, f"a repeated frame (sequence number {seq})"))
                pos = end
                continue
            if not (skipped and skipped[-1].end == pos and skipped[-1].seqs == (last + 1, seq - 1)):
                skipped.append(Skipped(path, pos, pos, "a gap in the sequence numbers", (last + 1, seq - 1)))
        if st == "ok":
            frames.append(obj)
            first = seq if first is None else first
            last = seq
            pos = end
            continue
        is_torn = (st in ("short-header", "incomplete") or (st == "zero-filled" and end == size)
                   or (st == "bad-header" and not any(data[pos:])))
        if is_torn and allow_torn_tail:
            torn = size - pos
            break
        if not salvage:
            raise _damage(path, pos, size, _WHAT[st] + (" in an older log segment" if is_torn else ""))
        nxt = _resync(data, pos, size, last)
        lost = None
        if nxt < size:
            nseq = _parse_v2(data, nxt, size)[1]
            if last is not None and nseq > last + 1:
                lost = (last + 1, nseq - 1)
        elif seq >= 0:
            lost = (seq, seq)
        skipped.append(Skipped(path, pos, nxt, _WHAT[st], lost))
        pos = nxt
    good_end = size - torn
    if frames and _is_header(frames[0], VERSION, fmt):
        return ReadResult(frames[0], frames[1:], good_end, torn, VERSION, first, last, skipped)
    if not frames and (good_end == 0 or salvage):
        return ReadResult({}, [], good_end, torn, VERSION, None, None, skipped)
    if not salvage:
        raise WALCorruptError(f"{path}: not a {fmt} version {VERSION} log (its first frame is not a log "
                              f"header: {frames[0]!r:.200})")
    # salvage, the header lost: keep the frames that are operations (the segment is taken as live)
    ops = [f for f in frames if isinstance(f, dict) and f.get("op") in ("add", "delete", "put")]
    skipped.append(Skipped(path, 0, 0, f"the segment's header frame is lost: its {len(ops)} intact "
                                       "operation(s) are replayed as the newest"))
    return ReadResult({}, ops, good_end, torn, VERSION, first, last, skipped)


def _is_header(obj: Any, version: int, fmt: str = FORMAT) -> bool:
    return (isinstance(obj, dict) and obj.get("format") == fmt and obj.get("version") == version
            and isinstance(obj.get("base_generation"), int))


def _read_v1(path: Path, data: bytes, salvage: bool) -> ReadResult:
    """A segment of format version 1: strict (any incomplete or bad frame is damage), or salvaged."""
    pos, size = 0, len(data)
    frames: list[dict[str, Any]] = []
    skipped: list[Skipped] = []
    while pos < size:
        bad = None
        if size - pos < _V1.size:
            bad, end = "a partial frame header", size
        else:
            n, crc = _V1.unpack_from(data, pos)
            end = pos + _V1.size + n
            if n > MAX_FRAME or end > size:
                bad, end = "a frame running past the end of the file", size
            elif zlib.crc32(data[pos + _V1.size:end]) != crc:
                bad = "a checksum mismatch"
            else:
                try:
                    frames.append(json.loads(data[pos + _V1.size:end].decode("utf-8")))
                except (UnicodeDecodeError, ValueError, RecursionError):
                    bad = "a frame that is not JSON"
        if bad is not None:
            if not salvage:
                raise WALCorruptError(
                    f"{path}: {bad} at byte {pos} of {size} in a version-1 log (written by an older gpuir). "
                    "Version-1 frames carry no header checksum, so a torn append cannot be told from damage "
                    "to acknowledged writes there: nothing was changed. Start with `gpuir serve --salvage` to "
                    "keep every intact frame (the file is then set aside), or restore it from a backup")
            skipped.append(Skipped(path, pos, end, bad + " (version-1 log)"))
        pos = end
    if not frames or not _is_header(frames[0], 1):
        if salvage:
            skipped.append(Skipped(path, 0, 0, "no version-1 log header"))
            return ReadResult({}, [], size, 0, 1, None, None, skipped)
        raise WALCorruptError(f"{path}: not a {FORMAT} log (no header frame)")
    return ReadResult(frames[0], frames[1:], size, 0, 1, None, None, skipped)


def segments(root: Path, kind: str = "service") -> list[tuple[int, Path]]:
    """The log segments of the ``kind`` of log in ``root``, oldest first: (number, path)."""
    out = []
    name = _NAMES[kind]
    for p in root.iterdir():
        m = name.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def segment_name(number: int, kind: str = "service") -> str:
    """The file name of log segment ``number`` of the ``kind`` of log (``service-wal-00000007.log``)."""
    return f"{kind}-wal-{number:08d}.log"


def _create_private(path: Path) -> int:
    """Create ``path`` (it must not exist) with mode 0600 whatever the umask; returns a write fd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if hasattr(os, "fchmod"):  # POSIX: the umask may have removed bits the mode asked for
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` (short writes continued; errors raised)."""
    view = memoryview(data)
    while view:
        if hasattr(os, "pwrite"):
            n = io.pwrite(fd, view, offset)
        else:  # pragma: no cover - Windows
            os.lseek(fd, offset, os.SEEK_SET)
            n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - pwrite raises instead on every platform we know
            raise OSError(_errno.EIO, "short write")
        view = view[n:]
        offset += n


@dataclass
class Recovery:
    """What :meth:`WriteAheadLog.recover` did, for the log and for the operator.

    Attributes
    ----------
    ops : the operations to replay, oldest first
    torn : torn tails truncated (each a :class:`Skipped`)
    skipped : damaged ranges skipped by a salvage
    upgraded : version-1 segments read (to be folded by a checkpoint)
    folded : segments deleted because a save already holds them
    needs_checkpoint : the service must checkpoint before it accepts writes
        (a version-1 or salvaged segment is never appended to)
    """

    ops: list[dict[str, Any]]
    torn: list[Skipped] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    upgraded: list[Path] = field(default_factory=list)
    folded: list[Path] = field(default_factory=list)
    needs_checkpoint: bool = False


class WriteAheadLog:
    """The appending side of the log (one writer: appends, roll-backs and rotations are serialised by the
    caller; :meth:`sync` may run from any thread, beside them: the group commit).

    Parameters
    ----------
    root : the memory directory
    kind : {"service", "memory"}
        Which log: the service's and a shard's (``service-wal-*.log``), or a
        :class:`~gpuir.memory.Memory`'s own (``memory-wal-*.log``).

    Group commit: :meth:`write_payloads` appends frames without syncing (under
    the writer's lock); :meth:`sync` then makes everything written so far
    durable with one ``fsync``, which covers every writer whose frames were
    written before it began -- concurrent writers share the fsync.
    """

    def __init__(self, root: Path, kind: str = "service"):
        if kind not in FORMATS:
            raise ValueError(f"kind must be one of {', '.join(FORMATS)}, got {kind!r}")
        self.kind = kind
        self.format = FORMATS[kind]
        self.root = Path(root)
        self._sync_lock = threading.Lock()
        self.synced = (0, 0)  # (segment number, byte offset) up to which the log is known durable
        self._fd: int | None = None
        self.number = 0
        self.bytes = 0  # end of the last good frame of the open segment
        self.ops = 0  # operations (records) not yet folded by a save
        self.seq = 0  # sequence number of the last frame written
        self._dirty = False  # a failed append may have left bytes after self.bytes
        self._pending_base: int | None = None  # a save committed but its new segment is not created yet
        self._set_aside: set[Path] = set()

    # ------------------------------------------------------------------ start
    def recover(self, generation: int, salvage: bool = False, append: bool = True) -> Recovery:
        """The operations to replay over the memory saved at ``generation``, oldest first.

        Deletes the segments already folded into that save, truncates a torn
        tail (logged), and leaves the newest segment open for appending, or
        starts one -- unless a version-1 or salvaged segment was read: then
        ``needs_checkpoint`` is set and the caller checkpoints (which starts a
        new segment) before any append. Nothing on disk changes before every
        segment was read, so a refusal leaves every file as it was.

        ``append=False`` (an older log being folded into a memory that keeps its own: nothing will be
        appended) only reads and drops: no segment is opened or started, and a torn tail is left as it is
        (the caller deletes the segments once a save holds their operations).

        Raises
        ------
        WALCorruptError
            Damage to acknowledged writes (unless ``salvage``), or a log whose
            base generation does not meet the memory's.
        """
        segs = segments(self.root, self.kind)
        rec = Recovery([])
        live, folded = [], []
        for i, (num, path) in enumerate(segs):
            newest = i == len(segs) - 1
            try:
                r = read_segment(path, allow_torn_tail=newest, salvage=salvage, fmt=self.format)
            except WALCorruptError:
                # damage in a segment a save already holds loses nothing: keep it to look at, go on
                r = read_segment(path, allow_torn_tail=newest, salvage=True, fmt=self.format)
                if not (r.header and int(r.header["base_generation"]) < generation):
                    raise
            if r.header and int(r.header["base_generation"]) < generation:
                folded.append((num, path, r))
            else:
                live.append((num, path, r))
        bases = [int(r.header["base_generation"]) for _, _, r in live if r.header]
        if bases and bases[0] != generation:
            raise WALCorruptError(
                f"{live[0][1]}: the log continues the memory's generation {bases[0]}, but the memory's "
                f"committed generation is {generation}: the operations in between are missing (was CURRENT "
                f"pointed at an older manifest?). Nothing was changed: point {self.root / 'CURRENT'} at "
                f"manifest-{bases[0]:08d}.json if that file is there")
        if any(b < a for a, b in itertools.pairwise(bases)):
            raise WALCorruptError(f"{self.root}: log segments out of order (base generations {bases})")
        prev = None  # sequence numbers continue from one live segment to the next
        for _num, path, r in live:
            if r.first_seq is not None and prev is not None and prev[1] is not None and r.first_seq != prev[1] + 1:
                gap = Skipped(path, 0, 0, f"sequence numbers jump from {prev[1]} (end of {prev[0].name}) to "
                                          f"{r.first_seq}", (prev[1] + 1, r.first_seq - 1)
                              if r.first_seq > prev[1] + 1 else None)
                if not salvage:
                    raise WALCorruptError(f"{gap.describe()}: frames are missing between two log segments. "
                                          "Nothing was changed; `gpuir serve --salvage` keeps the intact frames")
                r.skipped.append(gap)
            if r.last_seq is not None:
                prev = (path, r.last_seq)
            rec.ops.extend(r.ops)
            rec.skipped.extend(r.skipped)
            if r.skipped:
                self._set_aside.add(path)
            if r.version != VERSION:
                rec.upgraded.append(path)
        for s in rec.skipped:
            log.warning("salvage: skipped %s", s.describe())
        for _, path, r in folded:
            for s in r.skipped:
                log.warning("%s (a segment already folded into the memory: nothing is lost)", s.describe())
        # -- from here on the files change
        for _, path, r in folded:
            if r.skipped:
                self._move_aside(path)
            else:
                log.info("%s: deleted (its operations are in the memory's generation %d)", path, generation)
                path.unlink()
            rec.folded.append(path)
        self.seq = max([r.last_seq for _, _, r in live + folded if r.last_seq is not None], default=0)
        self.ops = sum(_op_size(op) for op in rec.ops)
        if not live:
            if append:
                self._start((segs[-1][0] if segs else 0) + 1, generation)
            fsync_dir(self.root)
            return rec
        num, path, r = live[-1]
        self.number = num
        if r.torn_bytes and not append:
            rec.torn.append(Skipped(path, r.good_end, r.good_end + r.torn_bytes,
                                    "a torn tail (an incomplete last frame, never acknowledged)"))
            log.warning("ignored %s", rec.torn[-1].describe())
        elif r.torn_bytes:
            s = Skipped(path, r.good_end, r.good_end + r.torn_bytes,
                        "a torn tail (an incomplete last frame, never acknowledged)")
            rec.torn.append(s)
            log.warning("dropped %s; the file is truncated to %d bytes", s.describe(), r.good_end)
            with open(path, "r+b") as f:
                f.truncate(r.good_end)
                f.flush()
                io.fsync(f.fileno())
        if not append:
            rec.needs_checkpoint = bool(rec.ops or rec.upgraded or self._set_aside or rec.torn)
        elif rec.upgraded or self._set_aside:
            rec.needs_checkpoint = True  # never append to a version-1 or salvaged segment
        elif not r.header:  # only a torn header: the segment was never used
            log.warning("%s: deleted (it held only a torn header: never used)", path)
            path.unlink()
            self._start(num, generation)
        else:
            self._fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            self.bytes = r.good_end
            self.synced = (num, r.good_end)
        fsync_dir(self.root)
        return rec

    def _move_aside(self, path: Path) -> None:
        dest = path.with_name(path.name + DAMAGED_SUFFIX)
        n = 1
        while dest.exists():
            dest = path.with_name(f"{path.name}{DAMAGED_SUFFIX}.{n}")
            n += 1
        os.replace(path, dest)
        log.warning("%s: set aside as %s (damaged; its intact frames were kept). Delete it when you no longer "
                    "need it", path, dest.name)

    def _start(self, number: int, generation: int) -> None:
        path = self.root / segment_name(number, self.kind)
        seq = self.seq + 1
        data = frame_bytes(seq, encode_payload({"format": self.format, "version": VERSION,
                                                "base_generation": int(generation)}))
        fd = _create_private(path)
        try:
            _write_all(fd, data, 0)
            io.fsync(fd)
            fsync_dir(self.root)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)  # created just now, holds nothing acknowledged
            raise
        with self._sync_lock:  # a concurrent sync never fsyncs a closed (or reused) descriptor
            old = self._fd
            if old is not None:
                io.fsync(old)  # the old segment's frames are durable before writes move on
            self._fd = fd
            if old is not None:
                os.close(old)
            self.number, self.bytes, self.seq = number, len(data), seq
            self.synced = (number, len(data))
        self._dirty = False
        self._pending_base = None

    # ------------------------------------------------------------------ appends
    def _repair(self) -> None:
        """Before an append: finish what a failed append or checkpoint left (or raise: nothing is appended)."""
        if self._pending_base is not None:
            self._start(self.number + 1, self._pending_base)
        if self._fd is None:
            raise RuntimeError("the log is not open (call recover, then checkpoint if it asks)")
        if self._dirty:
            with self._sync_lock:
                io.ftruncate(self._fd, self.bytes)
                io.fsync(self._fd)
            self._dirty = False
            log.info("%s: truncated to %d bytes (the end of the last good frame) after a failed append",
                     self.root / segment_name(self.number, self.kind), self.bytes)

    def append_payloads(self, payloads: list[bytes], ops: int = 0, sync: bool = True) -> tuple[int, int]:
        """Append encoded operations and fsync them (group commit: one fsync for the list).

        Returns the mark to :meth:`rollback` to (the log before this append).
        On any failure the append is rolled back (the file truncated to the
        last good frame, the sequence number restored) and the error raised:
        nothing of it may be acknowledged.
        """
        self._repair()
        mark = (self.bytes, self.seq)
        seq = self.seq
        chunks = []
        for p in payloads:
            seq += 1
            chunks.append(frame_bytes(seq, p))
        data = b"".join(chunks)
        try:
            self._dirty = True  # from here on the file may hold bytes after self.bytes
            _write_all(self._fd, data, self.bytes)
            if sync:
                io.fsync(self._fd)
        except BaseException as e:
            self._undo(mark, e)
            raise
        self._dirty = False
        self.bytes += len(data)
        self.seq = seq
        self.ops += ops
        if sync:
            self.synced = (self.number, self.bytes)
        return mark

    def write_payloads(self, payloads: list[bytes], ops: int = 0) -> tuple[int, int]:
        """Append encoded operations without syncing them (the first half of a group commit).

        The bytes are in the operating system's cache when this returns: they
        survive the process's crash (``kill -9``), not a power cut, until
        :meth:`sync`. Returns the mark to :meth:`rollback` to; a failed write is
        rolled back and raised, as by :meth:`append_payloads`.
        """
        return self.append_payloads(payloads, ops, sync=False)

    @property
    def end(self) -> tuple[int, int]:
        """(segment number, byte offset) of the end of what was written: what :meth:`sync` must cover."""
        return (self.number, self.bytes)

    def sync(self, upto: tuple[int, int] | None = None) -> None:
        """Make the log durable up to ``upto`` (default: everything written), with one ``fsync`` shared by
        every writer waiting (group commit). Raises the ``fsync``'s error: then nothing after the last
        successful sync may be taken as durable."""
        with self._sync_lock:
            if upto is not None and self.synced >= upto:
                return  # another writer's fsync covered these bytes
            if self._fd is None:
                raise RuntimeError("the log is closed")
            covered = (self.number, self.bytes)  # written completely before this fsync starts
            io.fsync(self._fd)
            self.synced = max(self.synced, covered)

    def cut_to_synced(self) -> None:
        """After a failed :meth:`sync`: remove every byte after the last successful sync (frames no writer was
        told are durable). The cut is synced when the disk allows; if not, the next successful sync of the
        file (before any later frame is acknowledged) makes it durable. Raises OSError when the file cannot
        be cut."""
        with self._sync_lock:
            if self._fd is None or self.synced[0] != self.number:
                raise OSError(_errno.EIO, "the log's last durable point is not in its open segment")
            io.ftruncate(self._fd, self.synced[1])
            self.bytes = self.synced[1]
            self._dirty = False
            path = self.root / segment_name(self.number, self.kind)
            try:
                io.fsync(self._fd)
            except OSError as e:
                log.warning("%s: cut back to %d bytes after a failed fsync; syncing the cut failed too (%s): the "
                            "next successful sync makes it durable", path, self.bytes, e)
                return
            log.warning("%s: cut back to %d bytes (its last durable frame) after a failed fsync", path, self.bytes)

    def append(self, ops: list[dict[str, Any]]) -> None:
        """Append operations (dicts) and fsync them."""
        self.append_payloads([encode_payload(op) for op in ops], sum(_op_size(op) for op in ops))

    def _undo(self, mark: tuple[int, int], cause: BaseException | None) -> None:
        self.bytes, self.seq = mark
        try:
            with self._sync_lock:
                io.ftruncate(self._fd, self.bytes)
                io.fsync(self._fd)
                if self.synced[0] == self.number and self.synced[1] > self.bytes:
                    self.synced = (self.number, self.bytes)
            self._dirty = False
            log.warning("%s: append failed (%s); rolled back to %d bytes (the last good frame)",
                        self.root / segment_name(self.number, self.kind), cause, self.bytes)
        except OSError as e:  # the next append tries again first; until then nothing is appended
            log.error("%s: append failed (%s) and the roll-back failed too (%s); the next append retries it",
                      self.root / segment_name(self.number, self.kind), cause, e)

    def rollback(self, mark: tuple[int, int], ops: int = 0) -> None:
        """Remove what was appended since ``mark`` (an append whose operations could not be applied)."""
        self._dirty = True
        self._undo(mark, RuntimeError("its operations could not be applied"))
        self.ops -= ops

    # ------------------------------------------------------------------ checkpoints
    def after_save(self, generation: int) -> list[Path]:
        """After ``Memory.save`` committed ``generation``: start its segment; returns the older segments.

        If the new segment cannot be created, the error is raised and appends
        are blocked (each first retries creating it): an operation appended to
        the old segment would be dropped as "already saved" at the next start.
        """
        older = [p for _, p in segments(self.root, self.kind)]
        self._pending_base = int(generation)
        self.ops = 0
        self._start(self.number + 1, generation)
        return older

    def rotate(self, next_generation: int) -> list[Path]:
        """Start a new segment for ``next_generation`` (the old checkpoint order); returns the older segments."""
        older = [p for _, p in segments(self.root, self.kind)]
        self.ops = 0
        self._start(self.number + 1, next_generation)
        return older

    def drop(self, paths: list[Path]) -> None:
        """Delete segments folded into a committed save (a damaged one is set aside, never deleted)."""
        for p in paths:
            try:
                if p in self._set_aside:
                    self._move_aside(p)
                    self._set_aside.discard(p)
                else:
                    p.unlink()
            except FileNotFoundError:
                pass

    def close(self, sync: bool = False) -> None:
        """Close the open segment (``sync``: fsync it first)."""
        with self._sync_lock:
            if self._fd is not None:
                try:
                    if sync:
                        io.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None


def _op_size(op: dict[str, Any]) -> int:
    if isinstance(op.get("n"), int):  # (a binary payload names its count)
        return op["n"]
    return len(op.get("records") or op.get("ids") or op.get("seqs") or ())


def read_log(root: Path, generation: int, kind: str = "memory") -> list[dict[str, Any]]:
    """The operations a *reader* replays over the memory saved at ``generation``, oldest first; nothing on
    disk changes (a torn tail of the newest segment is ignored, not truncated: a writer may be appending).

    Raises
    ------
    FileNotFoundError
        A segment vanished while it was read (a writer's checkpoint folded it): read the manifest again
        and retry.
    WALCorruptError
        Damage to acknowledged writes, or a log that does not continue ``generation`` (a newer commit
        appeared since the manifest was read: read it again and retry).
    """
    segs = segments(root, kind)
    ops: list[dict[str, Any]] = []
    first = True
    for i, (_, path) in enumerate(segs):
        r = read_segment(path, allow_torn_tail=i == len(segs) - 1, fmt=FORMATS[kind])
        base = int(r.header["base_generation"]) if r.header else None
        if base is not None and base < generation:
            continue
        if first and base is not None and base != generation:
            raise WALCorruptError(f"{path}: the log continues generation {base}, not {generation}")
        first = False
        ops.extend(r.ops)
    return ops
