"""The CUDA kernels themselves, run on the CPU, against NumPy.

``tests/cuda_host`` compiles the unmodified ``kernels/*.cu`` as C++ with a shim
of the CUDA execution model (``__syncthreads`` as a block barrier, warp
intrinsics as a per-warp exchange, atomics, shared memory per block) and
launches them on NumPy arrays. Their outputs must equal independent NumPy
references -- ``NumpyScorer`` bit for bit, ``topk_from_dense``,
``segment_reduce_numpy`` -- under several thread interleavings:

* ``forward`` / ``reverse`` / ``random``: one CUDA thread at a time, switching
  at barriers, blocks in that order too (a missing barrier gives a wrong result
  in at least one of them, reproducibly);
* ``parallel``: every thread of a block on its own OS thread (real races).

Shared memory is filled with random bytes before every block and every array
is surrounded by guard bytes, so reads of uninitialised shared memory and
out-of-bounds writes show; AddressSanitizer runs catch out-of-bounds reads.

* ``select_topk`` / ``pack_candidates`` / ``decode_keys`` are launched directly
  on adversarial candidate rows (ties across the k-th place, all tied, -0.0 next
  to +0.0, sentinels and garbage in the slots, counts past the capacity,
  thresholds).
* ``sub_plan`` / ``sub_score`` / ``tile_dense`` / ``haystack_score`` run behind
  ``CupyScorer`` (its host code builds their many inputs), through the fake
  ``cupy`` of ``gpuir.backends.kernel_model`` whose kernels are swapped for the
  real ones (``cuda_host/device.py``): search results and dense rows must equal
  ``NumpyScorer``'s bit for bit, for every method, filters, both scoring paths,
  overflow reruns, the large-k sort path and the production block sizes.
* The second half plants bugs (generic ones, and four in the real kernels) and
  checks that they fail.

Small template block sizes keep it fast; the production instantiations run too.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _helpers import random_index, random_queries
from cuda_host import HostBuildError, KernelError, build, find_compiler, run_sanitized, sanitizer_env
from cuda_host.device import real_kernels_installed, small_blocks, small_names

from gpuir.backends import cupy_backend as cb
from gpuir.backends import kernel_model as km
from gpuir.backends import kernels as K
from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import METHODS, BM25Params
from gpuir.dense.late_interaction import POOLING_OPS, segment_reduce_numpy
from gpuir.index.csr import CSRIndex

_CXX, _CXX_WHY = find_compiler()
pytestmark = pytest.mark.skipif(_CXX is None, reason=f"host kernel tests need a C++20 compiler: {_CXX_WHY}")

F32, U32, U64 = np.float32, np.uint32, np.uint64
#: Instantiations: the small ones of cuda_host.device.small_blocks and the production ones.
SMALL = small_names()
PROD = {f: list(v) for f, v in K.NAME_EXPRESSIONS.items()}
#: Block size of the small select_topk instantiation.
SEL_T = int(SMALL["topk.cu"][0].split("<")[1].rstrip(">"))
SCHEDULES = ("forward", "reverse", "random", "parallel")
SERIAL = SCHEDULES[:3]


def both(f: str) -> list[str]:
    """Small and production instantiations of a kernel file, once each."""
    return list(dict.fromkeys(SMALL[f] + PROD[f]))


# =============================================================================
# Builds: compiled in parallel once (cached on disk across runs), loaded per module
# =============================================================================
def build_specs() -> dict[str, dict]:
    """Every build of this module by name (the planted kernels are defined further down)."""
    return {
        "score": {"kernel": "bm25_score.cu", "names": both("bm25_score.cu")},
        "topk": {"kernel": "topk.cu", "names": both("topk.cu")},
        "seg": {"kernel": "segment_reduce.cu", "names": ["segment_reduce<float>", "segment_reduce<double>"],
                "defines": {"SEGMENT_REDUCE_BLOCK": 32}},
        "planted": {"kernel": "planted.cu", "names": _PLANTED_NAMES, "source": PLANTED},
        "topk_planted": {"kernel": "topk.cu (planted bugs)",
                         "names": [f"{b}::{n}" for b in TOPK_BUGS for n in SMALL["topk.cu"]],
                         "source": variants("topk.cu", TOPK_BUGS)},
        "score_planted": {"kernel": "bm25_score.cu (planted bugs)",
                          "names": [f"{b}::{n}" for b in SCORE_BUGS for n in SMALL["bm25_score.cu"]],
                          "source": variants("bm25_score.cu", SCORE_BUGS)},
        "asan_topk": {"kernel": "topk.cu + asan_planted.cu", "names": SMALL["topk.cu"] + ASAN_NAMES,
                      "source": K.load_source("topk.cu") + ASAN_PLANTED, "sanitize": True},
        "asan_score": {"kernel": "bm25_score.cu", "names": SMALL["bm25_score.cu"], "sanitize": True},
    }


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    """Compile every library of this module at once (on 2 cores about half the time of one by one)."""
    def one(spec):
        try:
            build(**spec, load=False)
        except (HostBuildError, AssertionError):
            pass  # the test that needs it reports the error

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        list(ex.map(one, build_specs().values()))


def load(name: str):
    return build(**build_specs()[name])


@pytest.fixture(scope="module")
def score_mod():
    return load("score")


@pytest.fixture(scope="module")
def topk_mod():
    return load("topk")


# =============================================================================
# select_topk, pack_candidates, decode_keys on adversarial candidate rows
# =============================================================================
def adversarial_rows(rng, N: int) -> dict[str, np.ndarray]:
    """Dense rows (-inf = not a candidate) that stress the radix select and the tie rule."""
    f = F32
    rows = {}

    def row(n_cand, values):
        r = np.full(N, -np.inf, f)
        idx = rng.choice(N, n_cand, replace=False)
        r[idx] = rng.choice(np.asarray(values, f), n_cand) if np.ndim(values) else values
        return r

    rows["all_tied"] = row(N // 2, f(2.5))
    rows["three_levels"] = row(2 * N // 3, [1.0, 2.0, 3.0])
    j = rng.integers(0, 2048, N // 2).astype(np.int32)  # 1.0 + j ulp: differ in key bits 32..42 only
    rows["low_mantissa"] = row(N // 2, (np.array(f(1.0)).view(np.int32) + j).view(f))
    rows["signed_zeros_negative"] = row(N // 2, [-0.0, 0.0, -1.5, -1e-30, 1e-30])
    rows["random"] = row(N - 7, (rng.standard_normal(N - 7) * 3).astype(f))
    rows["none"] = np.full(N, -np.inf, f)
    r = np.full(N, -np.inf, f)
    r[[0, N - 1]] = 1.0
    rows["first_and_last"] = r
    rows["dense_ties"] = np.repeat(np.array([5.0, 4.0, 4.0, 3.0], f), N // 4 + 1)[:N]
    return rows


class SelectCase:
    """Candidate slots as bm25_score.cu leaves them, and the rows the reference sees.

    Row r's slots hold its candidates' composite keys in random order with
    sentinels (0) among them; slots past ``counts[r]`` hold garbage keys that
    would win if read; a few rows overflowed (``counts[r]`` > capacity: only
    the slots are read) or have a threshold ``theta[r]`` (keys below it are not
    candidates).
    """

    def __init__(self, rng, N: int):
        rows = adversarial_rows(rng, N)
        self.names = list(rows)
        R = len(rows)
        self.doc_bits = max(1, (N - 1).bit_length())
        self.theta = np.zeros(R, U32)
        self.ref_rows = np.full((R, N), -np.inf, F32)
        slots, counts = [], []
        for r, dense in enumerate(rows.values()):
            d = rng.permutation(np.flatnonzero(np.isfinite(dense)))
            keys = km.composite_key(dense[d], d)
            if r == 1:  # a threshold: keys of scores below 2.0 are not candidates
                self.theta[r] = km.float_to_ordered(F32(2.0))[0]
            sent = rng.integers(0, keys.size + 1, 5)
            keys = np.insert(keys, sent, U64(0))
            count = keys.size
            if r == 4:  # overflow: 7 more keys were counted than fit
                count = keys.size + 7
            cap = keys.size + (0 if r == 4 else 3)
            garbage = km.composite_key(np.full(cap - keys.size, F32(1e30)), np.arange(cap - keys.size))
            slots.append(np.concatenate([keys, garbage]).astype(U64))
            counts.append(count if r == 4 else keys.size)
            valid = keys[(keys != 0) & ((keys >> U64(32)).astype(U32) >= self.theta[r])]
            self.ref_rows[r, km.key_doc(valid)] = km.key_score(valid)
        self.cand = np.concatenate(slots)
        self.cand_off = np.concatenate([[0], np.cumsum([x.size for x in slots])]).astype(np.int64)
        self.counts = np.array(counts, np.int32)


def run_select(mod, c: SelectCase, k: int, *, threads=None, schedule="forward", seed=0, name="select_topk"):
    threads = threads or SEL_T
    R = len(c.names)
    kpad = 1 << max(0, k - 1).bit_length()
    ids = np.full((R, k), 12345, np.int64)  # garbage: every slot must be written
    out = np.full((R, k), F32(7.0))
    mod.launch(f"{name}<{threads}>", (R,), (threads,),
               [c.cand, c.cand_off, c.counts, c.theta, np.int32(c.doc_bits), np.int32(k), np.int32(kpad),
                np.int32(1), np.int32(0), ids, out],  # segs = 1 (a block per row), raw_keys = 0
               shared=8 * kpad, schedule=schedule, seed=seed)
    return ids, out


def topk_mismatches(c: SelectCase, ids, out, k) -> list[str]:
    ref = topk_from_dense(c.ref_rows, k)
    return [n for r, n in enumerate(c.names)
            if not (np.array_equal(ids[r], ref.ids[r]) and np.array_equal(out[r].view(U32), ref.scores[r].view(U32)))]


@pytest.mark.parametrize("k", [1, 3, 40, 200, 700, 2000, 4096])
def test_select_topk_equals_tie_rule(topk_mod, k):
    """Exact ids and score bits of topk_from_dense, one block per row, under every interleaving."""
    c = SelectCase(np.random.default_rng(k), 1500)
    for schedule in SCHEDULES:
        ids, out = run_select(topk_mod, c, k, schedule=schedule, seed=k)
        assert not topk_mismatches(c, ids, out, k), (schedule, topk_mismatches(c, ids, out, k))


@pytest.mark.parametrize("segs", [2, 3, 7, 50])
def test_select_topk_in_two_stages(topk_mod, segs):
    """segs blocks per row each keep their segment's top k as raw keys; selecting over those equals the row's top k."""
    c = SelectCase(np.random.default_rng(segs), 1000)
    R, k = len(c.names), 30
    kpad = 1 << (k - 1).bit_length()
    raw = np.full((R * segs, k), 77, np.int64)
    unused = np.zeros((1, 1), F32)
    topk_mod.launch(f"select_topk<{SEL_T}>", (R * segs,), (SEL_T,),
                    [c.cand, c.cand_off, c.counts, c.theta, np.int32(c.doc_bits), np.int32(k), np.int32(kpad),
                     np.int32(segs), np.int32(1), raw, unused], shared=8 * kpad, schedule="reverse")
    second = SelectCase.__new__(SelectCase)
    second.names, second.doc_bits, second.theta, second.ref_rows = c.names, c.doc_bits, c.theta, c.ref_rows
    second.cand = raw.view(U64).reshape(-1).copy()
    second.cand_off = (np.arange(R + 1) * segs * k).astype(np.int64)
    second.counts = np.full(R, segs * k, np.int32)
    ids, out = run_select(topk_mod, second, k, schedule="random")
    assert not topk_mismatches(c, ids, out, k), topk_mismatches(c, ids, out, k)


def test_select_topk_production_block_size(topk_mod):
    c = SelectCase(np.random.default_rng(5), 1200)
    for schedule in ("forward", "parallel"):
        ids, out = run_select(topk_mod, c, 100, threads=K.SELECT_THREADS, schedule=schedule)
        assert not topk_mismatches(c, ids, out, 100), schedule


def test_pack_candidates_then_sort_and_decode(topk_mod):
    """The k > 4096 path: packed valid keys sorted descending and decoded give topk_from_dense."""
    c = SelectCase(np.random.default_rng(8), 900)
    R = len(c.names)
    width = int(np.diff(c.cand_off).max())
    for threads in {int(n.split("<")[1].rstrip(">")) for n in both("topk.cu") if n.startswith("pack_candidates")}:
        packed = np.zeros((R, width), U64)
        topk_mod.launch(f"pack_candidates<{threads}>", (3, R), (threads,),
                        [c.cand, c.cand_off, c.counts, c.theta, np.int64(width), packed], schedule="reverse")
        srt = np.ascontiguousarray(np.sort(packed, axis=1)[:, ::-1])
        ids = np.zeros((R, width), np.int64)
        out = np.zeros((R, width), F32)
        topk_mod.launch("decode_keys", (5,), (32,), [srt, np.int64(R * width), ids, out], schedule="parallel")
        assert not topk_mismatches(c, ids, out, width), threads


# =============================================================================
# sub_plan, sub_score, tile_dense, haystack_score behind CupyScorer, bit for bit
# =============================================================================
def with_empty_terms(idx: CSRIndex) -> CSRIndex:
    """The index plus two vocabulary terms without postings."""
    off = np.concatenate([idx.offsets, [idx.offsets[-1]] * 2]).astype(np.int64)
    return CSRIndex(offsets=off, doc_ids=idx.doc_ids, tfs=idx.tfs, doc_lens=idx.doc_lens,
                    vocab=[*idx.vocab, "zz0", "zz1"], ids=idx.ids)


def exact(a, b, where=""):
    """Equal ids, and equal score bits (up to the sign of zero, which NumPy ties)."""
    assert a.ids.shape == b.ids.shape and b.scores.dtype == np.float32
    bad = [i for i in range(a.ids.shape[0])
           if not (np.array_equal(a.ids[i], b.ids[i])
                   and np.array_equal(a.scores[i].view(U32) & U32(0x7FFFFFFF), b.scores[i].view(U32) & U32(0x7FFFFFFF)))]
    assert not bad, f"{where}: rows {bad[:5]} differ, e.g. {a.ids[bad[0]][:6]} vs {b.ids[bad[0]][:6]}"


N_DOCS, N_TERMS = 1300, 63


@pytest.fixture(scope="module")
def corpus():
    idx = with_empty_terms(random_index(N_DOCS, N_TERMS - 2, seed=11, heavy_df=1200))
    qs = random_queries(N_TERMS - 2, 10, seed=12, max_terms=6)
    qs += [np.array([N_TERMS - 1, 3], np.int64), np.array([2, 2, 2, 5, 9, 2], np.int64),
           np.arange(0, 40, dtype=np.int64)]  # a term without postings, repeats, 40 terms (> 32 threads)
    rng = np.random.default_rng(13)
    allow = [None, np.zeros(0, np.int64), np.sort(rng.choice(N_DOCS, 30, replace=False)), None,
             np.arange(0, N_DOCS, 3), np.array([N_DOCS - 1]), None, np.arange(N_DOCS), np.arange(700, 760),
             np.sort(rng.choice(N_DOCS, 300, replace=False)), None, np.arange(5), None]
    return idx, qs, allow


@pytest.fixture(scope="module")
def mods(score_mod, topk_mod):
    return {"bm25_score.cu": score_mod, "topk.cu": topk_mod}


@pytest.mark.parametrize("method", METHODS)
def test_scorer_on_real_kernels_equals_numpy(mods, corpus, method):
    """search (plain, filtered) and score_matrix: NumpyScorer's results, bit for bit."""
    idx, qs, allow = corpus
    schedule = SERIAL[METHODS.index(method) % len(SERIAL)]  # "parallel": test_haystack_modes, ASan
    ref = NumpyScorer(idx, BM25Params(method=method))
    with small_blocks(), real_kernels_installed(schedule=schedule, modules=mods) as cp:
        gpu = cb.CupyScorer(idx, BM25Params(method=method))
        assert gpu.n_tiles > 10 and (np.asarray(gpu.d_dir_row) >= 0).any() and (np.asarray(gpu.d_dir_row) < 0).any()
        for k in (1, 10, 300):
            exact(ref.search(qs, k), gpu.search(qs, k), f"{method} {schedule} k={k}")
            res = gpu.search(qs, k, allow)
            exact(ref.search(qs, k, allow), res, f"{method} {schedule} k={k} filtered")
            assert res.meta["haystack_rows"] >= 1
        want = ref.score_matrix(qs, allow)
        got = gpu.score_matrix(qs, allow)
        assert np.array_equal(want, got) and np.array_equal(np.isfinite(want), np.isfinite(got))
    assert {n.split("<")[0] for n, *_ in cp.launches} >= {"sub_plan", "sub_score", "haystack_score", "select_topk",
                                                          "tile_dense"}


