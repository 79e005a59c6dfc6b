"""The sharded memory's parts that need no Ray (they run in every `make test`).

* the memory's hook (gpuir.memory.termstats): several memories holding parts of the records, searched with the
  whole collection's statistics and given sequence numbers, return exactly what one memory returns;
* a shard (gpuir.cluster.shard.ShardServer): write-ahead log, replay after a crash, resent writes counted once,
  its statistics' deltas;
* the coordinator's statistics, routing, the directory's manifest, `gpuir memory info` of a sharded directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gpuir.analysis import Analyzer
from gpuir.bm25 import METHODS
from gpuir.cluster import layout
from gpuir.cluster.globalstats import GlobalStats
from gpuir.cluster.routing import owners, search_targets, shard_of
from gpuir.cluster.shard import ShardServer, write_payload
from gpuir.memory import Memory, MemoryFormatError, TermStats
from gpuir.memory.records import format_time, normalize_records
from gpuir.memory.where import compile_where
from gpuir.topk import topk_order

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
DAY = 86_400_000


def corpus(n: int, seed: int = 0) -> list[dict]:
    """Records with short texts over a small vocabulary (many exact ties), three tenants, times over ten weeks."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(1, 6)))
        rec = {"id": f"r{i:05d}", "text": " ".join(words), "tenant": "abc"[i % 3],
               "metadata": {"speaker": ["ann", "bo"][i % 2]}}
        if i % 17:
            rec["time"] = format_time(1_700_000_000_000 + int(rng.integers(0, 70)) * DAY)
        out.append(rec)
    # one word only in the records of tenant "c": absent from a part that holds no such record
    if n > 5:
        out[2]["text"] += " zzrare"
        out[5]["text"] += " zzrare zzrare"
    return out


QUERIES = ["alpha beta", "gamma gamma delta", "zzrare alpha", "epsilon zeta eta theta", "kappa", "omega",
           "iota lambda mu alpha", "delta zzrare beta"]


class Parts:
    """Records split over several memories by a hash of their id, numbered in one global add order."""

    def __init__(self, n: int, route: str = "id", **options):
        self.mems = [Memory(**options, record_times=False) for _ in range(n)]  # (as a sharded memory's)
        self.route = route
        self.next = 0
        self.where_is: dict[str, int] = {}

    def owner(self, rec) -> int:
        return owners([rec["id"]], [rec.get("tenant")], self.route, len(self.mems))[0]

    def add(self, recs, update=False):
        seqs = np.arange(self.next, self.next + len(recs))
        self.next += len(recs)
        if update:  # a record may move (route "tenant"): delete every old version, then add the new ones
            for r in recs:
                self.mems[self.where_is.pop(r["id"])].delete([r["id"]])
        for s in range(len(self.mems)):
            rows = [i for i, r in enumerate(recs) if self.owner(r) == s]
            if rows:
                self.mems[s].add([recs[i] for i in rows], seqs=seqs[rows])
                for i in rows:
                    self.where_is[recs[i]["id"]] = s

    def delete(self, ids):
        for rid in ids:
            self.mems[self.where_is.pop(rid)].delete([rid])

    def search(self, queries, k, where=None, local=False, **kw):
        stats = None
        if not local:
            stats = self.mems[0].term_stats(queries)
            for m in self.mems[1:]:
                stats = stats + m.term_stats(queries)
        res = [m.search(queries, k=k, where=where, backend="numpy", stats=stats, **kw) for m in self.mems]
        k = min(k, max(sum(len(m) for m in self.mems), 1))  # one memory's results are min(k, N) wide
        seqs = np.full((len(queries), k), -1, np.int64)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        for i in range(len(queries)):
            sq = np.concatenate([r.seqs[i] for r in res])
            sc = np.concatenate([r.scores[i] for r in res])
            ok = sq >= 0
            o = topk_order(sq[ok], sc[ok], k)
            seqs[i, : o.size], scores[i, : o.size] = sq[ok][o], sc[ok][o]
        return seqs, scores


