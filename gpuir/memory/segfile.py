"""Segment files that can be memory-mapped: an ordinary ``.npz`` with aligned, uncompressed members.

A memory's segment file (``seg-<uid>.npz``) is what ``np.savez`` writes -- a zip
archive of ``.npy`` members, stored uncompressed -- so ``np.load`` (and any
older gpuir) reads it. :func:`write_npz` additionally places every member's array
data at a multiple of :data:`ALIGN` bytes from the start of the file: the zip
local header's extra field carries the padding (header ID ``0xD935``, the one
Android's ``zipalign`` uses; zip readers skip extra fields they do not know).

:class:`MappedNpz` opens such a file without reading its arrays: it parses the
zip directory and each member's ``.npy`` header (a few hundred bytes per member)
and maps the file once (``mmap``, read-only). :meth:`MappedNpz.array` returns a
read-only NumPy view of one member's data in that mapping, so the process's
memory grows only with the pages a search actually touches, and the OS may drop
them again under pressure (they are clean file pages). A member whose data is
not aligned (a file written by ``np.savez``) is copied into memory when first
used instead, so every array a scorer sees is aligned.

**Integrity: every byte is checked before it is used.** The bytes of a file
fall in two kinds. Each member's data (its ``.npy`` header and array) carries
the CRC-32 the zip format keeps for it: with ``check=True``,
:meth:`MappedNpz.array` verifies it the first time the member is used (once per
open file, thread-safe) and raises :class:`SegmentFileError` on a mismatch,
before any caller sees the data. Everything else -- the zip's local headers,
central directory and end records, a few hundred bytes per member -- is the
file's *layout*: :attr:`MappedNpz.layout_sha256` hashes it when the file is
opened, and the memory compares it with the digest its manifest recorded when
the file was written (:func:`layout_digest`). The full sha256 of the file (also
in the manifest) is checked by ``Memory.open(path, verify="full")`` and
``gpuir memory verify``.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import re
import struct
import threading
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from numpy.lib import format as npy_format

#: Byte alignment of every member's array data in files written by :func:`write_npz`.
ALIGN = 64
#: Zip extra-field header ID of the alignment padding (as Android's zipalign).
PAD_ID = 0xD935
_LOCAL_SIG = b"PK\x03\x04"


class SegmentFileError(ValueError):
    """A segment file is damaged: its zip structure, an ``.npy`` header or a member's CRC-32."""


