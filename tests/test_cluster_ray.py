"""ShardedMemory on a local Ray runtime (2 CPUs, loopback only, no dashboard): every search equals one Memory's,
bit for bit, on the LoCoMo turns; SIGKILLed shards lose no acknowledged write; a saved memory opens in a new runtime;
``gpuir serve`` in front of it. Skipped, with the reason, where the ``ray`` extra is not installed."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

# read by Ray when it is imported: set before the import below, so this process's runtime stays on loopback
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gpuir[ray]'): "
                                        "ShardedMemory's tests need a Ray runtime")

from gpuir import Memory
from gpuir.bm25 import METHODS
from gpuir.cluster import ShardedMemory, ShardUnavailableError, runtime
from gpuir.cluster.routing import shard_of
from gpuir.eval.records import locomo_records
from gpuir.memory import RecordError, UnknownIdError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _runtime_down_after():
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def rt():
    """This process's local runtime: 2 CPUs, no GPU, loopback only (started once, again after a test stopped it)."""
    runtime.connect(None, num_cpus=2, num_gpus=0)
    return ray


@pytest.fixture(scope="module")
def records(data_dir):
    return locomo_records(data_dir / "locomo" / "locomo10.json")


@pytest.fixture(scope="module")
def questions(locomo):
    qs = locomo.queries[::15]  # about 130 questions over the ten conversations
    return [q.text for q in qs], [q.group for q in qs]


def assert_same(one, sm, queries, k=10, **kw):
    want = one.search(queries, k=k, backend="numba", **kw)
    got = sm.search(queries, k=k, backend="numba", **kw)
    assert np.array_equal(got.seqs, want.seqs), kw
    assert np.array_equal(got.scores, want.scores), kw  # float32, bit for bit (-inf padding included)
    for i in range(len(queries)):
        assert got.ids(i) == want.ids(i)
    i = int(np.argmax((want.seqs >= 0).sum(axis=1)))
    assert got.hits(i) == want.hits(i)  # the records' fields too


def test_runtime_is_loopback_only(rt):
    psutil = pytest.importorskip("psutil")
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert ray.cluster_resources().get("CPU") == 2 and not ray.cluster_resources().get("GPU")

    @ray.remote(num_cpus=0)
    def pid():
        return os.getpid()

    worker = ray.get(pid.remote())
    session = ray._private.worker._global_node.get_session_dir_path()
    procs = {worker, os.getpid()}
    for p in psutil.process_iter(["cmdline"]):
        if session in " ".join(p.info["cmdline"] or []):
            procs.add(p.pid)
    assert len(procs) > 3  # gcs, raylet, agents, the worker
    for c in psutil.net_connections(kind="inet"):
        if c.pid in procs:
            ip = ipaddress.ip_address(c.laddr.ip)
            ip = getattr(ip, "ipv4_mapped", None) or ip
            assert ip.is_loopback, (c, psutil.Process(c.pid).name())


# every variant, each route with lucene and with two or three others (the pairs, not the product: CI has 2 cores)
PAIRS = [("lucene", "tenant"), ("lucene", "id"), ("robertson", "id"), ("atire", "tenant"), ("bm25l", "id"),
         ("bm25+", "tenant")]


def test_the_pairs_cover_every_variant_and_route():
    assert {m for m, _ in PAIRS} == set(METHODS) and {r for _, r in PAIRS} == {"tenant", "id"}


