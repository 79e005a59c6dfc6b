"""Streaming build: chunk-size invariance, input errors, analyzer round trip."""

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import Analyzer, BM25Index
from gpuir.index.build import build_csr

FIELDS = ("offsets", "doc_ids", "tfs", "doc_lens")


@pytest.mark.parametrize("chunk", [1, 7, 100, 10_000])
def test_chunked_equals_one_shot_bit_for_bit(chunk):
    docs = random_corpus(700, 200, seed=5)
    one = build_csr(docs, "default", chunk_size=10**6)
    ch = build_csr(iter(docs), "default", chunk_size=chunk)  # a one-pass generator
    for f in FIELDS:
        a, b = getattr(one, f), getattr(ch, f)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f
    assert one.vocab == ch.vocab and one.ids == ch.ids


def test_layout_invariants():
    docs = random_corpus(300, 100, seed=2)
    csr = build_csr(docs, "plain")
    csr.validate()
    assert csr.offsets.dtype == np.int64 and csr.doc_ids.dtype == np.int32
    assert csr.vocab == sorted(csr.vocab)
    for t in range(csr.n_terms):  # doc ids ascending within each term
        d = csr.doc_ids[csr.offsets[t] : csr.offsets[t + 1]]
        assert np.all(np.diff(d) > 0)
    # total tf equals the total number of tokens
    assert csr.tfs.sum() == csr.doc_lens.sum() == sum(len(d.split()) for d in docs)


def test_ids_are_kept_and_checked():
    idx = BM25Index.build(["a", "b"], ids=["x", "y"], analyzer="plain")
    assert idx.ids == ["x", "y"]
    with pytest.raises(ValueError, match="unique"):
        BM25Index.build(["a", "b"], ids=["x", "x"])
    with pytest.raises(ValueError, match="ids ran out"):
        BM25Index.build(["a", "b"], ids=["x"])
    with pytest.raises(ValueError, match="more ids than documents"):
        BM25Index.build(["a"], ids=["x", "y"])


def test_empty_corpus_is_a_clear_error():
    with pytest.raises(ValueError, match="corpus is empty"):
        BM25Index.build([])


def test_non_string_text_names_the_document():
    with pytest.raises(TypeError, match="document 2"):
        BM25Index.build(["a", "b", 3])


def test_documents_without_tokens_are_kept():
    idx = BM25Index.build(["", "the", "cat"], analyzer="default")
    assert idx.n_docs == 3 and idx.csr.doc_lens.tolist() == [0, 0, 1]
    assert idx.search("cat", k=3).ids[0].tolist() == [2, -1, -1]


class TestAnalyzer:
    def test_unicode_and_case(self):
        a = Analyzer("plain")
        assert a("Ｆｕｌｌｗｉｄｔｈ Café NAÏVE straße") == ["fullwidth", "café", "naïve", "straße"]

    def test_stopwords_and_stemmers(self):
        assert Analyzer("nostem")("The running dogs") == ["running", "dogs"]
        assert Analyzer("default")("The running dogs") == ["run", "dog"]
        assert Analyzer("porter")("generously") != Analyzer("default")("generously")
        assert "about" in Analyzer("nostop")("about") and Analyzer("en-large")("about") == []

    def test_config_round_trip(self):
        a = Analyzer("porter")
        b = Analyzer(a.config)
        assert b.cfg == a.cfg
        assert b("Generously running") == a("Generously running")

    def test_bad_config_is_a_clear_error(self):
        with pytest.raises(ValueError, match="unknown analyzer"):
            Analyzer("klingon")
        with pytest.raises(ValueError, match="stemmer"):
            Analyzer({"stemmer": "klingon"})
        with pytest.raises(ValueError, match="unknown analyzer setting"):
            Analyzer({"colour": "red"})

    def test_bm25s_tokenization_is_identical(self):
        bm25s = pytest.importorskip("bm25s")
        Stemmer = pytest.importorskip("Stemmer")
        texts = random_corpus(50, 40, seed=9) + [
            "I'm going to the gym at 10am on 2023-05-08!",
            "Naïve CAFÉ résumé, a-b c_d e.f x y",
            "The quick brown foxes were running over the lazy dogs",
        ]
        ref = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"),
                             return_ids=False, show_progress=False)
        a = Analyzer("bm25s")
        assert [a(t) for t in texts] == ref


UNICODE_ALPHABET = list("abcXYZ_09 \n\t.-'") + [
    "é", "İ", "ß", "Σ", "ς", "ﬁ", "Ｆ", "\u0301", "\u0663", "²", "½", "\ud800", "😀", "中", "ǅ", "ⅸ", "\u00a0", "\u200b",
]


@pytest.mark.parametrize("analyzer", ["default", "bm25s", "plain", "nostop", "en-large"])
def test_compiled_build_equals_the_python_build(analyzer):
    """The compiled tokenizer and counting sort give the Python path's index, bit for bit."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(12)
    docs = random_corpus(400, 150, seed=6)
    # combining marks, case foldings that change length, final sigma, digits of other scripts,
    # lone surrogates, emoji, one- and two-letter runs, empty documents
    docs += ["".join(rng.choice(UNICODE_ALPHABET, size=rng.integers(0, 40))) for _ in range(300)]
    docs += ["", "a", "ab", "The THE the", "ΣΑΣ ΌΔΟΣ", "I'm going to the gym at 10am on 2023-05-08!"]
    for chunk in (1, 37, 10**6):
        py = build_csr(docs, analyzer, chunk_size=chunk, compiled=False)
        co = build_csr(iter(docs), analyzer, chunk_size=chunk, compiled=True)
        for f in FIELDS:
            a, b = getattr(py, f), getattr(co, f)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (f, chunk)
        assert py.vocab == co.vocab
    # and the tokens themselves: every document's terms, in order, from the index's postings
    an = Analyzer(analyzer)
    lens = [len(an(d)) for d in docs]
    assert co.doc_lens.tolist() == lens


def test_compiled_build_needs_a_word_run_pattern():
    pytest.importorskip("numba")
    custom = {"pattern": r"[a-z]+", "stopwords": None, "stemmer": None}
    with pytest.raises(ValueError, match="word-run token pattern"):
        build_csr(["a b"], custom, compiled=True)
    assert build_csr(["ab cd"], custom).vocab == ["ab", "cd"]  # auto: the Python path