@pytest.mark.parametrize("seed", [1, 2])
def test_any_block_and_thread_order_gives_the_same_results(mods, corpus, seed):
    """Blocks and threads in random orders, one SM (more tiles per block), tiles path only."""
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params())
    with small_blocks(), real_kernels_installed(schedule="random", seed=seed, sm_count=1, modules=mods):
        gpu = cb.CupyScorer(idx, BM25Params(), haystack="never")
        for k in (1, 5, 64):
            exact(ref.search(qs, k, allow), gpu.search(qs, k, allow), f"seed={seed} k={k}")


def tied_index(N: int) -> CSRIndex:
    """Term 0 in every document with tf 1 and equal lengths: every score ties."""
    return CSRIndex(offsets=np.array([0, N, N + 3], np.int64),
                    doc_ids=np.concatenate([np.arange(N), [5, N // 2, N - 1]]).astype(np.int32),
                    tfs=np.ones(N + 3, np.int32), doc_lens=np.full(N, 4, np.int32),
                    vocab=["a", "b"], ids=[str(i) for i in range(N)])


def test_ties_at_the_kth_place_across_tiles(mods):
    idx = tied_index(1000)
    qs = [np.array([0]), np.array([0, 1]), np.array([1, 0, 0])]
    ref = NumpyScorer(idx, BM25Params())
    with small_blocks(), real_kernels_installed(schedule="reverse", modules=mods):
        gpu = cb.CupyScorer(idx, BM25Params())
        for k in (1, 2, 3, 64, 65, 1000, 1001):
            res = gpu.search(qs, k)
            exact(ref.search(qs, k), res, f"k={k}")
    assert res.ids[0, 0] == 0  # all tied: the lowest document number first


def test_overflow_reruns_query_groups_and_large_k(mods, corpus, monkeypatch):
    """Candidate buffers too small (reruns), several rows per block, and k > 4096 (pack + sort)."""
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params(method="bm25l"))
    monkeypatch.setattr(cb, "_MAX_GRID_Y", 3)
    real = cb.candidate_slots
    monkeypatch.setattr(cb, "candidate_slots", lambda *a, **kw: np.minimum(real(*a, **kw), 5))
    with small_blocks(), real_kernels_installed(schedule="forward", modules=mods) as cp:
        gpu = cb.CupyScorer(idx, BM25Params(method="bm25l"), haystack="never", graphs=False)
        for k in (1, 4, 1400):
            res = gpu.search(qs, k, allow)
            exact(ref.search(qs, k, allow), res, f"k={k}")
        assert res.meta["overflow_rows"] > 0
        monkeypatch.setattr(cb, "candidate_slots", real)
        big = random_index(4500, 30, seed=21, heavy_df=4400)
        ref2, gpu2 = NumpyScorer(big, BM25Params(method="bm25+")), cb.CupyScorer(big, BM25Params(method="bm25+"))
        q2 = random_queries(30, 5, seed=22, max_terms=3)
        for k in (4097, 5000):
            exact(ref2.search(q2, k), gpu2.search(q2, k), f"sort path k={k}")
    assert any(n.startswith("pack_candidates") for n, *_ in cp.launches)


@pytest.mark.parametrize("mode", ["never", "always"])
def test_haystack_modes(mods, corpus, mode):
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params(method="atire"))
    with small_blocks(), real_kernels_installed(schedule="parallel", modules=mods):
        gpu = cb.CupyScorer(idx, BM25Params(method="atire"), haystack=mode)
        res = gpu.search(qs, 10, allow)
    exact(ref.search(qs, 10, allow), res, mode)
    assert (res.meta["haystack_rows"] == 0) == (mode == "never")


@pytest.mark.parametrize("method", ["robertson", "bm25l"])
def test_statistics_per_search_and_live_on_real_kernels(mods, corpus, method):
    """Other statistics per search (no re-upload) and deleted documents, on both paths, bit for bit."""
    from gpuir.backends.base import CollectionStats

    idx, qs, allow = corpus
    p = BM25Params(method=method)
    rng = np.random.default_rng(3)
    stats = CollectionStats(idx.n_docs * 2, idx.df.astype(np.int64) + rng.integers(0, 40, idx.n_terms),
                            idx.avgdl * 0.8)
    live = rng.random(idx.n_docs) > 0.2
    docs = np.flatnonzero(live)
    both = [docs if a is None else np.intersect1d(a, docs) for a in allow]
    ref = NumpyScorer(idx, p, stats=stats)
    with small_blocks(), real_kernels_installed(schedule="reverse", modules=mods):
        gpu = cb.CupyScorer(idx, p, haystack="auto")
        exact(ref.search(qs, 10, both), gpu.search(qs, 10, allow, stats=stats, live=live), method)
        exact(NumpyScorer(idx, p).search(qs, 7, allow), gpu.search(qs, 7, allow), "own statistics again")
    assert gpu.uploads == 1


def test_production_block_sizes(mods, corpus):
    """sub_plan / sub_score<256, 4096> (8 warps a block), tile_dense, haystack_score<256>, select_topk<512>."""
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params(method="bm25+"))
    with real_kernels_installed(schedule="forward", modules=mods) as cp:
        gpu = cb.CupyScorer(idx, BM25Params(method="bm25+"), haystack="auto")
        exact(ref.search(qs, 10, allow), gpu.search(qs, 10, allow), "production")
        assert np.array_equal(ref.score_matrix(qs[:4]), gpu.score_matrix(qs[:4]))
    want = {n for n in PROD["bm25_score.cu"] if "tile" in n or "sub_" in n}
    if gpu.n_tiles <= K.SEED_TILES:  # every tile with a posting is a seed already: the list stage is skipped
        want = {n for n in want if not n.startswith("tile_list")}
    assert {n for n, *_ in cp.launches} >= want
    assert f"select_topk<{K.SELECT_THREADS}>" in {n for n, *_ in cp.launches}


