"""``gpuir serve`` with a full disk injected into its memory's write-ahead log (for tests/test_service_faults.py).

Run as ``python tests/_fault_server.py serve MEMORY_DIR ...`` (the arguments of
``python -m gpuir.service``). While the file named by ``GPUIR_TEST_ENOSPC_FLAG``
exists, operations on the log's files fail as on a full file system:

* ``GPUIR_TEST_ENOSPC_MODE=fsync``: ``os.fsync`` of a log file raises ENOSPC
  (the bytes were written, as a delayed allocation failing at fsync);
* ``GPUIR_TEST_ENOSPC_MODE=write``: ``os.pwrite`` / ``os.write`` to a log file
  write half of what they are given and return the short count; given one byte,
  they raise ENOSPC (as a file system filling up mid-append).

Only descriptors whose path holds ``memory-wal-`` are affected (the memory's
segment files, sockets and the terminal are not). No real small file system is
needed; the production code is not changed for the test.
"""

from __future__ import annotations

import errno
import os
import sys

FLAG = os.environ["GPUIR_TEST_ENOSPC_FLAG"]
MODE = os.environ.get("GPUIR_TEST_ENOSPC_MODE", "fsync")


def _full(fd: int) -> bool:
    if not os.path.exists(FLAG):
        return False
    try:
        return "memory-wal-" in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False


def _enospc():
    return OSError(errno.ENOSPC, "No space left on device (injected by the test)")


_fsync, _pwrite, _write = os.fsync, os.pwrite, os.write


def fsync(fd):
    if MODE == "fsync" and _full(fd if isinstance(fd, int) else fd.fileno()):
        raise _enospc()
    return _fsync(fd)


def pwrite(fd, data, offset):
    if MODE == "write" and _full(fd):
        if len(data) <= 1:
            raise _enospc()
        return _pwrite(fd, bytes(data[: len(data) // 2]), offset)
    return _pwrite(fd, data, offset)


def write(fd, data):
    if MODE == "write" and _full(fd):
        if len(data) <= 1:
            raise _enospc()
        return _write(fd, bytes(data[: len(data) // 2]))
    return _write(fd, data)


os.fsync, os.pwrite, os.write = fsync, pwrite, write

if __name__ == "__main__":
    from gpuir.service.cli import main

    sys.exit(main(sys.argv[1:]))