@pytest.mark.parametrize(("method", "route"), PAIRS)
def test_every_search_equals_one_memory(rt, tmp_path, records, questions, method, route):
    queries, convs = questions
    # 4-week partitions: fewer segments to search on two busy cores (the equality holds for any settings)
    opts = {"method": method, "partition_days": 28}
    one = Memory(record_times=False, **opts)
    sm = ShardedMemory.create(tmp_path / "sm", shards=2, route=route, **opts)
    try:
        for i in range(0, len(records), 2000):
            assert sm.add(records[i:i + 2000]) == one.add(records[i:i + 2000])
        assert len(sm) == len(one)
        speaker = [{"tenant": c, "metadata.speaker": records[j * 97 % len(records)]["metadata"]["speaker"]}
                   for j, c in enumerate(convs)]
        assert_same(one, sm, queries)
        assert_same(one, sm, queries, where=[{"tenant": c} for c in convs])
        assert_same(one, sm, queries, k=3, where=speaker)
        assert_same(one, sm, queries, where={"time": {"gte": "2023-06-01", "lt": "2023-09-01"}})
        few = slice(0, len(queries), 4)  # the partition modes search one query at a time
        assert_same(one, sm, queries[few], mode="newest")
        assert_same(one, sm, queries[few], mode="budgeted", max_partitions=4, where=[{"tenant": c} for c in convs][few])
        # deletes and updates (with route "tenant", some updates move a record to another tenant's shard)
        dels = [r["id"] for r in records[::9]]
        assert sm.delete(dels) == one.delete(dels)
        gone = set(dels)
        ups = [dict(r, text=r["text"] + " and then a long walk by the lake",
                    tenant=r["tenant"] if j % 2 else "conv-26") for j, r in enumerate(records[5::13])
               if r["id"] not in gone]
        assert sm.update(ups) == one.update(ups)
        # partial updates merge into the stored records (one unchanged: not re-written), and whole replaces
        patches = [{"id": ups[1]["id"], "metadata": {"mood": "calm"}}, {"id": ups[2]["id"], "text": "a new text"},
                   {"id": ups[3]["id"], "session": ups[3].get("session")}]
        assert sm.update(patches) == one.update(patches) == 2  # the changed ones (issue 36)
        whole = [{"id": ups[4]["id"], "text": "painting by the lake", "tenant": "conv-30"}]
        assert sm.replace(whole) == one.replace(whole)
        assert len(sm) == len(one)
        assert_same(one, sm, queries, where=[{"tenant": c} for c in convs])
        assert_same(one, sm, queries, k=25)
        assert_same(one, sm, queries[few], mode="newest", where=[{"tenant": c} for c in convs][few])
        assert_same(one, sm, queries, ties="newest", min_score=2.0)
        assert_same(one, sm, queries, k=5, order_by="time", where={"time": {"gte": "2023-03-01"}})
        some = [r["id"] for r in records[1::250]] + [u["id"] for u in ups[:5]]
        assert sm.get(some, missing_ok=True) == one.get(some, missing_ok=True)
        def stayed(rid):  # every version of the record on one shard
            return route == "id" or len({shard_of(v["tenant"], 2) for v in one.history(rid) + one.get([rid])}) == 1

        kept = next(u["id"] for u in ups[1:] if one.history(u["id"]) and stayed(u["id"]))

        def versions(hist):  # (each entry's event_time is the clock of the memory that applied it)
            return [{k: v for k, v in h.items() if k != "event_time"} for h in hist]

        assert versions(sm.history(kept)) == versions(one.history(kept))  # a record that did not change shard
        # keeps its history
    finally:
        sm.close()


def test_fan_out_asks_only_shards_that_can_match(rt, tmp_path, records):
    sm = ShardedMemory.create(tmp_path / "sm", shards=4, route="tenant")
    try:
        sm.add(records[:3000])
        sm.add([{"id": "only-here", "text": "xylophonist quartet", "tenant": "solo"}])
        tenants = sorted({r["tenant"] for r in records[:3000]})
        res = sm.search(["support group"] * len(tenants), k=5, where=[{"tenant": t} for t in tenants])
        assert res.meta["shards_asked"] == [[shard_of(t, 4)] for t in tenants]
        res = sm.search(["xylophonist", "zzzunknownword"], k=5)
        assert res.meta["shards_asked"] == [[shard_of("solo", 4)], []]
        assert res.ids(0) == ["only-here"] and res.ids(1) == []
        info = sm.info()
        assert sum(s["records"] for s in info["shard_list"]) == len(sm) == 3001
        assert all(s["pid"] and s["node"] and s["device"] == "cpu" for s in info["shard_list"])
        assert len({s["pid"] for s in info["shard_list"]}) == 4
        # each actor owns its process: once its engine is warm, its startup objects leave the collector's passes
        deadline = time.monotonic() + 120
        while not all(s["gc_frozen_objects"] > 50_000 for s in info["shard_list"]) and time.monotonic() < deadline:
            time.sleep(0.2)
            info = sm.info()
        assert all(s["gc_frozen_objects"] > 50_000 for s in info["shard_list"]), info["shard_list"]
    finally:
        sm.close()


