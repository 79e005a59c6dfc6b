"""The directory of a sharded memory: its manifest and one memory directory per shard (no Ray needed).

Layout of ``PATH``::

    .gpuir                 marker: a gpuir "sharded-memory" store (gpuir.storage.dirlock)
    .gpuir.lock            the coordinator's writer lock (one ShardedMemory per directory)
    sharded.json           the manifest: shards, route, the memory settings (written once, checksummed)
    shard-00000/           shard 0: a memory directory (gpuir.memory.persist) and its
                           write-ahead log (service-wal-*.log, gpuir.wal)
    shard-00001/ ...

The manifest never changes after :meth:`ShardedMemory.create
<gpuir.cluster.ShardedMemory.create>` wrote it: the number of shards and the
route are fixed (records are placed by a hash of their tenant or id modulo the
number of shards). Everything that changes lives in the shards' directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..memory.persist import MemoryFormatError
from ..storage.files import fsync_dir

FORMAT = "gpuir-sharded-memory"
VERSION = 1
MANIFEST = "sharded.json"
#: The marker kind of a sharded memory's directory.
KIND = "sharded-memory"
#: How records are placed on shards.
ROUTES = ("tenant", "id")


def shard_dir(root: Path, i: int) -> Path:
    """The memory directory of shard ``i``."""
    return Path(root) / f"shard-{i:05d}"


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a sharded memory (its manifest is there)."""
    return (Path(path) / MANIFEST).is_file()


def _body_sha(m: dict[str, Any]) -> str:
    body = {k: v for k, v in m.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_manifest(root: Path, shards: int, route: str, memory: dict[str, Any], options: dict[str, Any]) -> dict:
    """Write the manifest atomically (temporary file, fsync, rename, directory fsync); returns it."""
    m = {"format": FORMAT, "version": VERSION, "shards": int(shards), "route": route, "memory": memory,
         "options": options, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    m["sha256"] = _body_sha(m)
    tmp = root / f".tmp-{MANIFEST}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(m, indent=1, sort_keys=True).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / MANIFEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(root)
    return m


def read_manifest(root: str | os.PathLike) -> dict[str, Any]:
    """The verified manifest of the sharded memory at ``root``.

    Raises
    ------
    MemoryFormatError
        No sharded memory there, or a damaged or foreign manifest (named).
    """
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise MemoryFormatError(f"no sharded memory at {root}: {path} is missing (create one with "
                                "ShardedMemory.create(path, shards=N))")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MemoryFormatError(f"{path}: damaged manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise MemoryFormatError(f"{path}: not a sharded-memory manifest")
    if m.get("sha256") != _body_sha(m):
        raise MemoryFormatError(f"{path}: damaged manifest (checksum mismatch); restore it from a backup")
    if int(m.get("version", 0)) > VERSION:
        raise MemoryFormatError(f"{path}: format version {m.get('version')} is newer than this gpuir reads "
                                f"({VERSION}): upgrade gpuir")
    if m.get("route") not in ROUTES or not isinstance(m.get("shards"), int) or m["shards"] < 1:
        raise MemoryFormatError(f"{path}: damaged manifest (route {m.get('route')!r}, shards {m.get('shards')!r})")
    return m
