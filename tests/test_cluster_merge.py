"""ShardedMemory.search's merge without Ray and without the LoCoMo data (issues 36 and 38).

* the ordering rules over arrays (gpuir.memory.hitorder.merge_topk) against a plain Python sort written here
  from the rules' statement (score descending, then lower sequence number; ``ties="newest"``: timed before
  untimed, later time, later sequence number; ``order_by="time"``: oldest first, untimed last, then add order);
* the coordinator's merge of shards' answers (gpuir.cluster.sharded.merge_answers) on synthetic answers;
* the whole query-then-fetch path of a ShardedMemory over in-process shards (ShardServer objects behind a fake
  actor handle, no Ray): ids, float32 scores and hits equal one Memory's, and records are fetched only for the
  final k (inline when one shard is asked).
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from gpuir.cluster import runtime
from gpuir.cluster.routing import shard_of
from gpuir.cluster.shard import ShardServer
from gpuir.cluster.sharded import ShardedMemory, memory_kwargs, merge_answers
from gpuir.memory import Memory
from gpuir.memory.hitorder import merge_topk, rank_order
from gpuir.memory.records import MISSING_TIME, format_time

# --------------------------------------------------------------------------- the rules, by hand


def key_of(seq: int, score: float, t: int, ties: str):
    if ties == "oldest":
        return (-score, seq)
    untimed = t == MISSING_TIME
    return (-score, untimed, -(0 if untimed else t), -seq)


def oracle(seqs, scores, times, groups, k, ties, order_by):
    """{group: [positions, in final order]} by Python's sort of tuples."""
    out = {}
    for g in sorted(set(groups.tolist())):
        idx = [i for i in range(len(seqs)) if groups[i] == g]
        idx.sort(key=lambda i: key_of(int(seqs[i]), float(scores[i]), int(times[i]), ties))
        idx = idx[:k]
        if order_by == "time":
            idx.sort(key=lambda i: (int(times[i]) == MISSING_TIME, 0 if times[i] == MISSING_TIME else int(times[i]),
                                    int(seqs[i])))
        out[g] = idx
    return out


def synthetic_hits(rng, m, n_groups):
    seqs = rng.permutation(10 * m)[:m].astype(np.int64)  # distinct, in no order
    scores = rng.choice(np.float32([0.5, 1.25, 1.25000012, 2.0, 3.5]), size=m)  # many exact ties
    times = rng.choice(np.r_[np.int64(MISSING_TIME), np.arange(5, dtype=np.int64) * 1000], size=m)
    groups = rng.integers(0, n_groups, size=m).astype(np.int64)
    return seqs, scores.astype(np.float32), times.astype(np.int64), groups


@pytest.mark.parametrize("ties", ["oldest", "newest"])
@pytest.mark.parametrize("order_by", ["score", "time"])
def test_merge_topk_follows_the_rules(ties, order_by):
    rng = np.random.default_rng([38, len(ties), len(order_by)])
    for trial in range(30):
        m = int(rng.integers(0, 60))
        seqs, scores, times, groups = synthetic_hits(rng, m, 4)
        k = int(rng.integers(1, 9))
        keep, col = merge_topk(seqs, scores, times, groups, k, ties, order_by)
        want = oracle(seqs, scores, times, groups, k, ties, order_by)
        got: dict[int, list[int]] = {}
        for j, c in zip(keep.tolist(), col.tolist()):
            assert c == len(got.setdefault(int(groups[j]), [])), "columns count 0, 1, ... in each question"
            got[int(groups[j])].append(j)
        assert got == want, (trial, ties, order_by)


def test_rank_order_refuses_newest_without_times_and_unknown_rules():
    with pytest.raises(ValueError, match="times"):
        rank_order(np.zeros(2, np.int64), np.zeros(2, np.float32), None, "newest")
    with pytest.raises(ValueError, match="ties must be"):
        rank_order(np.zeros(2, np.int64), np.zeros(2, np.float32), None, "latest")


