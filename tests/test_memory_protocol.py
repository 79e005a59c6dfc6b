"""One interface (gpuir.memory.protocol.MemoryAPI): the same API test bodies on a ``Memory`` and on a
``ShardedMemory`` over Ray (2 shards, route "tenant", loopback only, small data), so a feature of the
memory that the sharded memory lacks fails here. One Ray runtime for the module (its start is slow):
4 logical CPUs and one *pretend* GPU (``num_gpus=1`` on a machine without one), which the last test uses to check
that a shard per GPU asks Ray for one GPU of its own.
"""

from __future__ import annotations

import os
import time

# read by Ray when it is imported: set before the import below, so this process's runtime stays on loopback
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gpuir[ray]')")

from gpuir import Memory
from gpuir.cluster import ShardedMemory, runtime
from gpuir.memory import RecordError, UnknownIdError
from gpuir.memory.protocol import MemoryAPI, shard_list

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rt():
    # 4 logical CPUs: two 2-shard memories at once (a shard asks for one); the machine may have fewer cores
    started = runtime.connect(None, num_cpus=4, num_gpus=1)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(params=["memory", "sharded"])
def make(request, tmp_path, rt):
    """A factory of empty memories of one kind (closed at the end of the test)."""
    made = []

    def new(**opts):
        n = len(made)
        if request.param == "memory":
            m = Memory(**opts)
        else:
            m = ShardedMemory.create(tmp_path / f"sm{n}", shards=2, route="tenant", device="cpu", **opts)
        made.append(m)
        return m

    new.kind = request.param
    yield new
    for m in made:
        m.close()


RECS = [
    {"id": "a1", "text": "Caroline went to the support group on Tuesday", "tenant": "t1",
     "time": "2023-05-08T10:00:00Z", "metadata": {"speaker": "Caroline"}},
    {"id": "a2", "text": "Melanie painted a sunrise over the lake", "tenant": "t1", "time": "2023-05-09T10:00:00Z",
     "metadata": {"speaker": "Melanie"}},
    {"id": "b1", "text": "The support group met again", "tenant": "t2", "time": "2023-06-01T10:00:00Z"},
    {"id": "b2", "text": "a walk by the lake with the dog", "tenant": "t2"},
    {"id": "b3", "text": "a walk by the lake with the dog", "tenant": "t2", "time": "2023-07-01T10:00:00Z"},
    {"id": "c1", "text": "camping trip with the kids, lake and stars", "tenant": "t3", "time": "2023-04-01T00:00:00Z"},
]


def test_both_implement_the_protocol(make):
    m = make()
    assert isinstance(m, MemoryAPI)
    assert m.sharded == (make.kind == "sharded")
    shards = shard_list(m)
    assert (shards is None) == (make.kind == "memory")
    if shards is not None:
        assert [s["shard"] for s in shards] == [0, 1]


def test_add_get_count_and_refusals(make):
    m = make()
    assert m.add(RECS) == len(RECS) == len(m)
    assert "a1" in m and "zz" not in m
    got = m.get(["b1", "a1"])
    assert [r["id"] for r in got] == ["b1", "a1"] and got[1]["metadata"] == {"speaker": "Caroline"}
    assert got[1]["time"].startswith("2023-05-08T10:00:00")
    with pytest.raises(UnknownIdError):
        m.get(["nope"])
    assert m.get(["nope", "a2"], missing_ok=True)[0] is None
    with pytest.raises(RecordError):  # an id that exists: nothing of the batch is added
        m.add([{"id": "new1", "text": "x", "tenant": "t1"}, {"id": "a1", "text": "again", "tenant": "t1"}])
    assert "new1" not in m and len(m) == len(RECS)
    assert m.count({"tenant": "t2"}) == 3 and m.count({"tenant": "t1"}) == 2


def test_search_rules(make):
    m = make()
    m.add(RECS)
    res = m.search(["support group", "lake walk dog"], k=3)
    assert res.ids(0)[:2] == ["b1", "a1"]  # the shorter record scores higher
    assert res.scores.dtype == np.float32 and res.seqs.dtype == np.int64
    # equal scores: add order ("oldest"), or the later time first ("newest"; b2 has no time: after b3)
    assert res.ids(1)[:2] == ["b2", "b3"]
    assert m.search("lake walk dog", k=2, ties="newest").ids(0) == ["b3", "b2"]
    assert m.search("support group", k=5, where={"tenant": "t1"}).ids(0) == ["a1"]
    hits = m.search("lake", k=5, order_by="time").hits(0)  # oldest first, untimed last
    assert [h["id"] for h in hits] == ["c1", "a2", "b3", "b2"]
    assert all(h["score"] > 0 and h["text"] for h in hits)
    top = m.search("lake", k=5).scores[0]
    cut = float(top[1])
    assert all(h["score"] >= cut for h in m.search("lake", k=5, min_score=cut).hits(0))
    assert m.search("zzunknownword", k=3).ids(0) == []


def test_update_replace_upsert_and_history(make):
    m = make()
    m.add(RECS)
    assert m.update([{"id": "a1", "text": "Caroline went to the LGBTQ support group"}]) == 1
    rec = m.get(["a1"])[0]
    assert rec["text"].endswith("LGBTQ support group") and rec["metadata"] == {"speaker": "Caroline"}  # merged
    assert [v["text"] for v in m.history("a1")] == [RECS[0]["text"]]
    assert m.replace([{"id": "a2", "text": "only this now", "tenant": "t1"}]) == 1
    assert "metadata" not in m.get(["a2"])[0] or not m.get(["a2"])[0].get("metadata")
    assert m.upsert([{"id": "a3", "text": "a new one", "tenant": "t1"}, {"id": "a1", "text": "third version"}]) == 2
    assert m.get(["a3"])[0]["text"] == "a new one" and len(m) == len(RECS) + 1
    assert len(m.history("a1")) == 2
    with pytest.raises(UnknownIdError):
        m.update([{"id": "nope", "text": "x"}])
    assert m.search("LGBTQ", k=3).ids(0) == []  # the old version is not searchable
    assert m.search("third version", k=1).ids(0) == ["a1"]


