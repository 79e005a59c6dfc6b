"""The CUDA kernels themselves, run on the CPU, against NumPy.

``tests/cuda_host`` compiles the unmodified ``kernels/*.cu`` as C++ with a shim
of the CUDA execution model (a thread per CUDA thread, ``__syncthreads`` as a
block barrier, warp intrinsics as a per-warp exchange, atomics) and launches
them on NumPy arrays. Every kernel's output is compared with an independent
NumPy reference (``NumpyScorer``, ``topk_from_dense``,
``segment_reduce_numpy``), under several thread interleavings:

* ``forward`` / ``reverse`` / ``random``: one CUDA thread at a time, switching
  at barriers, blocks in that order too (a missing barrier gives a wrong result
  in at least one of them, reproducibly);
* ``parallel``: all threads of a block at once (real races on the atomics).

Shared memory is filled with random bytes before every block, and every array
is surrounded by guard bytes, so reads of uninitialised shared memory and
out-of-bounds writes show. The second half plants bugs in kernels (a missing
``__syncthreads``, an off-by-one, divergent barriers, the radix schedule topk.cu
had before review) and checks that the harness reports them.

Small template block sizes (``THREADS``) keep it fast; the production
instantiations run once each.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _helpers import random_index, random_queries
from cuda_host import HostBuildError, KernelError, build, find_compiler, run_sanitized, sanitizer_env

from gpuir.backends import kernels as K
from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.backends.weights import posting_weights
from gpuir.bm25 import METHODS, BM25Params
from gpuir.dense.late_interaction import POOLING_OPS, segment_reduce_numpy

_CXX, _CXX_WHY = find_compiler()
pytestmark = pytest.mark.skipif(_CXX is None, reason=f"host kernel tests need a C++20 compiler: {_CXX_WHY}")

F32 = np.float32
U32 = np.uint32
#: Small instantiations for most tests: (THREADS, PER_THREAD) of bm25_score, THREADS of topk_rows.
SCORE_T, SCORE_P = 32, 2
TOPK_T = 64
SERIAL = ("forward", "reverse", "random")


# =============================================================================
# Modules: compiled in parallel once (cached on disk across runs), loaded per module
# =============================================================================
def build_specs() -> dict[str, dict]:
    """Every build of this module, by fixture name (the planted ones are defined below)."""
    return {
        "score_mod": {"kernel": "bm25_score.cu", "names": [
            *(f"bm25_score<{m}, {SCORE_T}, {SCORE_P}>" for m in range(5)),
            f"bm25_score<0, {K.SCORE_THREADS}, {K.SCORE_PER_THREAD}>", "scatter_allow_bits", "finalize_dense"]},
        "topk_mod": {"kernel": "topk.cu", "names": [
            f"topk_rows<{TOPK_T}>", f"topk_rows<{K.TOPK_THREADS}>", "composite_keys", "decode_keys"]},
        "seg_mod": {"kernel": "segment_reduce.cu", "names": ["segment_reduce<float>", "segment_reduce<double>"],
                    "defines": {"SEGMENT_REDUCE_BLOCK": 32}},
        "planted": {"kernel": "planted.cu", "names": _PLANTED_NAMES, "source": PLANTED},
        "topk_planted": {"kernel": "topk.cu (planted bugs)", "names": [f"{bug}::topk_rows<{TOPK_T}>" for bug in TOPK_BUGS],
                         "source": "".join(f"namespace {bug} {{\n{topk_variant(bug)}}}\n" for bug in TOPK_BUGS)},
        "asan": {"kernel": "topk.cu + asan_planted.cu", "names": [f"topk_rows<{TOPK_T}>", *ASAN_NAMES],
                 "source": K.load_source("topk.cu") + ASAN_PLANTED, "sanitize": True},
    }


@pytest.fixture(scope="module", autouse=True)
def _prebuild():
    """Compile every library of this module at once (2 cores: about half the time of one by one)."""
    def one(spec):
        try:
            build(**spec, load=False)
        except (HostBuildError, AssertionError):
            pass  # the fixture that needs it reports the error

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        list(ex.map(one, build_specs().values()))


def _load(name: str):
    return build(**build_specs()[name])


@pytest.fixture(scope="module")
def score_mod():
    return _load("score_mod")


@pytest.fixture(scope="module")
def topk_mod():
    return _load("topk_mod")


# =============================================================================
# bm25_score, scatter_allow_bits, finalize_dense
# =============================================================================
def bits_of(rows: list[np.ndarray], n_docs: int) -> np.ndarray:
    """A (len(rows), ceil(N/32)) uint32 bitmap: bit d of row r set for d in rows[r]."""
    W = -(-n_docs // 32)
    out = np.zeros((len(rows), W), U32)
    for r, d in enumerate(rows):
        d = np.asarray(d, np.int64)
        np.bitwise_or.at(out[r], d >> 5, U32(1) << (d & 31).astype(U32))
    return out


def score_inputs(index, params: BM25Params, queries, allow, threads: int, per_thread: int) -> dict:
    """The arguments of bm25_score as its header documents them (pairs, chunk starts, ...)."""
    pw = posting_weights(index, params)
    df = np.diff(index.offsets)
    chunk = threads * per_thread
    pq, pt, pm = [], [], []
    row_const = np.zeros(len(queries), F32)
    for b, q in enumerate(queries):
        terms, mult = np.unique(np.asarray(q, np.int64), return_counts=True)
        row_const[b] = F32((pw.w0[terms] * mult).sum(dtype=F32)) if terms.size else F32(0)
        keep = df[terms] > 0
        pq += [b] * int(keep.sum())
        pt += terms[keep].tolist()
        pm += mult[keep].tolist()
    pair_t = np.array(pt, np.int32)
    chunk_start = np.zeros(len(pt) + 1, np.int64)
    np.cumsum(-(-df[pair_t] // chunk), out=chunk_start[1:])
    allow_row = np.full(len(queries), -1, np.int32)
    lists = []
    for b, a in enumerate(allow or []):
        if a is not None:
            allow_row[b] = len(lists)
            lists.append(np.asarray(a, np.int32))
    return {
        "pair_query": np.array(pq, np.int32), "pair_term": pair_t, "pair_mult": np.array(pm, F32),
        "chunk_start": chunk_start, "idf": pw.idf, "w0": pw.w0.astype(F32), "row_const": row_const,
        "allow_lists": lists, "allow_row": allow_row, "weights": pw.weights,
    }


def run_scoring(mod, index, params, inp, *, threads=SCORE_T, per_thread=SCORE_P, schedule="forward", grid=None,
                seed=0):
    """scatter_allow_bits + bm25_score + finalize_dense: the dense (B, N) rows, and the raw sums and bitmap."""
    N, B = index.n_docs, inp["allow_row"].size
    W = -(-N // 32)
    F = len(inp["allow_lists"])
    allow_bits = np.zeros((max(F, 1), W), U32)
    if F:
        docs = np.concatenate(inp["allow_lists"]).astype(np.int32)
        rows = np.concatenate([np.full(a.size, r, np.int32) for r, a in enumerate(inp["allow_lists"])])
        if docs.size:
            mod.launch("scatter_allow_bits", (3,), (32,), [docs, rows, np.int64(docs.size), allow_bits, np.int32(W)],
                       schedule=schedule, seed=seed)
    scores = np.zeros((B, N), F32)
    touched = np.zeros((B, W), U32)
    n_pairs = inp["pair_term"].size
    n_chunks = int(inp["chunk_start"][-1])
    if n_chunks:
        mod.launch(
            f"bm25_score<{params.code}, {threads}, {per_thread}>", (grid or n_chunks,), (threads,),
            [index.offsets, index.doc_ids, index.tfs, index.doc_lens, inp["pair_query"], inp["pair_term"],
             inp["pair_mult"], inp["chunk_start"], np.int32(n_pairs), inp["idf"], inp["w0"],
             allow_bits, inp["allow_row"], scores, touched, np.int64(N), np.int32(W),
             F32(params.k1), F32(params.b), F32(params.delta), F32(index.avgdl)],
            schedule=schedule, seed=seed,
        )
    raw = scores.copy()
    mod.launch("finalize_dense", (5,), (64,), [scores, touched, inp["row_const"], np.int32(B), np.int64(N),
                                                np.int32(W)], schedule=schedule, seed=seed)
    return scores, raw, touched


@pytest.fixture(scope="module")
def scoring_case():
    """A small index with many ties, queries with the edge cases, and mixed filters."""
    idx = random_index(700, 60, seed=5, heavy_df=400)
    qs = random_queries(60, 7, seed=6, max_terms=6)
    rng = np.random.default_rng(7)
    allow = [None, np.sort(rng.choice(700, 90, replace=False)), None, np.arange(0, 700, 3),
             np.zeros(0, np.int64), None, np.array([699])]
    return idx, qs, allow


@pytest.mark.parametrize("method", METHODS)
def test_bm25_score_equals_numpy_in_chunk_order(score_mod, scoring_case, method):
    """Blocks in chunk order add each document's terms in ascending term order,
    as NumpyScorer does: the dense rows must be equal, bit for bit."""
    idx, qs, allow = scoring_case
    p = BM25Params(method=method)
    ref = NumpyScorer(idx, p)
    inp = score_inputs(idx, p, qs, allow, SCORE_T, SCORE_P)
    for schedule in ("forward", "parallel"):
        dense, _, _ = run_scoring(score_mod, idx, p, inp, schedule=schedule)
        want = ref.score_matrix(qs, allow)
        assert np.array_equal(dense, want), (method, schedule)
        assert np.array_equal(np.signbit(dense), np.signbit(want))


def sums_in_term_order(idx, inp, qs, allow, descending: bool) -> np.ndarray:
    """Dense rows with each document's contributions added in ascending / descending term order (float32)."""
    N = idx.n_docs
    out = np.zeros((len(qs), N), F32)
    hit = np.zeros((len(qs), N), bool)
    for b, q in enumerate(qs):
        terms, mult = np.unique(q, return_counts=True)
        order = range(terms.size - 1, -1, -1) if descending else range(terms.size)
        ok = np.ones(N, bool)
        if allow is not None and allow[b] is not None:
            ok[:] = False
            ok[allow[b]] = True
        for i in order:
            s, e = idx.offsets[terms[i]], idx.offsets[terms[i] + 1]
            d = idx.doc_ids[s:e]
            w = inp["weights"][s:e] if mult[i] == 1 else inp["weights"][s:e] * F32(mult[i])
            out[b, d[ok[d]]] += w[ok[d]]
            hit[b, d[ok[d]]] = True
    return np.where(hit, out + inp["row_const"][:, None], F32(-np.inf))


