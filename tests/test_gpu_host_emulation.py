"""The two-stage selection of the real ``select_topk`` body, run on the CPU, equals NumpyScorer bit for bit.

``tests/test_kernels_host.py`` runs ``CupyScorer`` end to end on the real
kernel bodies (``tests/cuda_host``: the ``.cu`` files compiled as C++ with a
shim for the CUDA execution model). This adds the case it does not reach: a
batch with fewer rows than SMs, where each row's candidates are split over
several ``select_topk`` blocks that write raw keys (segs > 1, raw_keys = 1)
and a second launch merges them.
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends import cupy_backend as cb
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import BM25Params

cuda_host = pytest.importorskip("cuda_host")
if cuda_host.find_compiler()[0] is None:
    pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}", allow_module_level=True)

from cuda_host.device import real_kernels_installed, small_blocks


@pytest.mark.parametrize("schedule", ["forward", "random"])
def test_real_two_stage_selection(schedule):
    idx = random_index(2501, 81, seed=11, heavy_df=2500)
    qs = random_queries(81, 8, seed=12, max_terms=6)
    rng = np.random.default_rng(13)
    allow = [None, None, None, np.sort(rng.choice(2501, 1200, replace=False)), None, None, None, None]
    with small_blocks(), real_kernels_installed(schedule=schedule, sm_count=64) as cp:
        for method in ("lucene", "bm25l"):
            ref, gpu = NumpyScorer(idx, BM25Params(method=method)), cb.CupyScorer(idx, BM25Params(method=method))
            for i in (1, 3, 7):
                for k in (1, 10):
                    a, b = ref.search(qs[i:i + 1], k, allow[i:i + 1]), gpu.search(qs[i:i + 1], k, allow[i:i + 1])
                    assert np.array_equal(a.ids, b.ids), (method, i, k)
                    assert np.array_equal(np.abs(a.scores), np.abs(b.scores)), (method, i, k)
            # one row per search: a select_topk grid wider than 1 is the first stage
            assert any(n.startswith("select_topk") and g[0] > 1 for n, g, *_ in cp.launches)
            b = gpu.search(qs[2:5], 10, allow[2:5])  # three rows, each split over segments
            assert np.array_equal(ref.search(qs[2:5], 10, allow[2:5]).ids, b.ids)


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_sub_score_on_the_real_bodies_equals_numpy(method):
    """Issue 35: sub_plan + sub_score (warp per kept sub-block, no block barrier), the real kernel bodies run
    on the CPU, bit-exact with NumpyScorer for every BM25 variant -- plain, filtered, with deleted documents,
    repeated terms, and threads interleaved at random."""
    idx = random_index(1500, 100, seed=41, heavy_df=1200)
    qs = random_queries(100, 12, seed=3, max_terms=6)
    qs += [np.repeat(q[:3], 3) for q in qs[5:9]]
    rng = np.random.default_rng(1)
    allow = [None] * len(qs)
    allow[6] = np.sort(rng.choice(1500, 300, replace=False))
    allow[7] = np.sort(rng.choice(1500, 40, replace=False))
    live = rng.random(1500) > 0.1
    with small_blocks(), real_kernels_installed(schedule="random", seed=7) as cp:
        gpu = cb.CupyScorer(idx, BM25Params(method=method), haystack="never")
        ref = NumpyScorer(idx, BM25Params(method=method))
        for k in (1, 7):
            for al in (None, allow):
                a, b = ref.search(qs, k, al), gpu.search(qs, k, al)
                assert np.array_equal(a.ids, b.ids), (method, k)
                assert np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32)), (method, k)
        a = ref.search(qs, 5, allow, live=live)
        b = gpu.search(qs, 5, allow, live=live)
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32))
        assert b.meta["blocks_scored"] > 0
        names = {n.split("<")[0] for n, *_ in cp.launches}
        assert {"sub_plan", "sub_score"} <= names and "tile_score" not in names
