"""Saving and loading an index directory: atomic, checksummed, one writer, readers never broken.

Layout of ``INDEX_DIR`` (format version 3)::

    .gpuir                   marker: this directory is a gpuir index (see gpuir.storage.dirlock)
    .gpuir.lock              the writers' lock file (never deleted)
    CURRENT                  one line: the name of the live version folder
    v-<time>-<random>/       one complete, immutable version
        manifest.json        format version, analyzer, BM25 parameters, shapes, dtypes, sha256 of every
                             file, and manifest_sha256 (of the manifest's other fields)
        offsets.npy doc_ids.npy tfs.npy doc_lens.npy
        vocab.json           the terms, a JSON array of strings (any token round-trips)
        ids.json             the user's document ids, a JSON array of strings
        .lease               readers' lease file

**Ownership.** A save writes only into a directory it creates, an empty one,
or one that carries gpuir's marker (an unmarked format-1 index, made only of
gpuir's own entries, is adopted). It deletes only entries whose names it
generates (``v-YYYYmmddTHHMMSS-<8 hex>``, and ``.tmp-``/``.trash-`` of those,
``.CURRENT-<8 hex>``): a user's file inside the directory survives every save.

**Atomicity and one writer.** A save takes the directory's writer lock (an OS
file lock: a second writer, thread or process, waits up to ``lock_timeout``
seconds, then gets :class:`~gpuir.storage.dirlock.StoreLockedError`), writes a
new version folder under a temporary name, fsyncs it, renames it into place,
and only then replaces ``CURRENT`` with ``os.replace`` (atomic) and fsyncs the
directory. A save interrupted at any point -- an exception, a full disk,
``kill -9``, a power cut -- leaves the previous version live and intact; its
debris is removed by the next save. An operating-system error is a
:class:`~gpuir.storage.dirlock.StoreWriteError` naming the path and the reason,
and leaves no partial files.

**Retiring versions; readers never broken.** Versions are immutable. A save
first retires every version except the live one, then writes the new one: the
previous version therefore stays until the *next* save, and at most two
complete versions exist between saves. A version is retired only if no reader
holds a lease on it (:func:`~gpuir.storage.dirlock.retire_dir`); a reader holds a
shared lease from reading ``CURRENT`` until every file is open or mapped
(:func:`lease_version`). After that, a loaded index needs nothing from the
directory: memory-mapped files stay readable after they are deleted (POSIX).
If a version vanished between reading ``CURRENT`` and taking its lease (two
saves in those microseconds), ``CURRENT`` has moved and the load starts over
(at most :data:`LOAD_ATTEMPTS` times). So a load racing saves returns the old
or the new version, complete, never an error.

**Formats.** Version 3 makes the manifest's own checksum (``manifest_sha256``)
mandatory: a version-3 manifest without it, or whose fields do not match it, is
refused. Version 2 added the marker, the lease file and ``vocab.json``; its
manifests carry ``manifest_sha256`` only when written by gpuir since issue 23
(checked then), so a version-2 manifest without one still loads -- refusing it
would strand every index saved before, which nothing could tell from an edited
one. Version 1 (``vocab.txt``, one term a line) still loads. Both are rewritten
as version 3 by the next save.

**What the checksums catch.** Damage: a flipped bit, a truncated or missing
file, a manifest edited by hand. They are not a signature: they are unkeyed,
so someone who can write the directory can recompute all of them (or rewrite
the manifest as version 2 without its checksum). Protect the directory with
file permissions, not with the checksums.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.dirlock import (
    LEASE_NAME,
    LOCK_NAME,
    LeaseUnavailable,
    StoreError,
    StoreWriteError,
    WriterLock,
    check_claimable,
    check_path,
    claim_dir,
    lease,
    retire_dir,
    write_error,
)
from ..storage.files import fsync_dir, sha256_file
from .csr import CSRIndex

FORMAT = "gpuir-csr"
FORMAT_VERSION = 3
#: Format versions this gpuir reads.
READABLE_VERSIONS = (1, 2, 3)
#: The first format version whose manifest must carry its own checksum (:data:`MANIFEST_SHA`).
CHECKSUMMED_FROM = 3
ARRAYS = ("offsets", "doc_ids", "tfs", "doc_lens")
DTYPES = {"offsets": "int64", "doc_ids": "int32", "tfs": "int32", "doc_lens": "int32"}
#: The vocabulary file of each format version.
VOCAB_FILE = {1: "vocab.txt", 2: "vocab.json", 3: "vocab.json"}
#: Store kind written in the directory marker.
KIND = "index"
#: How many times a load reads ``CURRENT`` when versions vanish under it.
LOAD_ATTEMPTS = 3
#: Seconds a save waits for another writer by default.
DEFAULT_LOCK_TIMEOUT = 60.0

_V = r"v-\d{8}T\d{6}-[0-9a-f]{8}"
_VERSION = re.compile(rf"^{_V}$")
_DEBRIS = re.compile(rf"^(\.tmp-{_V}|\.trash-{_V}|\.CURRENT-[0-9a-f]{{8}})$")

__all__ = [
    "FORMAT", "FORMAT_VERSION", "IndexFormatError", "StoreError", "StoreWriteError",
    "check_save_path", "lease_version", "load_index", "read_manifest", "save_index",
]


class IndexFormatError(ValueError):
    """An index directory is missing, corrupt or of an incompatible format."""


class _Moved(Exception):
    """The version being loaded vanished: ``CURRENT`` moved (internal; the load retries)."""


# -- writing






class _HashingWriter:
    """A file wrapper that hashes what passes through it.

    Being no real file object, it also makes ``np.save`` write with ``write()``
    (in 16 MiB chunks) instead of ``ndarray.tofile``, whose short writes lose
    ``errno`` (a full disk would read "898418 requested and 507872 written").
    """

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def write(self, b) -> int:
        self.h.update(b)
        return self.f.write(b)


def _write_file(path: Path, data: bytes | np.ndarray) -> str:
    """Write bytes, or an array as ``.npy``, to a new file, fsync it, and return its sha256.

    Every file a save writes goes through here.
    """
    with open(path, "xb") as f:
        w = _HashingWriter(f)
        if isinstance(data, np.ndarray):
            np.save(w, data, allow_pickle=False)
        else:
            w.write(data)
        f.flush()
        os.fsync(f.fileno())
    return w.h.hexdigest()


def _json_bytes(obj: Any, **kw: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True, allow_nan=False, **kw).encode("ascii")


def _strings(values: Any, what: str) -> list[str]:
    out = list(values)
    bad = next((i for i, v in enumerate(out) if not isinstance(v, str)), None)
    if bad is not None:
        raise TypeError(f"{what} {bad} is a {type(out[bad]).__name__}; every {what} must be a str")
    return out


def _is_format1_index(root: Path) -> bool:
    """An unmarked directory holding nothing but a format-1 index's own entries."""
    names = [p.name for p in root.iterdir() if p.name != LOCK_NAME]
    return "CURRENT" in names and all(
        n == "CURRENT" or _VERSION.match(n) or _DEBRIS.match(n) for n in names
    )


