"""The per-search weight arithmetic every engine repeats (gpuir.backends.weights, base.weigh_queries)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuir import bm25
from gpuir.backends.base import CollectionStats, weigh_queries
from gpuir.backends.weights import (
    BOUND_SLACK,
    has_absent_weight,
    posting_weights,
    row_consts,
    term_weights,
    weight_bound,
    weights_of,
)
from gpuir.bm25 import METHODS, BM25Params

PARAMS = [BM25Params(method=m) for m in METHODS] + [
    BM25Params(method="bm25l", k1=1e-6, b=1.0, delta=1e6), BM25Params(method="bm25+", k1=1e6, b=0.0, delta=0.0),
    BM25Params(method="atire", k1=3.0, b=1.0), BM25Params(method="lucene", k1=0.01, b=0.999)]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"{p.method}-{p.k1}-{p.b}-{p.delta}")
def test_bound_dominates_every_weight_of_its_block(params):
    """tfc(max tf, min dl), widened and rounded up, is >= every float32 weight in the block, for any avgdl."""
    rng = np.random.default_rng(1)
    for avgdl in (0.5, 3.7, 31.0, 1e4):
        n_blocks = 300
        size = rng.integers(1, 40, n_blocks)
        tf = rng.integers(1, rng.choice([3, 50, 10**6]), size.sum())
        dl = np.maximum(tf, rng.integers(0, rng.choice([5, 500, 10**7]), size.sum()))
        blk = np.repeat(np.arange(n_blocks), size)
        df = rng.integers(1, 10**6, n_blocks)
        idf, w0 = term_weights(df, 10**6 + 7, params)
        w = weights_of(tf, dl, idf[blk], w0[blk], avgdl, params)
        starts = np.r_[0, np.cumsum(size)[:-1]]
        bound = weight_bound(np.maximum.reduceat(tf, starts), np.minimum.reduceat(dl, starts), idf, w0, avgdl,
                             params)
        assert bound.dtype == np.float32 and np.all(bound >= 0)
        assert np.all(w <= bound[blk])
        # and it is not loose beyond the slack: the block's best posting is within ~2 slacks
        best = np.maximum.reduceat(w.astype(np.float64), starts)
        tight = (np.maximum.reduceat(tf, starts) == tf[starts]) & (size == 1)
        scale = np.abs(idf.astype(np.float64)) * (params.k1 + 1 + params.delta)
        assert np.all(bound[tight] <= best[tight] * (1 + 3 * BOUND_SLACK) + 3 * BOUND_SLACK * scale[tight] + 1e-30)


def test_bound_of_empty_and_unbounded_blocks():
    p = BM25Params()
    idf, w0 = term_weights(np.array([3, 3]), 100, p)
    b = weight_bound(np.array([0, 2**31 - 1]), np.array([5, 5]), idf, w0, 10.0, p)
    assert b[0] == 0 and b[1] >= idf[1]  # lucene's tfc tends to 1 as tf grows
    huge = weights_of(np.array([10**9]), np.array([5]), idf[1], w0[1], 10.0, p)
    assert huge[0] <= b[1]


@pytest.mark.parametrize("method", METHODS)
def test_weights_of_is_the_posting_weights_arithmetic(method, tmp_path):
    """posting_weights (a static index's cache) and weights_of agree bit for bit, and match bm25.tfc * idf."""
    from _helpers import random_index

    idx = random_index(2000, 60, seed=4)
    p = BM25Params(method=method)
    stats = CollectionStats(5000, idx.df.astype(np.int64) + 7, idx.avgdl * 1.3)
    pw = posting_weights(idx, p, stats)
    term_of = np.repeat(np.arange(idx.n_terms), np.diff(idx.offsets))
    idf64 = bm25.idf(stats.df, stats.n_docs, method)
    want = idf64.astype(np.float32)[term_of] * bm25.tfc(idx.tfs, idx.doc_lens[idx.doc_ids], stats.avgdl, p)
    if has_absent_weight(p):
        want = want - bm25.absent_weight(idf64, p)[term_of]
    assert np.array_equal(pw.weights.view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("method", ["lucene", "bm25l", "bm25+"])
def test_weigh_queries_terms_and_constants(method):
    p = BM25Params(method=method)
    df = np.array([0, 5, 9, 1, 0, 3], np.int64)
    stats = CollectionStats(20, df, 4.5)
    qs = [np.array([5, 1, 1, 0, 3]), np.zeros(0, np.int64), np.array([4, 4]), np.array([2, 2, 2, 1, 3, 5, 5])]
    wq = weigh_queries(qs, stats, p)
    assert wq.off.tolist() == [0, 3, 3, 3, 7]  # df-0 terms (0 and 4) dropped
    assert wq.terms.tolist() == [1, 3, 5, 1, 2, 3, 5] and wq.mult.tolist() == [2, 1, 1, 1, 3, 1, 2]
    idf64 = bm25.idf(df[wq.terms], 20, method)
    assert np.array_equal(wq.idf, idf64.astype(np.float32))
    for q in range(4):
        s = wq.row(q)
        want = np.float32((wq.w0[s] * wq.mult[s]).sum(dtype=np.float32)) if wq.has_w0 else np.float32(0)
        assert wq.const[q].view(np.uint32) == np.float32(want).view(np.uint32) or (s.start == s.stop == 0)
    assert wq.has_w0 == (method != "lucene")
    given = weigh_queries(qs, stats, p, consts=np.array([1, 2, 3, 4], np.float32))
    assert given.const.tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="one float32 per query"):
        weigh_queries(qs, stats, p, consts=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="term ids outside"):
        weigh_queries([np.array([6])], stats, p)


def test_row_consts_follow_numpy_pairwise_order():
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 300, 200)
    off = np.r_[0, np.cumsum(lens)]
    w0 = rng.random(off[-1]).astype(np.float32) * 1e3
    mult = rng.integers(1, 4, off[-1])
    got = row_consts(w0, mult, off)
    want = [np.float32((w0[a:b] * mult[a:b]).sum(dtype=np.float32)) for a, b in itertools.pairwise(off)]
    assert np.array_equal(got.view(np.uint32), np.array(want, np.float32).view(np.uint32))