# =============================================================================
# segment_reduce
# =============================================================================
@pytest.fixture(scope="module")
def seg_mod():
    return load("seg")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_reduce_equals_numpy(seg_mod, dtype):
    rng = np.random.default_rng(2)
    lengths = np.array([0, 1, 5, 32, 33, 70, 0, 2])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    B, T, S = 3, int(offsets[-1]), lengths.size
    values = rng.standard_normal((B, T)).astype(dtype)
    values[:, 40:44] = 1.5  # ties for top-k
    name = "segment_reduce<float>" if dtype == np.float32 else "segment_reduce<double>"
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    for code, op in enumerate(POOLING_OPS):
        out = np.full((B, S), 123, dtype)
        seg_mod.launch(name, (S, B), (32,), [values, offsets, out, np.int64(T), np.int32(S), np.int32(code),
                                              np.int32(3), np.float64(2.0)], schedule="reverse" if code % 2 else "forward")
        want = segment_reduce_numpy(values, offsets, op, 3, 2.0)
        np.testing.assert_allclose(out, want, rtol=rtol, atol=0, err_msg=op)
        if op == "max":
            assert np.array_equal(out, want)


# =============================================================================
# The harness catches bugs: planted ones
# =============================================================================
PLANTED = r"""
#include "common.cuh"

// Reverse each block's slice through shared memory.
template <int THREADS, bool SYNC>
__global__ void reverse_block(const int* __restrict__ in, int* __restrict__ out) {
    __shared__ int buf[THREADS];
    const int t = threadIdx.x;
    buf[t] = in[blockIdx.x * THREADS + t];
    if (SYNC) __syncthreads();  // planted bug when SYNC is false
    out[blockIdx.x * THREADS + t] = buf[THREADS - 1 - t];
}

// out[i] = 2 * in[i] for i < n; the planted off-by-one writes out[n].
template <bool OFF_BY_ONE>
__global__ void twice(const float* __restrict__ in, float* __restrict__ out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; OFF_BY_ONE ? i <= n : i < n; i += gridDim.x * blockDim.x)
        out[i] = 2.0f * (OFF_BY_ONE && i == n ? 0.0f : in[i]);
}

// Sum of a block's values through a shared accumulator that is not zeroed.
__global__ void uninit_sum(const int* __restrict__ in, int* __restrict__ out) {
    __shared__ int acc;
    atomicAdd(&acc, in[blockIdx.x * blockDim.x + threadIdx.x]);  // planted: acc never set to 0
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// Only the first half of the block reaches this __syncthreads.
__global__ void divergent_sync(int* out) {
    if (threadIdx.x < blockDim.x / 2) {
        out[threadIdx.x] = 1;
        __syncthreads();
    }
    __syncthreads();
}

// A warp reduction that only half of the warp takes part in.
__global__ void partial_shuffle(int* out) {
    int v = threadIdx.x;
    if ((threadIdx.x & 31) < 16) v += __shfl_down_sync(0xFFFFFFFFu, v, 1);
    out[threadIdx.x] = v;
}

// A correct warp reduction, launched with a block that is not a multiple of 32.
__global__ void warp_sum(const int* __restrict__ in, int* __restrict__ out) {
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if ((threadIdx.x & 31) == 0) out[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = v;
}

// Thread 0 waits for a flag no one sets.
__global__ void spin(int* flag) {
    if (threadIdx.x == 0) while (atomicAdd(flag, 0) == 0) {}
}

// Block b reads what block b - 1 wrote: an order no launch guarantees.
__global__ void chain(int* data) {
    if (threadIdx.x == 0 && blockIdx.x > 0) data[blockIdx.x] += data[blockIdx.x - 1];
}

// The shim's built-ins and intrinsics, for test_intrinsics_follow_cuda_semantics:
// 12 ints per thread, 3 words per warp, 8 counters per launch.
__global__ void intrinsics(int* __restrict__ out, unsigned int* __restrict__ warps, int* __restrict__ counters) {
    const int n = blockDim.x * blockDim.y * blockDim.z;
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int g = b * n + t, lane = t & 31;
    int* o = out + 12 * g;
    o[0] = b;
    o[1] = __shfl_up_sync(0xFFFFFFFFu, g, 3, 8);
    o[2] = __shfl_down_sync(0xFFFFFFFFu, g, 5, 16);
    o[3] = __shfl_xor_sync(0xFFFFFFFFu, g, 9, 8);
    o[4] = __shfl_sync(0xFFFFFFFFu, g, lane + 33, 16);
    o[5] = __syncthreads_count(t % 3 == 0);
    o[6] = __syncthreads_and(t < n) + 2 * __syncthreads_or(t == 5) + 4 * __syncthreads_and(t != 7);
    o[7] = (int)__reduce_add_sync(0xFFFFFFFFu, (unsigned)g);
    o[8] = __reduce_max_sync(0xFFFFFFFFu, -g);
    o[9] = __popc((unsigned)g) + 100 * __clz(g) + 10000 * __ffs(g);
    o[10] = atomicCAS(&counters[4], 0, b + 1);  // only the first thread of the launch succeeds
    o[11] = (int)(__brev((unsigned)g) >> 20);
    const unsigned bal = __ballot_sync(0xFFFFFFFFu, lane % 3 == 0);
    const int any = __any_sync(0xFFFFFFFFu, g == 37), all = __all_sync(0xFFFFFFFFu, lane < 32);
    if (lane == 0) {
        unsigned int* w = warps + 3 * (g / 32);
        w[0] = bal;
        w[1] = (unsigned)any;
        w[2] = (unsigned)all;
    }
    atomicMin(&counters[0], -g);
    atomicMax(&counters[1], g);
    atomicInc((unsigned int*)&counters[2], 9u);
    atomicSub(&counters[3], 2);
    atomicExch(&counters[5], 42);
    atomicAnd(&counters[6], ~(1 << (g % 31)));
    atomicXor(&counters[7], 1 << (g % 31));
}
"""

