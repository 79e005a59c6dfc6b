"""Vectors stored in the memory's segments and the dense search over them.

The oracle is a brute-force ranking written here, independently of the code
under test: every live record passing the filter, its score the float32
rounding of the float64 inner product of the normalised query and the stored
(normalised, storage-dtype) vector, ranked by score descending then add order.
"""

from __future__ import annotations

import types
import zlib

import numpy as np
import pytest

from gpuir import Memory
from gpuir.backends import dense as dense_mod
from gpuir.memory import vecsearch
from gpuir.memory.embeddings import VectorError
from gpuir.memory.persist import MemoryFormatError
from gpuir.memory.where import compile_wheres

DIM = 24


def _norm(x, dtype=np.float32):
    a = np.asarray(x, np.float64)
    n = np.sqrt((a * a).sum(axis=1, keepdims=True))
    return (a / np.where(n > 0, n, 1)).astype(dtype)


class HashEncoder:
    """Deterministic bag-of-words vectors; counts every text it encodes."""

    def __init__(self, dim=DIM):
        self.dim = dim
        self.calls: list[int] = []

    def _enc(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0 + (zlib.crc32(w.encode()[::-1]) % 7) / 7
        return out

    def encode_passages(self, texts):
        self.calls.append(len(texts))
        return self._enc(texts)

    def encode_queries(self, texts):
        return self._enc(texts)


def _records(n, start=0, seed=0):
    rng = np.random.default_rng(seed + start)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta"]
    out = []
    for i in range(start, start + n):
        out.append({"id": f"r{i}", "text": " ".join(rng.choice(words, size=4)) + f" n{i}",
                    "tenant": "t1" if i % 3 else "t2", "metadata": {"g": int(i % 5)},
                    "time": f"2024-01-{1 + i % 28:02d}T00:00:00Z"})
    return out


def _oracle(mem: Memory, q: np.ndarray, k: int, where=None, name: str | None = None):
    """Brute force over the memory's live records: (ids, scores) per query."""
    snap = mem.snapshot()
    name = name or next(iter(mem.embeddings))
    wheres = compile_wheres(where, q.shape[0], snap.dicts, None, None)
    q64 = _norm(q).astype(np.float64)
    out = []
    for b in range(q.shape[0]):
        seqs, ids, vecs = [], [], []
        for v in snap.views:
            allow = (np.ones(v.seg.n_docs, bool) if v.live is None else v.live) if wheres[b] is None \
                else wheres[b].mask(v, snap.dicts)
            rows = np.flatnonzero(allow)
            seqs.extend(v.seg.seqs[rows].tolist())
            ids.extend(v.seg.ids.take(rows).tolist())
            vecs.append(np.asarray(v.seg.vectors(name))[rows])
        if not seqs:
            out.append(([], np.zeros(0, np.float32)))
            continue
        V = np.concatenate(vecs).astype(np.float64)
        s = (V @ q64[b]).astype(np.float32)
        order = np.lexsort((np.asarray(seqs), -s.astype(np.float64)))[:k]
        out.append(([ids[i] for i in order], s[order]))
    return out


def _check(mem, q, k, where=None, backends=("numpy", "numba"), name=None):
    want = _oracle(mem, q, k, where, name)
    for be in backends:
        r = mem.search_vectors(q, k=k, where=where, backend=be, embedding=name)
        for b in range(q.shape[0]):
            ids, sc = want[b]
            assert r.ids(b) == ids, (be, b)
            got = r.scores[b][: len(ids)]
            assert np.array_equal(got, sc), (be, b)
            assert np.all(r.seqs[b][len(ids):] == -1)
    return want


@pytest.fixture
def grown():
    rng = np.random.default_rng(7)
    m = Memory(background_merges=True, merge_min=8, merge_factor=2, partition_days=10)
    V = rng.normal(size=(400, DIM)).astype(np.float32)
    for s in range(0, 400, 40):
        m.add(_records(40, s), vectors={"v": V[s: s + 40]})
    return m, V


def test_scores_equal_the_float32_product_to_rounding(grown):
    m, V = grown
    q = np.random.default_rng(1).normal(size=(4, DIM)).astype(np.float32)
    r = m.search_vectors(q, k=10, backend="numpy")
    plain = _norm(q) @ _norm(V).T  # float32 everywhere (what a user would compute)
    for b in range(4):
        rows = [int(i[1:]) for i in r.ids(b)]
        assert np.allclose(r.scores[b], plain[b, rows], rtol=0, atol=2e-7)
        assert rows == [int(x) for x in np.argsort(-plain[b], kind="stable")[:10]]  # no near-tie in this data


def test_equals_brute_force_on_every_cpu_backend_with_where(grown):
    m, _ = grown
    m.wait_merges()
    q = np.random.default_rng(2).normal(size=(5, DIM)).astype(np.float32)
    _check(m, q, 7)
    _check(m, q, 7, where={"tenant": "t2"})
    _check(m, q, 400, where={"$and": [{"tenant": "t1"}, {"metadata.g": {"in": [1, 3]}}]})
    _check(m, q, 5, where=[{"tenant": "t1"}, None, {"tenant": "nobody"}, {"metadata.g": 0}, {"tenant": "t2"}])


def test_tenant_is_a_wall(grown):
    m, _ = grown
    q = np.random.default_rng(3).normal(size=(2, DIM)).astype(np.float32)
    r = m.search_vectors(q, k=400, where={"tenant": "t2"})
    for b in range(2):
        assert r.ids(b) and all(h["tenant"] == "t2" for h in r.hits(b))
    assert m.search_vectors(q, k=5, where={"tenant": "none"}).ids(0) == []


def test_after_deletes_updates_merges(grown):
    m, _ = grown
    q = np.random.default_rng(4).normal(size=(3, DIM)).astype(np.float32)
    top = m.search_vectors(q, k=3).ids(0)
    m.delete(top[:2] + [f"r{i}" for i in range(0, 400, 7)], missing_ok=True)
    _check(m, q, 9)
    m.add(_records(30, 400), vectors={"v": np.random.default_rng(5).normal(size=(30, DIM))})
    m.update([{"id": "r3", "metadata": {"g": 9}}])  # text kept: the stored vector kept, bit for bit
    before = m.vectors(["r5"]).copy()
    m.update([{"id": "r5", "metadata": {"g": 9}}])
    assert np.array_equal(m.vectors(["r5"]), before)
    m.wait_merges()
    _check(m, q, 9)
    _check(m, q, 9, where={"metadata.g": 9})
    m.merge()
    assert len(m.snapshot().views) <= len(m.snapshot().partitions)
    _check(m, q, 12, where={"tenant": "t1"})


def test_update_of_text_needs_an_encoder_and_reencodes():
    enc = HashEncoder()
    m = Memory(embeddings={"h": enc}, background_merges=False)
    m.add(_records(20))
    assert enc.calls == [20]  # one batched call
    m.update([{"id": "r1", "metadata": {"g": 7}}])
    assert enc.calls == [20]  # text unchanged: nothing encoded
    m.update([{"id": "r2", "text": "omega omega omega"}])
    assert enc.calls == [20, 1]
    assert np.array_equal(m.vectors(["r2"], "h"), _norm(enc._enc(["omega omega omega"])))
    bare = Memory(background_merges=False)
    bare.add(_records(3), vectors={"h": np.eye(3, DIM)})
    with pytest.raises(VectorError, match="no encoder"):
        bare.update([{"id": "r1", "text": "changed"}])
    assert bare.get(["r1"])[0]["text"] != "changed"  # nothing changed


def test_updates_take_given_vectors():
    enc = HashEncoder()
    m = Memory(embeddings={"h": enc}, background_merges=False)
    m.add(_records(4))
    enc.calls.clear()
    # vectors given (a row per record given): nothing encoded; the row of a record left as it was is dropped
    given = np.random.default_rng(3).normal(size=(3, DIM))
    r1 = m.get(["r1"])[0]
    assert m.update([{"id": "r0", "text": "new words"}, r1, {"id": "r2", "text": "more new"}], replace=True,
                    vectors={"h": given}) == 2
    assert enc.calls == []
    assert np.array_equal(m.vectors(["r0", "r2"], "h"), _norm(given[[0, 2]]))
    assert m.upsert([{"id": "r9", "text": "a new one"}], vectors={"h": given[:1]}) == 1 and enc.calls == []
    assert np.array_equal(m.vectors(["r9"], "h"), _norm(given[:1]))
    with pytest.raises(VectorError, match=r"shape \(2, dim\)"):
        m.update([{"id": "r3", "text": "x"}, m.get(["r1"])[0]], replace=True, vectors={"h": given})
    with pytest.raises(VectorError, match="dict"):
        m.upsert([{"id": "r3", "text": "x"}], vectors=given[:1])
    assert m.get(["r3"])[0]["text"] != "x"  # nothing changed
    # without vectors: a changed text encoded, an unchanged one keeps its vector
    assert m.update([{"id": "r3", "text": "x"}, m.get(["r9"])[0]], replace=True) == 1 and enc.calls == [1]
    assert np.array_equal(m.vectors(["r9"], "h"), _norm(given[:1]))


def test_the_embedding_is_public(tmp_path):
    enc = HashEncoder()
    m = Memory(embeddings={"h": enc}, background_merges=False)
    m.add(_records(4))
    enc.calls.clear()
    emb = m.embedding()  # the memory's own: its encodings are the stored vectors, bit for bit
    assert emb is m.embedding("h") and (emb.name, emb.dim, emb.dtype) == ("h", DIM, "float32")
    assert np.array_equal(emb.encode([_records(1)[0]["text"]], "test"), m.vectors(["r0"], "h"))
    assert np.array_equal(emb.encode_queries(["omega zeta"]), _norm(enc._enc(["omega zeta"])))
    m.save(tmp_path / "m")
    m.close()
    with Memory.open(tmp_path / "m", writer=False) as r:  # reopened without an encoder
        assert r.embedding().to_dict() == {"dim": DIM, "dtype": "float32", "model": "HashEncoder"}
        assert r.embedding().encoder is None
        with pytest.raises(VectorError, match="no encoder"):
            r.embedding().encode(["x"], "test")
    bare = Memory()
    with pytest.raises(VectorError, match="stores no vectors"):
        bare.embedding()
    bare.add(_records(1), vectors={"a": np.ones((1, 2)), "b": np.ones((1, 2))})
    with pytest.raises(VectorError, match="several embeddings"):
        bare.embedding()
    with pytest.raises(VectorError, match="no embedding 'c'"):
        bare.embedding("c")


def test_save_open_mapped_and_equal(grown, tmp_path):
    m, _ = grown
    m.delete(["r10", "r11"])
    q = np.random.default_rng(6).normal(size=(3, DIM)).astype(np.float32)
    want = _check(m, q, 8, where={"tenant": "t1"})
    m.save(tmp_path / "mem")
    m.close()
    m2 = Memory.open(tmp_path / "mem")
    assert m2.embeddings["v"]["dim"] == DIM
    seg = m2.snapshot().views[0].seg
    col = seg.vectors("v")
    assert not col.flags.writeable and not col.flags.owndata  # a view of the file's mapping
    got = _check(m2, q, 8, where={"tenant": "t1"})
    assert [w[0] for w in want] == [g[0] for g in got]
    m2.add(_records(10, 500), vectors={"v": np.ones((10, DIM))})
    m2.merge()
    _check(m2, q, 8)
    m2.save()
    m2.close()
    m3 = Memory.open(tmp_path / "mem", writer=False)
    _check(m3, q, 8)


def test_float16_storage(tmp_path):
    rng = np.random.default_rng(8)
    V = rng.normal(size=(120, DIM))
    m = Memory(embeddings={"h": {"encoder": None, "dtype": "float16"}}, background_merges=False)
    m.add(_records(120), vectors={"h": V})
    col = m.vectors([f"r{i}" for i in range(120)])
    assert col.dtype == np.float16
    assert np.array_equal(col, _norm(V, np.float16))
    q = rng.normal(size=(2, DIM))
    _check(m, q.astype(np.float32), 10)
    r = m.search_vectors(q, k=10)
    exact32 = _norm(q) @ _norm(V).T
    rows = [int(i[1:]) for i in r.ids(0)]
    assert np.allclose(r.scores[0], exact32[0, rows], atol=2e-3)  # float16 rounding of the stored vectors
    m.save(tmp_path / "m16")
    m.close()
    m2 = Memory.open(tmp_path / "m16")
    assert m2.embeddings["h"]["dtype"] == "float16"
    assert m2.snapshot().views[0].seg.vectors("h").dtype == np.float16
    _check(m2, q.astype(np.float32), 10)


def test_cupy_host_path(grown, monkeypatch):
    """The cupy branch's host code on NumPy standing in for CuPy (the device run is bench/gpu_verify's)."""
    m, _ = grown
    m.wait_merges()
    fake = types.SimpleNamespace(asarray=np.asarray, where=np.where, float32=np.float32, float64=np.float64)
    monkeypatch.setattr(dense_mod, "_cupy", lambda: fake)
    snap = m.snapshot()
    q = _norm(np.random.default_rng(9).normal(size=(3, DIM)))
    for where in (None, {"tenant": "t2"}):
        w = compile_wheres(where, 3, snap.dicts, None, None)
        a = vecsearch.search_snapshot(snap, "v", q, 6, w, "numpy")
        b = vecsearch.search_snapshot(snap, "v", q, 6, w, "cupy")
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


def test_faiss_method_equals_exact(grown, monkeypatch):
    pytest.importorskip("faiss")
    m, _ = grown
    m.wait_merges()
    monkeypatch.setattr(vecsearch, "FAISS_MIN_ROWS", 1)
    q = np.random.default_rng(10).normal(size=(4, DIM)).astype(np.float32)
    for where in (None, {"tenant": "t1"}):
        a = m.search_vectors(q, k=9, where=where, method="exact", backend="numpy")
        b = m.search_vectors(q, k=9, where=where, method="faiss", backend="numpy")
        assert np.array_equal(a.seqs, b.seqs) and np.array_equal(a.scores, b.scores)


def test_encoder_batches_once_and_text_queries(tmp_path):
    enc = HashEncoder()
    m = Memory(embeddings={"h": enc})
    m.add(_records(50))
    m.add(_records(25, 50))
    assert enc.calls == [50, 25]
    hits = m.search_vectors("alpha alpha beta", k=3).hits(0)
    assert set(hits[0]) >= {"id", "score", "text", "tenant"}
    q = enc.encode_queries(["alpha alpha beta"])
    assert [h["id"] for h in hits] == m.search_vectors(q, k=3).ids(0)
    m.save(tmp_path / "m")
    m.close()
    m2 = Memory.open(tmp_path / "m")  # no encoder given: stored vectors searchable by vector only
    assert m2.search_vectors(q, k=3).ids(0) == [h["id"] for h in hits]
    with pytest.raises(VectorError, match="no encoder"):
        m2.add(_records(1, 100))
    with pytest.raises(VectorError, match="no encoder"):
        m2.search_vectors("alpha", k=3)
    m2.close()
    enc2 = HashEncoder()
    m3 = Memory.open(tmp_path / "m", embeddings={"h": enc2})  # attached: nothing re-encoded
    assert enc2.calls == []
    m3.add(_records(5, 100))
    assert enc2.calls == [5]
    m3.close(discard_unsaved=True)


def test_old_directory_without_vectors_opens_and_backfills(tmp_path):
    m = Memory(background_merges=False)
    m.add(_records(30))
    m.delete(["r4"])
    m.save(tmp_path / "old")
    m.close()
    import json

    cur = (tmp_path / "old" / "CURRENT").read_text().strip()
    assert "embeddings" not in json.loads((tmp_path / "old" / cur).read_text())  # the format as before
    o = Memory.open(tmp_path / "old")
    assert o.embeddings == {}
    with pytest.raises(VectorError, match="stores no vectors"):
        o.search_vectors(np.ones(DIM), k=2)
    assert o.search("alpha", k=3).ids(0)  # BM25 as before
    o.close()
    enc = HashEncoder()
    b = Memory.open(tmp_path / "old", embeddings={"h": enc})  # a new embedding: every live record encoded
    assert enc.calls == [29]
    q = np.random.default_rng(11).normal(size=(2, DIM)).astype(np.float32)
    _check(b, q, 5, name="h")
    b.save()
    b.close()
    c = Memory.open(tmp_path / "old")
    assert c.embeddings["h"]["dim"] == DIM
    _check(c, q, 5, name="h")


def test_bad_vectors_are_clear_errors():
    m = Memory(background_merges=False)
    with pytest.raises(VectorError, match=r"shape \(2, dim\)"):
        m.add(_records(2), vectors={"v": np.ones((3, 4))})
    with pytest.raises(VectorError, match="NaN"):
        m.add(_records(2), vectors={"v": np.full((2, 4), np.nan)})
    with pytest.raises(VectorError, match="embedding names"):
        m.add(_records(2), vectors={"bad name": np.ones((2, 4))})
    assert len(m) == 0 and m.embeddings == {}
    m.add(_records(2), vectors={"v": np.ones((2, 4))})
    with pytest.raises(VectorError, match="4-dimensional"):
        m.add(_records(1, 9), vectors={"v": np.ones((1, 5))})
    with pytest.raises(VectorError, match="add_embedding"):
        m.add(_records(1, 9), vectors={"v": np.ones((1, 4)), "w": np.ones((1, 4))})
    with pytest.raises(VectorError, match="4-dimensional"):
        m.search_vectors(np.ones(3), k=1)
    with pytest.raises(ValueError, match="method"):
        m.search_vectors(np.ones(4), k=1, method="annoy")
    assert len(m) == 2


def test_damaged_vectors_are_named(tmp_path):
    m = Memory(background_merges=False)
    m.add(_records(5), vectors={"v": np.ones((5, 4))})
    m.save(tmp_path / "m")
    m.close()
    cur = (tmp_path / "m" / "CURRENT").read_text().strip()
    import hashlib
    import json

    man = json.loads((tmp_path / "m" / cur).read_text())
    man["embeddings"]["w"] = {"dim": 4, "dtype": "float32", "model": None}  # a column no segment has
    body = {k: v for k, v in man.items() if k != "sha256"}
    man["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (tmp_path / "m" / cur).write_text(json.dumps(man))
    with pytest.raises(MemoryFormatError, match="no vectors of embedding 'w'"):
        Memory.open(tmp_path / "m")


def test_sparse_filters_score_only_their_rows_and_equal_brute_force():
    """Many tenants in one memory: a query of one tenant gathers its rows (the sparse path), others don't."""
    rng = np.random.default_rng(12)
    m = Memory(background_merges=False, partition_days=None)
    recs = [{"id": f"s{i}", "text": f"x{i}", "tenant": f"u{i % 20}", "session": f"g{i % 7}"} for i in range(600)]
    m.add(recs, vectors={"v": rng.normal(size=(600, DIM))})
    q = rng.normal(size=(4, DIM)).astype(np.float32)
    wheres = [{"tenant": "u3"}, None, {"tenant": "u17"}, {"$or": [{"session": "g1"}, {"session": "g2"}]}]
    _check(m, q, 8, where=wheres)
    _check(m, q, 40, where={"tenant": "u5"})  # k above the tenant's 30 records: all 30, in order
    m.delete([f"s{i}" for i in range(5, 600, 40)])
    _check(m, q, 40, where={"tenant": "u5"})


def test_export_writes_the_stored_vectors(tmp_path):
    m = Memory(background_merges=False)
    V = np.random.default_rng(13).normal(size=(4, DIM))
    m.add(_records(4), vectors={"v": V})
    m.export(tmp_path / "e.jsonl", vectors="v")
    got: dict = {}
    Memory.from_export(tmp_path / "e.jsonl", vectors=got)
    for i in range(4):
        assert np.array_equal(got[f"r{i}"], _norm(V)[i])


def test_compiled_path_split_over_threads_equals_numpy(monkeypatch):
    """Enough rows that the compiled loop splits them over threads (GPUIR_THREADS=3)."""
    monkeypatch.setenv("GPUIR_THREADS", "3")
    rng = np.random.default_rng(14)
    V = rng.normal(size=(13_000, 8)).astype(np.float32)
    q = rng.normal(size=(3, 8)).astype(np.float32)
    a = dense_mod.dense_topk(_norm(q), _norm(V), 25, None, "numpy")
    b = dense_mod.dense_topk(_norm(q), _norm(V), 25, None, "numba")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    full = dense_mod.dense_scores(_norm(q), _norm(V), "numba")
    assert np.array_equal(full, (_norm(q).astype(np.float64) @ _norm(V).astype(np.float64).T).astype(np.float32))
