"""The memory served by the CUDA engine's per-segment path, run on the real kernel bodies on the CPU
(``tests/cuda_host``): every search equals a fresh index bit for bit, and each sealed segment is uploaded
once for its lifetime while later adds and deletes change the statistics every search applies.

The cupy backend serves a memory in one device pass by default (``gpuir.backends.devicesearch``, tested in
tests/test_memory_device_onepass.py); these tests turn that off (``ONE_PASS = False``) to keep the
per-segment path (one tile scorer per segment) covered."""

from __future__ import annotations

import numpy as np
import pytest
from _memory_oracle import Model, grow_both, random_query, random_where

from gpuir import Memory
from gpuir.bm25 import METHODS

cuda_host = pytest.importorskip("cuda_host")
if cuda_host.find_compiler()[0] is None:
    pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}", allow_module_level=True)

from cuda_host.device import real_kernels_installed, small_blocks

U32 = np.uint32


def same(res, ids, scores, what):
    """The fresh index's ids and score bits (up to the sign of zero, as the kernel tests compare)."""
    for i in range(len(ids)):
        assert res.ids(i) == ids[i], f"{what}: query {i}"
    got = np.asarray(res.scores, np.float32).view(U32) & U32(0x7FFFFFFF)
    want = np.asarray(scores, np.float32).view(U32) & U32(0x7FFFFFFF)
    assert np.array_equal(got, want), what


@pytest.mark.parametrize("method", METHODS)
def test_memory_on_the_real_kernels_equals_a_fresh_index(method, monkeypatch):
    from gpuir import backends
    from gpuir.backends import cupy_backend as cb
    from gpuir.backends import devicesearch

    monkeypatch.setattr(devicesearch, "ONE_PASS", False)
    rng = np.random.default_rng([21, len(method)])
    m = Memory(method=method, partition_days=1, merge_factor=100, merge_min=10**6)  # no merges
    model = Model(analyzer="default", method=method)
    qs = [random_query(rng) for _ in range(10)]
    ws = [random_where(rng) if i % 3 == 1 else None for i in range(10)]
    with small_blocks(), real_kernels_installed(schedule="forward"):
        monkeypatch.setattr(backends, "cuda_device", cb.cuda_device)  # the emulated device, for "cupy"
        scorers = {}
        for step in range(3):
            grow_both(m, model, rng, step, 70, 6)
            ids, scores = model.search(qs, 10, where=ws)
            for mode in ("exhaustive", "newest"):
                res = m.search(qs, k=10, where=ws, backend="cupy", mode=mode, ties="oldest")
                assert res.meta["backend"] == "cupy"
                same(res, ids, scores, f"{method} step {step} {mode}")
            for v in m.snapshot().views:
                sc = v.seg.cache.get(("scorer", "cupy", m.params))
                if sc is not None:
                    assert scorers.setdefault(v.seg.uid, sc) is sc, "a segment's scorer was rebuilt"
                    assert sc.uploads == 1, "a segment was uploaded again"
        assert len(scorers) >= 3


@pytest.mark.parametrize("method", METHODS)
def test_a_plain_batch_on_the_real_kernels_is_one_device_search_per_segment(method, monkeypatch):
    """An unfiltered batch on "cupy" makes one device search per segment for every query at once (the
    memory's per-query loop cost 11-21x the compiled CPU engine on an H200), and still equals the general
    path and a fresh index bit for bit."""
    from gpuir import backends
    from gpuir.backends import cupy_backend as cb
    from gpuir.backends import devicesearch
    from gpuir.memory import searcher

    monkeypatch.setattr(devicesearch, "ONE_PASS", False)
    rng = np.random.default_rng([23, len(method)])
    m = Memory(method=method, partition_days=1, merge_factor=100, merge_min=10**6, background_merges=False)  # no merges
    model = Model(analyzer="default", method=method)
    qs = [random_query(rng) for _ in range(9)] + ["zzzunseen qqqnothing"]
    calls: list[int] = []
    real = cb.CupyScorer.search
    monkeypatch.setattr(cb.CupyScorer, "search", lambda self, queries, *a, **kw: calls.append(len(queries))
                        or real(self, queries, *a, **kw))
    with small_blocks(), real_kernels_installed(schedule="forward"):
        monkeypatch.setattr(backends, "cuda_device", cb.cuda_device)  # the emulated device, for "cupy"
        for step in range(3):
            grow_both(m, model, rng, step, 70, 6)
            n_views = len(m.snapshot().views)
            ids, scores = model.search(qs, 10)
            del calls[:]
            res = m.search(qs, k=10, backend="cupy")
            assert res.meta["backend"] == "cupy"
            assert calls and max(calls) > 1 and len(calls) <= n_views, (calls, n_views)
            same(res, ids, scores, f"{method} step {step}")
            with monkeypatch.context() as mp:
                mp.setattr(searcher, "scan_unfiltered", lambda *a: None)  # the general path: hits per query
                general = m.search(qs, k=10, backend="cupy")
            for a in ("seqs", "scores", "vidx", "rows"):
                np.testing.assert_array_equal(getattr(res, a), getattr(general, a), err_msg=a)
        assert n_views >= 3
