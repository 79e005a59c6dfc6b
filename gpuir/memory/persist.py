"""The memory directory: checksummed segment files, a checksummed manifest, atomic commits.

Layout of ``MEMORY_DIR``::

    .gpuir                     marker: a gpuir "memory" store (gpuir.storage.dirlock)
    .gpuir.lock                the writers' OS lock (never deleted)
    CURRENT                    one line: the name of the committed manifest
    manifest-<gen>.json        configuration, counters, every segment with its file's sha256 and
                               size, its deletions file; the manifest's own sha256 over the rest
    seg-<uid>.npz              one immutable segment (an uncompressed .npz whose arrays are aligned so
                               that they can be memory-mapped: gpuir.memory.segfile; never rewritten)
    del-<uid>-<gen>.npy        the deleted rows of a segment (int64, ascending), as of save <gen>
    history-<gen>.jsonl        records' earlier versions (gpuir.memory.history), as of save <gen>

**Incremental.** A save writes the segments not yet on disk and a deletions file
for each segment whose deletions changed since the last save; everything else
is referenced again, unchanged.

**Atomic.** Every file is written under a temporary name (``.tmp-*``), flushed
and fsynced, then renamed; the manifest likewise; the commit is the
``os.replace`` of ``CURRENT`` (then the directory is fsynced). A process killed
at any moment leaves ``CURRENT`` naming the previous manifest, whose files are
all still there: files are removed only after a commit, and only those
referenced by neither the new manifest nor the one before it (a reader that
read ``CURRENT`` just before the commit can still load). Only files whose names
follow these patterns are ever removed, and only inside a directory carrying
gpuir's marker.

**Checked.** Opening verifies the manifest's checksum and each file's size and
structure (the zip directory and every array header of a segment file) and
the sha256 of each segment file's layout (every byte outside its arrays' data),
reads the deletions files whole (checked against their sha256), and maps the
segment files; each array of a segment file is checked against its CRC-32 the
first time it is read (:mod:`gpuir.memory.segfile`), before any search sees it.
``verify="full"`` (and :func:`verify_dir`, behind ``gpuir memory verify``) also
checks every file's sha256, reading every byte. A damaged or missing file
raises :class:`MemoryFormatError` naming it.

**Never silently empty.** A directory holding a memory's segments or manifests
without ``CURRENT`` is damaged, not absent: :func:`read_manifest` and
:func:`check_not_orphaned` raise :class:`MemoryFormatError` naming the newest
manifest and how to restore it, and no save is made over it.

**Private.** Every file is created with mode 0600 (:data:`FILE_MODE`, set on the
open descriptor, whatever the umask); ``Memory.save`` claims a directory with
mode 0700 (:data:`DIR_MODE`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.files import fsync_dir, sha256_file
from .segfile import MappedNpz, SegmentFileError, layout_digest, write_npz

FORMAT = "gpuir-memory"
FORMAT_VERSION = 1
CURRENT = "CURRENT"
_OWNED = re.compile(r"^(seg-\d{8}\.npz|del-\d{8}-\d{8}\.npy|history-\d{8}\.jsonl|manifest-\d{8}\.json|\.tmp-.*)$")


class MemoryFormatError(ValueError):
    """A memory directory is missing, damaged or of another format; the message names the file."""


#: Mode of every file a memory writes (owner read and write only), whatever the umask.
FILE_MODE = 0o600
#: Mode of a memory directory gpuir creates or claims (owner only), whatever the umask.
DIR_MODE = 0o700
_STATE = re.compile(r"^(seg-\d{8}\.npz|del-\d{8}-\d{8}\.npy|history-\d{8}\.jsonl|manifest-\d{8}\.json)$")


def open_private(path: Path):
    """``open(path, "xb")`` with mode 0600 whatever the umask (a new file; it must not exist)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if hasattr(os, "fchmod"):  # POSIX: the umask may have removed bits the mode asked for
            os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def state_files(root: Path) -> list[str]:
    """The names of a memory's committed-state files in ``root`` (manifests, segments, deletions), sorted."""
    try:
        return sorted(p.name for p in root.iterdir() if _STATE.match(p.name))
    except FileNotFoundError:
        return []


def orphan_message(root: Path, files: list[str]) -> str:
    """Why a directory holding a memory's files but no ``CURRENT`` is damaged, and what to do."""
    manifests = [f for f in files if f.startswith("manifest-")]
    hint = (f" The newest manifest there is {manifests[-1]}: if it is the last commit, restore it with "
            f"`echo {manifests[-1]} > {root / CURRENT}`." if manifests else "")
    shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
    return (f"{root}: {CURRENT} is missing, but the directory holds {len(files)} file(s) of a memory ({shown}): "
            f"the memory is damaged, not empty. Refusing to start a new, empty memory over it (that would "
            f"lose those records); nothing was changed.{hint}")