_PLANTED_NAMES = ["reverse_block<64, true>", "reverse_block<64, false>", "twice<false>", "twice<true>",
                  "uninit_sum", "divergent_sync", "partial_shuffle", "warp_sum", "spin", "chain", "intrinsics"]


@pytest.fixture(scope="module")
def planted():
    return load("planted")


def test_missing_syncthreads_gives_wrong_results(planted):
    data = np.arange(4 * 64, dtype=np.int32)
    want = data.reshape(4, 64)[:, ::-1].reshape(-1)
    for schedule in ("forward", "reverse", "random", "parallel"):
        out = np.zeros_like(data)
        planted.launch("reverse_block<64, true>", (4,), (64,), [data, out], schedule=schedule)
        assert np.array_equal(out, want), schedule
    for schedule in ("forward", "reverse"):
        out = np.zeros_like(data)
        planted.launch("reverse_block<64, false>", (4,), (64,), [data, out], schedule=schedule)
        assert not np.array_equal(out, want), f"{schedule}: the missing __syncthreads went unnoticed"


def test_off_by_one_write_is_caught(planted):
    x = np.arange(100, dtype=F32)
    y = np.zeros(100, F32)
    planted.launch("twice<false>", (2,), (32,), [x, y, 100], schedule="parallel")
    assert np.array_equal(y, 2 * x)
    with pytest.raises(KernelError, match=r"wrote 4 byte\(s\) outside argument 1, out .* bytes \[400, 404\)"):
        planted.launch("twice<true>", (2,), (32,), [x, np.zeros(100, F32), 100])