def same(one: Memory, parts: Parts, queries, k, **kw) -> bool:
    want = one.search(queries, k=k, backend="numpy", **kw)
    seqs, scores = parts.search(queries, k, **kw)
    return np.array_equal(want.seqs, seqs) and np.array_equal(want.scores, scores)


@pytest.mark.parametrize("route", ["id", "tenant"])
@pytest.mark.parametrize("method", METHODS)
def test_parts_under_global_statistics_equal_one_memory(method, route):
    recs = corpus(600)
    one, parts = Memory(record_times=False, method=method), Parts(3, route=route, method=method)
    for i in range(0, 600, 150):
        one.add(recs[i:i + 150])
        parts.add(recs[i:i + 150])
    wheres = [None, {"tenant": "c"}, {"metadata.speaker": "bo"}, {"time": {"gte": format_time(1_700_000_000_000 + 30 * DAY)}},
              [{"tenant": "abc"[i % 3]} for i in range(len(QUERIES))]]
    for w in wheres:
        for k in (1, 5, 700):
            assert same(one, parts, QUERIES, k, where=w), (method, w, k)
    for mode, kw in (("newest", {}), ("budgeted", {"max_partitions": 3})):
        # the parts merge by (score, add order): the engine's tie rule (ties="newest" merges in the Ray tests)
        assert same(one, parts, QUERIES, 10, mode=mode, ties="oldest", **kw), (method, mode)
    dels = [r["id"] for r in recs[::7]]
    one.delete(dels)
    parts.delete(dels)
    ups = [dict(r, text=r["text"] + " zzrare omega", tenant="b") for r in recs[1::9] if r["id"] not in set(dels)]
    one.update(ups)
    parts.add(ups, update=True)
    for w in wheres:
        assert same(one, parts, QUERIES, 10, where=w), (method, w, "after deletes and updates")
    # the check can fail: each part scored with its own statistics does not give one memory's scores
    assert not np.array_equal(parts.search(QUERIES, 10, local=True)[1], one.search(QUERIES, k=10).scores)


def test_absent_term_counts_in_the_constant():
    """bm25l/bm25+: a query term a part never saw still adds its w0 to every candidate there (as one memory)."""
    one, parts = Memory(record_times=False, method="bm25l"), Parts(2, method="bm25l")
    recs = [{"id": "x1", "text": "alpha"}, {"id": "x2", "text": "beta"}, {"id": "x3", "text": "alpha alpha"}]
    one.add(recs)
    parts.add(recs)
    assert any(not m.term_stats(["beta"]).df["beta"] for m in parts.mems)
    assert same(one, parts, ["alpha beta"], 5)


def test_term_stats_count_live_records():
    m = Memory()
    recs = corpus(200, seed=3)
    m.add(recs)
    m.delete([r["id"] for r in recs[:50]])
    st = m.term_stats(["gamma delta", "zzrare"])
    an = Analyzer("default")
    live = recs[50:]
    assert st.n_docs == 150 and st.total_len == sum(len(an(r["text"])) for r in live)
    for t, d in st.df.items():
        assert d == sum(t in an(r["text"]) for r in live)
    assert st.avgdl == st.total_len / 150
    assert (TermStats(2, 10, {"a": 1}) + TermStats(3, 5, {"a": 2, "b": 1})) == TermStats(5, 15, {"a": 3, "b": 1})
    with pytest.raises(ValueError, match="outside"):
        m.search("gamma", stats=TermStats(2, 10, {"gamma": 3}))


def test_given_sequence_numbers_are_checked():
    m = Memory()
    m.add([{"id": "a", "text": "x"}], seqs=[10])
    assert m.next_seq == 11
    one = [{"id": "b", "text": "y"}]
    two = [{"id": "b", "text": "y"}, {"id": "c", "text": "z"}]
    for recs, bad in ((one, [5]), (one, [1.5]), (one, [11, 12]), (two, [11, 11]), (two, [12, 11])):
        with pytest.raises(ValueError, match="seqs"):
            m.add(recs, seqs=bad)
    assert len(m) == 1
    with pytest.raises(ValueError, match="seqs"):
        m.update([{"id": "a", "text": "y"}], seqs=[3])
    assert m.get(["a"])[0]["text"] == "x"


