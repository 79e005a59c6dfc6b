"""The GPU backend's logic, checked without a GPU.

Nothing here launches a kernel on a device. Instead:

* **Native helpers on the host.** The key encoding, the radix digit schedule,
  ``scaled`` and ``lower_bound`` of ``kernels/common.cuh`` are
  ``__host__ __device__``: a small host program compiled with nvcc runs the
  real source on adversarial inputs; results must equal the NumPy model.
* **The kernel model** (:mod:`gpuir.backends.kernel_model`: tiles, one term per
  round, float32 tile bounds, the running threshold, candidate emission with
  overflow, haystack scoring, radix select) drives ``CupyScorer``'s real host
  code through a fake ``cupy``; results must equal ``NumpyScorer`` BIT FOR BIT
  on adversarial cases: ties at the k-th place, k > candidates, k = 1, empty and
  out-of-vocabulary queries, repeated terms, every BM25 variant, filters, many
  tiles and query groups, several block orders, overflow reruns, the haystack
  path, k > 4096, chunking and out-of-memory retries, concurrent callers.
* **The host pieces** (vectorised batch prep, NumPy-exact row constants,
  allow-list checks, the block-max directory, the path choice) against
  brute-force references.
* **Tests that can fail**: a threshold one ulp above the k-th score, or terms
  added in the wrong order, must change results -- the harness can tell.
"""

from __future__ import annotations

import itertools
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir.backends import cupy_backend as cb
from gpuir.backends import kernel_model as km
from gpuir.backends import kernels as K
from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import METHODS, BM25Params
from gpuir.index.csr import CSRIndex

U32, U64, F32 = np.uint32, np.uint64, np.float32


# =============================================================================
# Keys and the digit schedule
# =============================================================================
def test_digit_schedule_covers_every_varying_bit_once():
    for doc_bits in range(1, 32):
        seen = np.zeros(64, int)
        for p in range(km.radix_passes(doc_bits)):
            s, w = km.radix_digit(p, doc_bits)
            assert 1 <= w <= km.RADIX_BITS and s >= 0
            seen[s:s + w] += 1
        want = np.zeros(64, int)
        want[32:] = 1
        want[:doc_bits] = 1
        assert seen.tolist() == want.tolist(), doc_bits


def _adversarial_scores(rng) -> np.ndarray:
    base = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-45, -1e-45, 1.1754944e-38,
            np.finfo(F32).max, -np.finfo(F32).max, 0.5, 2.0, 7.25]
    ulps = np.arange(-1024, 1025, dtype=np.int32)
    one_ulps = (np.array(F32(1.0)).view(np.int32) + ulps).view(F32)
    neg_ulps = (np.array(F32(-3.0)).view(np.int32) + ulps).view(F32)
    rand = rng.standard_normal(2000).astype(F32) * F32(10)
    return np.concatenate([np.array(base, F32), one_ulps, neg_ulps, rand, np.repeat(np.array([0.0, -0.0, 4.5], F32), 50)])


def test_key_order_is_the_tie_rule_and_decodes_exactly():
    rng = np.random.default_rng(0)
    s = _adversarial_scores(rng)
    d = rng.permutation(np.arange(s.size, dtype=np.int64) * 977 % (2**31 - 1))
    keys = km.composite_key(s, d)
    assert np.all(keys > 0) and np.unique(keys).size == keys.size
    assert np.array_equal(np.argsort(keys)[::-1], np.lexsort((d, -s.astype(np.float64))))
    assert np.array_equal(km.key_doc(keys), d)
    dec = km.key_score(keys)
    assert np.array_equal(dec, s) and not np.signbit(dec[s == 0]).any()
    # -0.0 and +0.0 tie: the lower document number wins; every score key > 0 (0 = no candidate).
    assert km.composite_key(np.array([-0.0, 0.0], F32), np.array([3, 9]))[0] > km.composite_key(
        np.array([0.0], F32), np.array([9]))[0]
    assert km.float_to_ordered(np.array([-np.inf], F32))[0] > 0