@pytest.mark.parametrize("route", ["tenant", "id"])
def test_refused_writes_change_nothing(rt, tmp_path, records, route):
    sm = ShardedMemory.create(tmp_path / "sm", shards=2, route=route)
    try:
        sm.add(records[:200])
        batch = records[300:340] + [records[7]]  # spans both shards; one id exists
        with pytest.raises(RecordError, match="already exists"):
            sm.add(batch)
        with pytest.raises(UnknownIdError):
            sm.delete([records[1]["id"], "no-such-id", records[2]["id"]])
        with pytest.raises(UnknownIdError):
            sm.update([dict(records[3], text="x"), {"id": "no-such-id", "text": "y"}])
        assert len(sm) == 200 and sm.get([records[300]["id"]], missing_ok=True) == [None]
        assert sm.get([records[1]["id"]])[0]["text"] == records[1]["text"]
        assert sm.delete([records[1]["id"], "no-such-id"], missing_ok=True) == 1
    finally:
        sm.close()


def test_sigkill_during_a_write_stream_loses_no_acknowledged_record(rt, tmp_path, records):
    sm = ShardedMemory.create(tmp_path / "sm", shards=2, route="id", checkpoint_every=300, restart_timeout=120)
    acked: list[dict] = []
    errors: list[BaseException] = []
    stream = records[:2400]

    def writer():
        try:
            for i in range(0, len(stream), 20):
                sm.add(stream[i:i + 20])
                acked.extend(stream[i:i + 20])  # acknowledged: add returned
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    rng = random.Random(7)
    pids = []
    try:
        for s in (0, 1, 0):
            time.sleep(rng.uniform(0.3, 1.2))
            if not t.is_alive():
                break
            pids.append(sm.kill_shard(s))
        t.join(300)
        assert not errors, errors
        assert len(pids) == 3 and len(acked) == len(stream)
        after = [s["pid"] for s in sm.info()["shard_list"]]
        assert not set(after) & set(pids)  # both shards were restarted
        ids = [r["id"] for r in acked]
        got = sm.get(ids)  # every acknowledged record is there ...
        assert [g["text"] for g in got] == [r["text"] for r in acked]
        for r in acked[::60]:  # ... and searchable
            assert sm.search(r["text"], k=1, where={"id": r["id"]}).ids(0) == [r["id"]]
        one = Memory(record_times=False)
        one.add(acked)
        assert len(sm) == len(one)
        assert_same(one, sm, [r["text"] for r in acked[::40]], k=10)
    finally:
        t.join(300)
        sm.close()


def test_a_sigkilled_shard_replays_its_memory_log(rt, tmp_path, records):
    """No checkpoint after the create: every acknowledged write of a shard is in its memory's own log
    (``memory-wal-*.log``; no shard keeps a log of its own), and a SIGKILLed shard actor comes back with
    every one of them."""
    from gpuir.cluster import layout
    from gpuir.wal import FORMATS, read_segment, segments

    sm = ShardedMemory.create(tmp_path / "sm", shards=2, route="id", checkpoint_every=10 ** 9)
    try:
        acked = []
        for i in range(0, 300, 30):
            assert sm.add(records[i:i + 30]) == 30  # acknowledged
            acked.extend(records[i:i + 30])
        assert sm.delete([r["id"] for r in acked[:5]]) == 5
        for s in range(2):
            d = layout.shard_dir(tmp_path / "sm", s)
            assert not segments(d, "service")
            logged = [op for _, p in segments(d, "memory") for op in read_segment(p, True, fmt=FORMATS["memory"]).ops]
            assert [op["tag"]["wid"] for op in logged] == sorted(op["tag"]["wid"] for op in logged)  # write ids
        pids = [sm.kill_shard(s) for s in (0, 1)]
        got = sm.get([r["id"] for r in acked[5:]])  # waits for the restarts
        assert [g["text"] for g in got] == [r["text"] for r in acked[5:]]
        assert sm.get([r["id"] for r in acked[:5]], missing_ok=True) == [None] * 5
        info = sm.info()["shard_list"]
        assert not {s["pid"] for s in info} & set(pids)
        assert sum(s["replayed_operations"] for s in info) >= 11  # replayed from the memories' logs
        one = Memory(record_times=False)
        one.add(acked)
        one.delete([r["id"] for r in acked[:5]])
        assert len(sm) == len(one)
        assert_same(one, sm, [r["text"] for r in acked[::30]], k=10)
    finally:
        sm.close()