# --------------------------------------------------------------------------- the shard


def shard_at(tmp_path, **kw) -> ShardServer:
    return ShardServer(tmp_path / "s0", 0, create={"method": "bm25+"}, **kw)


def crash(s: ShardServer) -> None:
    """What a SIGKILL leaves: no checkpoint, the lock released by the OS."""
    mem = s.memory
    mem._writer._stop_merges()
    mem._writer._log.close()
    mem._writer._log = None
    mem._writer._release_lock(discard_unsaved=True)


def add_payload(recs, wid, start):
    b = normalize_records(recs)
    return write_payload("add", wid, batch=b, seqs=np.arange(start, start + len(recs)))


def test_shard_log_replay_and_resent_writes(tmp_path):
    recs = corpus(90)
    s = shard_at(tmp_path)
    p1, p2 = add_payload(recs[:40], 1, 0), add_payload(recs[40:], 2, 40)
    a1, a2 = s.write(p1), s.write(p2)
    assert a1["n"] == 40 and a2["n"] == 50 and "error" not in a1
    assert s.write(write_payload("delete", 3, ids=["r00001", "r00002"]))["n"] == 2
    crash(s)
    s = ShardServer(tmp_path / "s0", 0)
    assert s.replayed == 3 and len(s.memory) == 88 and s.last_wid == 3
    assert s.write(p2) == {"replayed": True}  # resent after a crash: counted once
    assert len(s.memory) == 88
    s.checkpoint()
    crash(s)  # the log is folded: the last write id comes from the memory's manifest
    s = ShardServer(tmp_path / "s0", 0)
    assert s.replayed == 0 and s.last_wid == 3 and s.write(p2) == {"replayed": True}
    one = Memory(record_times=False, method="bm25+")
    one.add(recs)
    one.delete(["r00001", "r00002"])
    got = s.memory.search(QUERIES, k=20, backend="numpy")
    want = one.search(QUERIES, k=20, backend="numpy")
    assert np.array_equal(got.seqs, want.seqs) and np.array_equal(got.scores, want.scores)
    s.close()