def _current_name(root: Path) -> str | None:
    try:
        name = (root / "CURRENT").read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if _VERSION.match(name) else None


def _collect(root: Path) -> None:
    """Retire every version but the live one (unless leased) and remove dead writers' debris.

    Runs under the writer lock: no other writer can be writing a temporary.
    Failures only leave garbage for a later save; they never fail this one.
    """
    live = _current_name(root)
    entries = list(root.iterdir())
    for p in entries:  # debris first: a stale .trash-<v> would block retiring <v>
        if _DEBRIS.match(p.name):
            with contextlib.suppress(OSError):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink()
    for p in entries:
        if _VERSION.match(p.name) and p.name != live:
            with contextlib.suppress(OSError):
                retire_dir(p, root / f".trash-{p.name}")


def check_save_path(path: str | os.PathLike) -> Path:
    """Check, writing nothing, that :func:`save_index` may write to ``path`` (same errors)."""
    return check_claimable(path, KIND, adopt=_is_format1_index)


def save_index(
    csr: CSRIndex,
    path: str | os.PathLike,
    extra: dict[str, Any] | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Path:
    """Write ``csr`` to the directory ``path`` atomically (see the module docstring).

    Parameters
    ----------
    csr : CSRIndex
    path : directory: created if missing; an existing one must be empty or a gpuir index
    extra : dict, optional
        More JSON-able settings to keep in the manifest (e.g. the BM25 parameters).
    lock_timeout : float
        Seconds to wait for another writer of the same directory (negative: forever).

    Returns
    -------
    Path of the version folder now live.

    Raises
    ------
    StoreError
        Empty path, a path that is (or lies below) a regular file, another kind of store.
    NotAGpuirDirError
        A non-empty directory that gpuir did not create.
    StoreLockedError
        Another writer still holds the directory after ``lock_timeout`` seconds.
    StoreWriteError
        The operating system refused a write (read-only or full file system,
        permissions); the previous index is intact and no partial file is left.
    TypeError
        A document id or term that is not a str.
    """
    ids = _strings(csr.ids, "document id")
    vocab = _strings(csr.vocab, "term")
    root = claim_dir(path, KIND, adopt=_is_format1_index)
    with WriterLock(root, lock_timeout):
        _collect(root)
        name = f"v-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        tmp, final = root / f".tmp-{name}", root / name
        cur_tmp = root / f".CURRENT-{secrets.token_hex(4)}"
        committed = False
        try:
            tmp.mkdir()
            files: dict[str, dict[str, Any]] = {}
            for a in ARRAYS:
                arr = np.ascontiguousarray(getattr(csr, a), dtype=DTYPES[a])
                digest = _write_file(tmp / f"{a}.npy", arr)
                files[f"{a}.npy"] = {"shape": list(arr.shape), "dtype": DTYPES[a], "sha256": digest}
            for fname, data in (("vocab.json", _json_bytes(vocab)), ("ids.json", _json_bytes(ids))):
                files[fname] = {"sha256": _write_file(tmp / fname, data)}
            _write_file(tmp / LEASE_NAME, b"")
            manifest = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "n_docs": csr.n_docs,
                "n_terms": csr.n_terms,
                "n_postings": csr.n_postings,
                "analyzer": csr.analyzer,
                "files": files,
                **(extra or {}),
            }
            manifest[MANIFEST_SHA] = manifest_digest(manifest)
            _write_file(tmp / "manifest.json", _json_bytes(manifest, indent=2))
            fsync_dir(tmp)
            os.rename(tmp, final)
            fsync_dir(root)
            _write_file(cur_tmp, (name + "\n").encode())
            os.replace(cur_tmp, root / "CURRENT")
            committed = True
            fsync_dir(root)
        except BaseException as e:
            if not committed:  # nobody can have seen the new version: remove every trace of it
                for p in (tmp, final):
                    shutil.rmtree(p, ignore_errors=True)
                with contextlib.suppress(OSError):
                    cur_tmp.unlink()
            if isinstance(e, OSError):
                doing = "make the saved index durable" if committed else f"save the index to {root}"
                raise write_error(e, doing) from None
            raise
    return final


