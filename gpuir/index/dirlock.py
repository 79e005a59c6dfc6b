"""Directories that gpuir owns, and the one-writer lock on them.

Every store gpuir writes (an index directory, a memory directory) is marked as
gpuir's by a marker file, and gpuir only ever writes into, or deletes from, a
directory that carries its marker (or that it created empty). Writers of one
directory are serialised by an OS file lock held in that directory:

* :func:`claim_dir` -- create the directory, or adopt an empty one, and mark it;
  refuse a non-empty directory without the marker (it holds someone else's files).
* :class:`WriterLock` -- an exclusive, cross-process and cross-thread lock
  (``filelock``: ``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows). A
  second writer waits up to ``timeout`` seconds, then gets
  :class:`StoreLockedError`. The lock is released when the holder exits the
  ``with`` block or its process dies (the OS drops the lock with the file
  descriptor), so a killed writer never leaves the store locked.

Why ``filelock``: it is the well-kept library for exactly this (used by pip,
virtualenv and the Hugging Face hub), pure Python, and it hides the platform
differences; hand-written ``fcntl`` code would not run on Windows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import filelock

#: Name of the marker file that says "this directory is gpuir's".
MARKER_NAME = ".gpuir"
#: Name of the lock file writers hold (never deleted: deleting a lock file
#: another process has open would let two writers in).
LOCK_NAME = ".gpuir.lock"


class StoreError(ValueError):
    """A store directory cannot be used as asked; the message says what to fix."""


class NotAGpuirDirError(StoreError):
    """The directory holds files that gpuir did not create."""


class StoreLockedError(StoreError):
    """Another writer holds the store's lock."""


def check_path(path: "str | os.PathLike") -> Path:
    """A store path as a :class:`~pathlib.Path`, refusing empty ones.

    Raises
    ------
    StoreError
        ``path`` is empty (``""`` would silently mean the current directory).
    """
    if path is None or str(path).strip() == "":
        raise StoreError("the store path is empty: name a directory (it is created if missing)")
    return Path(path)


def is_claimed(path: "str | os.PathLike") -> bool:
    """Whether ``path`` is a directory carrying gpuir's marker."""
    return (Path(path) / MARKER_NAME).is_file()


def claim_dir(path: "str | os.PathLike", kind: str) -> Path:
    """Make ``path`` a gpuir store directory of ``kind`` (e.g. "index", "memory").

    Creates the directory (and its parents) when missing; adopts an existing
    empty directory; accepts one that already carries the marker of the same
    kind. Anything else is refused, and nothing is written.

    Returns
    -------
    Path of the directory.

    Raises
    ------
    StoreError
        Empty path; the path is a file; the directory is another kind of store.
    NotAGpuirDirError
        A non-empty directory without gpuir's marker.
    """
    root = check_path(path)
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root} exists and is not a directory: choose another path")
    marker = root / MARKER_NAME
    if root.is_dir():
        if marker.is_file():
            try:
                found = json.loads(marker.read_text("utf-8")).get("kind")
            except (OSError, ValueError, AttributeError):
                found = None
            if found != kind:
                raise StoreError(f"{root} is a gpuir {found or 'unknown'} store, not a {kind} store")
            return root
        if any(root.iterdir()):
            raise NotAGpuirDirError(
                f"{root} is not empty and was not created by gpuir: refusing to write into it "
                "(gpuir only writes into empty directories or its own stores). Choose a new or empty path"
            )
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{MARKER_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"kind": kind}) + "\n", encoding="utf-8")
    os.replace(tmp, marker)
    return root


class WriterLock:
    """The exclusive writer lock of a store directory (a context manager).

    Parameters
    ----------
    path : store directory (must exist)
    timeout : float
        Seconds to wait for another writer; 0 fails at once, a negative value waits forever.

    Raises
    ------
    StoreLockedError
        On entry, when the lock is still held by another writer after ``timeout``.
    """

    def __init__(self, path: "str | os.PathLike", timeout: float = 10.0):
        self.path = Path(path)
        self.timeout = float(timeout)
        self._lock = filelock.FileLock(str(self.path / LOCK_NAME), timeout=self.timeout, thread_local=False)

    def __enter__(self) -> "WriterLock":
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise StoreLockedError(
                f"{self.path} is locked by another writer (waited {self.timeout:g} s): wait for it to "
                "finish, or pass a longer timeout"
            ) from None
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    @property
    def held(self) -> bool:
        return self._lock.is_locked