def test_shard_loads_its_compiled_engine_as_it_opens(tmp_path):
    """A shard warms the compiled engine in a thread as it opens (numba's load took 1.6 s of the first add:
    the longest add of a 5M-record run), while a memory opened to be searched imports no compiler. In a
    fresh process: no numba after opening a plain memory; numba loaded once the shard's warm-up is done.
    Only a shard that owns its process (an actor) then freezes the process's objects out of the
    collector's passes: one in its caller's process leaves the heap as it was."""
    code = f"""
import gc, sys, threading
from pathlib import Path
from gpuir.memory import Memory
m = Memory(); m.save(Path({str(tmp_path)!r}) / "plain"); m.close()
Memory.open(Path({str(tmp_path)!r}) / "plain").close()
plain = "numba" in sys.modules
from gpuir.cluster.shard import ShardServer

def warmed():
    for t in threading.enumerate():
        if t.name == "gpuir-shard-warm":
            t.join(120)

s = ShardServer(Path({str(tmp_path)!r}) / "shard", create={{}})
warmed()
print(plain, "numba" in sys.modules, gc.get_freeze_count())
s.close()
s = ShardServer(Path({str(tmp_path)!r}) / "actor", create={{}}, own_process=True)
warmed()
print(gc.get_freeze_count() > 50_000, s.info()["gc_frozen_objects"] == gc.get_freeze_count())
s.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "0", "True", "True"], out.stdout + out.stderr


def test_a_write_does_not_wait_for_the_checkpoint_it_starts(tmp_path, monkeypatch):
    """The write that crosses checkpoint_every answers while the save's files are still being written (in a
    thread of the shard), and so does the next write; the checkpoint then folds the log; close waits for it."""
    import threading

    from gpuir.memory.commit import PendingSave

    release, started = threading.Event(), threading.Event()
    finish = PendingSave.finish

    def slow_finish(self):
        started.set()
        assert release.wait(60)
        return finish(self)

    recs = corpus(90)
    s = shard_at(tmp_path, checkpoint_every=30)
    monkeypatch.setattr(PendingSave, "finish", slow_finish)
    answered = []
    w = threading.Thread(target=lambda: answered.append(s.write(add_payload(recs[:40], 1, 0))))
    w.start()
    w.join(30)
    assert answered and answered[0]["n"] == 40, "the write waited for its checkpoint's files"
    assert started.wait(30) and s.checkpoints == 0  # the save is under way, not committed
    assert s.write(add_payload(recs[40:60], 2, 40))["n"] == 20  # a write meanwhile: not held either
    release.set()
    assert s.wait_checkpoint(60) and s.checkpoints == 1
    assert s.pending_records == 20  # the 40 folded by the save; the 20 written during it are in the new log
    s.close()
    r = ShardServer(tmp_path / "s0", 0)
    assert len(r.memory) == 60
    r.close()


def test_shard_refuses_without_logging(tmp_path):
    s = shard_at(tmp_path)
    s.write(add_payload(corpus(5), 1, 0))
    size = s.memory._writer._log.wal.bytes
    ans = s.write(add_payload(corpus(2), 2, 5))  # ids r00000, r00001 exist
    assert ans["error"][0] == "exists"
    assert s.write(write_payload("delete", 3, ids=["nope"]))["error"][:2] == ("unknown", "delete")
    assert s.write(write_payload("delete", 4, ids=["nope"], missing_ok=True))["n"] == 0
    upd = normalize_records([{"id": "nope", "text": "x"}])
    assert s.write(write_payload("update", 5, batch=upd, seqs=np.array([9])))["error"][0] == "unknown"
    assert s.memory._writer._log.wal.bytes == size and len(s.memory) == 5
    s.close()


def test_shard_torn_tail_is_dropped(tmp_path):
    s = shard_at(tmp_path)
    s.write(add_payload(corpus(10), 1, 0))
    crash(s)
    from gpuir.wal import segments

    assert not segments(tmp_path / "s0", "service")  # the shard keeps no log of its own
    with open(segments(tmp_path / "s0", "memory")[-1][1], "ab") as f:
        f.write(b"gWAL\x05\x00")  # an append cut short: never acknowledged
    s = ShardServer(tmp_path / "s0", 0)
    assert len(s.memory) == 10
    s.close()


def test_shard_stat_deltas_sum_to_its_statistics(tmp_path):
    s = shard_at(tmp_path, checkpoint_every=25)
    gs = GlobalStats(1)
    recs = corpus(120, seed=5)
    wid = 0
    for i in range(0, 120, 30):
        wid += 1
        gs.apply(0, s.write(add_payload(recs[i:i + 30], wid, i)))
        assert s.wait_checkpoint(60)  # (each write crossed checkpoint_every: its checkpoint runs in a thread)
    wid += 1
    gs.apply(0, s.write(write_payload("delete", wid, ids=[r["id"] for r in recs[::4]])))
    wid += 1
    upd = normalize_records([dict(r, text="omega omega psi") for r in recs[1:20:4]])
    gs.apply(0, s.write(write_payload("update", wid, batch=upd, seqs=np.arange(200, 205))))
    full = GlobalStats(1)
    full.replace(0, s.sync())
    assert s.checkpoints >= 3
    assert (gs.n, gs.length, gs.partitions) == (full.n, full.length, full.partitions)
    terms = sorted(set(full.vocab.values) | set(gs.vocab.values))
    assert np.array_equal(gs.lookup(terms)[0], full.lookup(terms)[0])
    snap = s.memory.snapshot()
    assert gs.n_docs == snap.n_docs and gs.total_len == snap.total_len
    s.close()


# --------------------------------------------------------------------------- routing, manifest, CLI


def test_routing_is_stable_across_processes_and_spread():
    keys = [f"tenant-{i}" for i in range(2000)]
    here = [shard_of(k, 8) for k in keys]
    code = "import sys; from gpuir.cluster.routing import shard_of; print([shard_of(f'tenant-{i}', 8) for i in range(2000)])"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      check=True, cwd=os.getcwd()).stdout)
    assert here == there
    counts = np.bincount(here, minlength=8)
    assert counts.min() > 180 and counts.max() < 320  # 250 each on average
    assert owners(["i1", "i2"], ["t", None], "tenant", 8) == [shard_of("t", 8), shard_of("i2", 8)]
    assert search_targets(compile_where({"tenant": "t"}, {}), "tenant", 8) == [shard_of("t", 8)]
    assert search_targets(compile_where({"id": {"in": ["a", "b"]}}, {}), "id", 8) == sorted(
        {shard_of("a", 8), shard_of("b", 8)})
    assert search_targets(compile_where({"tenant": "t"}, {}), "id", 8) == list(range(8))
    assert search_targets(None, "tenant", 3) == [0, 1, 2]


def test_manifest_checked(tmp_path):
    root = tmp_path / "sm"
    root.mkdir()
    with pytest.raises(MemoryFormatError, match="no sharded memory"):
        layout.read_manifest(root)
    layout.write_manifest(root, 2, "id", Memory().config(), {})
    assert layout.read_manifest(root)["shards"] == 2 and layout.is_sharded(root)
    p = root / layout.MANIFEST
    p.write_text(p.read_text().replace('"shards": 2', '"shards": 3'))
    with pytest.raises(MemoryFormatError, match="checksum"):
        layout.read_manifest(root)


def test_memory_info_of_a_sharded_directory_needs_no_ray(tmp_path, capsys):
    from gpuir.cli import main
    from gpuir.storage.dirlock import claim_dir

    root = claim_dir(tmp_path / "sm", layout.KIND)
    recs = corpus(30)
    for i in range(2):
        s = ShardServer(layout.shard_dir(root, i), i, create={})
        s.write(add_payload(recs[i * 15:(i + 1) * 15], 1, i * 15))
        if i == 0:
            s.checkpoint()
        crash(s)  # shard 1's records are only in its log
    layout.write_manifest(root, 2, "id", Memory().config(), {"device": "cpu"})
    assert main(["memory", "info", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shards"] == 2 and info["records_saved"] == 15 and info["log_records"] == 15
    assert [s["records_saved"] for s in info["shard_list"]] == [15, 0]
    assert main(["memory", "info", str(root)]) == 0
    assert "2 shards, route id" in capsys.readouterr().out


def test_where_ids_under_or_and_not():
    from gpuir.cluster.routing import where_ids

    def ids(w):
        return where_ids(compile_where(w, {}))

    assert ids({"id": "a"}) == {"a"}
    assert ids({"$and": [{"id": {"in": ["a", "b"]}}, {"id": "b"}]}) == {"b"}
    assert ids({"$or": [{"id": "a"}, {"id": "c"}]}) == {"a", "c"}
    # an id under $or beside another field, or under $not, confines nothing: every shard must be asked
    assert ids({"$or": [{"id": "a"}, {"session": "s1"}]}) is None
    assert ids({"$not": {"id": "a"}}) is None
    assert search_targets(compile_where({"$or": [{"id": "a"}, {"session": "s"}]}, {}), "id", 8) == list(range(8))


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO}, check=False)


def test_the_cluster_imports_only_downward():
    r = _python("import sys\nimport gpuir.cluster, gpuir.cluster.sharded, gpuir.cluster.shard, gpuir.cluster.cli\n"
                "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('gpuir.')}))\n"
                "print('ray' in sys.modules)")
    assert r.returncode == 0, r.stderr
    layers, ray_loaded = r.stdout.splitlines()
    assert "service" not in layers and "eval" not in layers, layers  # the library never imports the service
    assert ray_loaded == "False"  # Ray is imported only when a sharded memory starts


def test_without_ray_the_extra_is_named_and_the_ray_tests_skip(tmp_path):
    # `import ray` fails in these processes, as where the extra is not installed
    block = "import sys\nsys.modules['ray'] = None\n"
    r = _python(block + "from gpuir import ShardedMemory\n"
                f"ShardedMemory.create({str(tmp_path / 'sm')!r}, shards=2)\n")
    assert r.returncode == 1 and "pip install 'gpuir[ray]'" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "sm").exists()  # nothing created
    r = _python(block + "import pytest\nsys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', "
                "'tests/test_cluster_ray.py']))")
    assert r.returncode in (0, 5), r.stdout[-2000:]  # 5: the module skipped whole, so no test was collected
    assert "1 skipped" in r.stdout and "the ray extra is not installed" in r.stdout, r.stdout[-2000:]


def _old_shard(d, payloads, last_wid):
    """A shard directory as an older gpuir left it: its memory saved without a log of its own, the shard's
    own log (``service-wal-*.log``, the frames :func:`write_payload` makes) and ``cluster-shard.json``."""
    from gpuir.wal import WriteAheadLog

    m = Memory(method="bm25+", durability="none")
    m.save(d)
    m.close()
    w = WriteAheadLog(d, kind="service")
    w.recover(1)
    w.append_payloads(payloads)
    w.close()
    (d / "cluster-shard.json").write_text(json.dumps({"last_wid": last_wid}))


def test_an_older_shard_log_is_replayed_once_then_retired(tmp_path, monkeypatch):
    from gpuir.memory.store import PendingSave
    from gpuir.wal import segments

    recs = corpus(30)
    d = tmp_path / "s0"
    p2, p3 = add_payload(recs[:20], 2, 0), add_payload(recs[20:], 3, 20)
    _old_shard(d, [p2, p3, write_payload("delete", 4, ids=["r00001"])], last_wid=1)
    real = PendingSave.finish

    def boom(self, *a, **k):  # the fold's save fails (as a crash before its commit)
        self.mem._save_lock.release()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PendingSave, "finish", boom)
    with pytest.raises(OSError):
        ShardServer(d, 0)
    assert len(segments(d, "service")) == 1  # nothing of the old log was lost or deleted
    monkeypatch.setattr(PendingSave, "finish", real)
    s = ShardServer(d, 0)
    assert s.replayed == 3 and s.last_wid == 4 and len(s.memory) == 29
    assert not segments(d, "service") and segments(d, "memory")  # retired: the memory's log is the one log
    assert s.write(p3) == {"replayed": True}  # a resent write of the old log is known
    assert s.write(add_payload(corpus(31)[30:], 5, 30))["n"] == 1
    crash(s)
    s = ShardServer(d, 0)  # replays its memory's log only: the old log is applied once
    assert s.last_wid == 5 and len(s.memory) == 30 and s.replayed == 1
    one = Memory(record_times=False, method="bm25+")
    one.add(corpus(31))
    one.delete(["r00001"])
    got, want = s.memory.search(QUERIES, k=10, backend="numpy"), one.search(QUERIES, k=10, backend="numpy")
    assert np.array_equal(got.seqs, want.seqs) and np.array_equal(got.scores, want.scores)
    s.close()


@pytest.mark.parametrize("level", ["fsync", "flush", "none"])
def test_a_shards_durability_is_its_memorys(tmp_path, level):
    from gpuir.wal import segments

    s = shard_at(tmp_path, durability=level)
    assert s.memory.durability == level
    s.write(add_payload(corpus(6), 1, 0))
    logged = bool(segments(tmp_path / "s0", "memory"))
    assert logged == (level != "none") and not segments(tmp_path / "s0", "service")
    assert s.pending_records == 6  # in the log, or (at "none") written since the last save
    s.close()
    s = ShardServer(tmp_path / "s0", 0, durability=level)
    assert len(s.memory) == 6 and s.last_wid == 1  # the close saved; the write id is in the manifest
    s.close()
    with pytest.raises(ValueError, match="durability"):
        ShardServer(tmp_path / "s0", 0, durability="sometimes")
