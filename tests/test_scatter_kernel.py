"""The design card's scatter kernel (kernels/scatter.cu, gpuir/backends/cupy_scatter.py) equals NumPy bit for bit.

Run twice: on the NumPy model of the kernels (the fake cupy of gpuir.backends.kernel_model) and on
the real kernel bodies compiled for the CPU (tests/cuda_host), for all five BM25 variants, the
default statistics (cached weights) and per-search statistics (weights computed in the kernel),
allow-lists, tombstones, several document windows and row groups. Planted bugs (rounds in another
order, a slot left without its sentinel) are caught. The scatter kernel is also the independent
cross-check of the pruned tile kernels (CupyScorer).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from _helpers import random_index, random_queries

import gpuir.backends.cupy_scatter as cs
from gpuir.backends import kernel_model as km
from gpuir.backends import kernels as K
from gpuir.backends import make_scorer
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.backends.weights import CollectionStats
from gpuir.bm25 import METHODS, BM25Params

VARIANTS = tuple(METHODS)


def _same(a, b, what=""):
    assert np.array_equal(a.ids, b.ids), (what, a.ids[:3, :6], b.ids[:3, :6])
    assert np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32)), what


@pytest.fixture(params=["model", "real"])
def device(request, monkeypatch):
    """A fake cupy whose kernels are the model, or the real kernel bodies run on the CPU."""
    monkeypatch.setattr(cs, "MIN_WIDTH", 64)  # small windows, so a small index spans several
    if request.param == "model":
        ctx = contextlib.ExitStack()
        ctx.enter_context(km.small_kernels())
        cp = ctx.enter_context(km.fake_cupy_installed(sm_count=4))
    else:
        cuda_host = pytest.importorskip("cuda_host")
        if cuda_host.find_compiler()[0] is None:
            pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}")
        from cuda_host.device import real_kernels_installed, small_blocks

        ctx = contextlib.ExitStack()
        ctx.enter_context(small_blocks())
        cp = ctx.enter_context(real_kernels_installed(schedule="random", sm_count=4))
    with ctx:
        yield cp


@pytest.fixture(scope="module")
def data():
    idx = random_index(901, 71, seed=21, heavy_df=800)
    qs = random_queries(71, 7, seed=22, max_terms=7)
    return idx, qs


@pytest.mark.parametrize("method", VARIANTS)
def test_equals_numpy_every_variant(device, data, method):
    idx, qs = data
    p = BM25Params(method=method)
    ref = NumpyScorer(idx, p)
    one = make_scorer("cupy", idx, p, kernel="scatter")  # one window, all rows
    small = make_scorer("cupy", idx, p, kernel="scatter", memory_budget_bytes=30_000)  # windows x row groups
    assert isinstance(one, cs.ScatterScorer)
    for k in (1, 10, 1000):
        want = ref.search(qs, k)
        _same(want, one.search(qs, k), (method, k, "one window"))
        _same(want, small.search(qs, k), (method, k, "windows"))
    assert one.last_stats.windows == 1 and small.last_stats.windows > 2
    assert any(n.startswith("scatter_round") for n, *_ in device.launches)
    assert any(n.startswith("scatter_clip") for n, *_ in device.launches)  # windows walk their own postings
    # per-search statistics: weights computed in the kernel (not the cached ones)
    st = CollectionStats(idx.n_docs * 3, np.asarray(CollectionStats.of(idx).df) + 5, 7.5)
    consts = np.linspace(0.0, 2.0, len(qs)).astype(np.float32)
    for k in (3, 17):
        _same(ref.search(qs, k, stats=st, consts=consts), small.search(qs, k, stats=st, consts=consts), (method, k))


def test_allow_lists_and_tombstones(device, data):
    idx, qs = data
    rng = np.random.default_rng(5)
    allow = [None if i % 3 == 0 else np.sort(rng.choice(idx.n_docs, 200 + 40 * i, replace=False))
             for i in range(len(qs))]
    allow[1] = np.zeros(0, np.int64)  # an empty allow-list: no candidate
    live = rng.random(idx.n_docs) > 0.3
    for method in ("lucene", "bm25+"):
        p = BM25Params(method=method)
        ref, g = NumpyScorer(idx, p), make_scorer("cupy", idx, p, kernel="scatter", memory_budget_bytes=40_000)
        for k in (1, 12):
            _same(ref.search(qs, k, allow), g.search(qs, k, allow), (method, k, "allow"))
            _same(ref.search(qs, k, allow, live=live), g.search(qs, k, allow, live=live), (method, k, "live"))


def test_cross_checks_the_tile_kernels(device, data):
    """The scatter kernel and the pruned tiles (CupyScorer) agree: two independent device engines."""
    idx, qs = data
    from gpuir.backends.cupy_backend import CupyScorer

    for method in ("robertson", "bm25l"):
        p = BM25Params(method=method)
        tiles, scat = CupyScorer(idx, p), make_scorer("cupy", idx, p, kernel="scatter")
        for k in (1, 10):
            _same(tiles.search(qs, k), scat.search(qs, k), (method, k))


def test_bad_input(device, data):
    idx, qs = data
    g = make_scorer("cupy", idx, BM25Params(), kernel="scatter")
    with pytest.raises(ValueError, match="k must be a positive int"):
        g.search(qs, 0)
    with pytest.raises(ValueError, match="kernel must be 'tiles' or 'scatter'"):
        make_scorer("cupy", idx, BM25Params(), kernel="atomic")
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        make_scorer("cupy", idx, BM25Params(), kernel="scatter", memory_budget_bytes=-1)
    with pytest.raises(ValueError, match="outside"):
        g.search(qs[:1], 5, [np.array([idx.n_docs + 3])])


# ---------------------------------------------------------------------------------------------------------
# Planted bugs: each must be caught by the bit-for-bit comparison
# ---------------------------------------------------------------------------------------------------------
def _differs(ref, g, qs, ks=(1, 10, 50)):
    for k in ks:
        a, b = ref.search(qs, k), g.search(qs, k)
        if not (np.array_equal(a.ids, b.ids) and np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32))):
            return True
    return False


def test_planted_round_order_swapped_is_caught(device, data, monkeypatch):
    """Rounds launched in descending term order: the same adds in another float order -> other bits."""
    idx, _ = data
    rng = np.random.default_rng(9)
    qs = [rng.choice(idx.n_terms, 8, replace=False) for _ in range(24)]  # long queries: sums of 3+ terms
    p = BM25Params(method="bm25+")
    ref, g = NumpyScorer(idx, p), make_scorer("cupy", idx, p, kernel="scatter")
    assert not _differs(ref, g, qs)
    monkeypatch.setattr(cs, "round_order", lambda n: list(range(n))[::-1])
    assert _differs(ref, g, qs)


def test_planted_sentinel_not_set_is_caught(data):
    """scatter_keys that writes only candidates' keys (no sentinel 0 elsewhere) returns garbage slots."""
    cuda_host = pytest.importorskip("cuda_host")
    if cuda_host.find_compiler()[0] is None:
        pytest.skip("no C++20 compiler for the host emulation")
    from cuda_host.device import real_kernels_installed, small_blocks

    src = K.load_source("scatter.cu")
    good = "        keys[r * width + d] = key;\n"
    assert src.count(good) == 1
    bad = src.replace(good, "        if (key) keys[r * width + d] = key;\n")
    idx, qs = data
    p = BM25Params(method="lucene")
    with small_blocks():
        names = K.NAME_EXPRESSIONS["scatter.cu"]
        mod = cuda_host.build("scatter.cu", names, source=bad)
        ref = NumpyScorer(idx, p)
        with real_kernels_installed(sm_count=4):
            assert not _differs(ref, make_scorer("cupy", idx, p, kernel="scatter"), qs, ks=(10,))
        with real_kernels_installed(sm_count=4, modules={"scatter.cu": mod}):
            assert _differs(ref, make_scorer("cupy", idx, p, kernel="scatter"), qs, ks=(10,))


