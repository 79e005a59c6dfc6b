"""Parity with the libraries users already trust, on a real corpus: the LoCoMo turns.

bm25s: every variant, scores within 1e-5 relative, top-10 identical up to ties.
rank_bm25: BM25Plus shares our (bm25s's) definition exactly; BM25Okapi equals
(k1 + 1) x our robertson score wherever its idf is positive. rank_bm25's BM25L is
not comparable: it multiplies each term's contribution by the term frequency a
second time (``idf * tf * (k1 + 1) * (c + delta) / (k1 + c + delta)``).
"""

import json

import numpy as np
import pytest

from gpuir import METHODS, BM25Index

bm25s = pytest.importorskip("bm25s")
Stemmer = pytest.importorskip("Stemmer")


@pytest.fixture(scope="module")
def locomo(data_dir):
    data = json.loads((data_dir / "locomo" / "locomo10.json").read_text())
    texts, questions = [], []
    for conv in data:
        c = conv["conversation"]
        n = sorted(int(k.split("_")[1]) for k in c if k.startswith("session_") and not k.endswith("date_time"))
        for s in n:
            texts.extend(turn["text"] for turn in c[f"session_{s}"])
        questions.extend(qa["question"] for qa in conv["qa"])
    assert len(texts) == 5882 and len(questions) == 1986  # counts from the data README
    return texts, questions


@pytest.fixture(scope="module")
def ours(locomo):
    return BM25Index.build(locomo[0], analyzer="bm25s")


def assert_topk_matches(ids, scores, ref, k, rtol=1e-5):
    """Our row (ids, scores) is a correct top-k of the reference score vector, up to ties."""
    valid = ids >= 0
    got_ids, got = ids[valid], scores[valid]
    np.testing.assert_allclose(got, ref[got_ids], rtol=rtol)
    assert np.all(np.diff(got) <= 0)
    kth = got[-1]
    tol = rtol * max(1.0, abs(kth))
    outside = np.setdiff1d(np.arange(ref.size), got_ids)
    if got.size == k:  # a full row: nothing outside it is strictly better
        assert ref[outside].max() <= kth + tol
    return got_ids


@pytest.mark.parametrize("method", METHODS)
def test_bm25s_parity_every_variant(locomo, ours, method):
    texts, questions = locomo
    st = Stemmer.Stemmer("english")
    ref = bm25s.BM25(method=method, k1=1.2, b=0.75, delta=0.5)
    ref.index(bm25s.tokenize(texts, stopwords="en", stemmer=st, show_progress=False), show_progress=False)
    qtok = bm25s.tokenize(questions, stopwords="en", stemmer=st, show_progress=False, return_ids=False)
    idx = ours.with_params(method=method)
    res = idx.search(questions, k=10)
    checked = 0
    for i, toks in enumerate(qtok):
        toks = [t for t in toks if t in ref.vocab_dict]
        if not toks:
            assert (res.ids[i] == -1).all()
            continue
        s = ref.get_scores(toks)
        assert_topk_matches(res.ids[i], res.scores[i], s, 10)
        checked += 1
    assert checked > 1900


@pytest.fixture(scope="module")
def rank_bm25_corpus(locomo, ours):
    rank_bm25 = pytest.importorskip("rank_bm25")
    tok = [ours.analyzer(t) for t in locomo[0]]
    queries = [ours.analyzer(q) for q in locomo[1][:150]]
    return rank_bm25, tok, queries


@pytest.mark.parametrize("cls, method", [("BM25Plus", "bm25+")])
def test_rank_bm25_same_definition(rank_bm25_corpus, ours, locomo, cls, method):
    rank_bm25, tok, queries = rank_bm25_corpus
    ref = getattr(rank_bm25, cls)(tok, k1=1.2, b=0.75, delta=0.5)
    idx = ours.with_params(method=method)
    res = idx.search(locomo[1][:150], k=10)
    for i, q in enumerate(queries):
        q = [t for t in q if t in ours.csr.term_to_id]
        if q:
            assert_topk_matches(res.ids[i], res.scores[i], ref.get_scores(q), 10)


def test_rank_bm25_okapi_is_scaled_robertson(rank_bm25_corpus, ours, locomo):
    rank_bm25, tok, queries = rank_bm25_corpus
    ref = rank_bm25.BM25Okapi(tok, k1=1.2, b=0.75)
    idx = ours.with_params(method="robertson")
    res = idx.search(locomo[1][:150], k=10)
    N, df = ours.n_docs, ours.csr.df
    t2i = ours.csr.term_to_id
    checked = 0
    for i, q in enumerate(queries):
        q = [t for t in q if t in t2i]
        if not q or any(df[t2i[t]] >= N / 2 for t in q):  # idf <= 0: the definitions part
            continue
        assert_topk_matches(res.ids[i], res.scores[i] * 2.2, ref.get_scores(q), 10)
        checked += 1
    assert checked > 100
