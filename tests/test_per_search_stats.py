"""Statistics applied per search (issue 18): the CPU engines equal an oracle built from
``posting_weights(index, params, stats)`` bit for bit, for every variant and adversarial parameters,
with tombstones (``live``), allow-lists and given row constants; the compiled kernels' weight
arithmetic is the reference's (no fused multiply-add, no float64), and their bounds hold."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import random_queries

from gpuir.backends.base import CollectionStats, topk_from_dense, weigh_queries
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.backends.weights import has_absent_weight, posting_weights, term_weights, weight_floor, weights_of
from gpuir.bm25 import METHODS, BM25Params
from gpuir.index.csr import CSRIndex

ADVERSARIAL = [BM25Params(method=m) for m in METHODS] + [
    BM25Params(method="bm25l", k1=1e-6, b=1.0, delta=1e6), BM25Params(method="bm25l", k1=1.02, b=0.3, delta=7e5),
    BM25Params(method="bm25+", k1=1e6, b=0.0, delta=0.0), BM25Params(method="bm25+", k1=0.37, b=0.91, delta=3e5),
    BM25Params(method="atire", k1=3.0, b=1.0), BM25Params(method="lucene", k1=0.01, b=0.999),
    BM25Params(method="robertson", k1=1e-6, b=0.123), BM25Params(method="lucene", k1=1e6, b=1.0)]
IDS = [f"{p.method}-{p.k1:g}-{p.b:g}-{p.delta:g}" for p in ADVERSARIAL]


def wide_index(n_docs: int, n_terms: int, seed: int) -> CSRIndex:
    """A random index with tfs from 1 to 10^6 and lengths beyond 2^24 (float32 rounds them)."""
    rng = np.random.default_rng(seed)
    dfs = rng.zipf(1.5, n_terms).clip(1, n_docs)
    dfs[0] = n_docs - 1
    dfs[1] = n_docs  # in every document: idf 0 under atire, robertson clips
    doc_ids, tfs = [], []
    for df in dfs:
        doc_ids.append(np.sort(rng.choice(n_docs, size=int(df), replace=False)).astype(np.int32))
        scale = rng.choice([3, 40, 10**6])
        tfs.append(rng.integers(1, scale + 1, size=int(df)).astype(np.int32))
    offsets = np.zeros(n_terms + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(dfs)
    d, f = np.concatenate(doc_ids), np.concatenate(tfs)
    base = np.bincount(d, weights=f, minlength=n_docs).astype(np.int64)
    extra = rng.choice([0, 7, 5000, 2**24 + 3, 2**27], size=n_docs)
    doc_lens = np.minimum(base + extra, 2**31 - 1).astype(np.int32)
    return CSRIndex(offsets=offsets, doc_ids=d, tfs=f, doc_lens=doc_lens,
                    vocab=[f"t{i:05d}" for i in range(n_terms)], ids=[str(i) for i in range(n_docs)])


@pytest.fixture(scope="module")
def widx():
    return wide_index(900, 120, seed=21)


def random_stats(index: CSRIndex, rng, zero_some: bool = True) -> CollectionStats:
    """Collection statistics of a bigger store: N beyond the index, any df in [0, N], any avgdl."""
    n = int(index.n_docs * rng.choice([1, 3, 50]))
    df = rng.integers(1, n + 1, index.n_terms)
    df[:3] = [n - 1, n, max(1, n // 2)]
    if zero_some:
        df[rng.choice(index.n_terms, 5, replace=False)] = 0  # terms absent from the live store
    return CollectionStats(n, df.astype(np.int64), float(rng.choice([0.7, 13.25, 3.3e4, 9.1e6])))


def oracle(index, params, stats, queries, allow=None, live=None, consts=None) -> np.ndarray:
    """Dense scores from posting_weights: ascending term order from 0.0f, + C, candidates only."""
    pw = posting_weights(index, params, stats)
    wq = weigh_queries(queries, stats, params, consts)
    N = index.n_docs
    out = np.full((len(queries), N), -np.inf, np.float32)
    for q in range(len(queries)):
        acc = np.zeros(N, np.float32)
        cand = np.zeros(N, bool)
        sl = wq.row(q)
        for t, m in zip(wq.terms[sl].tolist(), wq.mult[sl].tolist()):
            s, e = int(index.offsets[t]), int(index.offsets[t + 1])
            w = pw.weights[s:e]
            acc[index.doc_ids[s:e]] += w if m == 1 else w * np.float32(m)
            cand[index.doc_ids[s:e]] = True
        if wq.has_w0:
            acc = acc + wq.const[q]
        if live is not None:
            cand &= live
        if allow is not None and allow[q] is not None:
            mask = np.zeros(N, bool)
            mask[allow[q]] = True
            cand &= mask
        out[q, cand] = acc[cand]
    return out


def assert_bits(a, b, what=""):
    np.testing.assert_array_equal(a.ids, b.ids, err_msg=what)
    np.testing.assert_array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32), err_msg=what)


@pytest.mark.parametrize("params", ADVERSARIAL, ids=IDS)
def test_engines_equal_the_posting_weights_oracle(widx, params):
    pytest.importorskip("numba")
    from gpuir.backends.numba_backend import NumbaScorer

    rng = np.random.default_rng([7, ADVERSARIAL.index(params)])
    qs = random_queries(widx.n_terms, 40, seed=8, max_terms=12)
    qs += [np.arange(0, 40), np.array([0, 1, 1, 1, 2]), np.array([5] * 9)]
    live = rng.random(widx.n_docs) < 0.75
    allow = [None if i % 3 else np.sort(rng.choice(widx.n_docs, int(rng.integers(0, 300)), replace=False))
             for i in range(len(qs))]
    consts = (rng.random(len(qs)) * 50).astype(np.float32)
    engines = [NumpyScorer(widx, params), NumpyScorer(widx, params, prune=False),
               NumbaScorer(widx, params, threads=2), NumbaScorer(widx, params, prune=False, threads=1)]
    cases = [{}, {"stats": random_stats(widx, rng)}, {"stats": random_stats(widx, rng), "live": live},
             {"stats": random_stats(widx, rng), "live": live, "allow": allow},
             {"stats": random_stats(widx, rng), "consts": consts}]
    for case in cases:
        stats = case.get("stats") or CollectionStats.of(widx)
        dense = oracle(widx, params, stats, qs, case.get("allow"), case.get("live"), case.get("consts"))
        kw = {x: case[x] for x in ("stats", "live", "consts") if x in case}
        for k in (1, 7, widx.n_docs + 3):
            want = topk_from_dense(dense, k)
            for eng in engines:
                got = eng.search(qs, k, case.get("allow"), **kw)
                assert_bits(got, want, f"{eng.name} prune={eng._prune if hasattr(eng, '_prune') else eng.prune} "
                                       f"k={k} {sorted(case)}")
        for eng in engines[::2]:
            got = eng.score_matrix(qs, case.get("allow"), **kw)
            np.testing.assert_array_equal(got.view(np.uint32), dense.view(np.uint32))


def _kernel_weights(index, params, stats) -> np.ndarray:
    """Every posting's weight as the compiled kernels compute it (cpu_kernels.weight, no cache)."""
    from gpuir.backends import cpu_kernels
    from gpuir.backends.numba_backend import _NO_F32, _ro

    f = np.float32
    k1, b, delta, avgdl = f(params.k1), f(params.b), f(params.delta), f(stats.avgdl)
    fp = np.array([f(1) - b, b, k1, k1 + f(1), delta, avgdl], np.float32)
    wt = (_NO_F32, fp, int(params.code), bool(has_absent_weight(params)))
    ix = (_ro(index.offsets, np.int64), _ro(index.doc_ids, np.int32), _ro(index.tfs, np.int32),
          _ro(index.doc_lens, np.int32))
    idf, w0 = term_weights(stats.df, stats.n_docs, params)
    out = np.empty(index.n_postings, np.float32)
    for t in range(index.n_terms):
        s, e = int(index.offsets[t]), int(index.offsets[t + 1])
        cpu_kernels.weights_into(ix, wt, t, idf[t], w0[t], out[s:e])
    return out