def test_delete_missing_ok_and_keep_history(make):
    m = make()
    m.add(RECS)
    m.update([{"id": "a1", "text": "changed once"}, {"id": "b1", "text": "changed too"}])
    with pytest.raises(UnknownIdError):
        m.delete(["a2", "nope"])
    assert "a2" in m  # nothing deleted
    assert m.delete(["a2", "nope"], missing_ok=True) == 1
    assert m.delete(["a1"]) == 1  # the default keeps the history (issue 36)
    assert "a1" not in m
    kept = m.history("a1")
    assert [v["text"] for v in kept] == [RECS[0]["text"], "changed once"]  # the deleted version last
    assert m.delete(["b1"], keep_history=False) == 1
    assert m.history("b1") == []  # keep_history=False: a deleted record's history goes with it
    assert len(m) == len(RECS) - 3 and m.search("support group", k=5).ids(0) == []


def test_list_pages_a_tenant(make):
    m = make()
    m.add(RECS)
    page = m.list({"tenant": "t2"}, limit=2)
    assert [r["id"] for r in page.records] == ["b1", "b2"] and page.cursor
    rest = m.list({"tenant": "t2"}, limit=2, cursor=page.cursor)
    assert [r["id"] for r in rest.records] == ["b3"] and rest.cursor is None


def test_export_then_import(make, tmp_path):
    m = make()
    m.add(RECS)
    m.update([{"id": "c1", "text": "camping trip, then home"}])
    path = tmp_path / "t3.jsonl"
    assert m.export(path, where={"tenant": "t3"}) == 1
    want, want_history = m.get(["c1"]), m.history("c1")
    m.close()  # (the runtime's CPUs hold two sharded memories at once)
    m2 = make()
    assert m2.import_(path) == 1
    assert m2.get(["c1"]) == want
    assert m2.history("c1") == want_history and len(want_history) == 1
    with pytest.raises(RecordError):
        m2.import_(path)  # the id exists: nothing added
    assert m2.import_(path, replace=True) == 1 and len(m2) == 1
    other = make(method="bm25l")
    with pytest.raises(ValueError, match="bm25"):
        other.import_(path)
    assert len(other) == 0


def test_merge_keeps_every_answer(make):
    m = make(partition_days=None, merge_min=10**6)  # no merges but the ones asked for
    for r in RECS:
        m.add([r])
    m.delete(["a2"])
    qs = ["support group", "lake", "walk dog", "camping stars"]
    before = m.search(qs, k=4)
    assert m.merge() >= 1
    after = m.search(qs, k=4)
    assert np.array_equal(before.seqs, after.seqs) and np.array_equal(before.scores, after.scores)
    assert [after.hits(i) for i in range(4)] == [before.hits(i) for i in range(4)]


def test_sharded_answers_equal_one_memory(rt, tmp_path):
    rng = np.random.default_rng(38)
    words = ["lake", "walk", "dog", "support", "group", "paint", "trip", "stars", "kids", "music"]
    recs = [{"id": f"r{i}", "text": " ".join(rng.choice(words, size=int(rng.integers(1, 5)))),
             "tenant": f"t{i % 5}", **({"time": f"2023-0{1 + i % 9}-01T00:00:00Z"} if i % 4 else {})}
            for i in range(300)]
    one = Memory()
    with ShardedMemory.create(tmp_path / "sm", shards=2, route="id", device="cpu") as sm:
        for i in range(0, 300, 100):
            assert one.add(recs[i:i + 100]) == sm.add(recs[i:i + 100])
        qs = ["lake walk", "support group paint", "dog", "trip stars kids music"]
        for kw in ({}, {"where": {"tenant": "t2"}}, {"ties": "newest"}, {"order_by": "time", "k": 4}):
            a, b = one.search(qs, **kw), sm.search(qs, **kw)
            assert np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores), kw
            assert [a.hits(i) for i in range(len(qs))] == [b.hits(i) for i in range(len(qs))], kw
            assert b.meta["fetch_calls"] >= 1 or kw  # route "id": several shards asked, the final k fetched


def test_a_gpu_shard_asks_ray_for_a_gpu_of_its_own(rt, tmp_path):
    """device="gpu": each shard actor holds one GPU (num_gpus=1) and serves with the CuPy engine. This
    runtime has one pretend GPU: a second GPU shard is refused, and the GPU is Ray's again after close."""
    assert runtime.shard_options(True, 0.5, -1)["num_gpus"] == 1
    assert runtime.shard_options(False, 0.5, -1)["num_gpus"] == 0
    with pytest.raises(ValueError, match="one GPU per shard"):
        ShardedMemory.create(tmp_path / "two", shards=2, device="gpu")
    sm = ShardedMemory.create(tmp_path / "one", shards=1, device="gpu")
    try:
        assert sm.device == "gpu"
        assert ray.available_resources().get("GPU", 0) == 0  # the shard holds the runtime's one GPU
        sm.add(RECS)  # writes need no device
        (info,) = shard_list(sm)
        assert info["device"] == "cuda:0"  # Ray gave the actor its GPU
        # the CuPy engine ("unavailable" without a device: the shard does not fall back to the CPU engine)
        assert info["backend"] in ("cupy", "unavailable")
    finally:
        sm.close()
    deadline = time.monotonic() + 30  # Ray frees a killed actor's resources a moment later
    while ray.available_resources().get("GPU", 0) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("GPU", 0) == 1
