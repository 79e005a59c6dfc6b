"""The REAL kernel bodies of the fused GPU path, run on the CPU, equal NumpyScorer bit for bit.

``tests/cuda_host`` compiles ``kernels/bm25_score.cu`` and ``kernels/topk.cu``
as C++ with a shim for the CUDA execution model (a thread per CUDA thread,
barriers that detect divergence and deadlock, warp intrinsics, atomics through
``std::atomic_ref``, guard bytes around every array, poisoned shared memory).
Here the fake ``cupy`` of :mod:`gpuir.backends.kernel_model` forwards every
launch of ``CupyScorer`` to those host builds instead of the NumPy model, so
the scorer's host code AND the kernels' own code run end to end: tile bounds,
the round barriers, the threshold atomics, warp-aggregated emission, the
overflow rerun, haystack scoring, the radix select and the sort path. Small
instantiations (32-thread tiles of 64 documents, 64-thread selection) keep it
quick; thread interleavings "forward" and "random" (switching at barriers) are
both run.

What still needs a device: the real memory model and scheduling of a GPU,
the -ftz/--fmad=false arithmetic of the device compiler (the host build uses
-ffp-contract=off and SSE float32), performance, and the launch configurations
of the full-size instantiations.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends import cupy_backend as cb
from gpuir.backends import kernel_model as km
from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import BM25Params
from gpuir.index.csr import CSRIndex

cuda_host = pytest.importorskip("cuda_host")
if cuda_host.find_compiler()[0] is None:
    pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}", allow_module_level=True)


@pytest.fixture(scope="module")
def host_modules():
    return {f: cuda_host.build(f, names) for f, names in km.small_names().items()}


@contextlib.contextmanager
def _installed(host_modules, schedule, sm_count=4):
    """The fake cupy whose launches run the real kernel bodies on the CPU; yields (name, grid) of each launch."""
    launches = []

    def runner(filename, name, grid, block, args, shared):
        launches.append((name, grid))
        host_modules[filename].launch(name, grid, block, args, shared=shared, schedule=schedule, seed=len(launches))

    with km.fake_cupy_installed(runner=runner, sm_count=sm_count), km.small_tiles():
        yield launches


@pytest.fixture
def real_kernels(host_modules):
    """Real kernel bodies, threads interleaved at random at every barrier."""
    with _installed(host_modules, "random") as launches:
        yield launches


def _exact(a, b, where=""):
    assert np.array_equal(a.ids, b.ids), where
    mag = np.uint32(0x7FFFFFFF)
    assert np.array_equal(a.scores.view(np.uint32) & mag, b.scores.view(np.uint32) & mag), where


@pytest.fixture(scope="module")
def corpus():
    N, V = 2501, 81
    idx = random_index(N, V, seed=11, heavy_df=2500)
    qs = random_queries(V, 10, seed=12, max_terms=6) + [np.arange(0, 40, dtype=np.int64)]
    rng = np.random.default_rng(13)
    allow = [None, np.zeros(0, np.int64), np.sort(rng.choice(N, 40, replace=False)), None,
             np.arange(0, N, 3), np.array([N - 1]), None, np.arange(N), np.arange(700, 760),
             np.sort(rng.choice(N, 400, replace=False)), None]
    return idx, qs, allow


@pytest.mark.parametrize(("method", "schedule"), [("lucene", "forward"), ("bm25+", "random")])
def test_real_kernels_equal_reference(host_modules, corpus, method, schedule):
    with _installed(host_modules, schedule) as launches:
        _check_corpus(corpus, method, launches)


def _check_corpus(corpus, method, launches):
    idx, qs, allow = corpus
    ref, gpu = NumpyScorer(idx, BM25Params(method=method)), cb.CupyScorer(idx, BM25Params(method=method))
    _exact(ref.search(qs, 10), gpu.search(qs, 10), f"{method} k=10")
    res = gpu.search(qs, 100, allow)
    _exact(ref.search(qs, 100, allow), res, f"{method} filtered")
    assert res.meta["haystack_rows"] >= 1
    assert np.array_equal(ref.score_matrix(qs[:4], allow[:4]), gpu.score_matrix(qs[:4], allow[:4]))
    assert {n.split("<")[0] for n, _ in launches} >= {"tile_score", "haystack_score", "select_topk", "tile_dense"}


def test_real_kernels_ties_groups_and_overflow(real_kernels, monkeypatch):
    N = 1500
    tied = CSRIndex(offsets=np.array([0, N, N + 3], np.int64),
                    doc_ids=np.concatenate([np.arange(N), [5, N // 2, N - 1]]).astype(np.int32),
                    tfs=np.ones(N + 3, np.int32), doc_lens=np.full(N, 4, np.int32),
                    vocab=["a", "b"], ids=[str(i) for i in range(N)])
    ref, gpu = NumpyScorer(tied, BM25Params(method="bm25l")), cb.CupyScorer(tied, BM25Params(method="bm25l"))
    qs = [np.array([0]), np.array([0, 1]), np.array([1, 0, 0])]
    monkeypatch.setattr(cb, "_MAX_GRID_Y", 2)  # two rows per block
    real = cb.candidate_slots
    monkeypatch.setattr(cb, "candidate_slots", lambda *a: np.minimum(real(*a), 3))  # force overflow reruns
    for k in (1, 65):
        res = gpu.search(qs, k)
        _exact(ref.search(qs, k), res, f"k={k}")
    assert res.ids[0, 0] == 0 and res.meta["overflow_rows"] > 0


def test_real_sort_path_for_large_k(real_kernels):
    idx = random_index(4200, 30, seed=21, heavy_df=4000)
    ref, gpu = NumpyScorer(idx, BM25Params()), cb.CupyScorer(idx, BM25Params())
    qs = [np.array([1], np.int64), np.array([0, 1, 5], np.int64)]
    _exact(ref.search(qs, 4097), gpu.search(qs, 4097))
    assert "decode_keys" in [n for n, _ in real_kernels]


def test_real_select_kernel_on_adversarial_rows(host_modules):
    """select_topk's body on ties across the k-th place, ulp-close scores, -0.0 / +0.0, thresholds."""
    rng = np.random.default_rng(3)
    N = 3000
    f = np.float32
    rows = np.full((4, N), -np.inf, f)
    rows[0, rng.choice(N, 1500, replace=False)] = f(2.5)
    idx = rng.choice(N, 2000, replace=False)
    rows[1, idx] = rng.choice(np.array([1.0, 2.0, 3.0], f), idx.size)
    idx = rng.choice(N, 1500, replace=False)
    rows[2, idx] = (np.array(f(1.0)).view(np.int32) + rng.integers(0, 2048, idx.size).astype(np.int32)).view(f)
    idx = rng.choice(N, 1200, replace=False)
    rows[3, idx] = rng.choice(np.array([-0.0, 0.0, -1.5, -1e-30, 1e-30], f), idx.size)
    threads = km.SMALL["SELECT_THREADS"]
    for k in (1, 7, 1000, 2048):
        want = topk_from_dense(rows, k)
        keys, off = [], [0]
        for b in range(rows.shape[0]):
            d = rng.permutation(np.flatnonzero(rows[b] > -np.inf))
            keys.append(km.composite_key(rows[b, d], d))
            off.append(off[-1] + d.size + 2)
        cand = np.full(off[-1], 0xDEADBEEF, np.uint64)  # garbage past the counts
        for b, kb in enumerate(keys):
            cand[off[b]:off[b] + kb.size] = kb
        kth = want.scores[:, k - 1]
        theta = np.where(np.isfinite(kth), km.float_to_ordered(kth), 0).astype(np.uint32)  # exact k-th: allowed
        ids = np.empty((rows.shape[0], k), np.int64)
        out = np.empty((rows.shape[0], k), np.float32)
        kpad = km.next_pow2(k)
        host_modules["topk.cu"].launch(
            f"select_topk<{threads}>", (rows.shape[0],), (threads,),
            [cand, np.array(off, np.int64), np.array([x.size for x in keys], np.int32), theta,
             np.int32(12), np.int32(k), np.int32(kpad), np.int32(1), np.int32(0), ids, out],
            shared=8 * kpad, schedule="random", seed=k)
        assert np.array_equal(ids, want.ids), k
        assert np.array_equal(out, want.scores), k


def test_real_segmented_selection(host_modules, corpus):
    """One row at a time on a 64-SM 'device': the two-stage selection of the real kernel, exactly."""
    idx, qs, _ = corpus
    with _installed(host_modules, "random", sm_count=64) as launches:
        ref, gpu = NumpyScorer(idx, BM25Params()), cb.CupyScorer(idx, BM25Params(), haystack="never")
        for i in (3, 7):
            _exact(ref.search(qs[i:i + 1], 10), gpu.search(qs[i:i + 1], 10), f"query {i}")
    assert any(n.startswith("select_topk") and g[0] > 1 for n, g in launches)
