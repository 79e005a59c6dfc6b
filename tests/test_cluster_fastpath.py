"""The shards' direct read channel (gpuir.cluster.fastpath), without Ray: a call answers what the method
answers, a shard's exception is raised again in the caller, a connection without the token is refused, only
the read methods are served, and a closed (or dead) shard's channel reports ChannelBroken, so the coordinator
asks over Ray instead. The channel inside a sharded memory over Ray, with a shard SIGKILLed between two
searches: tests/test_memory_protocol.py."""

from __future__ import annotations

import os
import pickle
import socket
import stat
import struct

import numpy as np
import pytest

from gpuir.cluster.fastpath import ChannelBroken, FastClient, FastServer, _recv, _send


class _Shard:
    def search(self, q, k):
        if q == "boom":
            raise ValueError("the shard's own error")
        return {"seqs": np.arange(k, dtype=np.int64)[None], "q": q}

    def fetch(self, seqs):
        return [int(s) * 2 for s in seqs]

    def write(self, payload):  # pragma: no cover - must never be reached over the channel
        raise AssertionError("a write went over the read channel")


def _server():
    shard = _Shard()
    return FastServer(lambda name, args: getattr(shard, name)(*args))


def test_calls_answer_and_raise_as_the_shard_does():
    srv = _server()
    try:
        assert stat.S_IMODE(os.stat(os.path.dirname(srv.path)).st_mode) == 0o700, "only the shard's user connects"
        c = FastClient(srv.path, srv.token, timeout=10)
        got = c.call("search", ("lake", 3))
        assert got["q"] == "lake" and got["seqs"].dtype == np.int64 and got["seqs"].tolist() == [[0, 1, 2]]
        with pytest.raises(ValueError, match="the shard's own error"):
            c.call("search", ("boom", 1))
        assert c.call("fetch", (np.array([4, 5]),)) == [8, 10], "the connection is reused after an error"
        with pytest.raises(ValueError, match="not served on the fast path"):
            c.call("write", (b"x",))
        # two calls in flight on two connections (several shards, or threads, at once)
        s1, s2 = c.start("fetch", ([1],)), c.start("fetch", ([2],))
        assert (c.finish(s2), c.finish(s1)) == ([4], [2])
        assert not c.broken
    finally:
        srv.close()


def test_a_connection_without_the_token_is_closed():
    srv = _server()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(srv.path)
        with pytest.raises(ConnectionError):  # closed (end of file: ChannelBroken), reset or a broken pipe
            _send(s, b"\0" * 32)  # a wrong token: nothing after it is unpickled
            _send(s, pickle.dumps(("fetch", ([1],))))
            _recv(s)
        s.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a first frame longer than a token: not read
        s.settimeout(10)
        s.connect(srv.path)
        with pytest.raises(ConnectionError):
            s.sendall(struct.pack(">I", 2**31))
            _recv(s)
        s.close()
        bad = FastClient(srv.path, b"x" * 32, timeout=10)
        with pytest.raises(ChannelBroken):
            bad.call("fetch", ([1],))
        assert bad.broken
    finally:
        srv.close()


def test_a_closed_shard_breaks_the_channel():
    srv = _server()
    c = FastClient(srv.path, srv.token, timeout=10)
    assert c.call("fetch", ([3],)) == [6]
    srv.close()
    assert not os.path.exists(srv.path)
    with pytest.raises(ChannelBroken):  # the idle connection's shard is gone, and no new one can be made
        c.call("fetch", ([3],))
        c.call("fetch", ([3],))
    assert c.broken


def test_concurrent_callers_each_get_their_own_answer():
    """The service's threads search at once: each call takes a connection of its own from the pool."""
    import threading

    srv = _server()
    try:
        c = FastClient(srv.path, srv.token, timeout=10)
        wrong: list = []

        def work(t):
            for i in range(50):
                seqs = [t, i]
                if c.call("fetch", (seqs,)) != [2 * t, 2 * i]:
                    wrong.append((t, i))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert wrong == [] and not c.broken and 1 <= len(c._idle) <= 8
    finally:
        srv.close()


_OWNER_SCRIPT = """
import sys, time
from gpuir.cluster.fastpath import FastServer
srv = FastServer(lambda name, args: None, base=sys.argv[1])
print(srv.path, flush=True)
time.sleep(600)
"""


def _owner_process(base):
    """A process that opens a channel under ``base`` and waits (as a shard does); returns (process, dir)."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT, str(base)], stdout=subprocess.PIPE, text=True,
                         env=env)
    return p, os.path.dirname(p.stdout.readline().strip())


def test_a_killed_shards_directory_is_removed_by_the_next_channel(tmp_path):
    """A SIGKILLed shard closes nothing: its socket's directory stays until the next channel opened on the
    machine sweeps it. Only directories whose marker names a dead process are removed: a live shard's, a
    directory without a marker (not ours), one holding another file, and one whose pid now belongs to
    another process (a reused pid) stay or go as their owner says."""
    import signal

    dead, dead_dir = _owner_process(tmp_path)
    live, live_dir = _owner_process(tmp_path)
    srv = None
    try:
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait(30)
        assert os.path.exists(os.path.join(dead_dir, "s")), "nothing cleans up after a SIGKILL by itself"
        foreign = tmp_path / "gpuir-shard-notours"  # no marker: made by someone else
        foreign.mkdir()
        (foreign / "s").write_text("")
        extra = tmp_path / "gpuir-shard-extra"  # a dead owner, but a file gpuir did not make
        extra.mkdir()
        (extra / "owner").write_text(f"{dead.pid} 1\n")
        (extra / "notes.txt").write_text("keep me")
        reused = tmp_path / "gpuir-shard-reused"  # a live pid with another start time: its owner is dead
        reused.mkdir()
        (reused / "owner").write_text(f"{os.getpid()} 1\n")
        garbled = tmp_path / "gpuir-shard-garbled"
        garbled.mkdir()
        (garbled / "owner").write_text("not a pid\n")

        srv = FastServer(lambda name, args: None, base=str(tmp_path))
        assert sorted(srv.swept) == sorted([dead_dir, str(reused)])
        assert not os.path.exists(dead_dir) and not reused.exists()
        assert os.path.exists(os.path.join(live_dir, "s")), "a live shard's channel stays"
        assert (foreign / "s").exists() and (extra / "notes.txt").exists() and (garbled / "owner").exists()
        assert os.path.exists(srv.path)
    finally:
        live.kill()
        live.wait(30)
        if srv is not None:
            srv.close()
            assert not os.path.exists(os.path.dirname(srv.path)), "a closed channel removes its own directory"