@pytest.mark.parametrize("params", ADVERSARIAL, ids=IDS)
def test_kernel_weight_arithmetic_is_the_reference_bit_for_bit(widx, params):
    """No FMA contraction, no float64 widening: both would change bits the data exposes (checked)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng([9, ADVERSARIAL.index(params)])
    for _ in range(3):
        stats = random_stats(widx, rng, zero_some=False)
        want = posting_weights(widx, params, stats).weights
        got = _kernel_weights(widx, params, stats)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_data_would_expose_fma_or_float64():
    """The weight test can fail: on this data, a fused norm (one rounding of n1 + b * r) and a float64
    evaluation rounded once both differ from the float32 reference somewhere."""
    idx = wide_index(900, 120, seed=21)
    p = BM25Params(method="lucene", k1=1.37, b=0.61)
    stats = random_stats(idx, np.random.default_rng(3), zero_some=False)
    idf, w0 = term_weights(stats.df, stats.n_docs, p)
    term_of = np.repeat(np.arange(idx.n_terms), np.diff(idx.offsets))
    tf = idx.tfs.astype(np.float32)
    dl = idx.doc_lens[idx.doc_ids].astype(np.float32)
    ref = weights_of(idx.tfs, idx.doc_lens[idx.doc_ids], idf[term_of], w0[term_of], stats.avgdl, p)
    f = np.float32
    r = dl / f(stats.avgdl)
    fused_norm = ((f(1) - f(p.b)).astype(np.float64) + np.float64(f(p.b)) * r.astype(np.float64)).astype(f)
    fused = idf[term_of] * (tf / (f(p.k1) * fused_norm + tf))
    assert np.any(fused.view(np.uint32) != ref.view(np.uint32))
    n64 = (1 - p.b) + p.b * (dl.astype(np.float64) / stats.avgdl)
    wide = (idf[term_of].astype(np.float64) * (tf / (p.k1 * n64 + tf))).astype(f)
    assert np.any(wide.view(np.uint32) != ref.view(np.uint32))


@pytest.mark.parametrize("params", ADVERSARIAL, ids=IDS)
def test_kernel_bounds_hold_for_every_weight(widx, params):
    """bound64 (term and block bounds without a cache) >= every float32 weight; floor64 <= every one,
    and agrees with weights.weight_floor."""
    pytest.importorskip("numba")
    from gpuir.backends.cpu_maxscore import bound64, floor64
    from gpuir.backends.weights import BOUND_SLACK

    rng = np.random.default_rng([11, ADVERSARIAL.index(params)])
    has_w0 = bool(has_absent_weight(params))
    for _ in range(3):
        stats = random_stats(widx, rng, zero_some=False)
        w = posting_weights(widx, params, stats).weights.astype(np.float64)
        idf, w0 = term_weights(stats.df, stats.n_docs, params)
        bp = np.array([params.k1, params.b, params.delta, float(np.float32(stats.avgdl)), BOUND_SLACK])
        dl = widx.doc_lens[widx.doc_ids]
        for t in range(widx.n_terms):
            s, e = int(widx.offsets[t]), int(widx.offsets[t + 1])
            for a, z in ((s, e), (s, min(e, s + 3))):  # a term, and a block of it
                hi = bound64(int(widx.tfs[a:z].max()), int(dl[a:z].min()), bp, params.code, has_w0, idf[t], w0[t])
                lo = floor64(int(widx.tfs[a:z].min()), int(dl[a:z].max()), bp, params.code, has_w0, idf[t], w0[t])
                assert hi >= 0 and np.all(w[a:z] <= hi), (t, hi, w[a:z].max())
                assert np.all(w[a:z] >= lo), (t, lo, w[a:z].min())
                ref_lo = weight_floor(widx.tfs[a:z].min(), dl[a:z].max(), idf[t], w0[t], stats.avgdl, params)
                assert lo == pytest.approx(float(ref_lo), rel=1e-12, abs=1e-300)


def test_live_and_consts_are_checked(widx):
    eng = NumpyScorer(widx, BM25Params())
    with pytest.raises(ValueError, match="live must be a bool array"):
        eng.search([np.array([3])], 5, live=np.ones(5, bool))
    with pytest.raises(ValueError, match="one float32 per query"):
        eng.search([np.array([3])], 5, consts=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="one df per term"):
        eng.search([np.array([3])], 5, stats=CollectionStats(10, np.ones(3, np.int64), 2.0))


def test_static_cache_is_used_for_the_default_stats_only(widx, monkeypatch):
    """The cache of precomputed weights is keyed by the default statistics object: an equal but
    distinct object takes the per-search path (and gives the same bits)."""
    pytest.importorskip("numba")
    import gpuir.backends.batch_plan as bp
    from gpuir.backends.numba_backend import NumbaScorer

    calls = []
    real = bp.posting_weights
    monkeypatch.setattr(bp, "posting_weights", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    qs = random_queries(widx.n_terms, 30, seed=2)
    for cls in (NumpyScorer, NumbaScorer):
        calls.clear()
        eng = cls(widx, BM25Params(method="bm25+"))
        per = eng.search(qs, 10, stats=CollectionStats.of(widx))
        assert calls == []  # per search: nothing precomputed
        cached = eng.search(qs, 10)
        cached2 = eng.search(qs, 10, stats=eng.stats)
        assert calls == [1]  # once, for the default statistics
        assert_bits(per, cached)
        assert_bits(cached2, cached)


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_weigh_static_equals_weigh_queries(widx, method):
    """The static index's fast weighing (cached idf / w0, one query without the batch machinery) gives
    what weigh_queries gives, field for field, including terms without postings (dropped) and repeats."""
    from gpuir.backends.batch_plan import StaticWeights, weigh_static

    off = np.concatenate([widx.offsets, [widx.offsets[-1]] * 2])  # two terms without postings
    idx = CSRIndex(offsets=off, doc_ids=widx.doc_ids, tfs=widx.tfs, doc_lens=widx.doc_lens,
                   vocab=[*widx.vocab, "zz0", "zz1"], ids=widx.ids)
    p = BM25Params(method=method)
    sw = StaticWeights.of(idx, p, CollectionStats.of(idx))
    V = idx.n_terms
    batches = [[np.array([5, 3, 5, 5, V - 1])], [np.zeros(0, np.int64)], [[7]], [np.array([V - 2, V - 1])],
               [np.array([1, 1]), np.array([V - 1, 0, 2]), np.zeros(0, np.int64)],
               random_queries(V, 30, seed=5, max_terms=12)]
    for qs in batches:
        a = weigh_static(qs, sw, p)
        b = weigh_queries(qs, sw.stats, p)
        for f in ("off", "terms", "mult", "idf", "w0", "const"):
            x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
            assert x.dtype.kind == y.dtype.kind and np.array_equal(x, y), (f, qs)
        assert (a.has_w0, a.avgdl) == (b.has_w0, b.avgdl)
    for bad, err in (([np.array([V])], ValueError), ([np.array([-1])], ValueError), ([np.array([1.5])], TypeError)):
        with pytest.raises(err, match="query 0"):
            weigh_static(bad, sw, p)