def test_uninitialised_shared_memory_is_caught(planted):
    x = np.ones(2 * 64, np.int32)
    out = np.zeros(2, np.int32)
    planted.launch("uninit_sum", (2,), (64,), [x, out], poison=0)
    assert np.array_equal(out, [64, 64])  # passes only if shared memory happened to be 0
    planted.launch("uninit_sum", (2,), (64,), [x, out])  # random poison: as a GPU, garbage
    assert not np.array_equal(out, [64, 64])


def test_divergent_syncthreads_is_an_error(planted):
    with pytest.raises(KernelError, match=r"divergent __syncthreads.*planted.cu:\d+"):
        planted.launch("divergent_sync", (1,), (64,), [np.zeros(64, np.int32)])
    with pytest.raises(KernelError, match="divergent __syncthreads"):
        planted.launch("divergent_sync", (1,), (64,), [np.zeros(64, np.int32)], schedule="parallel")


def test_partial_warps_are_errors(planted):
    for schedule in ("forward", "reverse", "parallel"):
        with pytest.raises(KernelError, match="__shfl_down_sync") as e:
            planted.launch("partial_shuffle", (1,), (64,), [np.zeros(64, np.int32)], schedule=schedule)
        assert "returned" in str(e.value), str(e.value)
    x = np.arange(96, dtype=np.int32)
    out = np.zeros(3, np.int32)
    planted.launch("warp_sum", (1,), (96,), [x, out], schedule="random")
    assert np.array_equal(out, x.reshape(3, 32).sum(1))
    with pytest.raises(KernelError, match=r"warp of 16 threads \(block size 48"):
        planted.launch("warp_sum", (1,), (48,), [x[:48], out])


