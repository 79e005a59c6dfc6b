"""``gpuir serve`` over a 2-shard memory: a shard actor SIGKILLed in the middle of a stream of acknowledged
writes loses none of them. The server stays up; Ray restarts the shard, whose memory replays its log, and
the writes that meet the dead shard wait for it. Every acknowledged record is then read back by id and
counted. The same drill at load: ``bench/bench_service.py --shards 2 --kill shard`` (docs/scaling.md)."""

from __future__ import annotations

import os
import signal
import threading
import time

# read by Ray when it is imported: set before the import below, so this process's runtime stays on loopback
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gpuir[ray]')")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from gpuir.cluster import ShardedMemory
from gpuir.cluster.routing import shard_of
from gpuir.service.client import MemoryClient, ServiceError
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess

pytestmark = pytest.mark.slow

#: Two tenants on each shard of a 2-shard memory (route "tenant": blake2b of the tenant's name).
TENANTS = [t for t in (f"agent-{i}" for i in range(40)) if shard_of(t, 2) == 0][:2] + \
          [t for t in (f"agent-{i}" for i in range(40)) if shard_of(t, 2) == 1][:2]


def test_a_shard_killed_in_the_write_stream_loses_no_acknowledged_write(tmp_path):
    assert len(TENANTS) == 4 and {shard_of(t, 2) for t in TENANTS} == {0, 1}
    root = tmp_path / "sm"
    ShardedMemory.create(root, shards=2, route="tenant", device="cpu").close()  # ends this process's runtime
    ks = KeyStore(root)
    keys = {t: ks.add(t) for t in TENANTS}
    operator = ks.add_operator()
    # checkpoints every 25 records: several fall in the stream (the service's first one used to kill its
    # writer thread, and every later write waited for ever)
    srv = ServerProcess(root, ["--statistics", "pooled", "--batch-window-ms", "1", "--checkpoint-every", "25"]
                        ).start(timeout=300)
    acked: dict[str, list[str]] = {t: [] for t in TENANTS}
    errors: list[str] = []
    stop = threading.Event()
    killed = threading.Event()
    after_kill = {t: 0 for t in TENANTS}  # writes acknowledged after the kill, per tenant

    def writer(t: str) -> None:
        c = MemoryClient(srv.url, keys[t], timeout=180)
        i = 0
        while not stop.is_set() and not (killed.is_set() and after_kill[t] >= 15):
            rid = f"n{i}"
            try:
                assert c.add([{"id": rid, "text": f"note {i} of {t}: w{t.replace('-', '')}x{i}"}]) == 1
            except ServiceError as e:  # never expected: a write that meets the dead shard waits for it
                errors.append(f"{t} {rid}: HTTP {e.status}: {e.detail}")
                return
            except httpx.TimeoutException as e:  # no answer at all (a writer thread gone)
                errors.append(f"{t} {rid}: no answer in 180 s: {type(e).__name__}")
                return
            acked[t].append(rid)
            if killed.is_set():
                after_kill[t] += 1
            i += 1

    threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in TENANTS]
    try:
        op = MemoryClient(srv.url, operator, timeout=300)
        before = {s["shard"]: s["pid"] for s in op.health()["shards"]}
        for th in threads:
            th.start()
        deadline = time.monotonic() + 120
        while sum(map(len, acked.values())) < 40 and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
        assert sum(map(len, acked.values())) >= 40, (errors, acked)
        at_kill = {t: len(v) for t, v in acked.items()}
        os.kill(before[1], signal.SIGKILL)  # the writers are mid-stream: some requests are in flight
        killed.set()
        for th in threads:
            th.join(240)
        stop.set()
        assert not errors, errors
        assert all(not th.is_alive() for th in threads)
        health = op.health()
        assert health["checkpoints"] >= 2, "checkpoints ran in the stream"
        victims = [t for t in TENANTS if shard_of(t, 2) == 1]
        assert all(len(acked[t]) > at_kill[t] for t in victims), "the killed shard's tenants kept writing"
        after = {s["shard"]: s["pid"] for s in op.health()["shards"]}
        assert after[1] != before[1] and after[0] == before[0], "shard 1 was restarted, shard 0 was not"
        # every acknowledged write, counted and read back (a record that is found is the stored record)
        for t in TENANTS:
            c = MemoryClient(srv.url, keys[t], timeout=300)
            assert c.count() == len(acked[t]), t
            for rid in acked[t]:
                got = c.get(rid)
                assert got is not None and got["text"].startswith(f"note {rid[1:]} of {t}:"), (t, rid, got)
            # and searchable: the last acknowledged record is the top hit of its own word
            last = acked[t][-1]
            hits = c.search([f"w{t.replace('-', '')}x{last[1:]}"], k=1)[0]
            assert hits and hits[0]["id"] == last, (t, hits)
    finally:
        stop.set()
        assert srv.stop(timeout=120) == 0, srv.output()[-3000:]