def test_model_refuses_two_adds_to_a_slot_in_one_round():
    """The model checks the kernel's exactness condition: within a round each slot is added at most once."""
    a = {"n_spans": 2, "width": 8, "words": 1, "doc0": 0, "sp_start": np.array([0, 0], np.int64),
         "sp_cum": np.array([0, 2, 4], np.int64), "sp_base": np.array([0, 0], np.int32),
         "sp_row": np.array([0, 0], np.int32), "sp_mult": np.ones(2, np.float32), "has_weights": 1,
         "weights": np.ones(2, np.float32), "doc_ids": np.array([1, 2], np.int32),
         "acc": np.zeros(8, np.float32), "touched": np.zeros(1, np.uint32)}
    with pytest.raises(AssertionError, match="added twice"):
        km.model_scatter_round(a, (1,))


def test_k_above_the_selection_limit_on_the_model(monkeypatch):
    """k > SELECT_MAX_K: each window's keys are sorted on the device and the windows merged the same way."""
    monkeypatch.setattr(cs, "MIN_WIDTH", 64)
    monkeypatch.setattr(K, "SELECT_MAX_K", 64)  # so a small index takes the large-k path
    idx = random_index(700, 40, seed=31, heavy_df=600)
    qs = random_queries(40, 5, seed=32, max_terms=5)
    with km.small_kernels(), km.fake_cupy_installed(sm_count=4):
        for method in ("lucene", "bm25l"):
            p = BM25Params(method=method)
            ref = NumpyScorer(idx, p)
            for budget in (None, 20_000):
                g = make_scorer("cupy", idx, p, kernel="scatter", memory_budget_bytes=budget)
                for k in (100, 900):
                    _same(ref.search(qs, k), g.search(qs, k), (method, budget, k))