def shard_answer(seqs, scores, times, groups, qis, k, ties):
    """What a shard answers: each asked question's own top k of its hits, best first, padded."""
    b = len(qis)
    out = {"seqs": np.full((b, k), -1, np.int64), "scores": np.full((b, k), -np.inf, np.float32),
           "times": np.full((b, k), MISSING_TIME, np.int64), "records": {}}
    for r, q in enumerate(qis):
        idx = np.flatnonzero(groups == q)
        idx = idx[rank_order(seqs[idx], scores[idx], times[idx], ties)][:k]
        n = idx.size
        out["seqs"][r, :n], out["scores"][r, :n], out["times"][r, :n] = seqs[idx], scores[idx], times[idx]
    return out


@pytest.mark.parametrize("ties", ["oldest", "newest"])
def test_merge_answers_of_three_shards_equals_the_top_k_of_the_union(ties):
    rng = np.random.default_rng([36, len(ties)])
    B, S, k = 6, 3, 5
    for _ in range(20):
        seqs, scores, times, groups = synthetic_hits(rng, 90, B)
        home = rng.integers(0, S, size=seqs.size)
        asked = {s: [q for q in range(B) if rng.random() < 0.8 or s == q % S] for s in range(S)}
        got = {}
        for s, qis in asked.items():
            mine = home == s
            got[s] = shard_answer(seqs[mine], scores[mine], times[mine], groups[mine], qis, k, ties)
        merged = merge_answers(B, k, asked, got, ties, "score")
        # the union of what each question's asked shards hold, ranked by the rules by hand
        for q in range(B):
            pool = [i for i in range(seqs.size) if groups[i] == q and q in asked[int(home[i])]]
            pool.sort(key=lambda i: key_of(int(seqs[i]), float(scores[i]), int(times[i]), ties))
            want = [int(seqs[i]) for i in pool[:k]]
            assert merged.seqs[q][merged.seqs[q] >= 0].tolist() == want
            assert merged.scores[q][: len(want)].tolist() == [float(scores[i]) for i in pool[:k]]
            assert np.all(np.isneginf(merged.scores[q][len(want):]))
        assert np.all(merged.record_of == -1)  # no inline records were sent: every hit is fetched


# --------------------------------------------------------------------------- a fake in-process shard


class FakeActor:
    """A ShardServer behind Ray's call shape (``actor.method.remote(...)`` -> a ref ``get`` returns)."""

    def __init__(self, server: ShardServer, calls: list):
        self.server, self.calls = server, calls

    def __getattr__(self, name):
        def remote(*args):
            self.calls.append((self.server.index, name))
            return getattr(self.server, name)(*args)

        return types.SimpleNamespace(remote=remote)


class _Err(Exception):
    pass


FAKE_RAY = types.SimpleNamespace(
    get=lambda ref, timeout=None: ref, kill=lambda *a, **kw: None, shutdown=lambda: None, nodes=list,
    exceptions=types.SimpleNamespace(RayActorError=_Err, GetTimeoutError=_Err, ActorUnavailableError=_Err,
                                     ActorDiedError=_Err))


class _NoLock:
    def __exit__(self, *a):
        pass


def in_process(tmp_path, monkeypatch, shards, route, backend="auto", **opts):
    monkeypatch.setattr(runtime, "require_ray", lambda: FAKE_RAY)
    config = Memory(**opts).config()
    root = tmp_path / "sm"
    root.mkdir()
    manifest = {"route": route, "shards": shards, "memory": config, "options": {}}
    sm = ShardedMemory(root, manifest, _NoLock(), False, 10.0, 10.0)
    calls: list = []
    servers = [ShardServer(root / f"shard-{i}", i, create=memory_kwargs(config), backend=backend)
               for i in range(shards)]
    sm._attach([FakeActor(x, calls) for x in servers])
    return sm, calls


WORDS = ["walk", "lake", "paint", "group", "support", "dog", "music", "trip", "camp", "book"]