def _empty_manifest(path: Path) -> bool:
    """Whether ``path`` is a manifest of a memory without records (losing it loses nothing)."""
    try:
        m = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(m, dict) and m.get("n_records") == 0 and m.get("segments") == []


def check_not_orphaned(root: Path, extra: list[str] | None = None) -> None:
    """Raise :class:`MemoryFormatError` when ``root`` has no ``CURRENT`` but holds a memory's files.

    A manifest of an empty memory alone (a first save interrupted before its
    commit) holds nothing to lose and is not counted. ``extra``: other file
    names that belong to the memory (e.g. the service's log segments).
    """
    if (root / CURRENT).exists():
        return
    files = [f for f in state_files(root) if not (f.startswith("manifest-") and _empty_manifest(root / f))]
    files += sorted(extra or [])
    if files:
        raise MemoryFormatError(orphan_message(root, files))


def _write_atomic(root: Path, name: str, write) -> dict[str, Any]:
    """Write ``root/name`` (mode 0600) through a fsynced temporary; returns {"file", "sha256", "bytes"}."""
    tmp = root / f".tmp-{name}-{secrets.token_hex(4)}"
    try:
        with open_private(tmp) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        entry = {"file": name, "sha256": sha256_file(tmp), "bytes": tmp.stat().st_size}
        os.replace(tmp, root / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return entry


def segment_name(uid: int) -> str:
    return f"seg-{uid:08d}.npz"


def write_segment(root: Path, uid: int, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write one segment file (mappable, see :func:`gpuir.memory.segfile.write_npz`); returns its manifest
    entry (file, sha256, bytes)."""
    entry = _write_atomic(root, segment_name(uid), lambda f: write_npz(f, arrays))
    entry["layout_sha256"] = layout_digest(root / entry["file"])
    return entry


def write_deletes(root: Path, uid: int, gen: int, rows: np.ndarray) -> dict[str, Any]:
    """Write a segment's deleted rows (ndarray (m,), int64) as of save ``gen``."""
    arr = np.ascontiguousarray(rows, dtype=np.int64)
    entry = _write_atomic(root, f"del-{uid:08d}-{gen:08d}.npy", lambda f: np.save(f, arr, allow_pickle=False))
    entry["n_deleted"] = int(arr.size)
    return entry


def _body_sha(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def commit(root: Path, manifest: dict[str, Any]) -> str:
    """Write the manifest and make it current (the atomic commit); returns its file name."""
    gen = int(manifest["generation"])
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION)
    manifest["sha256"] = _body_sha(manifest)
    name = f"manifest-{gen:08d}.json"
    data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    _write_atomic(root, name, lambda f: f.write(data))
    fsync_dir(root)
    cur_tmp = root / f".tmp-{CURRENT}-{secrets.token_hex(4)}"
    try:
        with open_private(cur_tmp) as f:
            f.write((name + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(cur_tmp, root / CURRENT)  # the commit
    except BaseException:
        cur_tmp.unlink(missing_ok=True)
        raise
    fsync_dir(root)
    return name


def read_manifest(root: Path) -> tuple[str, dict[str, Any]]:
    """The committed manifest of memory ``root``: (file name, verified contents).

    Raises
    ------
    MemoryFormatError
        No memory there, or a damaged or foreign manifest (naming the file).
    """
    if not root.is_dir():
        raise MemoryFormatError(f"no memory at {root}: the directory does not exist "
                                "(create one with `gpuir memory add` or Memory().save(path))")
    cur = root / CURRENT
    if not cur.is_file():
        check_not_orphaned(root)  # a memory's files without CURRENT: damaged, not absent
        raise MemoryFormatError(f"no memory at {root}: {cur.name} is missing "
                                "(create one with `gpuir memory add` or Memory().save(path))")
    name = cur.read_text("utf-8").strip()
    mpath = root / name
    if not re.fullmatch(r"manifest-\d{8}\.json", name) or not mpath.is_file():
        raise MemoryFormatError(f"{cur}: names {name!r}, which is not a manifest in {root}")
    try:
        manifest = json.loads(mpath.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MemoryFormatError(f"{mpath}: damaged manifest (not valid JSON: {e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise MemoryFormatError(f"{mpath}: not a gpuir memory manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise MemoryFormatError(f"{mpath}: format version {manifest.get('format_version')!r} is not supported "
                                f"(this gpuir reads version {FORMAT_VERSION})")
    if manifest.get("sha256") != _body_sha(manifest):
        raise MemoryFormatError(f"{mpath}: damaged manifest (checksum mismatch)")
    return name, manifest


def _check_file(root: Path, entry: dict[str, Any], verify: bool) -> Path:
    p = root / entry["file"]
    if not p.is_file():
        raise FileNotFoundError(errno.ENOENT, "missing", str(p))
    if p.stat().st_size != entry["bytes"]:
        raise MemoryFormatError(f"{p}: damaged file (size {p.stat().st_size} bytes, the manifest says "
                                f"{entry['bytes']})")
    if verify and sha256_file(p) != entry["sha256"]:
        raise MemoryFormatError(f"{p}: damaged file (checksum mismatch)")
    return p


def read_segment_arrays(root: Path, entry: dict[str, Any], verify: bool = True) -> dict[str, np.ndarray]:
    """The arrays of one segment file (checked against its manifest entry)."""
    p = _check_file(root, entry, verify)
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, KeyError, EOFError) as e:
        raise MemoryFormatError(f"{p}: damaged segment file ({type(e).__name__}: {e})") from None


def open_segment(root: Path, entry: dict[str, Any], verify: bool | str = True) -> MappedNpz:
    """Map one segment file (checked against its manifest entry's size; ``verify="full"``: and sha256).

    With ``verify`` true, each array is checked against its CRC-32 when first read.

    Raises
    ------
    FileNotFoundError
        The file is missing (the caller decides: a writer may have committed meanwhile).
    MemoryFormatError
        A damaged file, named.
    """
    p = _check_file(root, entry, verify == "full")
    try:
        mz = MappedNpz(p, check=bool(verify))
    except SegmentFileError as e:
        raise MemoryFormatError(f"{p}: damaged segment file ({e})") from None
    except OSError as e:
        raise MemoryFormatError(f"{p}: cannot map the segment file ({e})") from None
    want = entry.get("layout_sha256")  # absent for files written before mapping (checked by verify="full")
    if verify and want is not None and mz.layout_sha256 != want:
        raise MemoryFormatError(f"{p}: damaged segment file (its zip layout does not match its checksum)")
    return mz


def verify_dir(root: Path, analyzer: dict | None = None) -> dict[str, Any]:
    """Check a memory directory's committed state completely: the manifest, every file's size and sha256,
    every segment file's structure and every array's CRC-32, every deletions file. Reads every byte.

    Returns
    -------
    dict: ``generation``, ``files`` checked, ``bytes`` read, ``segments``, ``records`` (rows in segments).

    Raises
    ------
    MemoryFormatError
        The first damaged or missing file, named.
    """
    name, manifest = read_manifest(root)
    files = nbytes = records = 0
    for e in manifest.get("segments", []):
        try:
            p = _check_file(root, e, True)
            mz = MappedNpz(p, check=True)
            for member in mz.names:
                mz.verify(member)
        except FileNotFoundError as err:
            raise MemoryFormatError(f"{err.filename}: missing (named by {root / name})") from None
        except SegmentFileError as err:
            raise MemoryFormatError(f"{root / e['file']}: damaged segment file ({err})") from None
        files += 1
        nbytes += int(e["bytes"])
        records += int(e.get("n_docs", 0))
        if e.get("deletes"):
            try:
                read_deletes(root, e["deletes"], int(e.get("n_docs", 0)) or 2**62, True)
            except FileNotFoundError as err:
                raise MemoryFormatError(f"{err.filename}: missing (named by {root / name})") from None
            files += 1
            nbytes += int(e["deletes"]["bytes"])
    return {"generation": int(manifest["generation"]), "manifest": name, "files": files, "bytes": nbytes,
            "segments": len(manifest.get("segments", [])), "records": records}


def read_deletes(root: Path, entry: dict[str, Any], n_docs: int, verify: bool = True) -> np.ndarray:
    """The deleted rows of a segment: ndarray (m,), int64, checked to lie in [0, n_docs)."""
    p = _check_file(root, entry, verify)
    try:
        rows = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise MemoryFormatError(f"{p}: damaged deletions file ({type(e).__name__}: {e})") from None
    if rows.ndim != 1 or rows.dtype.kind not in "iu" or (rows.size and (rows.min() < 0 or rows.max() >= n_docs)):
        raise MemoryFormatError(f"{p}: damaged deletions file (rows outside the segment)")
    return rows.astype(np.int64)


def collect_garbage(root: Path, keep: set[str]) -> list[str]:
    """Remove gpuir's own files in ``root`` that ``keep`` does not name; returns the names removed."""
    removed = []
    for p in root.iterdir():
        if p.name in keep or not _OWNED.match(p.name) or not p.is_file():
            continue
        try:
            p.unlink()
            removed.append(p.name)
        except FileNotFoundError:
            pass
    return removed


def manifest_files(manifest: dict[str, Any]) -> set[str]:
    """Every file a manifest references (segments, deletions)."""
    out = set()
    if manifest.get("history"):  # records' earlier versions (gpuir.memory.history)
        out.add(manifest["history"]["file"])
    for s in manifest.get("segments", []):
        out.add(s["file"])
        if s.get("deletes"):
            out.add(s["deletes"]["file"])
    return out
