"""Directories that gpuir owns, the one-writer lock on them, and readers' leases.

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
* :func:`lease` / :func:`retire_dir` -- a reader holds a *shared* lease on an
  immutable sub-directory (an index version, a segment) while it opens the
  files in it; a writer deletes such a directory only if it can take the lease
  *exclusively* without waiting, so it never deletes what a reader is opening.
  Leases are ``fcntl.flock`` locks on a ``.lease`` file in that directory,
  dropped by the OS when the reader exits or dies. Where ``fcntl`` is missing
  (Windows) leases are no-ops and callers rely on their other safeguards.

Why ``filelock`` for the writer lock: it is the well-kept library for exactly
this (used by pip, virtualenv and the Hugging Face hub), pure Python, and it
hides the platform differences. It has no shared lock on a plain file (its
``ReadWriteLock`` keeps state in an SQLite database), so leases use
``fcntl.flock`` directly: a few lines, on the one platform family that has it.

Every operating-system failure (read-only or full file system, permission
denied, a path below a regular file) becomes a :class:`StoreError` whose
message names the path and the reason; :class:`StoreWriteError` keeps the
original ``errno``.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: Name of the marker file that says "this directory is gpuir's".
MARKER_NAME = ".gpuir"
#: Name of the lock file writers hold (never deleted: deleting a lock file
#: another process has open would let two writers in).
LOCK_NAME = ".gpuir.lock"
#: Name of the lease file in a leased sub-directory.
LEASE_NAME = ".lease"
#: Temporary names of the marker while it is written.
_MARKER_TMP = re.compile(r"^\.gpuir\.tmp-[0-9a-f]+$")


class StoreError(ValueError):
    """A store directory cannot be used as asked; the message says what to fix."""


class NotAGpuirDirError(StoreError):
    """The directory holds files that gpuir did not create."""


class StoreLockedError(StoreError):
    """Another writer holds the store's lock."""


class StoreWriteError(StoreError):
    """The operating system refused a write (read-only or full file system, permissions, ...).

    Attributes
    ----------
    errno : int or None
        The ``errno`` of the underlying :class:`OSError`.
    """

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class LeaseUnavailable(Exception):
    """The directory to lease is gone or being retired (internal: callers retry)."""


def os_error_message(e: OSError, doing: str) -> str:
    """``"cannot <doing>: <path>: <reason>"`` plus what to do for the common reasons."""
    reason = e.strerror or str(e)
    where = f"{e.filename}: " if e.filename else ""
    hint = {
        _errno.ENOSPC: "free some space or choose a path on another disk",
        _errno.EDQUOT: "free some space or ask for a larger quota",
        _errno.EROFS: "choose a path on a writable file system",
        _errno.EACCES: "choose a path you may write to, or fix its permissions",
        _errno.EPERM: "choose a path you may write to, or fix its permissions",
        _errno.ENOTDIR: "a part of the path is a regular file: choose another path",
        _errno.EEXIST: "a part of the path exists and is not a directory: choose another path",
        _errno.ENAMETOOLONG: "choose a shorter path",
    }.get(e.errno or -1, "")
    return f"cannot {doing}: {where}{reason}" + (f" ({hint})" if hint else "")


def write_error(e: OSError, doing: str) -> StoreWriteError:
    """A :class:`StoreWriteError` for ``e`` (see :func:`os_error_message`)."""
    return StoreWriteError(os_error_message(e, doing), e.errno)


def check_path(path: str | os.PathLike) -> Path:
    """A store path as a :class:`~pathlib.Path`, refusing empty ones.

    Raises
    ------
    StoreError
        ``path`` is empty (``""`` would silently mean the current directory).
    """
    if path is None or str(path).strip() == "":
        raise StoreError("the store path is empty: name a directory (it is created if missing)")
    return Path(path)