def records(n, rng):
    out = []
    for i in range(n):
        rec = {"id": f"r{i:04d}", "text": " ".join(rng.choice(WORDS, size=int(rng.integers(1, 5)))),
               "tenant": "abcd"[i % 4]}
        if i % 7:
            rec["time"] = format_time(1_700_000_000_000 + int(rng.integers(0, 40)) * 86_400_000)
        out.append(rec)
    return out


def same(one, sm, queries, **kw):
    want = one.search(queries, backend="numpy", **kw)
    got = sm.search(queries, backend="numpy", **kw)
    assert np.array_equal(got.seqs, want.seqs), kw
    assert np.array_equal(got.scores, want.scores), kw
    for i in range(len(queries)):
        assert got.hits(i) == want.hits(i), (kw, i)
    return got


@pytest.mark.parametrize("route", ["id", "tenant"])
def test_query_then_fetch_over_in_process_shards_equals_one_memory(tmp_path, monkeypatch, route):
    rng = np.random.default_rng(len(route))
    recs = records(400, rng)
    one = Memory(record_times=False, partition_days=7)
    sm, calls = in_process(tmp_path, monkeypatch, 3, route, partition_days=7)
    try:
        qs = ["walk lake", "paint group support", "dog", "music trip camp book", "nothing here"]
        tenants = [{"tenant": t} for t in "abcda"]
        for i in range(0, len(recs), 150):  # searched between writes: each state's statistics, never a stale one
            sm.add(recs[i:i + 150])
            one.add(recs[i:i + 150])
            same(one, sm, qs, k=5)
            same(one, sm, qs, k=5, where=tenants)
        sm.delete([r["id"] for r in recs[::11]])
        one.delete([r["id"] for r in recs[::11]])
        calls.clear()
        got = same(one, sm, qs, k=8)
        assert "fetch" in {c for _, c in calls}  # no where: several shards asked, the final k fetched
        assert got.meta["fetch_calls"] >= 1
        calls.clear()
        got = same(one, sm, qs, k=8, where=tenants)
        if route == "tenant":  # one shard per question: records come with the answer, no fetch call
            assert [c for _, c in calls].count("fetch") == 0 and got.meta["fetch_calls"] == 0
            assert all(len(a) <= 1 for a in got.meta["shards_asked"])
        for kw in ({"ties": "newest"}, {"order_by": "time"}, {"ties": "newest", "order_by": "time", "min_score": 1.0},
                   {"mode": "newest"}, {"mode": "budgeted", "max_partitions": 2}):
            same(one, sm, qs, k=6, **kw)
            same(one, sm, qs, k=6, where=tenants, **kw)
        same(one, sm, qs, k=500)  # k wider than the memory: min(k, N) columns, as one Memory's
    finally:
        sm.close()


def test_only_the_final_k_are_fetched(tmp_path, monkeypatch):
    """A question asked of two shards fetches k records in all, not each shard's k."""
    rng = np.random.default_rng(5)
    recs = records(300, rng)
    sm, calls = in_process(tmp_path, monkeypatch, 2, "id")
    fetched: list[int] = []
    for a in sm._actors:
        real = a.server.fetch
        a.server.fetch = lambda seqs, real=real: fetched.append(len(seqs)) or real(seqs)
    try:
        sm.add(recs)
        calls.clear()
        res = sm.search(["walk lake dog"], k=4, backend="numpy")
        assert sum(fetched) == 4 == int((res.seqs >= 0).sum())
        assert [c for _, c in calls].count("search") == 2  # one call per asked shard for the batch
    finally:
        sm.close()