def _npy_header(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    d = npy_format.header_data_from_array_1_0(arr)
    try:
        npy_format.write_array_header_1_0(buf, d)
    except ValueError:  # a header over 64 KiB (never for a segment's 1-d arrays)
        buf = io.BytesIO()
        npy_format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def write_npz(f: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to the seekable binary file ``f`` as an ``.npz`` whose members' data are aligned.

    Parameters
    ----------
    f : binary file open for writing, positioned at 0, seekable
    arrays : dict name -> ndarray (host; any shape; no object dtype)
    """
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in arrays.items():
            arr = np.ascontiguousarray(a)
            if arr.dtype.hasobject:
                raise TypeError(f"array {name!r} has an object dtype; segment files hold plain arrays")
            hdr = _npy_header(arr)
            zi = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_STORED
            zi.file_size = len(hdr) + arr.nbytes
            offset = f.tell()  # where zipfile writes this member's local header
            # local header: 30 fixed bytes, the name, our extra field (4 + pad), zip64's (20: forced below)
            base = 30 + len(zi.filename.encode("utf-8")) + 4 + 20
            pad = (-(offset + base + len(hdr))) % ALIGN
            zi.extra = struct.pack("<HH", PAD_ID, pad) + bytes(pad)
            with zf.open(zi, "w", force_zip64=True) as w:
                w.write(hdr)
                if arr.nbytes:
                    w.write(memoryview(arr.reshape(-1)).cast("B"))


_HEADER = re.compile(r"\{'descr': '([<>|=]?[A-Za-z]\d*)', 'fortran_order': (True|False), "
                     r"'shape': \((\d*(?:, ?\d+)*,?)\), \}[ ]*\n")


def _read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran, dtype, header bytes) of the ``.npy`` header at ``f``'s position (which it moves).

    The headers NumPy writes are matched directly; anything else goes to NumPy's own parser.
    """
    pos = f.tell()
    head = f.read(12)
    if len(head) < 10 or head[:6] != b"\x93NUMPY":
        raise ValueError("not an .npy header")
    major = head[6]
    if major == 1:
        hl, off = struct.unpack("<H", head[8:10])[0], 10
    else:
        hl, off = struct.unpack("<I", head[8:12])[0], 12
    f.seek(pos + off)
    text = f.read(hl)
    m = _HEADER.fullmatch(text.decode("latin1"))
    if m is not None:
        shape = tuple(int(x) for x in m.group(3).replace(" ", "").split(",") if x)
        return shape, m.group(2) == "True", np.dtype(m.group(1)), off + hl
    f.seek(pos)  # unusual: NumPy's parser
    version = npy_format.read_magic(f)
    reader = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
    shape, fortran, dtype = reader(f)
    return tuple(shape), fortran, dtype, f.tell() - pos


class _Member:
    __slots__ = ("crc", "data_off", "dtype", "fortran", "nbytes", "shape", "size", "start")

    def __init__(self, start, size, crc, data_off, shape, dtype, fortran):
        self.start, self.size, self.crc = start, size, crc
        self.data_off, self.shape, self.dtype, self.fortran = data_off, shape, dtype, fortran
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


class MappedNpz:
    """A read-only, memory-mapped ``.npz`` (see the module docstring).

    Parameters
    ----------
    path : path of the file
    check : bool
        Verify each member's CRC-32 the first time :meth:`array` returns it.

    Raises
    ------
    SegmentFileError
        Not a zip of ``.npy`` members, a compressed member, an ``.npy`` header
        that does not fit its member, or an object dtype.
    OSError
        The file cannot be opened or mapped.
    """

    def __init__(self, path: str | os.PathLike, check: bool = True):
        self.path = Path(path)
        self.check = check
        self._lock = threading.Lock()
        self._checked: set[str] = set()
        self._cache: dict[str, np.ndarray] = {}
        members: dict[str, _Member] = {}
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            try:
                with zipfile.ZipFile(f) as zf:
                    infos = zf.infolist()
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error) as e:
                raise SegmentFileError(f"not a readable zip archive ({type(e).__name__}: {e})") from None
            for zi in infos:
                name = zi.filename.removesuffix(".npy")
                if zi.compress_type != zipfile.ZIP_STORED:
                    raise SegmentFileError(f"member {zi.filename!r} is compressed; segment files are stored")
                f.seek(zi.header_offset)
                lh = f.read(30)
                if len(lh) != 30 or lh[:4] != _LOCAL_SIG:
                    raise SegmentFileError(f"member {zi.filename!r}: bad local header")
                n_name, n_extra = struct.unpack("<HH", lh[26:30])
                start = zi.header_offset + 30 + n_name + n_extra
                if start + zi.file_size > size:
                    raise SegmentFileError(f"member {zi.filename!r} runs past the end of the file")
                f.seek(start)
                try:
                    shape, fortran, dtype, hlen = _read_npy_header(f)
                except (ValueError, OSError, SyntaxError, EOFError, TypeError) as e:
                    raise SegmentFileError(f"member {zi.filename!r}: bad .npy header ({e})") from None
                if dtype.hasobject:
                    raise SegmentFileError(f"member {zi.filename!r} has an object dtype")
                m = _Member(start, zi.file_size, zi.CRC, start + hlen, tuple(shape), dtype, fortran)
                if m.data_off - start + m.nbytes != zi.file_size:
                    raise SegmentFileError(f"member {zi.filename!r}: its .npy header does not match its size")
                members[name] = m
            self._members = members
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            self.size = size
        #: sha256 of every byte outside the members' data (see the module docstring).
        self.layout_sha256 = self._layout_sha256()

    def _layout_sha256(self) -> str:
        h = hashlib.sha256()
        pos = 0
        mv = memoryview(self._mm) if self._mm is not None else memoryview(b"")
        for m in sorted(self._members.values(), key=lambda m: m.start):
            if m.start < pos:
                raise SegmentFileError("members overlap")
            h.update(mv[pos: m.start])
            pos = m.start + m.size
        h.update(mv[pos: self.size])
        return h.hexdigest()

    @property
    def names(self) -> list[str]:
        return list(self._members)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def shape(self, name: str) -> tuple[int, ...]:
        return self._members[name].shape

    def aligned(self, name: str) -> bool:
        """Whether member ``name``'s data can be mapped in place (aligned for its dtype)."""
        m = self._members[name]
        return m.data_off % max(m.dtype.alignment, 1) == 0

    def verify(self, name: str) -> None:
        """Check member ``name``'s CRC-32 (once; raises :class:`SegmentFileError` on a mismatch)."""
        if name in self._checked:
            return
        m = self._members[name]
        crc = zlib.crc32(memoryview(self._mm)[m.start: m.start + m.size]) if m.size else 0
        if crc != m.crc:
            raise SegmentFileError(f"member {name!r}: damaged (CRC-32 mismatch)")
        self._checked.add(name)

    def array(self, name: str) -> np.ndarray:
        """Member ``name`` as a read-only array (a view of the mapping, or a copy when unaligned).

        Raises
        ------
        KeyError
            No such member.
        SegmentFileError
            ``check`` and the member's CRC-32 does not match.
        """
        a = self._cache.get(name)
        if a is not None:
            return a
        with self._lock:
            a = self._cache.get(name)
            if a is not None:
                return a
            m = self._members[name]
            if self.check:
                self.verify(name)
            count = m.nbytes // m.dtype.itemsize if m.dtype.itemsize else 0
            if m.nbytes == 0:
                a = np.zeros(m.shape, dtype=m.dtype)
            else:
                a = np.frombuffer(self._mm, dtype=m.dtype, count=count, offset=m.data_off)
                a = a.reshape(m.shape, order="F" if m.fortran else "C")
                if not a.flags.aligned:
                    a = a.copy()
            a.flags.writeable = False
            self._cache[name] = a
            return a

    def read_all(self) -> dict[str, np.ndarray]:
        """Every member (mapped where aligned)."""
        return {n: self.array(n) for n in self._members}

    def mapped_bytes(self) -> int:
        return len(self._mm) if self._mm is not None else 0

    def __repr__(self) -> str:
        return f"MappedNpz({str(self.path)!r}, members={len(self._members)})"


def layout_digest(path: str | os.PathLike) -> str:
    """The :attr:`MappedNpz.layout_sha256` of a file (what a manifest records when the file is written)."""
    return MappedNpz(path, check=False).layout_sha256


def members_info(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Per member: data offset, dtype, shape (for tests and tools)."""
    mz = MappedNpz(path, check=False)
    return {n: {"data_offset": m.data_off, "dtype": str(m.dtype), "shape": m.shape}
            for n, m in mz._members.items()}