@pytest.mark.parametrize("fault", ["kill_after_log", "kill_after_apply"])
def test_a_shard_killed_inside_a_write_counts_it_once(rt, tmp_path, records, fault):
    sm = ShardedMemory.create(tmp_path / "sm", shards=2, route="tenant")
    one = Memory(record_times=False)
    try:
        sm.add(records[:500])
        one.add(records[:500])
        batch = [r for r in records[500:900] if shard_of(r["tenant"], 2) == 0][:50]
        sm._fault = fault  # the shard dies after logging (or applying) and before answering
        assert sm.add(batch) == 50
        one.add(batch)
        sm._fault = fault
        assert sm.delete([r["id"] for r in batch[:10]]) == 10
        one.delete([r["id"] for r in batch[:10]])
        assert len(sm) == len(one) == 540
        assert_same(one, sm, [r["text"] for r in records[:500:25]], k=10)
    finally:
        sm.close()


def test_a_dead_shard_fails_a_search_clearly(rt, tmp_path, records):
    sm = ShardedMemory.create(tmp_path / "sm", shards=2, route="id", max_restarts=0, restart_timeout=5)
    try:
        sm.add(records[:400])
        sm.kill_shard(1)
        with pytest.raises(ShardUnavailableError, match="shard 1 .*Nothing partial was returned"):
            sm.search(["support group", "painting"], k=5)
    finally:
        sm.close()


@pytest.mark.parametrize("saved", [True, False])
def test_open_in_a_new_runtime(rt, tmp_path, records, questions, saved):
    queries, convs = questions
    path = tmp_path / "sm"
    sm = ShardedMemory.create(path, shards=2, route="tenant", method="bm25+")
    one = Memory(record_times=False, method="bm25+")
    for i in range(0, 2500, 500):
        sm.add(records[i:i + 500])
        one.add(records[i:i + 500])
    dels = [r["id"] for r in records[:2500:11]]
    sm.delete(dels)
    one.delete(dels)
    if saved:
        sm.save()
        sm.close()
    else:  # the coordinator's process dies: no checkpoint, the shards die with the runtime, logs stay
        sm._lock.__exit__(None, None, None)
    ray.shutdown()
    sm2 = ShardedMemory.open(path)  # a new local runtime
    try:
        assert sm2._started_ray and len(sm2) == len(one)
        replayed = sum(s["replayed_operations"] for s in sm2.info()["shard_list"])
        assert (replayed == 0) if saved else replayed > 0
        assert_same(one, sm2, queries, where=[{"tenant": c} for c in convs])
        assert_same(one, sm2, queries)
        sm2.add(records[2500:3000])
        one.add(records[2500:3000])
        assert_same(one, sm2, queries)
    finally:
        sm2.close()
    assert not ray.is_initialized()  # the runtime it started is stopped by close


