"""The memory service over a real uvicorn server on loopback: routes, keys, tenants, limits, batching."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from gpuir.memory import Memory, UnknownIdError
from gpuir.service.batcher import MicroBatcher
from gpuir.service.client import AsyncMemoryClient, MemoryClient, ServiceError
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc") / "mem"
    ks = KeyStore(root)
    from gpuir.storage.dirlock import claim_dir

    claim_dir(root, "memory")
    keys = {t: ks.add(t) for t in ("alice", "bob", "carol")}
    keys["operator"] = ks.add_operator()
    # a 20 ms window: concurrent test searches meet in a batch even on a slow machine
    srv = ServerProcess(root, ["--max-body-bytes", "20000", "--batch-window-ms", "20"]).start()
    yield srv, keys, root
    n = httpx.get(srv.url + "/healthz", headers={"Authorization": f"Bearer {keys['operator']}"}).json()["records"]
    assert srv.stop() == 0, srv.output()  # a graceful stop by SIGTERM exits 0 (uvicorn alone would re-raise it)
    # the graceful shutdown folded the memory's log into its segments; the service keeps no log of its own
    from gpuir.wal import FORMATS, read_segment, segments

    assert all(not read_segment(p, True, fmt=FORMATS["memory"]).ops for _, p in segments(root, "memory"))
    assert segments(root, "memory") and not segments(root, "service")
    assert len(Memory.open(root, writer=False)) == n


def _client(server, tenant):
    srv, keys, _ = server
    return MemoryClient(srv.url, keys[tenant])


def test_openapi_lists_exactly_the_routes(server):
    srv, _, _ = server
    schema = httpx.get(srv.url + "/openapi.json").json()
    got = {(p, m.upper()) for p, ops in schema["paths"].items() for m in ops}
    assert got == {
        ("/v1/tenants/{tenant}/records", "POST"), ("/v1/tenants/{tenant}/search", "POST"),
        ("/v1/tenants/{tenant}/records/{id}", "GET"), ("/v1/tenants/{tenant}/records/{id}", "DELETE"),
        ("/healthz", "GET"), ("/metrics", "GET"),
        ("/v1/tenants/{tenant}/records", "GET"), ("/v1/tenants/{tenant}/count", "GET"),
        ("/v1/tenants/{tenant}/records/{id}", "PATCH"), ("/v1/tenants/{tenant}/records/{id}", "PUT"),
        ("/v1/tenants/{tenant}/records/{id}/history", "GET"), ("/v1/tenants/{tenant}/export", "GET"),
        ("/v1/tenants", "GET"), ("/v1/tenants/{tenant}/overview", "GET"),
        ("/v1/tenants/{tenant}/delete", "POST"),
    }
    assert httpx.get(srv.url + "/docs").status_code == 404


def test_health_needs_no_key_and_metrics_an_operator_key(server):
    srv, keys, _ = server
    h = httpx.get(srv.url + "/healthz")
    assert h.status_code == 200 and h.json() == {"status": "ok"}  # nothing about any tenant without a key
    assert httpx.get(srv.url + "/metrics").status_code == 401
    assert httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {keys['alice']}"}).status_code == 403
    m = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {keys['operator']}"})
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert "# TYPE gpuir_requests_total counter" in m.text
    assert "gpuir_search_batch_queries_bucket" in m.text
    assert 'gpuir_gc_pause_seconds_count{generation="0"}' in m.text  # a started server has collected by now
    frozen = [ln for ln in m.text.splitlines() if ln.startswith("gpuir_gc_frozen_objects ")]
    assert frozen and float(frozen[0].split()[1]) > 10_000  # `gpuir serve` froze what it loaded to start


def test_freezing_the_startup_heap_keeps_later_objects_and_the_warm_ups_garbage_collectable():
    """freeze_startup_heap, in a fresh process (a freeze lasts for the process): it returns the frozen
    count; the warm-up's cyclic garbage is freed before the freeze, and a cycle made after it is
    collected as before."""
    import subprocess
    import sys

    code = """
import gc, weakref
from gpuir.memory.warmup import freeze_startup_heap

class Node:
    pass

refs = []

def warm_up():
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    refs.append(weakref.ref(a))

