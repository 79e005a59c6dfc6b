"""The one-question fast path of CupyScorer (issue 35, item 2), on the fake cupy (no device).

* the scorer's own statistics weigh a question from a per-scorer cache of idf and w0
  (``weigh_static``), never through ``weigh_queries``, with the same batch field for field;
* a graph copies up only the bytes in use (not the 64 KB allow-list region of a row without one);
* graphs of one shape form a pool: a question asked while another holds a graph gets its own
  graph (its own workspace and stream) instead of waiting behind one lock, and results stay exact
  when threads ask at once;
* a large batch runs as pieces, two in flight on two workspaces (issue 35, item 3), with the
  whole batch's results and its input errors.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends import cupy_backend as cb
from gpuir.backends import kernel_model as km
from gpuir.backends.base import CollectionStats
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import METHODS, BM25Params


@pytest.fixture()
def fake():
    with km.fake_cupy_installed(seed=0) as cp, km.small_tiles(32, 64):
        yield cp


@pytest.fixture(scope="module")
def index():
    return random_index(1200, 90, seed=71, heavy_df=1000)


def _same(a, b):
    return np.array_equal(a.ids, b.ids) and np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32))


@pytest.mark.parametrize("method", METHODS)
def test_default_statistics_skip_weigh_queries(fake, index, method, monkeypatch):
    gpu = cb.CupyScorer(index, BM25Params(method=method), haystack="never", graphs=False)
    qs = random_queries(90, 6, seed=72, max_terms=5) + [np.array([3, 3, 7], np.int64)]
    other = CollectionStats(gpu.stats.n_docs, np.asarray(gpu.stats.df).copy(), gpu.stats.avgdl)  # equal, not it
    slow = gpu.prepare(qs, None, other)
    for one in ([qs[0]], qs):
        want = gpu.prepare(one, None, other)

        def boom(*a, **kw):
            raise AssertionError("weigh_queries called for the scorer's own statistics")

        with monkeypatch.context() as m:
            m.setattr(cb, "weigh_queries", boom)
            got = gpu.prepare(one, None)
        for f in ("qt_off", "qt_term", "qt_mult", "qt_idf", "qt_w0", "row_const"):
            assert np.array_equal(getattr(want, f), getattr(got, f)), f
            assert getattr(want, f).dtype == getattr(got, f).dtype, f
    assert slow.n_rows == len(qs)
    ref = NumpyScorer(index, BM25Params(method=method))
    assert _same(ref.search(qs, 5), gpu.search(qs, 5))


def test_a_graph_copies_only_the_bytes_in_use(fake, index):
    gpu = cb.CupyScorer(index, BM25Params(), haystack="never", graphs=True)
    q = [np.array([2, 5, 40], np.int64)]
    ref = NumpyScorer(index, BM25Params())
    assert _same(ref.search(q, 5), gpu.search(q, 5))
    (pool,) = gpu._graphs.values()
    g = pool[0]
    allow_region = g.offs[9] - g.offs[8]
    assert allow_region >= 4 * cb.GRAPH_ALLOW_PER_ROW  # the region exists ...
    assert g.copied == g.h2d_end - allow_region  # ... and none of it went up
    allow = [np.arange(0, 1200, 7)]
    assert _same(ref.search(q, 5, allow), gpu.search(q, 5, allow))
    assert g.copied == g.h2d_end - allow_region + -(-4 * allow[0].size // 8) * 8


def test_concurrent_questions_get_their_own_graphs(fake, index):
    gpu = cb.CupyScorer(index, BM25Params(), haystack="never", graphs=True)
    qs = [q for q in random_queries(90, 14, seed=74, max_terms=4)[5:] if q.size]
    sc = cb.search_consts(gpu.params, gpu.stats.avgdl)
    lv = gpu._live_bits(None)
    b = gpu.prepare(qs[:1], None)
    g1 = gpu._graph_for(b, 5, sc, lv)  # held, as by a thread in the middle of a search
    g2 = gpu._graph_for(b, 5, sc, lv)
    assert g1 is not None and g2 is not None and g1 is not g2 and g1.ws is not g2.ws
    g1.ws.lock.release()
    g3 = gpu._graph_for(b, 5, sc, lv)
    assert g3 is g1  # a free graph of the pool is taken before a new one is captured
    g2.ws.lock.release()
    g3.ws.lock.release()
    ref = NumpyScorer(index, BM25Params())
    want = [ref.search([q], 5) for q in qs]
    got: dict[int, object] = {}

    def ask(i):
        got[i] = gpu.search([qs[i]], 5)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(qs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(_same(want[i], got[i]) for i in range(len(qs)))
    assert all(got[i].meta["graph_runs"] == 1 for i in range(len(qs)))
    assert sum(len(p) for p in gpu._graphs.values()) >= 2  # concurrent questions ran several graphs
    assert all(len(p) <= cb.GRAPH_POOL for p in gpu._graphs.values())  # at most GRAPH_POOL of each shape


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_a_large_batch_runs_as_pieces_with_the_same_results(fake, index, method):
    gpu = cb.CupyScorer(index, BM25Params(method=method), haystack="auto", graphs=False)
    gpu.pipeline_rows = 8
    qs = random_queries(90, 30, seed=75, max_terms=5)
    rng = np.random.default_rng(76)
    allow = [None if i % 3 else np.sort(rng.choice(1200, 50 + 10 * i, replace=False)) for i in range(30)]
    ref = NumpyScorer(index, BM25Params(method=method))
    for al in (None, allow):
        got = gpu.search(qs, 7, al)
        assert got.meta["pieces"] == 4 and got.meta["n_chunks"] >= 4
        assert _same(ref.search(qs, 7, al), got)
    consts = np.linspace(0, 1, 30).astype(np.float32)
    assert _same(ref.search(qs, 5, consts=consts), gpu.search(qs, 5, consts=consts))
    assert len(gpu._pool) == 2  # two workspaces, one per piece in flight
    n_launches = len(fake.launches)
    with pytest.raises(ValueError, match="query 27"):
        gpu.search(qs[:27] + [np.array([10**6])] + qs[28:], 5)
    with pytest.raises(ValueError):
        gpu.search(qs, 5, allow[:29])
    assert len(fake.launches) == n_launches  # bad input: no device work
    gpu.pipeline_rows = 0
    one = gpu.search(qs, 7)
    assert "pieces" not in one.meta and _same(ref.search(qs, 7), one)


def test_a_segment_of_at_most_16_tiles_skips_the_list_stage(fake):
    """With n_tiles <= 16 every tile with a posting is a seed: no list, no seed threshold, same results."""
    small = random_index(900, 60, seed=77, heavy_df=800)
    gpu = cb.CupyScorer(small, BM25Params(), haystack="never", graphs=False)
    assert gpu.n_tiles <= 16
    qs = [q for q in random_queries(60, 12, seed=78, max_terms=5) if q.size]
    ref = NumpyScorer(small, BM25Params())
    n0 = len(fake.launches)
    for k in (1, 5, 50):
        assert _same(ref.search(qs, k), gpu.search(qs, k))
    names = [n.split("<")[0] for n, *_ in fake.launches[n0:]]
    assert "tile_list" not in names and "seed_theta" not in names and names.count("sub_score") == 3
    big = cb.CupyScorer(random_index(1500, 60, seed=77, heavy_df=1300), BM25Params(), haystack="never", graphs=False)
    n0 = len(fake.launches)
    big.search(qs, 5)
    assert "tile_list" in [n.split("<")[0] for n, *_ in fake.launches[n0:]]
