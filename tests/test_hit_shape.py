"""One hit shape and one filter vocabulary on every search of the package.

``hits(i)`` of ``BM25Index.search``, ``Memory.search``, ``Retriever.search``, the service
client and the adapters' backends gives dicts with the user's ``id`` and a float ``score``
(records add their ``text`` and fields); ``ids(i)`` gives the ids; each takes ``where=``.
The same records and query give the same ids and scores (float32) on every surface.
"""

from __future__ import annotations

import pytest

from gpuir import BM25Index, Memory, Retriever
from gpuir.adapters import as_backend
from gpuir.results import HitLists

TEXTS = {
    "r1": "Caroline went to the LGBTQ support group",
    "r2": "Melanie painted a sunrise over the lake",
    "r3": "Caroline is researching adoption agencies",
    "r4": "the support group met again on Friday",
}
RECORDS = [{"id": i, "text": t, "tenant": "alice", "session": "s1" if i < "r3" else "s2"} for i, t in TEXTS.items()]
QUERY = "Caroline support group"
WHERE_IDS = ["r1", "r3", "r4"]  # every surface filters r2 out the same way
EXPECT = ["r1", "r4", "r3"]


def _check(hits, ids, with_text=True):
    assert [h["id"] for h in hits] == ids == EXPECT
    for h in hits:
        assert isinstance(h["score"], float)
        if with_text:
            assert h["text"] == TEXTS[h["id"]] and h["tenant"] == "alice"
    return [round(h["score"], 5) for h in hits]


@pytest.fixture(scope="module")
def memory():
    m = Memory()
    m.add(RECORDS)
    return m


def test_static_index(memory):
    idx = BM25Index.build(list(TEXTS.values()), ids=list(TEXTS))
    res = idx.search([QUERY], k=10, where={"id": {"in": WHERE_IDS}})
    scores = _check(res.hits(0), res.ids(0), with_text=False)
    assert set(res.hits(0)[0]) == {"id", "score"}
    assert res.ids[0].tolist()[:3] == [0, 3, 2]  # the array is still the document numbers
    # the same where per query, and its other conditions
    res2 = idx.search([QUERY, QUERY], k=10, where=[{"id": {"nin": ["r2"]}}, {"id": "r4"}])
    assert res2.ids(0) == EXPECT and res2.ids(1) == ["r4"]
    mem = memory.search([QUERY], k=10, where={"id": {"in": WHERE_IDS}})
    assert _check(mem.hits(0), mem.ids(0)) == scores  # the static index and the memory agree


def test_static_index_where_errors():
    idx = BM25Index.build(list(TEXTS.values()), ids=list(TEXTS))
    with pytest.raises(ValueError, match="no field 'tenant'"):
        idx.search(QUERY, where={"tenant": "alice"})
    with pytest.raises(ValueError, match="unknown condition 'gt'"):
        idx.search(QUERY, where={"id": {"gt": "r1"}})
    with pytest.raises(ValueError, match="2 entries but there are 1 queries"):
        idx.search(QUERY, where=[None, None])
    assert idx.search(QUERY, where={"id": {"in": ["nope"]}}).ids(0) == []  # unknown ids match nothing


def test_memory_retriever_and_adapters(memory):
    want = _check(memory.search(QUERY, k=10, where={"id": {"in": WHERE_IDS}}).hits(0), EXPECT)
    r = Retriever(memory, {"channels": [{"kind": "bm25"}], "fusion": None})
    res = r.search(QUERY, k=10, where={"id": {"in": WHERE_IDS}})
    assert _check(res.hits(0), res.ids(0)) == want
    ses = r.search(QUERY, k=10, where={"id": {"in": WHERE_IDS}}, unit="session").hits(0)
    assert [h["id"] for h in ses] == [h["session"] for h in ses] and all(isinstance(h["score"], float) for h in ses)
    for backend in (as_backend(memory), as_backend(r)):
        got = backend.search([QUERY], k=10, where={"id": {"in": WHERE_IDS}})
        assert isinstance(got, HitLists) and got[0] == got.hits(0)
        assert _check(got.hits(0), got.ids(0)) == want


def test_service_client(tmp_path, memory):
    pytest.importorskip("fastapi")
    from gpuir.service.client import MemoryClient
    from gpuir.service.keys import KeyStore
    from gpuir.service.testing import ServerProcess
    from gpuir.storage.dirlock import claim_dir

    root = tmp_path / "mem"
    claim_dir(root, "memory")
    key = KeyStore(root).add("alice")
    want = _check(memory.search(QUERY, k=10, where={"id": {"in": WHERE_IDS}}).hits(0), EXPECT)
    with ServerProcess(root, ["--checkpoint-every", "1000000"]) as srv:
        c = MemoryClient(srv.url, key)
        c.add([{k: v for k, v in rec.items() if k != "tenant"} for rec in RECORDS])
        res = c.search([QUERY], k=10, where={"id": {"in": WHERE_IDS}})
        assert isinstance(res, HitLists) and res[0] == res.hits(0)
        assert _check(res.hits(0), res.ids(0)) == want