def test_stats_check_allows_segments_with_deletions():
    from _helpers import random_index

    idx = random_index(500, 20, seed=2)
    CollectionStats(100, np.minimum(idx.df, 100).astype(np.int64), 3.0).check(idx)  # fewer live docs than rows
    with pytest.raises(ValueError, match="one df per term"):
        CollectionStats(100, idx.df[:5], 3.0).check(idx)
    with pytest.raises(ValueError, match=r"\[0, N=10\]"):
        CollectionStats(10, idx.df.astype(np.int64) + 10, 3.0).check(idx)
    with pytest.raises(ValueError, match="avgdl"):
        CollectionStats(100, np.minimum(idx.df, 100), float("nan")).check(idx)


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"{p.method}-{p.k1}-{p.b}-{p.delta}")
def test_compiled_weights_looked_up_in_the_tf_table_are_the_reference_bits(params):
    """The compiled engine's weight of a posting, computed (no table) and looked up in the tf-part table
    (:func:`gpuir.backends.cpu_kernels.tfc_table`, with each posting's key, ``tf_keys``), equals the NumPy reference's :func:`weights_of` bit for
    bit, inside the table (small tf and length) and outside it, for every variant and odd parameters."""
    pytest.importorskip("numba")
    from gpuir.backends import cpu_kernels as ck

    rng = np.random.default_rng(7)
    n = 20_000
    tf = np.concatenate([rng.integers(1, ck.TABLE_TF + 1, n // 2), rng.integers(1, 300, n // 2)]).astype(np.int32)
    dl = np.maximum(tf, np.concatenate([rng.integers(1, ck.TABLE_DL + 1, n // 2),
                                        rng.integers(1, 5 * ck.TABLE_DL, n // 2)])).astype(np.int32)
    inside = (tf < ck.TABLE_TF) & (dl < ck.TABLE_DL)
    assert 0.3 < inside.mean() < 0.7, "both sides of the table's edge are tested"
    for avgdl in (0.5, 3.7, 31.0, 1e4):
        f = np.float32
        fp6 = np.array([f(1) - f(params.b), f(params.b), f(params.k1), f(params.k1) + f(1), f(params.delta),
                        f(avgdl)], np.float32)
        table = ck.tfc_table(fp6, params.code)
        assert table.size > 8 and np.array_equal(table[:6], fp6)
        idf, w0 = term_weights(np.array([3, 900]), 1000, params)
        for j in range(2):
            want = weights_of(tf, dl, idf[j], w0[j], avgdl, params)
            docs = np.arange(n, dtype=np.int32)
            keys = ck.tf_keys(docs, tf, dl)
            assert np.array_equal(keys < 0, ~inside)
            for fp, tfs in ((fp6, tf), (table, keys)):  # (with the table, the postings' keys in it)
                got = np.empty(n, np.float32)
                ck.weights_into((np.array([0, n], np.int64), docs, tfs, dl),
                                (np.empty(0, np.float32), fp, params.code, has_absent_weight(params)), 0,
                                idf[j], w0[j], got)
                np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32),
                                              err_msg=f"{params} avgdl={avgdl} table={fp.size > 6}")