def test_a_tenant_move_cut_short_keeps_the_newer_copy(rt, tmp_path):
    from gpuir.cluster.shard import write_payload
    from gpuir.memory.intake import to_batch

    path = tmp_path / "sm"
    sm = ShardedMemory.create(path, shards=2, route="tenant")
    assert shard_of("alice", 2) == 1 and shard_of("bob", 2) == 0
    sm.add([{"id": "x", "text": "the old version", "tenant": "alice"}, {"id": "y", "text": "other", "tenant": "bob"}])
    # the first half of moving x to bob: its new version upserted on bob's shard; the crash comes before the delete
    seqs = np.asarray([sm._next_seq], dtype=np.int64)
    sm._next_seq += 1
    batch = to_batch([{"id": "x", "text": "the new version", "tenant": "bob"}])
    sm._write({0: write_payload("upsert", sm._wid(), batch=batch, seqs=seqs)})
    sm.close()
    with ShardedMemory.open(path) as sm2:
        assert len(sm2) == 2 and sm2.get(["x"])[0]["text"] == "the new version"
        assert [s["records"] for s in sm2.info()["shard_list"]] == [2, 0]
        assert sm2.search("version", k=5).ids(0) == ["x"]


def test_serve_a_sharded_memory(rt, tmp_path, records):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from gpuir.cli import main
    from gpuir.service.client import MemoryClient, ServiceError
    from gpuir.service.keys import KeyStore
    from gpuir.service.testing import ServerProcess

    root = tmp_path / "sm"
    ShardedMemory.create(root, shards=2, route="tenant").close()
    ks = KeyStore(root)
    keys = {t: ks.add(t) for t in ("alice", "bob")}
    operator = ks.add_operator()
    with pytest.raises(RuntimeError, match="--statistics pooled"):
        ServerProcess(root).start(timeout=180)  # statistics per tenant: refused, exit 2, saying why
    srv = ServerProcess(root, ["--statistics", "pooled"]).start(timeout=180)
    try:
        a, b = MemoryClient(srv.url, keys["alice"]), MemoryClient(srv.url, keys["bob"])
        conv = [{"id": r["id"].split(":", 1)[1], "text": r["text"]} for r in records if r["tenant"] == "conv-26"]
        assert a.add(conv[:300]) == 300
        assert b.add(conv[300:400]) == 100
        with pytest.raises(ServiceError) as e:
            a.add([conv[0]])
        assert e.value.status == 409
        hits = a.search(["support group"], k=5)[0]
        assert hits and all(h["id"] in {c["id"] for c in conv[:300]} for h in hits)
        assert a.get(conv[1]["id"])["text"] == conv[1]["text"]
        assert a.delete([conv[1]["id"]]) == 1 and a.get(conv[1]["id"]) is None
        assert b.get(conv[2]["id"]) is None  # tenants are walls for reads
        # PATCH merges (metadata kept), PUT replaces; history, list and count read the tenant's shard
        assert a.update({"id": conv[3]["id"], "metadata": {"mood": "calm"}}) == 1
        assert a.update({"id": conv[3]["id"], "session": "S9"}) == 1
        got = a.get(conv[3]["id"])
        assert got["metadata"] == {"mood": "calm"} and got["session"] == "S9" and got["text"] == conv[3]["text"]
        assert [v.get("session") for v in a.history(conv[3]["id"])] == [None, None]
        with pytest.raises(ServiceError) as e:
            a.update({"id": "no-such-record", "text": "x"})
        assert e.value.status == 404
        assert a.count() == 299 and b.count() == 100
        assert len(a.list(limit=1000).records) == 299
        health = MemoryClient(srv.url, operator).health()
        assert shard_of("alice", 2) == 1 and shard_of("bob", 2) == 0
        assert [s["records"] for s in health["shards"]] == [100, 299]
        assert all(s["pid"] and s["node"] and s["device"] == "cpu" for s in health["shards"])
    finally:
        assert srv.stop() == 0, srv.output()[-3000:]
    assert main(["memory", "info", str(root), "--json"]) == 0
    repo = str(Path(__file__).resolve().parent.parent)  # this checkout's gpuir, in a process of its own
    out = subprocess.run([sys.executable, "-m", "gpuir", "memory", "info", str(root), "--start", "--json"],
                         check=False, capture_output=True, text=True, timeout=300, cwd=repo,
                         env={**os.environ, "PYTHONPATH": repo})
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout)
    assert info["records"] == 399 and len(info["shard_list"]) == 2
    for s in info["shard_list"]:
        assert s["node"] and s["pid"] > 0 and s["device"] == "cpu" and s["records"] >= 0