# -- reading


def _load_json(path: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise IndexFormatError(f"{path}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None


#: The manifest's own checksum: sha256 of its other fields as compact JSON with sorted keys.
MANIFEST_SHA = "manifest_sha256"


def manifest_digest(m: dict[str, Any]) -> str:
    """The sha256 a manifest carries over itself (every field but :data:`MANIFEST_SHA`)."""
    body = {k: v for k, v in m.items() if k != MANIFEST_SHA}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def _check_manifest(mpath: Path, m: Any) -> dict[str, Any]:
    """``m`` if it is a manifest this gpuir reads; IndexFormatError naming the first problem otherwise.

    A manifest carrying its own checksum (:data:`MANIFEST_SHA`, written by every save since issue 23)
    must match it: a manifest whose file checksums were edited (say, after tampering with the postings)
    is refused. From format version 3 (:data:`CHECKSUMMED_FROM`) the checksum is mandatory; version-2
    manifests saved before issue 23, and version-1 ones, carry none and are read as before (see the
    module docstring: the checksums catch damage, not someone who can write the directory).
    """
    if not isinstance(m, dict):
        raise IndexFormatError(f"{mpath}: the manifest must be a JSON object, got {type(m).__name__}; rebuild the index")
    if m.get("format") != FORMAT:
        raise IndexFormatError(f"{mpath}: format {m.get('format')!r} is not {FORMAT!r}")
    version = m.get("format_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise IndexFormatError(
            f"{mpath}: format version {version!r} is not supported (this gpuir reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}); rebuild the index"
        )
    files = m.get("files")
    if not isinstance(files, dict):
        raise IndexFormatError(f'{mpath}: "files" must be a JSON object naming every file; rebuild the index')
    for fname in [f"{a}.npy" for a in ARRAYS] + [VOCAB_FILE[version], "ids.json"]:
        meta = files.get(fname)
        ok = (isinstance(meta, dict) and isinstance(meta.get("sha256"), str)
              and re.fullmatch(r"[0-9a-f]{64}", meta["sha256"]) is not None)
        if ok and fname.endswith(".npy"):
            shape = meta.get("shape")
            ok = (isinstance(shape, list) and len(shape) == 1
                  and all(type(s) is int and s >= 0 for s in shape)
                  and meta.get("dtype") == DTYPES[fname[:-4]])
        if not ok:
            raise IndexFormatError(f'{mpath}: the entry of {fname} in "files" is missing or malformed; rebuild the index')
    if not isinstance(m.get("analyzer", {}), dict):
        raise IndexFormatError(f'{mpath}: "analyzer" must be a JSON object (the analyzer configuration)')
    if MANIFEST_SHA not in m and version >= CHECKSUMMED_FROM:
        raise IndexFormatError(f"{mpath}: the manifest of format version {version} has no checksum of its own "
                               f"({MANIFEST_SHA}): it was edited or damaged after it was written; rebuild the index")
    if MANIFEST_SHA in m and m[MANIFEST_SHA] != manifest_digest(m):
        raise IndexFormatError(f"{mpath}: the manifest's own checksum does not match its contents (the manifest "
                               "was changed after it was written); rebuild the index")
    return m


def _read_verified(p: Path, meta: dict[str, Any], verify: bool) -> bytes:
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise IndexFormatError(f"{p}: missing") from None
    if verify and hashlib.sha256(raw).hexdigest() != meta["sha256"]:
        raise IndexFormatError(f"{p}: checksum mismatch (the file is corrupt); rebuild the index")
    return raw


def _load_version(vdir: Path, mmap: bool, verify: bool) -> tuple[CSRIndex, dict[str, Any]]:
    mpath = vdir / "manifest.json"
    try:
        raw = mpath.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise _Moved from None
    manifest = _check_manifest(mpath, _load_json(mpath, raw))
    version, files = manifest["format_version"], manifest["files"]
    arrays = {}
    for a in ARRAYS:
        p = vdir / f"{a}.npy"
        meta = files[p.name]
        if not p.is_file():
            raise IndexFormatError(f"{p}: missing")
        if verify and sha256_file(p) != meta["sha256"]:
            raise IndexFormatError(f"{p}: checksum mismatch (the file is corrupt); rebuild the index")
        try:
            arr = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - any failure to read a file names it as damaged (np.load raises many types)
            raise IndexFormatError(f"{p}: unreadable ({type(e).__name__}: {e})") from None
        if list(arr.shape) != meta["shape"] or str(arr.dtype) != meta["dtype"]:
            raise IndexFormatError(
                f"{p}: shape {arr.shape} / dtype {arr.dtype} differ from the manifest's "
                f"{tuple(meta['shape'])} / {meta['dtype']}"
            )
        arrays[a] = arr
    vname = VOCAB_FILE[version]
    vraw = _read_verified(vdir / vname, files[vname], verify)
    if version == 1:  # one term a line
        try:
            text = vraw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise IndexFormatError(f"{vdir / vname}: not valid UTF-8 ({e.reason})") from None
        vocab = text.split("\n")[:-1] if text else []
    else:
        vocab = _load_json(vdir / vname, vraw)
    ids = _load_json(vdir / "ids.json", _read_verified(vdir / "ids.json", files["ids.json"], verify))
    for fname, val in ((vname, vocab), ("ids.json", ids)):
        if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
            raise IndexFormatError(f"{vdir / fname}: must be a JSON array of strings; rebuild the index")
    if len(set(ids)) != len(ids):
        raise IndexFormatError(f"{vdir / 'ids.json'}: document ids must be unique; rebuild the index")
    csr = CSRIndex(vocab=vocab, ids=ids, analyzer=manifest.get("analyzer", {}), **arrays)
    try:
        csr.validate()
    except ValueError as e:
        raise IndexFormatError(f"{vdir}: inconsistent index ({e})") from None
    return csr, manifest


def _root(path: str | os.PathLike) -> Path:
    try:
        root = check_path(path)
    except StoreError as e:
        raise IndexFormatError(str(e)) from None
    if not root.exists():
        raise IndexFormatError(f"no index at {root}: the directory does not exist (build one with `gpuir index`)")
    if not root.is_dir():
        raise IndexFormatError(f"{root} is not an index directory")
    return root


def _read_current(root: Path) -> str:
    cur = root / "CURRENT"
    try:
        raw = cur.read_bytes()
    except FileNotFoundError:
        raise IndexFormatError(f"{cur}: missing; {root} is not a gpuir index (build one with `gpuir index`)") from None
    except OSError as e:
        raise IndexFormatError(f"{cur}: cannot be read ({e.strerror})") from None
    name = raw.decode("utf-8", "replace").strip()
    if not _VERSION.match(name):
        raise IndexFormatError(f"{cur}: does not name a version folder ({name[:80]!r}); rebuild the index")
    return name


@contextlib.contextmanager
def lease_version(vdir: str | os.PathLike) -> Iterator[None]:
    """Keep writers from retiring the version folder ``vdir`` while the block runs.

    A version written without a lease file (format 1) is read without one.

    Raises
    ------
    _Moved
        (internal) the version is gone or being retired.
    """
    vdir = Path(vdir)
    if not (vdir / LEASE_NAME).exists() and (vdir / "manifest.json").is_file():
        yield  # format 1: no lease file
        return
    try:
        with lease(vdir):
            yield
    except LeaseUnavailable:
        raise _Moved from None


def read_manifest(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The live version folder of index ``path`` and its (checked) manifest."""
    root = _root(path)
    name = _read_current(root)
    mpath = root / name / "manifest.json"
    try:
        raw = mpath.read_bytes()
    except OSError:
        raise IndexFormatError(f"{root / 'CURRENT'} names version {name!r}, whose manifest.json is missing") from None
    return root / name, _check_manifest(mpath, _load_json(mpath, raw))


def load_index(path: str | os.PathLike, mmap: bool = True, verify: bool = True) -> tuple[CSRIndex, dict[str, Any]]:
    """Load the live version of an index written by :func:`save_index`.

    Safe while other threads or processes save into ``path``: returns the old or
    the new version, complete (see the module docstring).

    Parameters
    ----------
    path : index directory
    mmap : bool
        Memory-map the arrays (read-only) instead of reading them into memory.
    verify : bool
        Check every file's sha256 against the manifest.

    Returns
    -------
    (CSRIndex, manifest dict)

    Raises
    ------
    IndexFormatError
        Naming the file and the problem.
    """
    root = _root(path)
    for _ in range(LOAD_ATTEMPTS):
        name = _read_current(root)
        try:
            with lease_version(root / name):
                return _load_version(root / name, mmap, verify)
        except (_Moved, IndexFormatError, OSError) as e:
            if _read_current(root) != name:
                continue  # a save moved CURRENT under this load: read the new version
            if isinstance(e, IndexFormatError):
                raise
            if isinstance(e, OSError):
                raise IndexFormatError(f"{root / name}: cannot be read ({e.strerror or e})") from None
            raise IndexFormatError(
                f"{root / 'CURRENT'} names version {name!r}, whose manifest.json is missing; rebuild the index"
            ) from None
    raise IndexFormatError(f"{root}: the index changed {LOAD_ATTEMPTS} times while loading; try again")