def test_spin_wait_times_out_instead_of_hanging(planted):
    for schedule in ("parallel", "forward"):  # OS threads; fibers (a watchdog thread of its own)
        with pytest.raises(KernelError, match="no progress for 1 s"):
            planted.launch("spin", (1,), (32,), [np.zeros(1, np.int32)], schedule=schedule, timeout_s=1.0)


def test_block_order_dependence_is_caught(planted):
    results = set()
    for schedule in ("forward", "reverse"):
        d = np.ones(8, np.int32)
        planted.launch("chain", (8,), (32,), [d], schedule=schedule)
        results.add(tuple(d))
    assert len(results) == 2, "forward and reverse block orders must disagree on an order-dependent kernel"


@pytest.mark.parametrize("schedule", ["reverse", "parallel"])
def test_intrinsics_follow_cuda_semantics(planted, schedule):
    """Built-ins of a 3-D launch and the intrinsics, against the CUDA Programming Guide's definitions."""
    grid, block = (2, 1, 2), (16, 2, 2)  # x fastest: linear thread id = x + Dx * (y + Dy * z)
    n = 64
    total = 4 * n
    out = np.zeros((total, 12), np.int32)
    warps = np.zeros((total // 32, 3), np.uint32)
    counters = np.array([0, 0, 0, 1000, 0, 0, -1, 0], np.int32)
    planted.launch("intrinsics", grid, block, [out, warps, counters], schedule=schedule)
    g = np.arange(total)
    lane, b = g % 32, g // n
    base = g - lane
    assert np.array_equal(out[:, 0], b)
    i8 = lane % 8  # shfl_up, width 8: lanes with index < delta in their group keep their value
    assert np.array_equal(out[:, 1], np.where(i8 >= 3, g - 3, g))
    i16 = lane % 16  # shfl_down, width 16
    assert np.array_equal(out[:, 2], np.where(i16 + 5 < 16, g + 5, g))
    src = lane ^ 9  # shfl_xor, width 8: a source in a later group of 8 returns the caller's own value
    assert np.array_equal(out[:, 3], np.where(src >= (lane // 8 + 1) * 8, g, base + src))
    assert np.array_equal(out[:, 4], base + (lane // 16) * 16 + (lane + 33) % 16)
    assert np.all(out[:, 5] == sum(1 for x in range(n) if x % 3 == 0))
    assert np.all(out[:, 6] == 1 + 2 + 0)
    assert np.array_equal(out[:, 7], np.repeat(g.reshape(-1, 32).sum(axis=1), 32))
    assert np.array_equal(out[:, 8], -base)
    pop = np.array([int(x).bit_count() for x in g])
    clz = np.array([32 - int(x).bit_length() for x in g])
    ffs = np.array([(int(x) & -int(x)).bit_length() for x in g])
    assert np.array_equal(out[:, 9], pop + 100 * clz + 10000 * ffs)
    rev = np.array([int(f"{int(x):032b}"[::-1], 2) >> 20 for x in g])
    assert np.array_equal(out[:, 11], rev)
    first = np.flatnonzero(out[:, 10] == 0)  # one winner; everyone else sees its block number + 1
    assert first.size == 1 and np.all(np.delete(out[:, 10], first) == b[first[0]] + 1)
    assert np.all(warps[:, 0] == sum(1 << i for i in range(0, 32, 3)))
    assert np.array_equal(warps[:, 1], (np.arange(total // 32) == 1).astype(np.uint32))  # g == 37: warp 1
    assert np.all(warps[:, 2] == 1)
    acc_and, acc_xor = -1, 0
    for x in g:
        acc_and &= ~(1 << (x % 31))
        acc_xor ^= 1 << (x % 31)
    assert counters.tolist() == [-(total - 1), total - 1, total % 10, 1000 - 2 * total, b[first[0]] + 1, 42,
                                 np.int32(acc_and), np.int32(acc_xor)]


def test_launch_arguments_are_checked(planted, topk_mod):
    x = np.arange(100, dtype=F32)
    with pytest.raises(TypeError, match="expected dtype float32, got float64"):
        planted.launch("twice<false>", (1,), (32,), [x.astype(np.float64), x.copy(), 100])
    with pytest.raises(TypeError, match=r"n \(int32\): got numpy.int64"):
        planted.launch("twice<false>", (1,), (32,), [x, x.copy(), np.int64(100)])
    with pytest.raises(TypeError, match="read-only"):
        ro = x.copy()
        ro.flags.writeable = False
        planted.launch("twice<false>", (1,), (32,), [x, ro, 100])
    with pytest.raises(TypeError, match="C-contiguous"):
        planted.launch("twice<false>", (1,), (32,), [x[::2], np.zeros(50, F32), 50])
    with pytest.raises(TypeError, match="takes 3 arguments"):
        planted.launch("twice<false>", (1,), (32,), [x, x.copy()])
    with pytest.raises(ValueError, match="at most 1024 threads"):
        planted.launch("twice<false>", (1,), (2048,), [x, x.copy(), 100])
    with pytest.raises(KeyError, match="not built"):
        topk_mod.launch("select_topk<128>", (1,), (128,), [])


# -----------------------------------------------------------------------------
# Bugs planted in the real kernels
# -----------------------------------------------------------------------------
#: (text of the kernel file, its replacement).
TOPK_BUGS = {
    # No barrier between the gather into shared memory and the bitonic sort.
    "nosync": ("    __syncthreads();\n\n    // Bitonic sort, descending.", "\n    // Bitonic sort, descending."),
    # The radix schedule topk.cu had before review: pass 2 covered key bits 40..31, not 41..32.
    "oldradix": ("gpuir::radix_digit(pass, doc_bits, &shift, &width);",
                 ("gpuir::radix_digit(pass, doc_bits, &shift, &width);\n"
                  "        if (pass < 3) { shift = 53 - 11 * pass; width = pass < 2 ? 11 : 10; }")),
}
SCORE_BUGS = {
    # The rounds of a batch of terms in descending term id: a document's adds in another float order.
    "roundswap": ("            for (int i = 0; i < n; ++i) {\n                const long long plo",
                  "            for (int i = n - 1; i >= 0; --i) {\n                const long long plo"),
    # The sub-block's threshold L one ulp (one key step) above its k-th best: theta may pass s_k, and the
    # query's k-th document is then never emitted.
    "lulp": ("                if (__reduce_add_sync(GPUIR_FULL_MASK, n) >= k) lb = c;\n            }\n",
             ("                if (__reduce_add_sync(GPUIR_FULL_MASK, n) >= k) lb = c;\n            }\n"
             "            lb += 1u;\n")),
    # The accumulator sentinel not set: a slot keeps what the warp's previous sub-block (or the poison)
    # left there, so documents without a posting become candidates or start from garbage.
    "nosentinel": ("                val[d] = ok ? GPUIR_EMPTY_SLOT : GPUIR_BLOCKED_SLOT;",
                   "                if (!ok) val[d] = GPUIR_BLOCKED_SLOT;"),
    # The tile bound ignores a repeated query term's multiplicity: it may fall below a real score, so a
    # tile holding part of the top k is left out of the work list.
    "nomult": ("bound = gpuir::add_rn(bound, gpuir::scaled(bt, qt_mult[t0 + i]));",
               "bound = gpuir::add_rn(bound, bt);"),
    # A seed tile is listed again (its key not zeroed): its documents are emitted twice.
    "seedtwice": ("if (sd != 0ull && s == 0) ukey[(long long)q * n_tiles + j] = 0u;", ""),
    # The sub-block bound ignores a repeated term's multiplicity: below some real scores, so a sub-block
    # holding part of the top k is cut.
    "subnomult": ("ub = gpuir::add_rn(ub, gpuir::scaled(bb, qt_mult[uu]));", "ub = gpuir::add_rn(ub, bb);"),
    # Light terms (no directory row) add nothing to the sub-block bounds.
    "subnolight": ("h1 = here ? term_imp_off[t + 1] : h0;", "h1 = h0;"),
    # The plan's sub-block index shifted by one: a block is cut by its neighbour's bound.
    "subshift": (("const int it = (int)(g / GPUIR_SUBS), s = (int)(g % GPUIR_SUBS);\n        int q;\n        long long j;\n"
                 "        unsigned int u;"),
                 ("const int it = (int)(g / GPUIR_SUBS), s = (int)((g + 1) % GPUIR_SUBS);\n        int q;\n"
                 "        long long j;\n        unsigned int u;")),
    # A directory term's sub-block read from one past its first posting (the directory's end of the
    # previous sub-block off by one): that posting's document loses the term.
    "subend": ("const int e0 = s > 0 ? (int)dir_sub_end[cell * GPUIR_SUBS + s - 1] : 0;",
               "const int e0 = s > 0 ? (int)dir_sub_end[cell * GPUIR_SUBS + s - 1] + 1 : 0;"),
}


def variants(filename: str, bugs: dict[str, tuple[str, str]]) -> str:
    """One source holding the kernel file once per planted bug, each in a namespace named after it."""
    src = K.load_source(filename)
    out = []
    for bug, (old, new) in bugs.items():
        assert src.count(old) == 1, f"the planted bug {bug!r} no longer applies to {filename}: update it"
        out.append(f"namespace {bug} {{\n{src.replace(old, new)}}}  // namespace {bug}\n")
    return "".join(out)


def test_planted_bugs_in_select_topk_are_caught():
    c = SelectCase(np.random.default_rng(21), 1500)
    mod = load("topk_planted")
    caught = [bool(topk_mismatches(c, *run_select(mod, c, 40, schedule=s, name="nosync::select_topk"), 40))
              for s in ("forward", "reverse")]
    assert any(caught), "a missing __syncthreads before the sort went unnoticed"
    bad = topk_mismatches(c, *run_select(mod, c, 40, name="oldradix::select_topk"), 40)
    assert "low_mantissa" in bad, bad


def test_planted_bugs_in_sub_score_are_caught(mods, topk_mod):
    """Each bug fails the exact comparison on inputs where the real kernel passes it (issue 35: a round
    order swapped, a threshold one ulp too high, a sentinel not set)."""
    bugs = load("score_planted")
    # 1. Rounds in the wrong order: documents holding three or more of the query's frequent terms get
    #    their adds in another float order (a + b + c != c + b + a in float32 for some documents).
    idx = random_index(1000, 120, seed=41, heavy_df=900)
    rng = np.random.default_rng(42)
    frequent = np.argsort(-np.diff(idx.offsets), kind="stable")[:16]
    qs = [rng.choice(frequent, 12, replace=False).astype(np.int64) for _ in range(12)]
    qs += [rng.integers(0, 120, 12).astype(np.int64) for _ in range(12)]
    ref = NumpyScorer(idx, BM25Params())
    want = ref.search(qs, 50)
    with small_blocks(), real_kernels_installed(modules={"bm25_score.cu": (bugs, "roundswap::"),
                                                         "topk.cu": topk_mod}):
        got = cb.CupyScorer(idx, BM25Params(), haystack="never").search(qs, 50)
    assert not np.array_equal(want.scores, got.scores), "sub_score with its rounds reversed still matched NumPy"
    with small_blocks(), real_kernels_installed(schedule="reverse", modules=mods):
        exact(want, cb.CupyScorer(idx, BM25Params(), haystack="never").search(qs, 50), "control")
    # 2. L one ulp high (k = 1: a sub-block of 4 documents (tiles of 64) holds a query's best document
    #    and reaches k), 3. the sentinel not set, 4. the directory's sub-block start off by one.
    q2 = qs[:12] + [np.array([0, 1]), np.array([0]), np.array([1, 2, 3])]
    for bug, k in (("lulp", 1), ("nosentinel", 3), ("subend", 10)):
        want2 = ref.search(q2, k)
        with small_blocks(), real_kernels_installed(modules={"bm25_score.cu": (bugs, f"{bug}::"),
                                                             "topk.cu": topk_mod}):
            got = cb.CupyScorer(idx, BM25Params(), haystack="never").search(q2, k)
        assert not (np.array_equal(got.ids, want2.ids) and np.array_equal(got.scores, want2.scores)), \
            f"planted bug {bug} went unnoticed"
        with small_blocks(), real_kernels_installed(modules=mods):
            exact(want2, cb.CupyScorer(idx, BM25Params(), haystack="never").search(q2, k), f"control {bug}")
    # 5. Bounds without the multiplicity, and the seed tile listed twice: both change some results
    #    of queries with repeated terms. The tile bound only matters for tiles past the 16 seeds: an
    #    index of 4,000 documents (63 tiles of 64).
    big = random_index(4000, 120, seed=41, heavy_df=3600)
    q3 = [np.repeat(q[:4], 3) for q in qs]
    want3 = NumpyScorer(big, BM25Params()).search(q3, 5)
    for bug in ("nomult", "seedtwice"):
        with small_blocks(), real_kernels_installed(modules={"bm25_score.cu": (bugs, f"{bug}::"),
                                                             "topk.cu": topk_mod}):
            got = cb.CupyScorer(big, BM25Params(), haystack="never").search(q3, 5)
        assert not np.array_equal(got.ids, want3.ids), f"planted bug {bug} went unnoticed"
    with small_blocks(), real_kernels_installed(modules=mods):
        exact(want3, cb.CupyScorer(big, BM25Params(), haystack="never").search(q3, 5), "control")


def test_planted_bugs_in_the_sub_block_cut_are_caught(mods, topk_mod):
    """Each bug in the sub-block bounds or the seeds fails the exact comparison; the real kernel passes and cuts."""
    bugs = load("score_planted")
    idx = random_index(1000, 120, seed=41, heavy_df=900)
    rng = np.random.default_rng(44)
    qs = [rng.integers(0, 120, int(rng.integers(2, 6))).astype(np.int64) for _ in range(16)]
    qs += [np.repeat(q[:3], 3) for q in qs[:8]]  # repeated terms
    qs += [np.array([0, 1, t], np.int64) for t in range(60, 120, 6)]  # frequent terms and a light one
    ref = NumpyScorer(idx, BM25Params())
    for k in (3, 20):
        want = ref.search(qs, k)
        with small_blocks(), real_kernels_installed(schedule="reverse", modules=mods):
            res = cb.CupyScorer(idx, BM25Params(), haystack="never").search(qs, k)
        exact(want, res, f"control k={k}")
        # sub-blocks of 4 documents (tiles of 64) reach k = 3, not k = 20: only the first raises theta
        # while the seeds are scored, so only it cuts sub-blocks of this 16-tile index
        assert res.meta["blocks_scored"] > 0 and (k > 4 or res.meta["blocks_skipped"] > 0)
    want = ref.search(qs, 3)
    # (seedtwice needs a list stage: this 16-tile index has none, every tile being a seed; it is caught
    # on 63 tiles in test_planted_bugs_in_sub_score_are_caught)
    for bug in ("subnomult", "subnolight", "subshift"):
        with small_blocks(), real_kernels_installed(modules={"bm25_score.cu": (bugs, f"{bug}::"),
                                                             "topk.cu": topk_mod}):
            got = cb.CupyScorer(idx, BM25Params(), haystack="never").search(qs, 3)
        assert not (np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)), \
            f"planted bug {bug} went unnoticed"


# =============================================================================
# AddressSanitizer + UBSan (a separate process: the runtime must load first)
# =============================================================================
ASAN_PLANTED = r"""
#line 1 "asan_planted.cu"
// Reads one element past its input (AddressSanitizer finds it; guard bytes only see writes).
__global__ void read_past_end(const float* __restrict__ in, float* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i + 1];
}

// Writes one element past a __shared__ array.
__global__ void shared_overflow(int* __restrict__ out) {
    __shared__ int buf[64];
    buf[threadIdx.x + 1] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x];
}
"""
ASAN_NAMES = ["read_past_end", "shared_overflow"]


def asan_line(text: str) -> str:
    """``asan_planted.cu:<line>`` of a statement of ASAN_PLANTED."""
    lines = ASAN_PLANTED.split("#line 1", 1)[1].splitlines()[1:]
    return f"asan_planted.cu:{next(i for i, s in enumerate(lines, 1) if text in s)}"

_ASAN_PRELUDE = """
import numpy as np
import test_kernels_host as T
mod = T.load("asan_topk")
"""


@pytest.fixture(scope="module")
def asan_ok():
    if sanitizer_env() is None:
        pytest.skip("the compiler has no AddressSanitizer runtime")


def test_asan_passes_the_real_kernels_and_catches_a_read_past_the_end(asan_ok):
    r = run_sanitized(_ASAN_PRELUDE + """
from cuda_host.device import real_kernels_installed, small_blocks
from gpuir.backends import cupy_backend as cb
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import BM25Params
c = T.SelectCase(np.random.default_rng(4), 700)
for k in (1, 9, 300):
    assert not T.topk_mismatches(c, *T.run_select(mod, c, k, schedule="parallel"), k)
idx = T.random_index(700, 40, seed=3, heavy_df=600)
qs = T.random_queries(40, 6, seed=4, max_terms=5)
allow = [None, np.arange(0, 700, 7), None, np.array([5, 699]), None, np.arange(300)]
ref = NumpyScorer(idx, BM25Params(method="bm25l"))
with small_blocks(), real_kernels_installed(schedule="parallel", modules={"bm25_score.cu": T.load("asan_score"),
                                                                          "topk.cu": mod}):
    gpu = cb.CupyScorer(idx, BM25Params(method="bm25l"))
    T.exact(ref.search(qs, 10, allow), gpu.search(qs, 10, allow))
    assert np.array_equal(ref.score_matrix(qs, allow), gpu.score_matrix(qs, allow))
print("REAL KERNELS OK", flush=True)
x = np.arange(64, dtype=np.float32)
mod.launch("read_past_end", (2,), (32,), [x, np.zeros(64, np.float32), 64])
print("NOT CAUGHT", flush=True)
""")
    assert "REAL KERNELS OK" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "NOT CAUGHT" not in r.stdout
    assert "AddressSanitizer: heap-buffer-overflow" in r.stderr and "READ of size 4" in r.stderr, r.stderr[-3000:]
    assert asan_line("out[i] = in[i + 1]") in r.stderr, r.stderr[-3000:]


def test_asan_catches_a_shared_memory_overflow(asan_ok):
    r = run_sanitized(_ASAN_PRELUDE + """
mod.launch("shared_overflow", (1,), (64,), [np.zeros(64, np.int32)])
print("NOT CAUGHT", flush=True)
""")
    assert "NOT CAUGHT" not in r.stdout
    # UBSan (index out of bounds of the array type) or ASan (a write into the redzone), whichever comes first.
    assert ("runtime error: index 64 out of bounds for type 'int [64]'" in r.stderr
            or "AddressSanitizer: global-buffer-overflow" in r.stderr), r.stderr[-3000:]
    assert asan_line("buf[threadIdx.x + 1] =") in r.stderr and "shared_overflow" in r.stderr, r.stderr[-3000:]