n = freeze_startup_heap(warm_up)
assert n == gc.get_freeze_count() > 1000, n
assert refs[0]() is None, "the warm-up's garbage was frozen"
c, d = Node(), Node()
c.other, d.other = d, c
later = weakref.ref(c)
del c, d
gc.collect()
assert later() is None, "a cycle made after the freeze was not collected"
print("ok", n)
"""
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr


def test_gc_pauses_are_timed_while_installed_only():
    """The service's collector-pass histogram: each pass observed under its generation while installed,
    nothing after removal (a closed service leaves no callback in gc.callbacks)."""
    import gc

    import prometheus_client as prom

    from gpuir.service.gcpauses import GcPauses

    reg = prom.CollectorRegistry()
    g = GcPauses(prom.Histogram("t_gc_seconds", "t", ["generation"], registry=reg))

    def count():
        return reg.get_sample_value("t_gc_seconds_count", {"generation": "2"}) or 0.0

    g.install()
    g.install()  # idempotent: one callback
    gc.collect()
    assert count() == 1.0 and reg.get_sample_value("t_gc_seconds_sum", {"generation": "2"}) >= 0.0
    g.remove()
    gc.collect()
    assert count() == 1.0 and g._callback not in gc.callbacks


def test_missing_and_bad_keys_are_401_other_tenant_403(server):
    srv, keys, _ = server
    base = srv.url + "/v1/tenants/alice"
    body = {"records": [{"id": "k1", "text": "hello"}]}
    assert httpx.post(base + "/records", json=body).status_code == 401
    r = httpx.post(base + "/records", json=body, headers={"Authorization": "Bearer gpuir.alice.notarealkey12345678"})
    assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
    assert httpx.get(base + "/records/k1", headers={"Authorization": "Basic abc"}).status_code == 401
    # a valid key with the tenant part of its text changed is not a key
    forged = keys["bob"].replace("gpuir.bob.", "gpuir.alice.")
    assert httpx.get(base + "/records/k1", headers={"Authorization": f"Bearer {forged}"}).status_code == 401
    bob = {"Authorization": f"Bearer {keys['bob']}"}
    assert httpx.post(base + "/records", json=body, headers=bob).status_code == 403
    assert httpx.post(base + "/search", json={"queries": ["hello"]}, headers=bob).status_code == 403
    assert httpx.get(base + "/records/k1", headers=bob).status_code == 403
    assert httpx.delete(base + "/records/k1", headers=bob).status_code == 403


def test_tenant_isolation_both_ways(server):
    a, b = _client(server, "alice"), _client(server, "bob")
    assert a.add([{"id": "same", "text": "alice keeps a zebra named stripes"}]) == 1
    assert b.add([{"id": "same", "text": "bob keeps a yak named fluff"}]) == 1  # same id, other tenant
    assert [h["text"] for h in a.search("zebra stripes")[0]] == ["alice keeps a zebra named stripes"]
    assert b.search("zebra stripes")[0] == []
    assert a.search("yak fluff")[0] == []
    assert b.get("same")["text"] == "bob keeps a yak named fluff"
    assert a.get("same")["tenant"] == "alice"
    # a tenant's request cannot name the other tenant in records or filters
    with pytest.raises(ServiceError) as e:
        a.add([{"id": "x1", "text": "sneaky", "tenant": "bob"}])
    assert e.value.status == 403
    with pytest.raises(ServiceError) as e:
        a.search("yak", where={"tenant": "bob"})
    assert e.value.status == 403
    with pytest.raises(ServiceError) as e:
        a.search(["yak", "zebra"], where=[None, {"tenant": {"eq": "bob"}}])
    assert e.value.status == 403
    assert b.get("x1") is None
    # deleting in one tenant leaves the other's record of the same id
    assert a.delete("same") == 1
    assert a.get("same") is None and b.get("same") is not None
    with pytest.raises(UnknownIdError, match="'same'"):  # as Memory.delete: unknown ids raise ...
        a.delete(["same"])
    assert a.delete(["same"], missing_ok=True) == 0  # ... unless missing_ok


def test_body_limit_413(server):
    srv, keys, _ = server
    big = {"records": [{"id": "big", "text": "word " * 10_000}]}
    r = httpx.post(srv.url + "/v1/tenants/alice/records", json=big, headers={"Authorization": f"Bearer {keys['alice']}"})
    assert r.status_code == 413
    # streamed without a length
    def gen():
        yield b'{"records": [{"id": "big", "text": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}]}'
    r = httpx.post(srv.url + "/v1/tenants/alice/records", content=gen(),
                   headers={"Authorization": f"Bearer {keys['alice']}", "content-type": "application/json"})
    assert r.status_code == 413
    assert _client(server, "alice").get("big") is None


@pytest.mark.parametrize("path,body,field", [
    ("records", {"records": [{"id": "v1"}]}, "text"),
    ("records", {"records": [{"id": "v1", "text": "t", "colour": "red"}]}, "colour"),
    ("records", {"records": [{"id": "v1", "text": "t", "role": "robot"}]}, "role"),
    ("records", {"records": [{"id": "v1", "text": "t", "time": "yesterday-ish"}]}, "records"),
    ("records", {"records": []}, "records"),
    ("records", {"records": [{"id": "a/b", "text": "t"}]}, "id"),
    ("search", {"queries": ["q"], "k": 0}, "k"),
    ("search", {"queries": []}, "queries"),
    ("search", {"queries": ["q"], "where": {"time": {"around": 3}}}, "where"),
    ("search", {"queries": ["q", "r"], "where": [{}]}, "where"),
    ("search", {"queries": ["q"], "config": "no-such-config"}, "config"),
])
def test_422_names_the_field(server, path, body, field):
    srv, keys, _ = server
    r = httpx.post(f"{srv.url}/v1/tenants/carol/{path}", json=body, headers={"Authorization": f"Bearer {keys['carol']}"})
    assert r.status_code == 422, r.text
    locs = [d["loc"] for d in r.json()["detail"]]
    assert any(field in loc for loc in locs), locs
    assert _client(server, "carol").get("v1") is None


def test_conflicting_add_is_409_and_adds_nothing(server):
    a = _client(server, "carol")
    assert a.add([{"id": "c1", "text": "first"}]) == 1
    with pytest.raises(ServiceError) as e:
        a.add([{"id": "c2", "text": "second"}, {"id": "c1", "text": "again"}])
    assert e.value.status == 409
    assert a.get("c2") is None and a.get("c1")["text"] == "first"


def test_read_your_writes_sync(server):
    a = _client(server, "alice")
    for i in range(15):
        word = f"ryw{i}token"
        assert a.add([{"id": f"ryw-{i}", "text": f"note {word}", "time": 1_700_000_000_000 + i}], time_unit="ms") == 1
        hits = a.search([word], k=3)[0]
        assert [h["id"] for h in hits] == [f"ryw-{i}"]
        assert hits[0]["time"] == (f"2023-11-14T22:13:20.{i:03d}+00:00" if i else "2023-11-14T22:13:20+00:00")
        assert a.get(f"ryw-{i}")["text"] == f"note {word}"


def test_read_your_writes_concurrent_tenants(server):
    srv, _, root = server
    ks = KeyStore(root)
    tenants = [f"t{i:02d}" for i in range(12)]
    tkeys = {t: ks.add(t) for t in tenants}  # picked up by the running server

    async def agent(http, t):
        c = AsyncMemoryClient(srv.url, tkeys[t], http=http)
        for step in range(4):
            word = f"{t}w{step}"
            assert await c.add([{"id": f"s{step}", "text": f"{word} shared words"}]) == 1
            hits = (await c.search([word, "shared words"], k=10))
            assert [h["id"] for h in hits[0]] == [f"s{step}"]
            assert {h["id"] for h in hits[1]} == {f"s{j}" for j in range(step + 1)}
            assert all(h["tenant"] == t for h in hits[1])

    async def main():
        async with httpx.AsyncClient(timeout=30) as http:
            await asyncio.gather(*(agent(http, t) for t in tenants))

    asyncio.run(main())


def test_keys_revoked_while_serving(server):
    srv, _, root = server
    ks = KeyStore(root)
    key = ks.add("dave")
    c = MemoryClient(srv.url, key)
    assert c.add([{"id": "d1", "text": "dave"}]) == 1
    ks.revoke("dave")
    with pytest.raises(ServiceError) as e:
        c.get("d1")
    assert e.value.status == 401


# ---------------------------------------------------------------------- the micro-batcher
def _memory() -> Memory:
    m = Memory(partition_days=None)
    words = ["apple", "banana", "cherry", "date", "elder", "fig", "grape"]
    recs = []
    for i in range(300):
        t = f"ten{i % 5}"
        recs.append({"id": f"{t}/r{i}", "tenant": t,
                     "text": " ".join(words[(i * j) % 7] for j in range(1, 2 + i % 5))})
    m.add(recs)
    return m


def test_batcher_groups_concurrent_searches_and_matches_unbatched():
    mem = _memory()
    calls = []

    def fn(queries, k, wheres):
        calls.append(len(queries))
        res = mem.search(queries, k=k, where=wheres, backend="numpy")
        return [res.hits(i) for i in range(len(queries))]

    words = ["apple banana", "cherry", "date elder fig", "grape apple", "fig"]
    reqs = [([words[i % 5], words[(i + 2) % 5]], 1 + i % 7, {"tenant": f"ten{i % 5}"}) for i in range(40)]

    async def main():
        b = MicroBatcher(window_s=0.05, max_batch=1000)
        out = await asyncio.gather(*(b.search(None, fn, q, k, [w] * len(q)) for q, k, w in reqs))
        return b, out

    b, out = asyncio.run(main())
    assert b.batches == len(calls) <= 2 and sum(calls) == 80
    for (q, k, w), got in zip(reqs, out):
        want = mem.search(q, k=k, where=w, backend="numpy")
        assert got == [want.hits(0), want.hits(1)]
        assert all(h["tenant"] == w["tenant"] for row in got for h in row)


def test_batcher_respects_max_batch_and_isolates_errors():
    mem = _memory()
    calls = []

    def fn(queries, k, wheres):
        calls.append(len(queries))
        res = mem.search(queries, k=k, where=wheres, backend="numpy")
        return [res.hits(i) for i in range(len(queries))]

    async def main():
        b = MicroBatcher(window_s=0.05, max_batch=8)
        good = [b.search(None, fn, ["apple"], 3, [{"tenant": "ten1"}]) for _ in range(20)]
        bad = b.search(None, fn, ["apple"], 3, [{"time": {"around": 1}}])
        return await asyncio.gather(*good, bad, return_exceptions=True)

    res = asyncio.run(main())
    assert max(calls) <= 8
    want = mem.search(["apple"], k=3, where={"tenant": "ten1"}, backend="numpy").hits(0)
    assert all(r == [want] for r in res[:20])
    assert isinstance(res[20], ValueError)


@pytest.mark.parametrize("inline", [True, False])
def test_batcher_inline_runs_on_the_loop_thread_with_the_same_answers(inline):
    """inline=True: the scorer runs on the event loop's thread (a CPU scorer holds the GIL anyway);
    inline=False: in a worker thread. Both batch across tenants into one call and answer alike."""
    import threading

    mem = _memory()
    threads, calls = [], []

    def fn(queries, k, wheres):
        threads.append(threading.get_ident())
        calls.append(len(queries))
        res = mem.search(queries, k=k, where=wheres, backend="numpy")
        return [res.hits(i) for i in range(len(queries))]

    reqs = [(["apple", "fig grape"], 2 + i % 3, {"tenant": f"ten{i % 5}"}) for i in range(10)]

    async def main():
        b = MicroBatcher(window_s=0.05, max_batch=1000)
        out = await asyncio.gather(*(b.search(None, fn, q, k, [w] * 2, inline=inline) for q, k, w in reqs))
        return threading.get_ident(), out

    loop_thread, out = asyncio.run(main())
    assert calls == [20]  # ten requests of five tenants: one scorer call
    assert (threads == [loop_thread]) is inline
    for (q, k, w), got in zip(reqs, out):
        want = mem.search(q, k=k, where=w, backend="numpy")
        assert got == [want.hits(0), want.hits(1)]


def test_service_runs_cpu_bm25_inline(tmp_path):
    from gpuir.service.app import Service

    assert Service(tmp_path / "a", backend="numpy").bm25_inline is True
    assert Service(tmp_path / "b", backend="cupy").bm25_inline is False  # a GPU (or its absence, reported per search)


def test_server_batches_concurrent_searches(server):
    """Concurrent HTTP searches share scorer calls: the batch-size histogram counts fewer calls than queries."""
    srv, keys, _ = server

    def scrape():
        text = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {keys['operator']}"}).text
        vals = {}
        for line in text.splitlines():
            for name in ("gpuir_search_batch_queries_count", "gpuir_search_batch_queries_sum"):
                if line.startswith(name + " "):
                    vals[name] = float(line.split()[1])
        return vals["gpuir_search_batch_queries_count"], vals["gpuir_search_batch_queries_sum"]

    c0, s0 = scrape()
    a = _client(server, "alice")
    with cf.ThreadPoolExecutor(32) as ex:
        list(ex.map(lambda i: a.search([f"q{i}"], k=1), range(64)))
    c1, s1 = scrape()
    assert s1 - s0 == 64
    assert c1 - c0 < 64


def test_missing_extra_is_exit_2(monkeypatch, capsys, tmp_path):
    import importlib.util

    from gpuir.service import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "uvicorn" else real(n, *a))
    assert cli.main(["serve", str(tmp_path / "m")]) == 2
    assert "pip install 'gpuir[service]'" in capsys.readouterr().err


def test_serve_refuses_a_foreign_directory(tmp_path, capsys):
    from gpuir.service import cli

    (tmp_path / "mine.txt").write_text("not a memory")
    assert cli.main(["serve", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_serve_passes_keep_alive_to_uvicorn(tmp_path, monkeypatch, capsys):
    """Agents think for seconds between calls: the idle-connection timeout is an option (default 75 s)."""
    import uvicorn

    from gpuir.service import cli

    seen = []

    def run(self, sockets=None):  # uvicorn.Server.run, without listening
        seen.append(self.config)
        self.started = True

    monkeypatch.setattr(uvicorn.Server, "run", run)
    assert cli.main(["serve", str(tmp_path / "m1"), "--keep-alive-seconds", "9"]) == 0
    assert cli.main(["serve", str(tmp_path / "m2")]) == 0
    assert [c.timeout_keep_alive for c in seen] == [9.0, 75.0]
    assert cli.main(["serve", str(tmp_path / "m3"), "--keep-alive-seconds", "-1"]) == 2
    assert "--keep-alive-seconds" in capsys.readouterr().err


def test_named_retriever_config(server):
    """`config` names <MEMORY_DIR>.configs/NAME.json; a single BM25 channel ranks as plain BM25."""
    from gpuir.retrieve.config import ChannelConfig, RetrieverConfig

    root = server[2]
    folder = root.with_name(root.name + ".configs")
    folder.mkdir(exist_ok=True)
    RetrieverConfig(channels=[ChannelConfig("bm25", depth=50)], fusion=None).save(folder / "plain.json")
    c = _client(server, "carol")
    c.add([{"id": f"rc{i}", "text": f"orchid {'petal ' * i}garden"} for i in range(1, 6)])
    plain = c.search(["orchid petal"], k=3)[0]
    named = c.search(["orchid petal"], k=3, config="plain")[0]
    assert [h["id"] for h in named] == [h["id"] for h in plain] and len(plain) == 3
    assert all(h["tenant"] == "carol" for h in named)
    assert _client(server, "bob").search(["orchid petal"], k=3, config="plain")[0] == []
    # min_score with config: a fused score has no calibrated scale for records, so a 422 that says what to do
    # (it filtered the fused scores before), from both clients
    with pytest.raises(ServiceError) as e:
        c.search(["orchid petal"], k=3, config="plain", min_score=0.5)
    assert e.value.status == 422 and "min_score" in str(e.value.detail)
    for hint in ("no fixed scale", "with k", "ChannelConfig(min_score=...)", "--ranking hybrid"):
        assert hint in str(e.value.detail), hint
    ac = AsyncMemoryClient(server[0].url, server[1]["carol"])

    async def go():
        try:
            with pytest.raises(ServiceError) as ae:
                await ac.search("orchid", config="plain", min_score=0.0)
            return ae.value.status
        finally:
            await ac.aclose()

    assert asyncio.run(go()) == 422