def is_claimed(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory carrying gpuir's marker."""
    return (Path(path) / MARKER_NAME).is_file()


def _not_a_directory(root: Path) -> StoreError:
    return StoreError(f"{root} is not a directory (it, or a part of its path, is a regular file): choose another path")


def _check_marker(root: Path, kind: str) -> Path:
    """``root`` if its marker names ``kind``; StoreError otherwise."""
    try:
        found = json.loads((root / MARKER_NAME).read_text("utf-8")).get("kind")
    except (OSError, ValueError, AttributeError, RecursionError):
        found = None
    if found != kind:
        raise StoreError(f"{root} is a gpuir {found or 'unknown'} store, not a {kind} store")
    return root


def check_claimable(path: str | os.PathLike, kind: str, adopt: Callable[[Path], bool] | None = None) -> Path:
    """Check, writing nothing, that :func:`claim_dir` would accept ``path``.

    Lets a command refuse a bad destination before hours of work rather than after.

    Returns
    -------
    Path of the directory (which may not exist yet).

    Raises
    ------
    StoreError, NotAGpuirDirError
        As :func:`claim_dir`.
    """
    root = check_path(path)
    try:
        exists = root.exists()
    except OSError as e:
        raise write_error(e, "use the store directory") from None
    if exists and not root.is_dir():
        raise _not_a_directory(root)
    if not exists:
        parent = next((p for p in root.absolute().parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise _not_a_directory(root)
        return root
    marker = root / MARKER_NAME
    if marker.is_file():
        return _check_marker(root, kind)
    try:
        # the lock, or a marker being written by another claimant, is not "someone else's file"
        foreign = [p for p in root.iterdir() if p.name not in (LOCK_NAME, MARKER_NAME) and not _MARKER_TMP.match(p.name)]
    except OSError as e:
        raise write_error(e, "list the store directory") from None
    if foreign and marker.is_file():  # another claimant marked it (and began writing) since we looked
        return _check_marker(root, kind)
    if foreign and not (adopt is not None and adopt(root)):
        raise NotAGpuirDirError(
            f"{root} is not empty and was not created by gpuir: refusing to write into it "
            "(gpuir only writes into empty directories or its own stores). Choose a new or empty path"
        )
    return root


def claim_dir(path: str | os.PathLike, kind: str, adopt: Callable[[Path], bool] | None = None,
              mode: int | None = None) -> Path:
    """Make ``path`` a gpuir store directory of ``kind`` (e.g. "index", "memory").

    Creates the directory (and its parents) when missing; adopts an existing
    empty directory; accepts one that already carries the marker of the same
    kind. Anything else is refused, and nothing is written. Safe to call from
    several threads and processes at once.

    Parameters
    ----------
    path : store directory
    kind : str
        The kind of store, recorded in the marker.
    adopt : callable Path -> bool, optional
        Recognises an unmarked directory written by an older gpuir (e.g. an
        index of format version 1); such a directory is adopted and marked.
    mode : int, optional
        Permissions given to the directory when it is claimed (created or
        adopted; e.g. 0o700), whatever the umask. A directory already carrying
        the marker keeps its mode.

    Returns
    -------
    Path of the directory.

    Raises
    ------
    StoreError
        Empty path; the path (or a part of it) is a file; the directory is
        another kind of store.
    NotAGpuirDirError
        A non-empty directory without gpuir's marker.
    StoreWriteError
        The operating system refused to create the directory or the marker.
    """
    root = check_claimable(path, kind, adopt)
    marker = root / MARKER_NAME
    if marker.is_file():
        return root
    tmp = root / f"{MARKER_NAME}.tmp-{secrets.token_hex(6)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if mode is not None:
            os.chmod(root, mode)
        tmp.write_text(json.dumps({"kind": kind}) + "\n", encoding="utf-8")
        os.replace(tmp, marker)
    except (NotADirectoryError, FileExistsError):
        raise _not_a_directory(root) from None
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(e, "create the store directory") from None
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
    StoreWriteError
        On entry, when the lock file cannot be created (read-only file system, permissions).
    """

    def __init__(self, path: str | os.PathLike, timeout: float = 10.0):
        self.path = Path(path)
        self.timeout = float(timeout)
        self._lock = filelock.FileLock(str(self.path / LOCK_NAME), timeout=self.timeout, thread_local=False)

    def __enter__(self) -> WriterLock:  # noqa: PYI034 - typing.Self needs Python 3.11; gpuir supports 3.10
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise StoreLockedError(
                f"{self.path} is locked by another writer (waited {self.timeout:g} s): wait for it to "
                "finish, or pass a longer timeout"
            ) from None
        except OSError as e:
            if e.filename is None:
                e.filename = str(self.path / LOCK_NAME)
            raise write_error(e, "lock the store for writing") from None
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    @property
    def held(self) -> bool:
        return self._lock.is_locked


# -- leases on immutable sub-directories


def create_lease_file(directory: str | os.PathLike) -> None:
    """Create the (empty) lease file of a sub-directory being written."""
    with open(Path(directory) / LEASE_NAME, "wb"):
        pass


@contextlib.contextmanager
def lease(directory: str | os.PathLike) -> Iterator[None]:
    """Hold a shared lease on ``directory`` so that :func:`retire_dir` leaves it alone.

    Raises
    ------
    LeaseUnavailable
        The directory (or its lease file) is gone, or is being retired right now.
    """
    p = Path(directory) / LEASE_NAME
    try:
        fd = os.open(p, os.O_RDONLY)
    except FileNotFoundError:
        raise LeaseUnavailable(str(directory)) from None
    except NotADirectoryError:
        raise LeaseUnavailable(str(directory)) from None
    try:
        if fcntl is not None:  # flock locks of two descriptors conflict, even within one process
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # a writer is retiring it
                raise LeaseUnavailable(str(directory)) from None
        try:  # still the live lease file? (a writer may have retired it before we locked)
            same = os.path.samestat(os.fstat(fd), os.stat(p))
        except OSError:
            same = False
        if not same:
            raise LeaseUnavailable(str(directory))
        yield
    finally:
        os.close(fd)


def retire_dir(directory: str | os.PathLike, trash: str | os.PathLike) -> bool:
    """Delete a leased sub-directory unless a reader holds a lease on it.

    The directory is first renamed to ``trash`` (atomically: it vanishes at
    once for new readers), then removed. A crash half-way leaves ``trash``,
    which the caller removes later (nobody can lease it any more).

    Returns
    -------
    bool
        True when it was removed, False when a reader holds a lease (try again later).
    """
    d = Path(directory)
    try:
        fd = os.open(d / LEASE_NAME, os.O_RDONLY)
    except FileNotFoundError:
        fd = None  # written without leases (an older gpuir): nobody can lease it
    try:
        if fd is not None and fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        os.rename(d, trash)
    finally:
        if fd is not None:
            os.close(fd)
    shutil.rmtree(trash, ignore_errors=True)
    return True