def test_a_state_keeps_one_restated_snapshot_and_a_new_state_gets_a_new_one():
    from gpuir.memory.termstats import TermStats, restate

    m = Memory()
    m.add([{"id": "a", "text": "walk by the lake"}, {"id": "b", "text": "a dog"}])
    snap = m.snapshot()
    code = {t: int(snap.terms.lookup_many([t])[0]) for t in ("walk", "lake", "dog")}
    r1 = restate(snap, TermStats(10, 40, {"walk": 5}, version=7))
    r2 = restate(snap, TermStats(10, 40, {"lake": 3}, version=7))
    assert r1 is r2 and r2.df[code["walk"]] == 5 and r2.df[code["lake"]] == 3 and r2.n_docs == 10
    r3 = restate(snap, TermStats(10, 40, {"dog": 2}, version=8))
    assert r3 is not r1 and r3.df[code["lake"]] == 0 and r3.df[code["dog"]] == 2
    assert restate(snap, TermStats(10, 40, {"dog": 2})) is not restate(snap, TermStats(10, 40, {"dog": 2}))


def test_a_write_that_keeps_n_and_length_still_changes_the_scores(tmp_path, monkeypatch):
    """Delete one record and add one of the same length with other words: N and the total length are as they
    were, the df are not; the shards' searches must use the new state's statistics (a new version)."""
    sm, _ = in_process(tmp_path, monkeypatch, 2, "id")
    assert [shard_of(f"r{i}", 2) for i in (1, 2, 3, 4, 5, 9)] == [1, 0, 1, 1, 1, 0]
    one = Memory(record_times=False)
    recs = [{"id": f"r{i}", "text": t} for i, t in enumerate(
        ["walk lake", "walk dog", "lake camp", "music book", "dog trip", "walk camp"])]
    try:
        for m in (sm, one):
            m.add(recs)
        qs = ["walk", "music dog", "lake camp walk"]
        same(one, sm, qs, k=3)
        for m in (sm, one):
            m.delete(["r2"])  # on shard 0, as r9: shard 1 (r1, r3, r4, r5) is not written, its statistics change
            m.add([{"id": "r9", "text": "walk walk"}])  # two tokens, as "lake camp"
        assert len(sm) == len(one) == 6
        same(one, sm, qs, k=3)
    finally:
        sm.close()


@pytest.mark.parametrize("route", ["id", "tenant"])
def test_a_listing_over_several_shards_equals_one_memory(tmp_path, monkeypatch, route):
    """list() with a where that several shards can match: the same pages and the same cursors as one Memory
    (cursors interchangeable), in every order and direction; bad arguments refused as one Memory refuses them."""
    rng = np.random.default_rng(11)
    recs = records(300, rng)
    one = Memory(record_times=False)
    sm, calls = in_process(tmp_path, monkeypatch, 3, route)
    try:
        sm.add(recs)
        one.add(recs)
        sm.delete([r["id"] for r in recs[::13]])
        one.delete([r["id"] for r in recs[::13]])
        sm.update([{"id": "r0005", "text": "moved to the end of the add order"}])
        one.update([{"id": "r0005", "text": "moved to the end of the add order"}])
        for where in (None, {"tenant": "a"}, {"time": {"gte": format_time(1_700_000_000_000 + 9 * 86_400_000)}}):
            for order_by in ("seq", "time"):
                for descending in (False, True):
                    a_cur = b_cur = None
                    pages = 0
                    while True:
                        a = one.list(where, order_by=order_by, descending=descending, limit=37, cursor=a_cur)
                        b = sm.list(where, order_by=order_by, descending=descending, limit=37, cursor=b_cur)
                        assert b.records == a.records and b.cursor == a.cursor, (where, order_by, descending, pages)
                        pages += 1
                        if a.cursor is None:
                            break
                        a_cur = b_cur = a.cursor
                    assert pages >= 2 or where is not None
        calls.clear()
        sm.list(None, limit=5)
        assert sorted(s for s, c in calls if c == "list_keyed") == [0, 1, 2], "every shard asked once"
        for kw in ({"order_by": "nope"}, {"limit": 0}, {"cursor": "garbage"},
                   {"cursor": one.list(None, limit=2).cursor, "descending": True}):
            with pytest.raises(ValueError) as ea:
                one.list(None, **kw)
            with pytest.raises(ValueError) as eb:
                sm.list(None, **kw)
            assert str(ea.value) == str(eb.value), kw
    finally:
        sm.close()