def test_bm25_score_blocks_in_reverse_add_in_reverse(score_mod, scoring_case):
    """Blocks in reverse chunk order add in descending term order: equal to NumPy summing that way."""
    idx, qs, allow = scoring_case
    for method in ("bm25+", "robertson"):  # negative weights: cancellation
        p = BM25Params(method=method)
        inp = score_inputs(idx, p, qs, allow, SCORE_T, SCORE_P)
        asc = sums_in_term_order(idx, inp, qs, allow, descending=False)
        assert np.array_equal(asc, NumpyScorer(idx, p).score_matrix(qs, allow))  # the reference itself
        dense, _, _ = run_scoring(score_mod, idx, p, inp, schedule="reverse")
        assert np.array_equal(dense, sums_in_term_order(idx, inp, qs, allow, descending=True)), method


def test_bm25_score_any_order_within_rounding(score_mod, scoring_case):
    """Blocks in random order: within float32 rounding of the sum of |contributions|,
    exact for documents with one contributing term, and the same candidates."""
    idx, qs, allow = scoring_case
    p = BM25Params(method="bm25+")
    inp = score_inputs(idx, p, qs, allow, SCORE_T, SCORE_P)
    want = NumpyScorer(idx, p).score_matrix(qs, allow)
    # Per document: number of contributing terms and sum of |contribution|.
    n_terms = np.zeros(want.shape, np.int64)
    mag = np.zeros(want.shape, np.float64)
    for b in range(len(qs)):
        for t, m in zip(*np.unique(qs[b], return_counts=True)):
            s, e = idx.offsets[t], idx.offsets[t + 1]
            d = idx.doc_ids[s:e]
            n_terms[b, d] += 1
            mag[b, d] += np.abs(inp["weights"][s:e].astype(np.float64) * m)
    fin = np.isfinite(want)
    one = fin & (n_terms == 1)
    eps = np.finfo(F32).eps
    tol = (n_terms + 1) * eps * (mag + np.abs(inp["row_const"])[:, None])
    for seed in (1, 2):
        dense, _, _ = run_scoring(score_mod, idx, p, inp, schedule="random", seed=seed)
        assert np.array_equal(np.isfinite(dense), fin)
        assert one.sum() > 100 and np.array_equal(dense[one], want[one])
        err = np.abs(dense[fin].astype(np.float64) - want[fin])
        assert np.all(err <= tol[fin]), float((err / tol[fin]).max())


