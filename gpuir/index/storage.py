"""Saving and loading an index directory, atomically and with checksums.

Layout of ``INDEX_DIR``::

    CURRENT                  one line: the name of the live version folder
    v-<time>-<random>/       one complete version
        manifest.json        format version, analyzer, BM25 parameters, shapes, dtypes, sha256
        offsets.npy doc_ids.npy tfs.npy doc_lens.npy
        vocab.txt            one term a line (terms never contain a newline)
        ids.json             the user's document ids

A save writes a new version folder under a temporary name, fsyncs it, renames it
into place, and only then replaces ``CURRENT`` with ``os.replace`` (atomic). A
save interrupted at any point leaves the previous version live and intact;
older versions are removed after the switch.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .csr import CSRIndex

FORMAT = "gpuir-csr"
FORMAT_VERSION = 1
ARRAYS = ("offsets", "doc_ids", "tfs", "doc_lens")
DTYPES = {"offsets": "int64", "doc_ids": "int32", "tfs": "int32", "doc_lens": "int32"}


class IndexFormatError(ValueError):
    """An index directory is missing, corrupt or of an incompatible format."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_index(csr: CSRIndex, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """Write ``csr`` to the directory ``path`` atomically.

    Parameters
    ----------
    csr : CSRIndex
    path : directory (created if missing)
    extra : dict, optional
        More JSON-able settings to keep in the manifest (e.g. the BM25 parameters).

    Returns
    -------
    Path of the version folder now live.
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise ValueError(f"cannot save index to {root}: it exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    name = f"v-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
    tmp = root / f".tmp-{name}"
    tmp.mkdir()
    try:
        files: dict[str, dict[str, Any]] = {}
        for a in ARRAYS:
            arr = np.ascontiguousarray(getattr(csr, a), dtype=DTYPES[a])
            p = tmp / f"{a}.npy"
            with open(p, "wb") as f:
                np.save(f, arr, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            files[p.name] = {"shape": list(arr.shape), "dtype": DTYPES[a], "sha256": _sha256(p)}
        for fname, data in (
            ("vocab.txt", ("\n".join(csr.vocab) + ("\n" if csr.vocab else "")).encode("utf-8")),
            ("ids.json", json.dumps(list(csr.ids), ensure_ascii=False).encode("utf-8")),
        ):
            _write_file(tmp / fname, data)
            files[fname] = {"sha256": _sha256(tmp / fname)}
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
        _write_file(tmp / "manifest.json", json.dumps(manifest, indent=2).encode("utf-8"))
        _fsync_dir(tmp)
        final = root / name
        os.rename(tmp, final)
        cur_tmp = root / f".CURRENT-{secrets.token_hex(4)}"
        _write_file(cur_tmp, (name + "\n").encode())
        os.replace(cur_tmp, root / "CURRENT")
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in root.iterdir():  # garbage-collect older versions and stale temporaries
        if old.name != name and (old.name.startswith("v-") or old.name.startswith(".tmp-v-")):
            shutil.rmtree(old, ignore_errors=True)
    return final


def read_manifest(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The live version folder of index ``path`` and its manifest."""
    root = Path(path)
    if not root.exists():
        raise IndexFormatError(f"no index at {root}: the directory does not exist (build one with `gpuir index`)")
    if not root.is_dir():
        raise IndexFormatError(f"{root} is not an index directory")
    cur = root / "CURRENT"
    if not cur.is_file():
        raise IndexFormatError(f"{cur}: missing; {root} is not a gpuir index (build one with `gpuir index`)")
    name = cur.read_text().strip()
    vdir = root / name
    mpath = vdir / "manifest.json"
    if not name or "/" in name or not mpath.is_file():
        raise IndexFormatError(f"{cur} names version {name!r}, whose manifest.json is missing")
    try:
        manifest = json.loads(mpath.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexFormatError(f"{mpath}: not valid JSON ({e})") from None
    if manifest.get("format") != FORMAT:
        raise IndexFormatError(f"{mpath}: format {manifest.get('format')!r} is not {FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{mpath}: format version {manifest.get('format_version')!r} is not supported "
            f"(this gpuir reads version {FORMAT_VERSION}); rebuild the index"
        )
    return vdir, manifest


def load_index(path: str | os.PathLike, mmap: bool = True, verify: bool = True) -> tuple[CSRIndex, dict[str, Any]]:
    """Load an index written by :func:`save_index`.

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
    vdir, manifest = read_manifest(path)
    files = manifest.get("files", {})
    arrays = {}
    for a in ARRAYS:
        p = vdir / f"{a}.npy"
        meta = files.get(p.name)
        if meta is None or not p.is_file():
            raise IndexFormatError(f"{p}: missing")
        if verify and _sha256(p) != meta["sha256"]:
            raise IndexFormatError(f"{p}: checksum mismatch (the file is corrupt); rebuild the index")
        try:
            arr = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
        except Exception as e:
            raise IndexFormatError(f"{p}: unreadable ({type(e).__name__}: {e})") from None
        if list(arr.shape) != meta["shape"] or str(arr.dtype) != meta["dtype"]:
            raise IndexFormatError(
                f"{p}: shape {arr.shape} / dtype {arr.dtype} differ from the manifest's "
                f"{tuple(meta['shape'])} / {meta['dtype']}"
            )
        arrays[a] = arr
    texts = {}
    for fname in ("vocab.txt", "ids.json"):
        p = vdir / fname
        if not p.is_file() or fname not in files:
            raise IndexFormatError(f"{p}: missing")
        raw = p.read_bytes()
        if verify and hashlib.sha256(raw).hexdigest() != files[fname]["sha256"]:
            raise IndexFormatError(f"{p}: checksum mismatch (the file is corrupt); rebuild the index")
        texts[fname] = raw.decode("utf-8")
    vocab = texts["vocab.txt"].split("\n")[:-1] if texts["vocab.txt"] else []
    try:
        ids = json.loads(texts["ids.json"])
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{vdir / 'ids.json'}: not valid JSON ({e})") from None
    csr = CSRIndex(vocab=vocab, ids=ids, analyzer=manifest.get("analyzer", {}), **arrays)
    try:
        csr.validate()
    except ValueError as e:
        raise IndexFormatError(f"{vdir}: inconsistent index ({e})") from None
    return csr, manifest
