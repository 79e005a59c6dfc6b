"""A direct channel for a shard's searches on the coordinator's machine: a Unix socket beside Ray.

A Ray actor call costs about 1 ms on this project's machines (``bench/bench_ray_transport.py``: an
empty call 0.7--0.9 ms, a query-phase answer 1.2--1.3 ms), more than a one-question search at 50k
records. A compiled graph answers in 0.44 ms but its channel closes for good when a shard's process
dies. This channel is kill-safe the plain way: a shard opens it on demand
(:meth:`ShardServer.fast_address <gpuir.cluster.shard.ShardServer.fast_address>`, asked over Ray)
and serves its read calls (``search``, ``fetch``) on it from its own threads; the coordinator
(:class:`~gpuir.cluster.ShardedMemory`) sends them there when the shard runs on its own node, and
on any failure of the channel (the shard died: end of file, a reset connection) falls back to the
Ray call, which waits for Ray's restart of the shard and asks again; the restarted shard opens a new
channel when next asked. Writes and everything else stay on Ray.

**Wire.** Frames of a 4-byte big-endian length and a pickle (protocol 5). The socket lives in a
directory of its own (``mkdtemp``: mode 0700, so only the shard's user can connect), and the first
frame of every connection must be the 32-byte token the shard gave the coordinator over Ray (a
connection that does not send it is closed). Pickles are read only from a connection that sent the
token: the same trust as Ray's own calls, which are pickles too.

Replies are ``(True, value)`` or ``(False, exception)``: an exception raised by the shard's method is
raised again in the coordinator, as Ray raises it.

**Its directory is cleaned up after a kill.** A shard removes its socket's directory when it is closed,
but a SIGKILLed shard (or one whose coordinator was SIGKILLed, which takes its actors with it) closes
nothing. Each directory therefore holds a marker, ``owner``: the pid of the process that made it and
that process's start time (``/proc/PID/stat``; a reused pid is not taken for the owner). Every new
channel first sweeps its base directory (the system's temporary directory unless given) and removes
the ``gpuir-shard-*`` directories whose owner is dead -- only directories of this user that hold
nothing but the marker and the socket, file by file, never a whole tree; a directory without a
marker (made by someone else, or by a gpuir before this rule) is left as it is.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ChannelBroken", "FastClient", "FastServer", "sweep"]

_LEN = struct.Struct(">I")
#: The methods a shard serves on the channel (reads of its current snapshot only).
METHODS = ("search", "fetch")
#: A channel's directory: PREFIX + mkdtemp's random part, holding SOCKET and OWNER (nothing else).
PREFIX = "gpuir-shard-"
SOCKET = "s"
OWNER = "owner"


class ChannelBroken(ConnectionError):
    """The channel failed (the shard's process died or closed it): ask over Ray instead."""


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LEN.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ChannelBroken("the shard closed the channel")
        got += k
    return bytes(buf)


def _recv(sock: socket.socket, most: int | None = None) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if most is not None and n > most:
        raise ChannelBroken(f"a frame of {n} bytes where at most {most} were expected")
    return _recv_exact(sock, n)


def _start_time(pid: int) -> str | None:
    """Process ``pid``'s start time in clock ticks since boot (``/proc/PID/stat``, field 22), as text;
    None when there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_line() -> str:
    pid = os.getpid()
    return f"{pid} {_start_time(pid) or '-'}\n"


def _alive(pid: int, started: str) -> bool:
    """Whether the process that wrote the marker ``pid started`` still runs (a new process on a reused pid
    does not count where ``/proc`` tells start times apart)."""
    if os.path.isdir("/proc/self"):
        now = _start_time(pid)
        return now is not None and (started == "-" or now == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(base: str | None = None) -> list[str]:
    """Remove the channel directories under ``base`` (default: the system's temporary directory) whose
    owner process is dead; returns the paths removed.

    Only what a channel made is removed: a ``gpuir-shard-*`` directory (not a link) of this user whose
    marker names a dead process and which holds nothing but the marker and the socket. Anything else --
    no marker, a marker that does not parse, a live owner, another file inside -- is left alone.
    """
    base = base or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(PREFIX):
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or e.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            names = set(os.listdir(e.path))
            if OWNER not in names or not names <= {OWNER, SOCKET}:
                continue
            with open(os.path.join(e.path, OWNER)) as f:
                pid_text, started = f.read().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if pid <= 0 or _alive(pid, started):
            continue
        try:
            if SOCKET in names:
                os.unlink(os.path.join(e.path, SOCKET))
            os.unlink(os.path.join(e.path, OWNER))
            os.rmdir(e.path)
        except OSError:  # another sweeper got there first, or a file appeared: leave the rest
            continue
        removed.append(e.path)
    return removed


class FastServer:
    """The shard's end: a listening Unix socket, one thread per connection, calling ``handler(name, args)``.

    Parameters
    ----------
    handler : callable (method name, tuple of arguments) -> the answer
        Called for ``name`` in :data:`METHODS` only.
    base : str, optional
        Where its directory is made (default: the system's temporary directory); the stale directories
        there are swept first (:func:`sweep`).
    """

    def __init__(self, handler: Callable[[str, tuple], Any], base: str | None = None):
        self._handler = handler
        self.swept = sweep(base)
        self._dir = tempfile.mkdtemp(prefix=PREFIX, dir=base)  # mode 0700
        with open(os.path.join(self._dir, OWNER), "x") as f:
            f.write(_owner_line())
        self.path = os.path.join(self._dir, SOCKET)
        self.token = secrets.token_bytes(32)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(64)
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="gpuir-shard-fastpath", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="gpuir-shard-fastpath-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                if not secrets.compare_digest(_recv(conn, most=len(self.token)), self.token):
                    return
                while True:
                    name, args = pickle.loads(_recv(conn))
                    try:
                        if name not in METHODS:
                            raise ValueError(f"{name!r} is not served on the fast path")
                        reply = (True, self._handler(name, args))
                    except Exception as e:  # noqa: BLE001 - raised again in the coordinator
                        reply = (False, e)
                    _send(conn, pickle.dumps(reply, protocol=5))
            except (OSError, ChannelBroken, EOFError, pickle.UnpicklingError, struct.error):
                return
            finally:
                with self._lock:
                    self._conns.discard(conn)

    def close(self) -> None:
        """Stop listening and end every open connection (their callers then ask over Ray)."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
            except OSError:
                pass
            self._sock.close()
        finally:
            for name in (SOCKET, OWNER):
                try:
                    os.unlink(os.path.join(self._dir, name))
                except OSError:
                    pass
            try:
                os.rmdir(self._dir)
            except OSError:
                pass


class FastClient:
    """The coordinator's end for one shard: a small pool of connections (one per concurrent call).

    Parameters
    ----------
    path, token : the shard's :class:`FastServer` address
    timeout : float
        Seconds a call may take (the memory's ``call_timeout``): ``TimeoutError`` after it.
    """

    def __init__(self, path: str, token: bytes, timeout: float):
        self.path, self.token, self.timeout = path, token, float(timeout)
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self.broken = False

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self.path)
            _send(s, self.token)
        except BaseException:
            s.close()
            raise
        return s

    def start(self, name: str, args: tuple) -> socket.socket:
        """Send ``name(*args)`` to the shard; :meth:`finish` reads the answer (so that several shards
        work at once). Raises :class:`ChannelBroken` (ask over Ray instead)."""
        with self._lock:
            s = self._idle.pop() if self._idle else None
        try:
            if s is None:
                s = self._connect()
            _send(s, pickle.dumps((name, args), protocol=5))
        except (OSError, ChannelBroken) as e:
            if s is not None:
                s.close()
            self.close()
            raise ChannelBroken(f"{type(e).__name__}: {e}") from None
        return s

    def finish(self, s: socket.socket) -> Any:
        """The answer of the call sent on ``s``. Raises :class:`ChannelBroken` when the channel failed
        (nothing was answered: ask over Ray), ``TimeoutError`` after ``timeout`` seconds, or the
        shard's own exception."""
        try:
            ok, value = pickle.loads(_recv(s))
        except TimeoutError:
            s.close()
            raise
        except (OSError, ChannelBroken, EOFError, pickle.UnpicklingError) as e:
            s.close()
            self.close()
            raise ChannelBroken(f"{type(e).__name__}: {e}") from None
        with self._lock:
            if self.broken:
                s.close()
            else:
                self._idle.append(s)
        if not ok:
            raise value
        return value

    def call(self, name: str, args: tuple) -> Any:
        """``name(*args)`` on the shard (:meth:`start`, then :meth:`finish`)."""
        return self.finish(self.start(name, args))

    def close(self) -> None:
        """Close every idle connection; the client is not used again."""
        self.broken = True
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()