def test_bm25_score_production_block_size(score_mod):
    """bm25_score<0, 256, 4>, as CupyScorer launches it, with a grid smaller than the chunks (grid stride)."""
    idx = random_index(3000, 40, seed=9, heavy_df=2500)
    qs = [np.array([0, 1, 1, 5]), np.array([1]), np.array([3, 7, 0])]
    p = BM25Params(method="lucene")
    inp = score_inputs(idx, p, qs, None, K.SCORE_THREADS, K.SCORE_PER_THREAD)
    assert inp["chunk_start"][-1] > 3
    dense, _, _ = run_scoring(score_mod, idx, p, inp, threads=K.SCORE_THREADS, per_thread=K.SCORE_PER_THREAD,
                              schedule="parallel", grid=3)
    want = NumpyScorer(idx, p).score_matrix(qs)
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(dense))
    np.testing.assert_allclose(dense[fin], want[fin], rtol=1e-6)


def test_scatter_allow_bits_and_finalize_dense(score_mod):
    rng = np.random.default_rng(3)
    N, F = 1000, 4
    W = -(-N // 32)
    lists = [np.sort(rng.choice(N, n, replace=False)) for n in (0, 1, 333, N)]
    lists[1] = np.array([N - 1])
    docs = np.concatenate(lists).astype(np.int32)
    rows = np.concatenate([np.full(a.size, r, np.int32) for r, a in enumerate(lists)])
    perm = rng.permutation(docs.size)  # any order, duplicates allowed
    docs, rows = np.concatenate([docs[perm], docs[:50]]), np.concatenate([rows[perm], rows[:50]])
    for schedule in ("parallel", "reverse"):
        bits = np.zeros((F, W), U32)
        score_mod.launch("scatter_allow_bits", (4,), (64,), [docs, rows, np.int64(docs.size), bits, np.int32(W)],
                         schedule=schedule)
        assert np.array_equal(bits, bits_of(lists, N))
    # finalize_dense: score + row constant where touched, -inf elsewhere.
    B = 3
    scores = rng.standard_normal((B, N)).astype(F32)
    scores[0, :5] = [-0.0, 0.0, 1e-30, np.inf, -1.0]
    touched = bits_of([rng.choice(N, 400, replace=False), np.arange(5), np.arange(0)], N)
    row_const = np.array([0.0, 0.75, -3.5], F32)
    hit = np.zeros((B, N), bool)
    for r in range(B):
        d = np.arange(N)
        hit[r] = (touched[r, d >> 5] >> (d & 31).astype(U32)) & 1
    want = np.where(hit, scores + row_const[:, None], F32(-np.inf))
    out = scores.copy()
    score_mod.launch("finalize_dense", (7,), (32,), [out, touched, row_const, np.int32(B), np.int64(N), np.int32(W)])
    assert np.array_equal(out.view(U32), want.view(U32))


# =============================================================================
# topk_rows, composite_keys, decode_keys
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


def topk_case(rng, N: int):
    """(B, N) raw sums, bitmap, row constants, and the dense rows the reference sees."""
    rows = adversarial_rows(rng, N)
    dense = np.stack(list(rows.values()))
    B = dense.shape[0]
    row_const = np.zeros(B, F32)
    row_const[1], row_const[4] = F32(0.5), F32(-1.25)  # added by the kernel to every candidate
    cand = np.isfinite(dense)
    raw = np.where(cand, dense, F32(0)).astype(F32)
    ref_rows = np.where(cand, raw + row_const[:, None], F32(-np.inf)).astype(F32)
    touched = bits_of([np.flatnonzero(c) for c in cand], N)
    return list(rows), raw, touched, row_const, ref_rows


def run_topk(mod, raw, touched, row_const, k, *, threads=TOPK_T, schedule="forward", seed=0, name="topk_rows"):
    B, N = raw.shape
    kpad = 1 << max(0, k - 1).bit_length()
    ids = np.full((B, k), 12345, np.int64)  # garbage: every slot must be written
    out = np.full((B, k), F32(7.0))
    mod.launch(f"{name}<{threads}>", (B,), (threads,),
               [raw, touched, row_const, np.int64(N), np.int32(touched.shape[1]), np.int32(max(1, (N - 1).bit_length())),
                np.int32(k), np.int32(kpad), ids, out], shared=8 * kpad, schedule=schedule, seed=seed)
    return ids, out


def assert_topk_equal(names, ids, out, ref, k, label=""):
    for r, name in enumerate(names):
        assert np.array_equal(ids[r], ref.ids[r]), (label, name, k, ids[r][:10], ref.ids[r][:10])
        assert np.array_equal(out[r].view(U32), ref.scores[r].view(U32)), (label, name, k)


@pytest.mark.parametrize("k", [1, 3, 40, 200, 700, 2000])
def test_topk_rows_equals_tie_rule(topk_mod, k):
    """Exact ids and scores (bits) of topk_from_dense on adversarial rows, one block per row."""
    rng = np.random.default_rng(k)
    names, raw, touched, row_const, ref_rows = topk_case(rng, 1500)
    ref = topk_from_dense(ref_rows, k)
    for schedule in ("forward", "reverse", "random", "parallel"):
        if k >= 700 and schedule == "random":
            continue  # the long bitonic sorts: forward, reverse and parallel suffice
        ids, out = run_topk(topk_mod, raw, touched, row_const, k, schedule=schedule, seed=k)
        assert_topk_equal(names, ids, out, ref, k, schedule)


def test_topk_rows_candidates_around_k(topk_mod):
    """k = C - 1, C, C + 1 candidates, and k at the shared-memory limit (kpad = 4096)."""
    rng = np.random.default_rng(11)
    N = 5000
    dense = np.full((1, N), -np.inf, F32)
    idx = rng.choice(N, 4096, replace=False)
    dense[0, idx] = rng.choice(np.array([1.0, 2.0, -0.0, 0.0], F32), idx.size)
    raw = np.where(np.isfinite(dense), dense, F32(0))
    touched = bits_of([idx], N)
    zero = np.zeros(1, F32)
    for k in (4095, 4096, 2049, 2048):
        ids, out = run_topk(topk_mod, raw, touched, zero, k, schedule="parallel")
        ref = topk_from_dense(dense, k)
        assert np.array_equal(ids, ref.ids) and np.array_equal(out, ref.scores), k
    small = np.full((1, N), -np.inf, F32)
    small[0, [3, 10, 4999]] = [1.0, 1.0, 2.0]
    raw = np.where(np.isfinite(small), small, F32(0))
    tb = bits_of([np.array([3, 10, 4999])], N)
    for k in (2, 3, 4, 100):
        ids, out = run_topk(topk_mod, raw, tb, zero, k, schedule="reverse")
        ref = topk_from_dense(small, k)
        assert np.array_equal(ids, ref.ids) and np.array_equal(out, ref.scores), k


def test_topk_rows_production_block_size(topk_mod):
    """topk_rows<512>, as CupyScorer launches it."""
    rng = np.random.default_rng(5)
    names, raw, touched, row_const, ref_rows = topk_case(rng, 1200)
    sel = [1, 2, 3]  # three_levels, low_mantissa, signed zeros
    k = 100
    ids, out = run_topk(topk_mod, raw[sel], touched[sel], row_const[sel], k, threads=K.TOPK_THREADS,
                        schedule="parallel")
    assert_topk_equal([names[i] for i in sel], ids, out, topk_from_dense(ref_rows[sel], k), k)


def test_composite_keys_sort_to_the_tie_rule_and_decode(topk_mod):
    """Sorting composite_keys descending gives topk_from_dense's order; decode_keys inverts them."""
    rng = np.random.default_rng(8)
    names, raw, touched, row_const, ref_rows = topk_case(rng, 900)
    B, N = raw.shape
    keys = np.full((B, N), 99, np.uint64)
    topk_mod.launch("composite_keys", (6,), (64,), [raw, touched, row_const, np.int32(B), np.int64(N),
                                                     np.int32(touched.shape[1]), keys], schedule="reverse")
    assert np.array_equal(keys == 0, ~np.isfinite(ref_rows)), "key 0 marks exactly the non-candidates"
    assert all(np.unique(keys[r][keys[r] > 0]).size == np.count_nonzero(keys[r]) for r in range(B))
    order = np.argsort(keys, axis=1, kind="stable")[:, ::-1]
    srt = np.ascontiguousarray(np.take_along_axis(keys, order, axis=1))
    ids = np.zeros((B, N), np.int64)
    out = np.zeros((B, N), F32)
    topk_mod.launch("decode_keys", (5,), (32,), [srt, np.int64(B * N), ids, out], schedule="parallel")
    ref = topk_from_dense(ref_rows, N)
    assert_topk_equal(names, ids, out, ref, N)


# =============================================================================
# segment_reduce
# =============================================================================
@pytest.fixture(scope="module")
def seg_mod():
    return _load("seg_mod")


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
"""

_PLANTED_NAMES = ["reverse_block<64, true>", "reverse_block<64, false>", "twice<false>", "twice<true>",
                  "uninit_sum", "divergent_sync", "partial_shuffle", "warp_sum", "spin", "chain"]


@pytest.fixture(scope="module")
def planted():
    return _load("planted")


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
    with pytest.raises(KernelError, match="no progress for 1 s"):
        planted.launch("spin", (1,), (32,), [np.zeros(1, np.int32)], schedule="parallel", timeout_s=1.0)


def test_block_order_dependence_is_caught(planted):
    results = set()
    for schedule in ("forward", "reverse"):
        d = np.ones(8, np.int32)
        planted.launch("chain", (8,), (32,), [d], schedule=schedule)
        results.add(tuple(d))
    assert len(results) == 2, "forward and reverse block orders must disagree on an order-dependent kernel"


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
        topk_mod.launch("topk_rows<128>", (1,), (128,), [])


# -----------------------------------------------------------------------------
# Bugs planted in the real topk kernel
# -----------------------------------------------------------------------------
#: Planted bugs: (text of topk.cu, its replacement).
TOPK_BUGS = {
    # No barrier between the gather into shared memory and the bitonic sort.
    "nosync": ("    __syncthreads();\n\n    // Bitonic sort, descending.", "\n    // Bitonic sort, descending."),
    # The radix schedule topk.cu had before review: pass 2 covered key bits 40..31, not 41..32.
    "oldradix": ("gpuir::radix_digit(pass, doc_bits, &shift, &width);",
                 ("gpuir::radix_digit(pass, doc_bits, &shift, &width);\n"
                  "        if (pass < 3) { shift = 53 - 11 * pass; width = pass < 2 ? 11 : 10; }")),
}


def topk_variant(bug: str) -> str:
    """topk.cu with a planted bug (one build holds every variant, each in a namespace named after its bug)."""
    old, new = TOPK_BUGS[bug]
    src = K.load_source("topk.cu")
    assert src.count(old) == 1, f"the planted change {bug!r} no longer applies to topk.cu: update TOPK_BUGS"
    return src.replace(old, new)


def test_planted_bugs_in_topk_are_caught():
    """Both bugs must fail the exact comparison with topk_from_dense."""
    rng = np.random.default_rng(21)
    names, raw, touched, row_const, ref_rows = topk_case(rng, 1500)
    k = 40
    ref = topk_from_dense(ref_rows, k)
    mod = _load("topk_planted")
    caught = []
    for schedule in ("forward", "reverse"):
        ids, out = run_topk(mod, raw, touched, row_const, k, schedule=schedule, name="nosync::topk_rows")
        caught.append(not (np.array_equal(ids, ref.ids) and np.array_equal(out, ref.scores)))
    assert any(caught), "a missing __syncthreads before the sort went unnoticed"
    ids, out = run_topk(mod, raw, touched, row_const, k, name="oldradix::topk_rows")
    bad = [n for r, n in enumerate(names) if not np.array_equal(ids[r], ref.ids[r])]
    assert "low_mantissa" in bad, bad


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
from cuda_host import build
from gpuir.backends.base import topk_from_dense
import test_kernels_host as T
mod = build(**T.build_specs()["asan"])
"""


@pytest.fixture(scope="module")
def asan_ok():
    if sanitizer_env() is None:
        pytest.skip("the compiler has no AddressSanitizer runtime")


def test_asan_passes_topk_and_catches_a_read_past_the_end(asan_ok):
    r = run_sanitized(_ASAN_PRELUDE + """
names, raw, touched, row_const, ref_rows = T.topk_case(np.random.default_rng(4), 700)
for k in (1, 9, 300):
    ids, out = T.run_topk(mod, raw, touched, row_const, k, schedule="parallel")
    T.assert_topk_equal(names, ids, out, topk_from_dense(ref_rows, k), k)
print("REAL KERNEL OK", flush=True)
x = np.arange(64, dtype=np.float32)
mod.launch("read_past_end", (2,), (32,), [x, np.zeros(64, np.float32), 64])
print("NOT CAUGHT", flush=True)
""")
    assert "REAL KERNEL OK" in r.stdout, r.stdout + r.stderr[-3000:]
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
