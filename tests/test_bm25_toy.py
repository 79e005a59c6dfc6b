"""A toy index (three terms, five documents) whose BM25 scores are computed by hand."""

import math

import numpy as np
import pytest

from gpuir import BM25Index

# analyzer "plain": no stopwords, no stemming
DOCS = [
    "apple apple banana",  # d0: len 3
    "banana cherry",  # d1: len 2
    "apple",  # d2: len 1
    "cherry cherry cherry",  # d3: len 3
    "banana",  # d4: len 1
]
# N = 5, avgdl = 10 / 5 = 2, df: apple 2, banana 3, cherry 2.
K1, B = 1.2, 0.75


def L(dl):  # length normalisation 1 - b + b * dl / avgdl
    return 1 - B + B * dl / 2.0


IDF_APPLE = math.log(1 + (5 - 2 + 0.5) / (2 + 0.5))  # = ln 2.4
IDF_BANANA = math.log(1 + (5 - 3 + 0.5) / (3 + 0.5))  # = ln (12/7)
IDF_CHERRY = IDF_APPLE


@pytest.fixture(scope="module")
def toy():
    return BM25Index.build(DOCS, analyzer="plain")


def test_layout(toy):
    csr = toy.csr
    assert csr.vocab == ["apple", "banana", "cherry"]
    assert csr.offsets.tolist() == [0, 2, 5, 7]
    assert csr.doc_ids.tolist() == [0, 2, 0, 1, 4, 1, 3]
    assert csr.tfs.tolist() == [2, 1, 1, 1, 1, 1, 3]
    assert csr.doc_lens.tolist() == [3, 2, 1, 3, 1]


def test_single_term_by_hand(toy, backend):
    res = toy.search("apple", k=5, backend=backend)
    d2 = IDF_APPLE * 1 / (1 + K1 * L(1))  # 0.500268...
    d0 = IDF_APPLE * 2 / (2 + K1 * L(3))  # 0.479709...
    assert res.ids[0].tolist() == [2, 0, -1, -1, -1]
    np.testing.assert_allclose(res.scores[0][:2], [d2, d0], rtol=1e-6)
    assert np.all(np.isneginf(res.scores[0][2:]))


def test_two_terms_by_hand(toy, backend):
    res = toy.search("banana cherry", k=3, backend=backend)
    d1 = IDF_BANANA * 1 / (1 + K1 * L(2)) + IDF_CHERRY * 1 / (1 + K1 * L(2))
    d3 = IDF_CHERRY * 3 / (3 + K1 * L(3))
    d4 = IDF_BANANA * 1 / (1 + K1 * L(1))
    d0 = IDF_BANANA * 1 / (1 + K1 * L(3))
    expect = sorted([(d1, 1), (d3, 3), (d4, 4), (d0, 0)], key=lambda x: (-x[0], x[1]))[:3]
    assert res.ids[0].tolist() == [d for _, d in expect]
    np.testing.assert_allclose(res.scores[0], [s for s, _ in expect], rtol=1e-6)


def test_repeated_query_term_counts_twice(toy, backend):
    once = toy.search("apple", k=2, backend=backend).scores[0]
    twice = toy.search("apple apple", k=2, backend=backend).scores[0]
    np.testing.assert_allclose(twice, 2 * once, rtol=1e-6)


def test_bm25plus_absent_term_by_hand(toy, backend):
    idx = toy.with_params(method="bm25+", delta=0.5)
    res = idx.search("apple cherry", k=5, backend=backend)
    idf_a = math.log(6 / 2)
    idf_c = math.log(6 / 2)
    tfc = lambda tf, dl: tf * (K1 + 1) / (tf + K1 * L(dl)) + 0.5
    by_doc = {
        0: idf_a * tfc(2, 3) + idf_c * 0.5,  # cherry absent: idf * delta
        1: idf_a * 0.5 + idf_c * tfc(1, 2),
        2: idf_a * tfc(1, 1) + idf_c * 0.5,
        3: idf_a * 0.5 + idf_c * tfc(3, 3),
    }
    got = {d: s for d, s in zip(res.ids[0].tolist(), res.scores[0].tolist()) if d >= 0}
    assert set(got) == set(by_doc)  # d4 contains neither term: not a candidate
    for d, s in by_doc.items():
        assert got[d] == pytest.approx(s, rel=1e-6)


def test_ties_broken_by_lower_doc_id(backend):
    idx = BM25Index.build(["x y", "y x", "x y", "z"], analyzer="plain")
    res = idx.search("x", k=3, backend=backend)
    assert res.ids[0].tolist() == [0, 1, 2]
    assert res.scores[0][0] == res.scores[0][1] == res.scores[0][2]