_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "common.cuh"
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    FILE* o = fopen(argv[2], "wb");
    long long n;
    if (fread(&n, 8, 1, f) != 1) return 2;
    float* s = (float*)malloc(4 * n);
    long long* d = (long long*)malloc(8 * n);
    float* m = (float*)malloc(4 * n);
    if (fread(s, 4, n, f) != (size_t)n || fread(d, 8, n, f) != (size_t)n || fread(m, 4, n, f) != (size_t)n) return 2;
    for (long long i = 0; i < n; ++i) {
        unsigned long long key = gpuir::composite_key(s[i], d[i]);
        long long dd = gpuir::key_doc(key);
        float sc = gpuir::key_score(key);
        unsigned int ok = gpuir::float_to_ordered(s[i]);
        float w = gpuir::scaled(s[i], m[i]);
        fwrite(&key, 8, 1, o); fwrite(&dd, 8, 1, o); fwrite(&sc, 4, 1, o); fwrite(&ok, 4, 1, o); fwrite(&w, 4, 1, o);
    }
    for (int db = 1; db <= 31; ++db) {
        for (int p = 0; p < gpuir::radix_passes(db); ++p) {
            int sh, w;
            gpuir::radix_digit(p, db, &sh, &w);
            int rec[4] = {db, p, sh, w};
            fwrite(rec, 4, 4, o);
        }
    }
    int sorted_[9] = {1, 3, 3, 3, 7, 9, 9, 12, 40};
    for (int x = 0; x <= 41; ++x) {
        long long pos = gpuir::lower_bound(sorted_, 0ll, 9ll, x);
        fwrite(&pos, 8, 1, o);
    }
    fclose(o);
    return 0;
}
"""


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    nvcc = K._nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed: cannot compile the host test program")
    d = tmp_path_factory.mktemp("harness")
    (d / "h.cu").write_text(_HARNESS)
    r = subprocess.run([nvcc, "-std=c++17", "-O2", "-Xcompiler", "-ffp-contract=off", "-I", str(K.KERNEL_DIR),
                        "-o", str(d / "h"), str(d / "h.cu")], capture_output=True, text=True, check=False)
    if r.returncode != 0 and "unsupported" in (r.stderr + r.stdout).lower():
        pytest.skip(f"nvcc cannot build host code here: {r.stderr[:300]}")
    assert r.returncode == 0, r.stderr + r.stdout
    return d / "h"


def test_native_helpers_match_the_model(native, tmp_path):
    rng = np.random.default_rng(1)
    s = _adversarial_scores(rng)
    d = rng.integers(0, 2**31 - 1, s.size).astype(np.int64)
    d[:3] = [0, 2**31 - 2, 5_000_000]
    m = rng.choice(np.array([1, 1, 2, 3, 7], F32), s.size)
    inp = tmp_path / "in.bin"
    inp.write_bytes(np.int64(s.size).tobytes() + s.tobytes() + d.tobytes() + m.tobytes())
    out = tmp_path / "out.bin"
    subprocess.run([str(native), str(inp), str(out)], check=True)
    raw = out.read_bytes()
    rec = np.frombuffer(raw[: 28 * s.size], dtype=[("key", "<u8"), ("doc", "<i8"), ("score", "<f4"),
                                                   ("ord", "<u4"), ("w", "<f4")])
    assert np.array_equal(rec["key"], km.composite_key(s, d))
    assert np.array_equal(rec["doc"], d)
    assert np.array_equal(rec["score"].view(U32), km.key_score(km.composite_key(s, d)).view(U32))
    assert np.array_equal(rec["ord"], km.float_to_ordered(s))
    want_w = np.array([km.scaled(F32(x), F32(y)) for x, y in zip(s, m)], F32)
    same = (rec["w"].view(U32) == want_w.view(U32)) | (np.isnan(rec["w"]) & np.isnan(want_w))
    assert same.all()
    off = 28 * s.size
    n_sched = sum(km.radix_passes(db) for db in range(1, 32))
    sched = np.frombuffer(raw[off: off + 16 * n_sched], dtype=np.int32).reshape(-1, 4)
    for db, p, sh, w in sched.tolist():
        assert (sh, w) == km.radix_digit(p, db), (db, p)
    lb = np.frombuffer(raw[off + 16 * n_sched:], dtype=np.int64)
    arr = np.array([1, 3, 3, 3, 7, 9, 9, 12, 40])
    assert lb.tolist() == np.searchsorted(arr, np.arange(42), "left").tolist()


# =============================================================================
# The final selection
# =============================================================================
def _select_matches_reference(row: np.ndarray, k: int, theta: int = 0) -> bool:
    cand = np.flatnonzero(row > -np.inf)
    keys = km.composite_key(row[cand], cand)
    ids, sc = km.model_select_row(keys, theta, k, max(1, (row.size - 1).bit_length()))
    ref = topk_from_dense(row[None, :], k)
    return np.array_equal(ids, ref.ids[0]) and np.array_equal(sc, ref.scores[0])


def _adversarial_rows(rng, N=6000):
    rows = {}
    r = np.full(N, -np.inf, F32)
    r[rng.choice(N, 3000, replace=False)] = F32(2.5)
    rows["all_tied"] = r
    r = np.full(N, -np.inf, F32)
    idx = rng.choice(N, 4000, replace=False)
    r[idx] = rng.choice(np.array([1.0, 2.0, 3.0], F32), idx.size)
    rows["three_levels"] = r
    r = np.full(N, -np.inf, F32)  # scores 1.0 + j ulp: they differ only in key bits 32..42
    idx = rng.choice(N, 3000, replace=False)
    r[idx] = (np.array(F32(1.0)).view(np.int32) + rng.integers(0, 2048, idx.size).astype(np.int32)).view(F32)
    rows["low_mantissa"] = r
    r = np.full(N, -np.inf, F32)
    idx = rng.choice(N, 2500, replace=False)
    r[idx] = rng.choice(np.array([-0.0, 0.0, -1.5, -1e-30, 1e-30], F32), idx.size)
    rows["signed_zero_negative"] = r
    r = np.full(N, -np.inf, F32)
    idx = rng.choice(N, 5000, replace=False)
    r[idx] = (rng.standard_normal(idx.size) * 3).astype(F32)
    rows["random"] = r
    rows["none"] = np.full(N, -np.inf, F32)
    r = np.full(N, -np.inf, F32)
    r[[0, N - 1]] = F32(1.0)
    rows["two"] = r
    return rows


@pytest.mark.parametrize("k", [1, 2, 7, 100, 2049, 4096])
def test_select_model_is_the_tie_rule(k):
    rng = np.random.default_rng(k)
    for name, row in _adversarial_rows(rng).items():
        assert _select_matches_reference(row, k), (name, k)
        # Any threshold at or below the k-th best score changes nothing.
        ref = topk_from_dense(row[None, :], k)
        kth = ref.scores[0][ref.ids[0] >= 0]
        if kth.size:
            assert _select_matches_reference(row, k, int(km.float_to_ordered(kth[-1])[0])), (name, k)


# =============================================================================
# Host pieces
# =============================================================================
def test_row_sums_equal_numpys_own_summation():
    rng = np.random.default_rng(5)
    lens = np.concatenate([np.arange(0, 140), [200, 256, 257, 300, 1000]])
    vals = (rng.random(int(lens.sum())) * rng.choice([1e-3, 1, 1e3], int(lens.sum()))).astype(F32)
    off = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    got = cb.numpy_row_sums(vals, off)
    want = np.array([vals[a:b].sum(dtype=F32) for a, b in itertools.pairwise(off)], F32)
    assert np.array_equal(got.view(U32), want.view(U32))
    # A plain left-to-right sum differs from NumPy's pairwise order for some row: the emulation matters.
    seq = np.array([np.add.accumulate(vals[a:b], dtype=F32)[-1] if b > a else F32(0)
                    for a, b in itertools.pairwise(off)], F32)
    assert not np.array_equal(seq, want)


def test_row_constants_equal_the_reference_expression():
    from gpuir.backends.base import CollectionStats, weigh_queries

    idx = random_index(300, 400, seed=3)
    p = BM25Params(method="bm25+")
    ref = NumpyScorer(idx, p)
    rng = np.random.default_rng(4)
    qs = [rng.integers(0, 400, rng.integers(0, 260)).astype(np.int64) for _ in range(60)]
    wq = weigh_queries(qs, CollectionStats.of(idx), p)
    f, ao, ad = cb.check_allow(None, len(qs), idx.n_docs)
    b = cb.prepare_batch(wq, f, ao, ad, df=idx.df.astype(np.int64), n_tiles=5, tile=64, postings_per_doc=3.0,
                         haystack="never")
    for i, q in enumerate(qs):
        terms, mult = np.unique(q, return_counts=True)
        keep = idx.df[terms] > 0
        if not keep.any():
            assert b.row_const[i] == 0
            continue
        want = np.float32((ref.w0[terms[keep]] * mult[keep]).sum(dtype=np.float32))
        assert b.row_const[i].view(U32) == want.view(U32), i
        got = b.qt_term[b.qt_off[i]:b.qt_off[i + 1]]
        assert got.tolist() == terms[keep].tolist()
        assert b.qt_mult[b.qt_off[i]:b.qt_off[i + 1]].tolist() == mult[keep].tolist()
        assert np.array_equal(b.qt_idf[b.qt_off[i]:b.qt_off[i + 1]], ref.idf[terms[keep]])


def test_tile_directory_matches_brute_force():
    """Impacts (non-dominated (tf, length) pairs) per (long term, tile) and per light term, against a loop."""
    idx = random_index(3001, 60, seed=9)
    tile, n_tiles = 64, -(-3001 // 64)
    d = cb.build_directory(idx.offsets, idx.doc_ids, idx.tfs, idx.doc_lens, tile, n_tiles, 100)
    heavy = np.flatnonzero(idx.df >= 100)
    dir_row = d["dir_row"]
    assert heavy.size > 1 and (dir_row >= 0).sum() == heavy.size
    st = d["dir_start"].reshape(heavy.size, n_tiles + 1)

    def impacts(tf, dl):
        pairs = set(zip(np.minimum(tf, 0xFFFF).tolist(), np.minimum(dl, 0xFFFF).tolist()))
        return sorted((t, x) for t, x in pairs if not any((t2 >= t and x2 <= x) and (t2, x2) != (t, x)
                                                          for t2, x2 in pairs))

    def got(off, imp, b):
        return sorted((int(p) & 0xFFFF, int(p) >> 16) for p in imp[off[b]:off[b + 1]])

    for t in range(idx.n_terms):
        s, e = idx.offsets[t], idx.offsets[t + 1]
        want = [] if dir_row[t] >= 0 else impacts(idx.tfs[s:e], idx.doc_lens[idx.doc_ids[s:e]])
        assert got(d["term_imp_off"], d["term_imp"], t) == want, t
    for r, t in enumerate(heavy):
        assert dir_row[t] == r
        s, e = idx.offsets[t], idx.offsets[t + 1]
        dd = idx.doc_ids[s:e]
        for j in range(n_tiles):
            in_tile = (dd >= j * tile) & (dd < (j + 1) * tile)
            assert st[r, j] == np.searchsorted(dd, j * tile)
            want = impacts(idx.tfs[s:e][in_tile], idx.doc_lens[dd[in_tile]])
            assert got(d["dir_imp_off"], d["dir_imp"], r * n_tiles + j) == want, (t, j)
        assert st[r, n_tiles] == e - s
    assert cb.pack_summaries(np.array([0, 70000, 3]), np.array([9, 5, 10**6])).tolist() == [
        0, 0xFFFF | (5 << 16), 3 | (0xFFFF << 16)]


def test_allow_list_checks():
    f, off, docs = cb.check_allow([None, np.array([5, 1, 5, 3]), np.zeros(0, np.int64)], 3, 10)
    assert f.tolist() == [False, True, True]
    assert off.tolist() == [0, 0, 3, 3] and docs.tolist() == [1, 3, 5]  # sorted, de-duplicated
    with pytest.raises(ValueError, match=r"query 1 .*outside \[0, 10\)"):
        cb.check_allow([None, np.array([3, 10])], 2, 10)
    with pytest.raises(ValueError, match="query 0"):
        cb.check_allow([np.array([-1])], 1, 10)
    with pytest.raises(TypeError, match="normalize_filters"):
        cb.check_allow([np.ones(10, bool)], 1, 10)
    with pytest.raises(ValueError, match="one per query"):
        cb.check_allow([None], 2, 10)
    with pytest.raises(TypeError, match="query 1"):
        cb.check_queries([np.array([1]), np.array([0.5])], 10)
    with pytest.raises(ValueError, match=r"query 2 .*\[0, 10\)"):
        cb.check_queries([np.array([1]), np.zeros(0), np.array([3, 10])], 10)


def test_path_choice():
    B = 4
    has = np.ones(B, bool)
    filt = np.array([True, True, True, False])
    allow_len = np.array([500, 500, 0, 0])
    touched = np.array([500, 1, 0, 0])  # scattered haystack; a contiguous tenant
    nt, sumdf = np.full(B, 5), np.full(B, 100_000)
    p = cb.choose_paths(has, filt, allow_len, touched, nt, sumdf, 2000, 4096, 30.0, "auto")
    assert p.tolist() == [cb.PATH_HAYSTACK, cb.PATH_TILES, cb.PATH_NONE, cb.PATH_TILES]
    assert cb.choose_paths(has, filt, allow_len, touched, nt, sumdf, 2000, 4096, 30.0, "never")[0] == cb.PATH_TILES
    assert cb.choose_paths(has, filt, allow_len, touched, nt, sumdf, 2000, 4096, 30.0, "always")[1] == \
        cb.PATH_HAYSTACK


# =============================================================================
# The scorer's host code end to end on the kernel model
# =============================================================================
@pytest.fixture
def model_device():
    """Install the fake cupy with small tiles (32 threads, 64 documents); yields a scorer factory."""
    with km.fake_cupy_installed(seed=0) as cp, km.small_tiles(32, 64):
        def make(index, method="lucene", **kw):
            kw.setdefault("graphs", False)  # the ordinary path; test_small_batches_run_as_one_captured_graph: graphs
            return cb.CupyScorer(index, BM25Params(method=method), **kw)

        make.cp = cp
        yield make


def _exact(a, b, where=""):
    assert a.ids.shape == b.ids.shape and b.ids.dtype == np.int64 and b.scores.dtype == np.float32
    bad = [i for i in range(a.ids.shape[0])
           if not (np.array_equal(a.ids[i], b.ids[i]) and np.array_equal(a.scores[i].view(U32) & U32(0x7FFFFFFF),
                                                                       b.scores[i].view(U32) & U32(0x7FFFFFFF)))]
    assert not bad, f"{where}: rows {bad[:5]} differ, e.g. {a.ids[bad[0]][:6]} vs {b.ids[bad[0]][:6]}"


def _with_empty_terms(idx: CSRIndex) -> CSRIndex:
    """The index plus two vocabulary terms without postings (out of this index's documents)."""
    off = np.concatenate([idx.offsets, [idx.offsets[-1]] * 2]).astype(np.int64)
    return CSRIndex(offsets=off, doc_ids=idx.doc_ids, tfs=idx.tfs, doc_lens=idx.doc_lens,
                    vocab=[*idx.vocab, "zz0", "zz1"], ids=idx.ids)


def _tied_index(N: int) -> CSRIndex:
    """Term 0 in every document with tf 1 and equal lengths: every score ties."""
    return CSRIndex(offsets=np.array([0, N, N + 3], np.int64),
                    doc_ids=np.concatenate([np.arange(N), [5, N // 2, N - 1]]).astype(np.int32),
                    tfs=np.ones(N + 3, np.int32), doc_lens=np.full(N, 4, np.int32),
                    vocab=["a", "b"], ids=[str(i) for i in range(N)])


N_DOCS, N_TERMS = 2501, 83


@pytest.fixture(scope="module")
def corpus():
    idx = _with_empty_terms(random_index(N_DOCS, N_TERMS - 2, seed=11, heavy_df=2500))
    qs = random_queries(N_TERMS - 2, 12, seed=12, max_terms=6)
    qs += [np.array([N_TERMS - 1, 3], np.int64), np.array([N_TERMS - 2], np.int64),  # out of this index
           np.array([2, 2, 2, 5, 9, 2], np.int64), np.arange(0, 40, dtype=np.int64)]  # repeats, 40 terms
    rng = np.random.default_rng(13)
    allow = [None, np.zeros(0, np.int64), np.sort(rng.choice(N_DOCS, 40, replace=False)), None,
             np.arange(0, N_DOCS, 3), np.array([N_DOCS - 1]), None, np.arange(N_DOCS), np.arange(700, 760),
             np.sort(rng.choice(N_DOCS, 400, replace=False)), None, np.arange(5), None, None, None, None]
    return idx, qs, allow


@pytest.mark.parametrize("method", METHODS)
def test_model_equals_reference_bit_for_bit(model_device, corpus, method):
    idx, qs, allow = corpus
    ref, gpu = NumpyScorer(idx, BM25Params(method=method)), model_device(idx, method)
    assert gpu.n_tiles == 40 and (np.asarray(gpu.d_dir_row) >= 0).any() and (np.asarray(gpu.d_dir_row) < 0).any()
    for k in (1, 10, 300):
        _exact(ref.search(qs, k), gpu.search(qs, k), f"{method} k={k}")
        res = gpu.search(qs, k, allow)
        _exact(ref.search(qs, k, allow), res, f"{method} k={k} filtered")
        assert res.meta["haystack_rows"] >= 1  # the scattered allow-lists went to the haystack path
    assert np.array_equal(ref.score_matrix(qs, allow), gpu.score_matrix(qs, allow))
    names = {n.split("<")[0] for n, *_ in model_device.cp.launches}
    assert names >= {"sub_plan", "sub_score", "haystack_score", "select_topk", "tile_dense"}


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_any_block_order_gives_the_same_results(corpus, seed):
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params())
    with km.fake_cupy_installed(seed=seed, sm_count=1), km.small_tiles(32, 64):
        gpu = cb.CupyScorer(idx, BM25Params(), haystack="never")
        for k in (1, 5, 64):
            _exact(ref.search(qs, k, allow), gpu.search(qs, k, allow), f"seed={seed} k={k}")


def test_collection_stats_weight_a_segment_like_numpy(model_device, corpus):
    """stats= (a segment of a larger collection): the GPU scorer adds the very same weights as NumPy."""
    from gpuir.backends.base import CollectionStats

    idx, qs, allow = corpus
    stats = CollectionStats(n_docs=idx.n_docs + 777, df=idx.df.astype(np.int64) + 3, avgdl=idx.avgdl * 1.25)
    for method in ("atire", "bm25+"):
        p = BM25Params(method=method)
        ref = NumpyScorer(idx, p, stats=stats)
        gpu = cb.CupyScorer(idx, p, stats=stats)
        _exact(ref.search(qs, 10, allow), gpu.search(qs, 10, allow), method)
        assert not np.array_equal(NumpyScorer(idx, p).search(qs, 10).scores, ref.search(qs, 10).scores)
    with pytest.raises(ValueError, match=r"df must lie in \[0, N=1\]"):
        cb.CupyScorer(idx, BM25Params(), stats=CollectionStats(1, idx.df.astype(np.int64), 1.0))


def test_ties_at_the_kth_place_across_tiles(model_device):
    idx = _tied_index(3000)
    ref, gpu = NumpyScorer(idx, BM25Params()), model_device(idx)
    qs = [np.array([0]), np.array([0, 1]), np.array([1, 0, 0])]
    for k in (1, 2, 3, 64, 65, 3000, 3001):
        res = gpu.search(qs, k)
        _exact(ref.search(qs, k), res, f"k={k}")
    assert res.ids[0, 0] == 0  # all tied: the lowest document number first


def test_query_groups_overflow_reruns_and_k_beyond_matches(model_device, corpus, monkeypatch):
    idx, qs, allow = corpus
    ref, gpu = NumpyScorer(idx, BM25Params(method="bm25l")), model_device(idx, "bm25l", haystack="never")
    monkeypatch.setattr(cb, "_MAX_GRID_Y", 3)  # several rows per block (query groups)
    real = cb.candidate_slots
    monkeypatch.setattr(cb, "candidate_slots", lambda *a, **kw: np.minimum(real(*a, **kw), 5))  # force overflows
    for k in (1, 4, 2600):
        res = gpu.search(qs, k, allow)
        _exact(ref.search(qs, k, allow), res, f"k={k}")
    assert res.meta["overflow_rows"] > 0


def test_segmented_selection_for_small_batches(corpus):
    """Fewer rows than SMs: each row's candidates are split over several blocks, then merged, exactly."""
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params(method="bm25l"))
    with km.fake_cupy_installed(seed=0, sm_count=64) as cp, km.small_tiles(32, 64):
        gpu = cb.CupyScorer(idx, BM25Params(method="bm25l"), haystack="never")
        for i in (1, 3, 7, 12, 15):
            for k in (1, 10, 100):
                _exact(ref.search(qs[i:i + 1], k, allow[i:i + 1]), gpu.search(qs[i:i + 1], k, allow[i:i + 1]),
                       f"query {i} k={k}")
        stage1 = [g for n, g, *_ in cp.launches if n.startswith("select_topk") and g[0] > 1]
        assert stage1, "no search used the two-stage selection"


def test_large_k_sort_path(model_device):
    idx = random_index(5003, 60, seed=21, heavy_df=4000)
    ref, gpu = NumpyScorer(idx, BM25Params(method="bm25+")), model_device(idx, "bm25+")
    qs = random_queries(60, 5, seed=22, max_terms=4)
    for k in (4096, 4097, 6000):  # the shared-memory limit, then the sort path (k > N too)
        _exact(ref.search(qs, k), gpu.search(qs, k), f"k={k}")
    assert any(n.startswith("pack_candidates") for n, *_ in model_device.cp.launches)


@pytest.mark.parametrize("mode", ["never", "always"])
def test_haystack_modes(model_device, corpus, mode):
    idx, qs, allow = corpus
    ref, gpu = NumpyScorer(idx, BM25Params(method="atire")), model_device(idx, "atire", haystack=mode)
    res = gpu.search(qs, 10, allow)
    _exact(ref.search(qs, 10, allow), res, mode)
    n_filtered_live = sum(1 for q, a in zip(qs, allow) if a is not None and a.size and q.size)
    assert (res.meta["haystack_rows"] == 0) if mode == "never" else (res.meta["haystack_rows"] >= n_filtered_live - 1)


def test_unsorted_allow_lists_are_normalised_and_bad_ones_rejected(model_device, corpus):
    idx, qs, _ = corpus
    ref, gpu = NumpyScorer(idx, BM25Params()), model_device(idx)
    messy = [np.array([900, 5, 5, 77, 2000]), None] * (len(qs) // 2)
    clean = [None if a is None else np.unique(a) for a in messy]
    _exact(ref.search(qs, 7, clean), gpu.search(qs, 7, messy))
    with pytest.raises(ValueError, match="outside"):
        gpu.search(qs[:2], 5, [np.array([N_DOCS]), None])
    with pytest.raises(ValueError, match="term ids outside"):
        gpu.search([np.array([N_TERMS])], 5)
    with pytest.raises(ValueError, match="k must be"):
        gpu.search(qs, 0)


def test_threshold_semantics_can_fail(model_device):
    """Emitting '>= threshold, ties included' is exact; a threshold one ulp-key above the k-th score is not."""
    idx = random_index(2000, 40, seed=31, heavy_df=1500)
    ref, gpu = NumpyScorer(idx, BM25Params()), model_device(idx, haystack="never")
    qs = random_queries(40, 8, seed=32, max_terms=4)[1:]
    k = 20
    want = ref.search(qs, k)
    kth = km.float_to_ordered(want.scores[:, k - 1]).astype(np.int64)
    batch = gpu.prepare(qs, None)
    stats = {"n_chunks": 0, "rows_per_chunk": 0, "candidates": 0, "tiles_scored": 0, "tile_items": 0,
             "light_pairs": 0, "overflow_rows": 0, "haystack_rows": 0, "oom_retries": 0, "blocks_scored": 0,
             "blocks_skipped": 0}

    def run(theta):
        res = cb.empty_results(len(qs), k)
        ws = gpu._acquire()
        gpu._search_rows(ws, batch, k, cb.search_consts(gpu.params, gpu.stats.avgdl), gpu._live_bits(None),
                         cb._Timer(model_device.cp, False), dict(stats), res.ids, res.scores,
                         theta0=theta.astype(np.uint32))
        return res

    _exact(want, run(kth), "theta = k-th score")
    bad = run(kth + 1)
    assert not np.array_equal(bad.ids, want.ids)


def test_summation_order_matters_and_is_detected(model_device, monkeypatch):
    """Adding the terms in descending order instead changes some score bits: the bit-exact checks can fail."""
    idx = random_index(3000, 200, seed=41, heavy_df=2500)
    rng = np.random.default_rng(42)
    qs = [rng.integers(0, 200, 12).astype(np.int64) for _ in range(40)]
    ref, gpu = NumpyScorer(idx, BM25Params()), model_device(idx, haystack="never")
    _exact(ref.search(qs, 50), gpu.search(qs, 50))
    real = km._sub_accumulate
    monkeypatch.setattr(km, "_sub_accumulate", lambda a, q, *rest: real(_reversed(a, q), q, *rest))
    a, b = ref.search(qs, 50), gpu.search(qs, 50)
    assert not np.array_equal(a.scores, b.scores)


def _reversed(a, q):
    """The launch's arguments with row q's terms (and their weights) in descending order."""
    t0, t1 = int(a["qt_off"][q]), int(a["qt_off"][q + 1])
    b = dict(a)
    for name in ("qt_term", "qt_mult", "qt_idf", "qt_w0"):
        b[name] = a[name].copy()
        b[name][t0:t1] = a[name][t0:t1][::-1]
    return b


def test_one_copy_each_way_and_reused_buffers(model_device, corpus, monkeypatch):
    idx, qs, _ = corpus
    gpu = model_device(idx)
    gpu.search(qs, 10)
    (ws,) = gpu._pool
    dev = ws.dev
    calls = {"set": 0, "get": 0}
    real_set, real_get = km.DevArray.set, km.DevArray.get
    monkeypatch.setattr(km.DevArray, "set", lambda self, *a, **kw: (calls.__setitem__("set", calls["set"] + 1),
                                                                      real_set(self, *a, **kw))[1])
    monkeypatch.setattr(km.DevArray, "get", lambda self, *a, **kw: (calls.__setitem__("get", calls["get"] + 1),
                                                                      real_get(self, *a, **kw))[1])
    res = gpu.search(qs, 10)
    assert res.meta["n_chunks"] == 1 and res.meta["overflow_rows"] == 0
    assert calls == {"set": 1, "get": 1}
    assert gpu._pool == [ws] and ws.dev is dev  # the workspace and its device buffer were reused
    assert set(res.meta["timings"]) == {"prep_s", "total_s"}  # no events unless timing is asked
    gpu.timing = True
    res = gpu.search(qs, 10)
    assert set(res.meta["timings"]) >= {"prep_s", "h2d_s", "plan_s", "score_s", "topk_s", "d2h_s", "total_s"}


def test_memory_budget_chunks_and_oom(corpus):
    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params())
    want = ref.search(qs, 25, allow)
    with km.fake_cupy_installed(seed=0), km.small_tiles(32, 64):
        probe = cb.CupyScorer(idx, BM25Params())
        b = probe.prepare(qs, allow)
        live = b.take(np.flatnonzero(b.path != cb.PATH_NONE))
        per_row = probe.row_bytes(cb.candidate_slots(live, 25, N_DOCS), 25, live)
        gpu = cb.CupyScorer(idx, BM25Params(), memory_budget_bytes=int(per_row.max()) + 1)
        res = gpu.search(qs, 25, allow)
        _exact(want, res, "budget")
        assert res.meta["n_chunks"] >= 3
        with pytest.raises(MemoryError, match="memory_budget_bytes"):
            cb.CupyScorer(idx, BM25Params(), memory_budget_bytes=1000).search(qs, 25)
    # Any launch over more than 2 rows "runs out of memory": the chunk is halved until it fits.
    with km.fake_cupy_installed(oom_if=lambda name, args: name.startswith("select_topk") and
                                args[1].size > 3) as cp, km.small_tiles(32, 64):
        res = cb.CupyScorer(idx, BM25Params()).search(qs, 25, allow)
        _exact(want, res, "oom")
        assert cp.freed >= 1 and res.meta["n_chunks"] >= 6
    with km.fake_cupy_installed(oom_if=lambda name, args: True), km.small_tiles(32, 64), \
            pytest.raises(MemoryError, match="even one query"):
        cb.CupyScorer(idx, BM25Params()).search(qs, 7)


def test_concurrent_searches_equal_serial(model_device, corpus):
    idx, qs, allow = corpus
    gpu = model_device(idx, "bm25+")
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(12):
        sel = rng.choice(len(qs), rng.integers(1, len(qs)), replace=False)
        jobs.append(([qs[j] for j in sel], [allow[j] for j in sel], int(rng.choice([1, 10, 100]))))
    serial = [gpu.search(q, k, a) for q, a, k in jobs]
    out: list = [None] * len(jobs)
    errors: list = []

    def work(i):
        try:
            q, a, k = jobs[i]
            out[i] = gpu.search(q, k, a)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for s, o in zip(serial, out):
        _exact(s, o, "threads")


def test_empty_batches_and_collections(model_device):
    idx = random_index(100, 10, seed=1)
    gpu = model_device(idx)
    assert gpu.search([], 5).ids.shape == (0, 5)
    res = gpu.search([np.zeros(0, np.int64)], 3)
    assert (res.ids == -1).all() and np.isneginf(res.scores).all()
    assert gpu.score_matrix([]).shape == (0, 100)


# =============================================================================
# Launch checks
# =============================================================================
def test_launch_checker_rejects_python_scalars_and_wrong_dtypes():
    sigs = km.kernel_signatures("topk.cu")
    d = km._dev
    args = [d(np.zeros(4, np.uint64)), np.int64(4), d(np.zeros(4, np.int64)), d(np.zeros(4, np.float32))]
    km.check_launch(sigs, "decode_keys", (1,), (256,), args)
    with pytest.raises(km.LaunchError, match="Python int"):
        km.check_launch(sigs, "decode_keys", (1,), (256,), [args[0], 4, *args[2:]])
    with pytest.raises(km.LaunchError, match="uint64"):
        km.check_launch(sigs, "decode_keys", (1,), (256,), [d(np.zeros(4, np.int64)), *args[1:]])
    with pytest.raises(km.LaunchError, match="contiguous"):
        km.check_launch(sigs, "decode_keys", (1,), (256,), [d(np.zeros(8, np.uint64))[::2], *args[1:]])
    with pytest.raises(km.LaunchError, match="device array"):
        km.check_launch(sigs, "decode_keys", (1,), (256,), [np.zeros(4, np.uint64), *args[1:]])
    pack = [d(np.zeros(4, np.uint64)), d(np.zeros(2, np.int64)), d(np.zeros(1, np.int32)),
            d(np.zeros(1, np.uint32)), np.int64(4), d(np.zeros(4, np.uint64))]
    km.check_launch(sigs, "pack_candidates<256>", (1, 1), (256,), pack)
    with pytest.raises(km.LaunchError, match="THREADS"):
        km.check_launch(sigs, "pack_candidates<256>", (1, 1), (128,), pack)
    with pytest.raises(km.LaunchError, match="grid"):
        km.check_launch(sigs, "pack_candidates<256>", (1, 70000), (256,), pack)
    names = [p[0] for p in km.kernel_signatures("bm25_score.cu")["sub_score"]]
    assert "row_const" in names and names[:4] == ["offsets", "doc_ids", "tfs", "doc_lens"]
    assert names[-8:] == ["method", "k1", "b", "one_minus_b", "k1p1", "delta", "avgdl", "has_w0"]


_DIV_PROGRAM = r"""
#include "cuda_host_shim.h"
#include "common.cuh"
#include <cstdio>
#include <random>
// The device arithmetic of common.cuh (the shim defines __CUDA_ARCH__, so the device branches
// compile, with an estimate of 1/b that is 2 ulps off): div_rn and bm25_weight against IEEE.
int main() {
    std::mt19937_64 rng(12345);
    long long bad = 0, n = 0;
    auto check = [&](float a, float b) {
        const float got = gpuir::div_rn(a, b), want = a / b;
        ++n;
        if (__float_as_uint(got) != __float_as_uint(want)) {
            if (bad < 5) std::printf("div %.9g / %.9g: %.9g != %.9g\n", a, b, got, want);
            ++bad;
        }
    };
    std::uniform_real_distribution<double> ex(-60.0, 60.0);
    for (int i = 0; i < 3000000; ++i) {  // random normal floats over 36 decades
        const float a = (float)std::exp2(ex(rng)), b = (float)std::exp2(ex(rng));
        check(a, b);
        check(a, std::nextafter(b, 0.0f));
    }
    for (int tf = 1; tf <= 2000; ++tf)  // tf / (k1 * norm + tf)-shaped operands
        for (int j = 0; j < 300; ++j) {
            const float den = (float)tf + (float)(j + 1) * 0.0137f;
            check((float)tf, den);
            check((float)(tf * 3), (float)(j + 1));
        }
    for (unsigned int u = 0x3f800000u; u < 0x3f800000u + 200000u; ++u) {  // consecutive significands
        check(1.0f, __uint_as_float(u));
        check(__uint_as_float(u), 3.0f);
        check(__uint_as_float(u + 77u), __uint_as_float(u));
    }
    std::printf("checked %lld bad %lld\n", n, bad);
    return bad != 0;
}
"""


def test_device_division_is_ieee_division(tmp_path):
    """div_rn (a float estimate refined in double, no division instruction) equals IEEE a / b bit for bit."""
    import shutil

    cxx = next((c for c in ("g++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no C++ compiler")
    root = Path(__file__).resolve().parent
    (tmp_path / "div.cpp").write_text(_DIV_PROGRAM)
    r = subprocess.run([cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-I", str(root / "cuda_host"), "-I",
                        str(K.KERNEL_DIR), "-o", str(tmp_path / "div"), str(tmp_path / "div.cpp"), "-pthread"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "div")], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "bad 0" in out.stdout, out.stdout[-2000:]
    assert int(out.stdout.split("checked ")[1].split()[0]) > 6_000_000


def test_small_batches_run_as_one_captured_graph(model_device, corpus, monkeypatch):
    """B <= 64: the pipeline is captured once per (rows bucket, k, statistics) and replayed; results are exact,
    overflowing rows are rerun the ordinary way, and other statistics get their own graph."""
    from gpuir.backends.base import CollectionStats

    idx, qs, allow = corpus
    ref = NumpyScorer(idx, BM25Params(method="bm25+"))
    gpu = model_device(idx, "bm25+", haystack="never", graphs=True)
    cp = model_device.cp
    full = [q for q in qs if q.size and q.max() < idx.n_terms - 2]  # queries with terms in this index
    for i in range(3):
        sub = full[3 * i: 3 * i + 3]  # a bucket of 4 rows
        _exact(ref.search(sub, 10), gpu.search(sub, 10), f"graph {i}")
    assert cp.graph_captures == 1 and cp.graph_launches == 3
    for i in range(2):
        n, captures = len(cp.launches), cp.graph_captures
        res = gpu.search(qs[:4], 10, allow[:4])
        _exact(ref.search(qs[:4], 10, allow[:4]), res, "graph with allow-lists")
        assert res.meta["graph_runs"] == 1
    assert len(cp.launches) == n and cp.graph_captures == captures  # a replay launches nothing by itself
    _exact(ref.search(full[:1], 3), gpu.search(full[:1], 3), "another k")
    assert cp.graph_captures == captures + 1
    stats = CollectionStats(idx.n_docs * 3, idx.df.astype(np.int64) * 2, idx.avgdl * 1.5)
    _exact(NumpyScorer(idx, BM25Params(method="bm25+"), stats=stats).search(full[:3], 10),
           gpu.search(full[:3], 10, stats=stats), "other statistics")
    assert cp.graph_captures == captures + 2
    gpu.graphs = False
    assert gpu.search(qs[:4], 10).meta["graph_runs"] == 0
    gpu.graphs = True
    monkeypatch.setattr(cb._Graph, "SLOTS_EXTRA", 0)  # 4k slots: some rows overflow and are rerun
    fresh = model_device(idx, "bm25+", haystack="never", graphs=True)
    res = fresh.search(qs[:8], 2)
    _exact(ref.search(qs[:8], 2), res, "graph overflow")
    assert res.meta["graph_runs"] == 1 and res.meta["overflow_rows"] > 0


def test_a_capture_belongs_to_its_thread(model_device, corpus):
    """One thread capturing a graph (relaxed mode, its own stream) neither refuses another thread's copies nor
    records its work: the fake cupy's capture state is per thread, as CuPy's current stream is. (A global one
    made concurrent small searches fail at random in a dry run: another thread's copy was refused while a
    graph was being captured.)"""
    cp = model_device.cp
    a = cp.zeros(4, cp.float32)
    began, copied = threading.Event(), threading.Event()
    seen: dict = {}

    def capturing():
        st = cp.cuda.Stream()
        st.begin_capture()
        a.fill(7)  # recorded, not run
        began.set()
        copied.wait(10)
        seen["graph"] = st.end_capture()

    def other():
        began.wait(10)
        b = cp.zeros(4, cp.float32)
        b.set(np.arange(4, dtype=np.float32))  # a copy from another thread while the first captures
        b.fill(1)  # runs now: never part of the other thread's graph
        seen["b"] = b.get()
        copied.set()

    ts = [threading.Thread(target=capturing), threading.Thread(target=other)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    np.testing.assert_array_equal(seen["b"], np.ones(4, np.float32))
    np.testing.assert_array_equal(a.get(), np.zeros(4, np.float32))  # the capture has not run yet
    assert len(seen["graph"].ops) == 1
    seen["graph"].launch()
    np.testing.assert_array_equal(a.get(), np.full(4, 7, np.float32))
    # and the model's whole pipeline: small batches as graphs from many threads at once stay exact
    idx, qs, _ = corpus
    ref = NumpyScorer(idx, BM25Params(method="bm25+"))
    gpu = model_device(idx, "bm25+", haystack="never", graphs=True)
    out: list = [None] * 6
    errors: list = []

    def work(i):
        try:
            out[i] = [gpu.search(qs[j:j + 2], 10) for j in range(i, 24, 6)]
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    ws = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in ws:
        t.start()
    for t in ws:
        t.join()
    assert not errors, errors
    assert gpu.graph_error is None
    for i in range(6):
        for res, j in zip(out[i], range(i, 24, 6)):
            _exact(ref.search(qs[j:j + 2], 10), res, f"thread {i}, rows {j}")


def test_a_graph_that_cannot_be_captured_turns_graphs_off(model_device, corpus, monkeypatch, caplog):
    """Copies on a capturing stream are refused (as CuPy refuses them); any capture failure leaves the search exact
    on the ordinary path, with graphs off for that scorer and the reason logged."""
    idx, qs, _ = corpus
    ref = NumpyScorer(idx, BM25Params())
    gpu = model_device(idx, graphs=True)
    real = cb._Graph._record

    def copy_inside(self, scorer, sc, blocks):  # what the first device run did: the input copy inside the graph
        self.ws.h2d(self.h2d_end)
        real(self, scorer, sc, blocks)

    monkeypatch.setattr(cb._Graph, "_record", copy_inside)
    with caplog.at_level("WARNING", logger="gpuir.backends.cupy"):
        res = gpu.search(qs[:3], 10)
    _exact(ref.search(qs[:3], 10), res, "fallback")
    assert not gpu.graphs and "capturing" in gpu.graph_error and res.meta["graph_runs"] == 0
    assert "CUDA graphs turned off" in caplog.text
    _exact(ref.search(qs[:5], 10), gpu.search(qs[:5], 10), "after")


def test_directory_in_chunks_and_the_doubling_scan(monkeypatch):
    """Chunked builds (CuPy's path bounds its temporaries) equal one-chunk builds; the doubling running maximum
    (CuPy has no maximum.accumulate) equals NumPy's."""
    import types

    rng = np.random.default_rng(5)
    v = rng.integers(-1000, 1000, 5000)
    fake_xp = types.SimpleNamespace(maximum=np.maximum)
    assert np.array_equal(cb.running_max(v, fake_xp), np.maximum.accumulate(v))
    idx = random_index(3001, 60, seed=9)
    args = (idx.offsets, idx.doc_ids, idx.tfs, idx.doc_lens, 64, -(-3001 // 64), 100)
    whole = cb.build_directory(*args)
    monkeypatch.setattr(cb, "DIRECTORY_CHUNK", 500)  # many chunks, some terms longer than a chunk
    parts = cb.build_directory(*args)
    assert set(whole) == set(parts)
    for name in whole:
        assert np.array_equal(whole[name], parts[name]), name


# =============================================================================
# Sub-block bounds and the sub-block cut (impacts per 1/16 of a tile)
# =============================================================================
def test_sub_block_impacts_bound_every_posting():
    """Every posting of a heavy term is dominated by an impact of its own sub-block; empty ones have none."""
    idx = random_index(3000, 80, seed=3, heavy_df=2500)
    tile = 64
    n_tiles = -(-idx.n_docs // tile)
    d = cb.build_directory(idx.offsets, idx.doc_ids, idx.tfs, idx.doc_lens, tile, n_tiles, 2 * n_tiles)
    sub = tile // cb.SUBS
    heavy = np.flatnonzero(d["dir_row"] >= 0)
    assert heavy.size >= 2
    for t in heavy:
        r = int(d["dir_row"][t])
        docs = idx.doc_ids[idx.offsets[t]:idx.offsets[t + 1]].astype(np.int64)
        tf, dl = idx.tfs[idx.offsets[t]:idx.offsets[t + 1]], idx.doc_lens[docs]
        for j in range(n_tiles):
            cell = r * n_tiles + j
            w, o = int(d["dir_sub_cnt"][cell]), int(d["dir_sub_off"][cell])
            for s in range(cb.SUBS):
                c = (w >> (4 * s)) & 15
                imp = d["dir_sub_imp"][o:o + c].astype(np.int64)
                o += c
                sel = (docs // sub) == j * cb.SUBS + s
                assert (c == 0) == (not sel.any()), (t, j, s)
                for a, b in zip(tf[sel], dl[sel]):
                    assert ((imp & 0xFFFF) >= a).__and__((imp >> 16) <= b).any(), (t, j, s, a, b)
            assert o == int(d["dir_sub_off"][cell + 1])


def test_a_long_sub_block_frontier_is_merged_into_an_upper_bound():
    tf = np.arange(40, 0, -1)
    dl = np.arange(400, 0, -10)  # 40 non-dominated pairs in one sub-block
    off, cnt, pairs = cb.sub_block_impacts(np.zeros(40, np.int64), tf, dl, 1)
    assert off.tolist() == [0, 15] and int(cnt[0]) == 15
    p = pairs.astype(np.int64)
    assert (p[:14] & 0xFFFF).tolist() == tf[:14].tolist() and (p[:14] >> 16).tolist() == dl[:14].tolist()
    assert (int(p[14]) & 0xFFFF, int(p[14]) >> 16) == (26, 10)  # dominates pairs 14..39
    for a, b in zip(tf, dl):
        assert (((p & 0xFFFF) >= a) & ((p >> 16) <= b)).any()


def _tie_index(n_docs: int = 1024, seed: int = 5) -> CSRIndex:
    """Every document has length 9 and tf 1 or 2 of a few terms: thousands of exact ties at every score."""
    rng = np.random.default_rng(seed)
    doc_ids, tfs, offsets = [], [], [0]
    for df in (n_docs - 3, 700, 300, 90, 40, 12, 3):
        d = np.sort(rng.choice(n_docs, df, replace=False)).astype(np.int32)
        doc_ids.append(d)
        tfs.append(rng.integers(1, 3, d.size).astype(np.int32))
        offsets.append(offsets[-1] + df)
    return CSRIndex(offsets=np.array(offsets, np.int64), doc_ids=np.concatenate(doc_ids), tfs=np.concatenate(tfs),
                    doc_lens=np.full(n_docs, 9, np.int32), vocab=[f"t{i}" for i in range(7)],
                    ids=[str(i) for i in range(n_docs)])


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_sub_block_cut_with_ties_at_the_threshold(model_device, method):
    """Many documents tie at the k-th score across sub-blocks and tiles: the cut acts and stays exact."""
    idx = _tie_index()
    ref, gpu = NumpyScorer(idx, BM25Params(method=method)), model_device(idx, method, haystack="never")
    qs = [np.array(q, np.int64) for q in ([0, 1], [0, 1, 2], [1, 2, 3], [0, 4, 5], [2, 2, 6], [0, 1, 2, 3, 4, 5, 6])]
    cut = 0
    for k in (1, 7, 50, 333):
        res = gpu.search(qs, k)
        _exact(ref.search(qs, k), res, f"{method} k={k}")
        cut += res.meta["blocks_skipped"]
        assert res.meta["blocks_scored"] > 0
    assert cut > 0, "the sub-block cut never acted: the test does not exercise it"


def test_a_top_document_alone_in_its_sub_block_at_theta(model_device):
    """The k-th document is the only posting of its sub-block and scores exactly theta: it must be kept."""
    idx = _tie_index()
    ref = NumpyScorer(idx, BM25Params())
    gpu = model_device(idx, haystack="never")
    qs = [np.array([5, 6], np.int64), np.array([4, 6], np.int64), np.array([6], np.int64)]
    sub = K.TILE_DOCS // cb.SUBS  # small_tiles: 64-document tiles, sub-blocks of 4
    alone = 0
    for k in (1, 2, 3, 4, 13):
        want = ref.search(qs, k)
        kth = km.float_to_ordered(want.scores[:, k - 1]).astype(np.int64)
        kth[~np.isfinite(want.scores[:, k - 1])] = 0
        res = _run_with_theta(gpu, model_device.cp, qs, k, kth)  # theta = the k-th score from the start
        _exact(want, res, f"k={k}")
        dense = ref.score_matrix(qs)
        for i in range(len(qs)):
            d = int(want.ids[i, k - 1])
            if d >= 0:
                blk = dense[i, d // sub * sub:(d // sub + 1) * sub]
                alone += int(np.isfinite(blk).sum() == 1)
    assert alone > 0, "no k-th document was alone in its sub-block: the case is not exercised"


def _run_with_theta(gpu, cp, qs, k, theta):
    res = cb.empty_results(len(qs), k)
    ws = gpu._acquire()
    stats = {"n_chunks": 0, "rows_per_chunk": 0, "candidates": 0, "tiles_scored": 0, "tile_items": 0,
             "light_pairs": 0, "overflow_rows": 0, "haystack_rows": 0, "oom_retries": 0, "blocks_scored": 0,
             "blocks_skipped": 0}
    gpu._search_rows(ws, gpu.prepare(qs, None), k, cb.search_consts(gpu.params, gpu.stats.avgdl),
                     gpu._live_bits(None), cb._Timer(cp, False), stats, res.ids, res.scores,
                     theta0=np.asarray(theta).astype(np.uint32))
    res.meta = stats
    return res


def test_a_sub_block_bound_one_ulp_below_its_best_score_is_caught(model_device, monkeypatch):
    """The cut is exact with the tightest true bound (each block's best real score) and fails one ulp below it.

    The model's sub-block bounds are replaced by the exact largest score of each sub-block (a valid,
    tightest bound: the control) and then by that score's predecessor float (a bound one ulp too low):
    with theta = the k-th score from the start, the block holding the k-th document is cut.
    """
    idx = random_index(1500, 50, seed=61, heavy_df=1200)
    ref = NumpyScorer(idx, BM25Params())
    qs = random_queries(50, 10, seed=62, max_terms=4)[1:]
    k = 5
    want = ref.search(qs, k)
    kth = km.float_to_ordered(want.scores[:, k - 1]).astype(np.int64)
    dense = ref.score_matrix(qs)
    real = km._sub_bound

    def exact_max(ulps):
        def sub_bound(a, q, j, s, sbase, send):
            ub, pres = real(a, q, j, s, sbase, send)
            row = dense[q]  # one chunk of the whole batch: the launch's row q is query q
            sc = row[sbase:send] if send > sbase else np.zeros(0, np.float32)
            sc = sc[np.isfinite(sc)]
            if pres and sc.size:
                m = np.float32(sc.max())
                ub = np.nextafter(m, np.float32(-np.inf)) if ulps else m
            return ub, pres
        return sub_bound

    gpu = model_device(idx, haystack="never")
    monkeypatch.setattr(km, "_sub_bound", exact_max(0))
    good = _run_with_theta(gpu, model_device.cp, qs, k, kth)
    _exact(want, good, "tightest true bound")
    assert good.meta["blocks_skipped"] > 0
    monkeypatch.setattr(km, "_sub_bound", exact_max(1))
    bad = _run_with_theta(gpu, model_device.cp, qs, k, kth)
    assert not np.array_equal(bad.ids, want.ids), "a sub-block bound one ulp too low went unnoticed"


def test_seeds_are_the_best_bound_tiles_and_raise_theta(model_device, corpus):
    """seed_tiles picks each row's 16 best (bound, lower tile) tiles; their k-th best becomes theta."""
    idx, qs, _ = corpus
    gpu = model_device(idx, haystack="never")
    seen = {}
    real_seed, real_theta = km.MODELS["seed_tiles"], km.MODELS["seed_theta"]

    def seed_tiles(a, grid):
        real_seed(a, grid)
        n_tiles, R = int(a["n_tiles"]), int(a["n_rows"])
        for q in range(R):
            u = a["ukey"][q * n_tiles:(q + 1) * n_tiles].astype(np.int64)
            order = sorted((j for j in range(n_tiles) if u[j]), key=lambda j: (-u[j], j))[:km.SEEDS]
            got = [(~int(x)) & 0xFFFFFFFF for x in a["seeds"][q * km.SEEDS:(q + 1) * km.SEEDS] if int(x)]
            assert got == order, (q, got, order)
        seen["seeds"] = True

    def seed_theta(a, grid):
        before = a["theta"].copy()
        real_theta(a, grid)
        seen["raised"] = seen.get("raised", 0) + int((a["theta"] > before).sum())

    km.MODELS["seed_tiles"], km.MODELS["seed_theta"] = seed_tiles, seed_theta
    try:
        ref = NumpyScorer(idx, BM25Params())
        _exact(ref.search(qs, 3), gpu.search(qs, 3))
    finally:
        km.MODELS["seed_tiles"], km.MODELS["seed_theta"] = real_seed, real_theta
    assert seen.get("seeds") and seen.get("raised", 0) > 0


def test_overflow_reruns_are_planned_again(model_device, corpus, monkeypatch):
    """A rerun of overflowing rows runs the whole plan again for those rows only: bounds, seeds, list."""
    idx, qs, _ = corpus
    gpu = model_device(idx, haystack="never")
    real = cb.candidate_slots
    monkeypatch.setattr(cb, "candidate_slots", lambda *a, **kw: np.minimum(real(*a, **kw), 3))
    cp = model_device.cp
    n0 = len(cp.launches)
    res = gpu.search(qs[5:9], 10)
    _exact(NumpyScorer(idx, BM25Params()).search(qs[5:9], 10), res)
    over = res.meta["overflow_rows"]
    assert over > 0
    rows = {name.split("<")[0]: [] for name, *_ in cp.launches[n0:]}
    for name, grid, *_ in cp.launches[n0:]:
        rows[name.split("<")[0]].append(grid)
    assert len(rows["tile_bounds"]) == len(rows["seed_tiles"]) == len(rows["tile_list"]) == 2
    assert rows["tile_bounds"][1][1] == rows["seed_tiles"][1][0] == over  # the rerun's rows only
