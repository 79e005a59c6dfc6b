"""Storage utilities every persistent part of gpuir shares, below the index, the memory and the service.

* :mod:`~gpuir.storage.dirlock`: directories gpuir owns (a marker file), one writer
  (an OS file lock), readers' leases, retiring old versions, and the errors
  (:class:`StoreError` and its kinds) with an operating-system error named in one line.
* :mod:`~gpuir.storage.files`: a file's sha256 (streamed) and fsync of a directory.

Nothing here imports another part of gpuir.
"""

from .dirlock import (
    NotAGpuirDirError,
    StoreError,
    StoreLockedError,
    StoreWriteError,
    WriterLock,
    claim_dir,
    is_claimed,
    os_error_message,
)
from .files import fsync_dir, sha256_file

__all__ = [
    "NotAGpuirDirError",
    "StoreError",
    "StoreLockedError",
    "StoreWriteError",
    "WriterLock",
    "claim_dir",
    "fsync_dir",
    "is_claimed",
    "os_error_message",
    "sha256_file",
]
