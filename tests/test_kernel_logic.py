"""The GPU backend's logic, checked without a GPU.

Nothing here launches a kernel. Instead:

* **Native helpers on the host.** The key encoding (``composite_key``,
  ``key_doc``, ``key_score``), the radix digit schedule (``radix_digit``) and the
  BM25 arithmetic (``tfc``, ``posting_weight``) of ``kernels/common.cuh`` are
  ``__host__ __device__``: a small host program compiled with nvcc runs the
  real source on adversarial inputs, and the results must equal the NumPy
  emulation below and ``gpuir.bm25`` bit for bit.
* **Emulation of the kernels in NumPy**, mirroring ``kernels/*.cu`` step by
  step (the radix select's passes, histograms, bin choice, early exits,
  gather, sentinel slots), checked against the reference tie rule
  (``topk_from_dense``) on adversarial rows: all scores tied, ties straddling
  the k-th place, scores differing only in their lowest mantissa bits,
  negative scores, -0.0 next to +0.0, fewer candidates than k, k = 1, k =
  candidates, k at the shared-memory limit.
* **The CuPy scorer's host code end to end** against a fake ``cupy`` whose
  "kernels" are that emulation: every launch is checked against the kernel's
  parsed C signature (dtype and contiguity of every array, exact NumPy scalar
  type of every scalar -- CuPy passes a Python int as int64 and a float as
  float64, so a mismatch would read garbage), block size = the template's
  THREADS, grid and shared-memory limits; results must equal the NumPy
  backend's exactly (the emulation adds in the reference's order).
"""

from __future__ import annotations

import re
import subprocess
import sys
import types

import numpy as np
import pytest
from _helpers import random_index, random_queries

from gpuir import bm25
from gpuir.backends import kernels as K
from gpuir.backends.base import topk_from_dense
from gpuir.backends.numpy_backend import NumpyScorer
from gpuir.bm25 import METHODS, BM25Params

U32 = np.uint32
U64 = np.uint64
STATIC_SMEM_LIMIT = 48 * 1024


# =============================================================================
# Kernel signatures, parsed from the .cu text
# =============================================================================
_CTYPES = {
    "int": np.int32, "long long": np.int64, "unsigned int": np.uint32,
    "unsigned long long": np.uint64, "float": np.float32, "double": np.float64,
}


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", src)


def kernel_signatures(filename: str) -> dict[str, list[tuple[str, type, bool]]]:
    """``{kernel name: [(param, numpy scalar type, is_pointer), ...]}`` of a .cu file."""
    src = _strip_comments(K.load_source(filename))
    out = {}
    pat = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)\s*\{")
    for m in pat.finditer(src):
        params = []
        for p in m.group(2).split(","):
            p = " ".join(p.replace("__restrict__", " ").replace("const", " ").split())
            is_ptr = "*" in p
            p = p.replace("*", " ")
            *ty, name = p.split()
            params.append((name, _CTYPES[" ".join(ty)], is_ptr))
        out[m.group(1)] = params
    return out


def test_signatures_cover_every_instantiation():
    for f in ("bm25_score.cu", "topk.cu"):
        sigs = kernel_signatures(f)
        for expr in K.NAME_EXPRESSIONS[f]:
            assert expr.split("<")[0] in sigs, (f, expr)
    sig = kernel_signatures("bm25_score.cu")["bm25_score"]
    assert [p[0] for p in sig][:3] == ["offsets", "doc_ids", "tfs"]
    assert sig[0][1:] == (np.int64, True) and sig[1][1:] == (np.int32, True)
    assert {n: t for n, t, _ in sig}["n_docs"] is np.int64


# =============================================================================
# NumPy emulation of common.cuh
# =============================================================================
def float_to_ordered(f) -> np.ndarray:
    u = np.atleast_1d(np.asarray(f, dtype=np.float32)).view(U32).copy()
    u[u == U32(0x80000000)] = 0  # -0.0 -> +0.0
    nan = (u & U32(0x7FFFFFFF)) > U32(0x7F800000)
    out = np.where((u & U32(0x80000000)) != 0, ~u, u | U32(0x80000000)).astype(U32)
    out[nan] = 0
    return out


def ordered_to_float(k) -> np.ndarray:
    k = np.asarray(k, dtype=U32)
    u = np.where((k & U32(0x80000000)) != 0, k & U32(0x7FFFFFFF), ~k).astype(U32)
    return u.view(np.float32)


def composite_key(score, doc) -> np.ndarray:
    doc = np.asarray(doc, dtype=np.int64)
    return (float_to_ordered(score).astype(U64) << U64(32)) | (~doc.astype(U32)).astype(U64)


def key_doc(key) -> np.ndarray:
    return (~(np.asarray(key, U64) & U64(0xFFFFFFFF)).astype(U32)).astype(np.int64)


def key_score(key) -> np.ndarray:
    return ordered_to_float((np.asarray(key, U64) >> U64(32)).astype(U32))


RADIX_BITS = 11


def radix_passes(doc_bits: int) -> int:
    return 3 + -(-doc_bits // RADIX_BITS)


def radix_digit(p: int, doc_bits: int) -> tuple[int, int]:
    """(shift, width) of pass p, as gpuir::radix_digit computes it."""
    if p < 2:
        return 64 - RADIX_BITS * (p + 1), RADIX_BITS
    if p == 2:
        return 32, 64 - 2 * RADIX_BITS - 32
    top = doc_bits - RADIX_BITS * (p - 3)
    shift = top - RADIX_BITS if top > RADIX_BITS else 0
    return shift, top - shift


def old_radix_digit(p: int, doc_bits: int) -> tuple[int, int]:
    """The schedule topk.cu had before this review (pass 2 = bits 40..31)."""
    if p < 3:
        return 53 - RADIX_BITS * p, RADIX_BITS if p < 2 else 10
    return radix_digit(p, doc_bits)


def test_digit_schedule_covers_every_varying_bit_once():
    for doc_bits in range(1, 32):
        seen = np.zeros(64, int)
        for p in range(radix_passes(doc_bits)):
            s, w = radix_digit(p, doc_bits)
            assert 1 <= w <= RADIX_BITS and s >= 0
            seen[s:s + w] += 1
        want = np.zeros(64, int)
        want[32:] = 1
        want[:doc_bits] = 1
        assert seen.tolist() == want.tolist(), doc_bits
    # The old schedule misses bit 41 and re-resolves the constant bit 31: caught.
    seen = np.zeros(64, int)
    for p in range(3):
        s, w = old_radix_digit(p, 20)
        seen[s:s + w] += 1
    assert seen[41] == 0 and seen[31] == 1


def test_topk_kernel_uses_the_checked_schedule():
    src = _strip_comments(K.load_source("topk.cu"))
    body = src[src.index("topk_rows("):src.index("composite_keys(")]
    assert "gpuir::radix_digit(pass, doc_bits, &shift, &width)" in body
    assert "gpuir::radix_passes(doc_bits)" in body
    assert "53 -" not in body


def _adversarial_scores(rng) -> np.ndarray:
    f = np.float32
    base = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-45, -1e-45, 1.1754944e-38,
            np.finfo(f).max, -np.finfo(f).max, 3.4028235e38, 0.5, 2.0, 7.25]
    ulps = np.arange(-1024, 1025, dtype=np.int32)
    one_ulps = (np.array(f(1.0)).view(np.int32) + ulps).view(f)  # 1.0 +- k ulp: bits 32..42 of the key
    neg_ulps = (np.array(f(-3.0)).view(np.int32) + ulps).view(f)
    rand = rng.standard_normal(2000).astype(f) * f(10)
    return np.concatenate([np.array(base, f), one_ulps, neg_ulps, rand,
                           np.repeat(np.array([0.0, -0.0, 4.5], f), 50)])


def test_key_order_is_the_tie_rule_and_decodes_exactly():
    rng = np.random.default_rng(0)
    s = _adversarial_scores(rng)
    d = rng.permutation(np.arange(s.size, dtype=np.int64) * 977 % (2**31 - 1))
    keys = composite_key(s, d)
    assert np.all(keys > 0) and np.unique(keys).size == keys.size
    order_keys = np.argsort(keys)[::-1]
    order_rule = np.lexsort((d, -s.astype(np.float64)))  # the reference tie rule
    assert np.array_equal(order_keys, order_rule)
    assert np.array_equal(key_doc(keys), d)
    dec = key_score(keys)
    assert np.array_equal(dec, s)  # -0.0 decodes as +0.0, equal as a float
    pos0 = s == 0
    assert np.array_equal(dec[~pos0].view(U32), s[~pos0].view(U32))
    assert not np.signbit(dec[pos0]).any()
    # -0.0 and +0.0 tie: the lower document number wins.
    k = composite_key(np.array([-0.0, 0.0], np.float32), np.array([3, 9]))
    assert k[0] > k[1]
    k = composite_key(np.array([0.0, -0.0], np.float32), np.array([3, 9]))
    assert k[0] > k[1]
    # NaN sorts below every score (as NumPy sorts it last), still a candidate.
    kn = composite_key(np.array([np.nan, -np.inf], np.float32), np.array([0, 1]))
    assert 0 < kn[0] < kn[1] and np.isnan(key_score(kn[:1])[0])


# =============================================================================
# The native helpers of common.cuh, compiled for the host with nvcc
# =============================================================================
_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "common.cuh"
template <int M> static void tfc_all(long long n, const float* tf, const float* dl,
                                     const float* prm, FILE* o) {
    for (long long i = 0; i < n; ++i) {
        float v = gpuir::tfc<M>(tf[i], dl[i], prm[0], prm[1], prm[2], prm[3]);
        fwrite(&v, 4, 1, o);
    }
}
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    FILE* o = fopen(argv[2], "wb");
    long long n, nt;
    if (fread(&n, 8, 1, f) != 1) return 2;
    float* s = (float*)malloc(4 * n);
    long long* d = (long long*)malloc(8 * n);
    if (fread(s, 4, n, f) != (size_t)n || fread(d, 8, n, f) != (size_t)n) return 2;
    for (long long i = 0; i < n; ++i) {
        unsigned long long key = gpuir::composite_key(s[i], d[i]);
        long long dd = gpuir::key_doc(key);
        float sc = gpuir::key_score(key);
        fwrite(&key, 8, 1, o); fwrite(&dd, 8, 1, o); fwrite(&sc, 4, 1, o);
    }
    for (int db = 1; db <= 31; ++db) {
        int np_ = gpuir::radix_passes(db);
        for (int p = 0; p < np_; ++p) {
            int sh, w;
            gpuir::radix_digit(p, db, &sh, &w);
            int rec[4] = {db, p, sh, w};
            fwrite(rec, 4, 4, o);
        }
    }
    if (fread(&nt, 8, 1, f) != 1) return 2;
    float* tf = (float*)malloc(4 * nt); float* dl = (float*)malloc(4 * nt);
    float* w = (float*)malloc(4 * nt); float* z = (float*)malloc(4 * nt);
    float* m = (float*)malloc(4 * nt); float prm[4];
    if (fread(tf, 4, nt, f) != (size_t)nt || fread(dl, 4, nt, f) != (size_t)nt ||
        fread(w, 4, nt, f) != (size_t)nt || fread(z, 4, nt, f) != (size_t)nt ||
        fread(m, 4, nt, f) != (size_t)nt || fread(prm, 4, 4, f) != 4) return 2;
    tfc_all<0>(nt, tf, dl, prm, o); tfc_all<1>(nt, tf, dl, prm, o); tfc_all<2>(nt, tf, dl, prm, o);
    tfc_all<3>(nt, tf, dl, prm, o); tfc_all<4>(nt, tf, dl, prm, o);
    for (long long i = 0; i < nt; ++i) {
        float v = gpuir::posting_weight(w[i], tf[i], z[i], m[i]);
        fwrite(&v, 4, 1, o);
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
    r = subprocess.run([nvcc, "-std=c++17", "-O2", "-Xcompiler", "-ffp-contract=off", "-I", str(K.KERNEL_DIR), "-o", str(d / "h"), str(d / "h.cu")],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0 and "unsupported" in (r.stderr + r.stdout).lower():
        pytest.skip(f"nvcc cannot build host code here: {r.stderr[:300]}")
    assert r.returncode == 0, r.stderr + r.stdout
    return d / "h"


def test_native_keys_schedule_and_bm25_match(native, tmp_path):
    rng = np.random.default_rng(1)
    s = _adversarial_scores(rng)
    d = rng.integers(0, 2**31 - 1, s.size).astype(np.int64)
    d[:3] = [0, 2**31 - 2, 5_000_000]
    nt = 4000
    tf = rng.integers(1, 60, nt).astype(np.float32)
    dl = rng.integers(1, 5000, nt).astype(np.float32)
    dl[:4] = [1, 1e6, 3, 7]
    w = (rng.random(nt) * 12).astype(np.float32)
    z = (rng.random(nt) * 2).astype(np.float32)
    m = rng.integers(1, 4, nt).astype(np.float32)
    p = BM25Params(method="lucene", k1=1.37, b=0.71, delta=0.63)
    avgdl = 123.456789
    prm = np.array([p.k1, p.b, p.delta, avgdl], np.float32)
    inp = tmp_path / "in.bin"
    with open(inp, "wb") as f:
        f.write(np.int64(s.size).tobytes() + s.tobytes() + d.tobytes())
        f.write(np.int64(nt).tobytes() + tf.tobytes() + dl.tobytes() + w.tobytes() + z.tobytes()
                + m.tobytes() + prm.tobytes())
    out = tmp_path / "out.bin"
    subprocess.run([str(native), str(inp), str(out)], check=True)
    raw = out.read_bytes()
    rec = np.frombuffer(raw[: 20 * s.size], dtype=[("key", "<u8"), ("doc", "<i8"), ("score", "<f4")])
    assert np.array_equal(rec["key"], composite_key(s, d))
    assert np.array_equal(rec["doc"], d)
    assert np.array_equal(rec["score"].view(U32), key_score(composite_key(s, d)).view(U32))
    n_sched = sum(radix_passes(db) for db in range(1, 32))
    off = 20 * s.size
    sched = np.frombuffer(raw[off: off + 16 * n_sched], dtype=np.int32).reshape(-1, 4)
    for db, pas, sh, wd in sched.tolist():
        assert (sh, wd) == radix_digit(pas, db), (db, pas)
    off += 16 * n_sched
    vals = np.frombuffer(raw[off:], dtype=np.float32)
    assert vals.size == 6 * nt
    for i, method in enumerate(METHODS):
        q = BM25Params(method=method, k1=p.k1, b=p.b, delta=p.delta)
        want = bm25.tfc(tf, dl, avgdl, q)
        assert np.array_equal(vals[i * nt:(i + 1) * nt].view(U32), want.view(U32)), method
    # posting_weight(idf, tc, w0, m): as NumpyScorer's (idf * tfc - w0), times m when m != 1.
    want = w * tf - z
    want = np.where(m != 1, want * m, want).astype(np.float32)
    assert np.array_equal(vals[5 * nt:].view(U32), want.view(U32))


# =============================================================================
# NumPy emulation of the kernels
# =============================================================================
def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def emulate_topk_row(keys: np.ndarray, k: int, doc_bits: int, schedule=radix_digit):
    """topk_rows for one row: the k largest keys, sentinel-padded, as (ids, scores)."""
    keys = np.asarray(keys, dtype=U64)
    kpad = next_pow2(k)
    assert kpad <= 4096
    prefix, mask, krem, done = U64(0), U64(0), k, False
    for p in range(radix_passes(doc_bits)):
        if done:
            break
        shift, width = schedule(p, doc_bits)
        nb, dmask = 1 << width, U64((1 << width) - 1)
        sel = keys[(keys & mask) == prefix]
        hist = np.bincount(((sel >> U64(shift)) & dmask).astype(np.int64), minlength=nb)
        assert hist.size == nb
        total = int(hist.sum())
        if p == 0 and total <= krem:
            break  # take every candidate: prefix = mask = 0
        h_desc = hist[::-1]  # rank r = bin nb - 1 - r
        cum = np.concatenate([[0], np.cumsum(h_desc)[:-1]])
        hit = np.flatnonzero((cum < krem) & (krem <= cum + h_desc))
        assert hit.size == 1, "exactly one bin holds the k-th key"
        r = int(hit[0])
        b, h, c = nb - 1 - r, int(h_desc[r]), int(cum[r])
        prefix |= U64(b) << U64(shift)
        mask |= dmask << U64(shift)
        krem -= c
        done = h == krem
    gathered = keys[(keys & mask) >= prefix]
    assert gathered.size == min(k, keys.size), "gather must find exactly min(k, C) keys"
    sbuf = np.zeros(kpad, dtype=U64)  # every slot the sentinel before any read
    sbuf[: gathered.size] = gathered
    sbuf = np.sort(sbuf)[::-1][:k]
    ids = np.where(sbuf > 0, key_doc(sbuf), -1)
    scores = np.where(sbuf > 0, key_score(sbuf), np.float32(-np.inf)).astype(np.float32)
    return ids, scores


def _check_row(scores_row: np.ndarray, k: int, schedule=radix_digit) -> bool:
    """Emulated top-k of a dense row (-inf = non-candidate) equals the reference."""
    N = scores_row.size
    cand = np.flatnonzero(scores_row > -np.inf)
    keys = composite_key(scores_row[cand], cand)
    ids, sc = emulate_topk_row(keys, k, max(1, (N - 1).bit_length()), schedule)
    ref = topk_from_dense(scores_row[None, :], k)
    return np.array_equal(ids, ref.ids[0]) and np.array_equal(sc, ref.scores[0])


def _adversarial_rows(rng, N=6000):
    f = np.float32
    rows = {}
    r = np.full(N, -np.inf, f)
    r[rng.choice(N, 3000, replace=False)] = f(2.5)
    rows["all_tied"] = r
    r = np.full(N, -np.inf, f)
    idx = rng.choice(N, 4000, replace=False)
    r[idx] = rng.choice(np.array([1.0, 2.0, 3.0], f), idx.size)
    rows["three_levels"] = r
    # Scores 1.0 + j ulp: they differ only in key bits 32..42 (bit 41 included).
    r = np.full(N, -np.inf, f)
    idx = rng.choice(N, 3000, replace=False)
    j = rng.integers(0, 2048, idx.size).astype(np.int32)
    r[idx] = (np.array(f(1.0)).view(np.int32) + j).view(f)
    rows["low_mantissa"] = r
    r = np.full(N, -np.inf, f)
    idx = rng.choice(N, 2500, replace=False)
    r[idx] = rng.choice(np.array([-0.0, 0.0, -1.5, -1e-30, 1e-30], f), idx.size)
    rows["signed_zero_negative"] = r
    r = np.full(N, -np.inf, f)
    idx = rng.choice(N, 5000, replace=False)
    r[idx] = (rng.standard_normal(idx.size) * 3).astype(f)
    rows["random"] = r
    rows["none"] = np.full(N, -np.inf, f)
    r = np.full(N, -np.inf, f)
    r[[0, N - 1]] = [f(1.0), f(1.0)]
    rows["two"] = r
    return rows


@pytest.mark.parametrize("k", [1, 2, 7, 100, 1000, 2048, 2049, 2500, 3000, 4096])
def test_radix_select_emulation_matches_tie_rule(k):
    rng = np.random.default_rng(k)
    for name, row in _adversarial_rows(rng).items():
        assert _check_row(row, k), (name, k)
    # k == number of candidates, and one fewer / one more.
    row = _adversarial_rows(rng)["three_levels"]
    c = int(np.isfinite(row).sum())
    for kk in (c - 1, c, c + 1):
        if kk <= 4096:
            assert _check_row(row, kk), kk


def test_old_schedule_fails_the_same_checks():
    """The pass-2 schedule topk.cu had (bits 40..31) picks wrong documents."""
    rng = np.random.default_rng(3)
    row = _adversarial_rows(rng)["low_mantissa"]
    bad = [k for k in (10, 100, 500) if not _check_row(row, k, schedule=old_radix_digit)]
    assert bad, "the emulation must be able to tell the broken schedule apart"
    assert all(_check_row(row, k) for k in (10, 100, 500))


# -----------------------------------------------------------------------------
# Emulated kernels, launched through a fake cupy that checks every launch
# -----------------------------------------------------------------------------
class DevArray(np.ndarray):
    """A 'device' array: a NumPy array with CuPy's .get()."""

    def get(self):
        return np.array(self, copy=True).view(np.ndarray)


def _dev(a):
    return np.array(a, copy=True).view(DevArray)


def _tfc_kernel(method: int, tf, dl, k1, b, delta, avgdl):
    """gpuir::tfc<METHOD>, operation by operation, in float32."""
    f = np.float32
    norm = (f(1) + (-b)) + b * (dl / avgdl)
    k1p1 = k1 + f(1)
    if method in (0, 1):
        return tf / (k1 * norm + tf)
    if method == 2:
        return (tf * k1p1) / (tf + k1 * norm)
    if method == 3:
        c = tf / norm
        return (k1p1 * (c + delta)) / ((k1 + c) + delta)
    return (k1p1 * tf) / (k1 * norm + tf) + delta


def _bit(bits_row, d):
    return ((bits_row[d >> 5] >> (d & 31).astype(U32)) & U32(1)).astype(bool)


def emu_bm25_score(method, offsets, doc_ids, tfs, doc_lens, pair_query, pair_term, pair_mult,
                   chunk_start, n_pairs, idf, w0, allow_bits, allow_row, scores, touched,
                   n_docs, words_per_row, k1, b, delta, avgdl, *, threads, per_thread):
    chunk = threads * per_thread
    n_chunks = int(chunk_start[n_pairs])
    for c in range(n_chunks):  # blocks in chunk order: the reference's addition order
        lo, hi = 0, int(n_pairs) - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if chunk_start[mid] <= c:
                lo = mid
            else:
                hi = mid - 1
        p = lo
        q, t, m = int(pair_query[p]), int(pair_term[p]), pair_mult[p]
        begin = int(offsets[t]) + (c - int(chunk_start[p])) * chunk
        end = min(begin + chunk, int(offsets[t + 1]))
        d = doc_ids[begin:end].astype(np.int64)
        tf = tfs[begin:end].astype(np.float32)
        arow = int(allow_row[q])
        if arow >= 0:
            keep = _bit(allow_bits[arow], d)
            d, tf = d[keep], tf[keep]
        tc = _tfc_kernel(method, tf, doc_lens[d].astype(np.float32), k1, b, delta, avgdl)
        v = idf[t] * tc + (-w0[t])
        if m != np.float32(1):
            v = v * m
        scores[q, d] += v.astype(np.float32)  # docs are unique within a term
        np.bitwise_or.at(touched[q], d >> 5, (U32(1) << (d & 31).astype(U32)))


def emu_scatter_allow_bits(docs, rows, n, bits, words_per_row):
    d = docs[:n].astype(np.int64)
    np.bitwise_or.at(bits, (rows[:n], d >> 5), U32(1) << (d & 31).astype(U32))


def emu_finalize_dense(scores, touched, row_const, n_rows, n_docs, words_per_row):
    d = np.arange(n_docs)
    for r in range(n_rows):
        hit = _bit(touched[r], d)
        scores[r] = np.where(hit, scores[r] + row_const[r], np.float32(-np.inf))


def emu_topk_rows(scores, touched, row_const, n_docs, words_per_row, doc_bits, k, kpad,
                  out_ids, out_scores, *, threads):
    assert kpad == next_pow2(k) and kpad <= 4096
    d = np.arange(n_docs)
    for r in range(scores.shape[0]):
        cand = d[_bit(touched[r], d)]
        keys = composite_key(scores[r, cand] + row_const[r], cand)
        ids, sc = emulate_topk_row(keys, int(k), int(doc_bits))
        out_ids[r], out_scores[r] = ids, sc


def emu_composite_keys(scores, touched, row_const, n_rows, n_docs, words_per_row, keys):
    d = np.arange(n_docs)
    for r in range(n_rows):
        hit = _bit(touched[r], d)
        keys[r] = np.where(hit, composite_key(scores[r] + row_const[r], d), U64(0))


def emu_decode_keys(keys, n, ids, out):
    kk = keys.reshape(-1)[:n]
    ids.reshape(-1)[:n] = np.where(kk > 0, key_doc(kk), -1)
    out.reshape(-1)[:n] = np.where(kk > 0, key_score(kk), np.float32(-np.inf))


_EMU = {
    "bm25_score": emu_bm25_score, "scatter_allow_bits": emu_scatter_allow_bits,
    "finalize_dense": emu_finalize_dense, "topk_rows": emu_topk_rows,
    "composite_keys": emu_composite_keys, "decode_keys": emu_decode_keys,
}
_SIGS = {**kernel_signatures("bm25_score.cu"), **kernel_signatures("topk.cu")}
# Static shared memory of topk_rows: hist (2048 int) + warp_sums (32 int) +
# s_prefix, s_mask (u64) + s_krem, s_done, s_count (int).
_TOPK_STATIC_SMEM = 4 * 2048 + 4 * 32 + 8 * 2 + 4 * 3


class LaunchError(AssertionError):
    pass


def check_launch(name: str, grid, block, args, shared_mem: int = 0) -> None:
    """What CuPy would pass must be exactly what the kernel signature declares."""
    base = name.split("<")[0]
    sig = _SIGS[base]
    if len(args) != len(sig):
        raise LaunchError(f"{name}: {len(args)} arguments for {len(sig)} parameters")
    for a, (pname, ty, is_ptr) in zip(args, sig):
        if is_ptr:
            if not isinstance(a, DevArray):
                raise LaunchError(f"{name}.{pname}: expected a device array, got {type(a).__name__}")
            if a.dtype != np.dtype(ty) or not a.flags.c_contiguous:
                raise LaunchError(f"{name}.{pname}: expected contiguous {np.dtype(ty)}, got {a.dtype} "
                                  f"(contiguous={a.flags.c_contiguous})")
        elif type(a) is not ty:
            raise LaunchError(f"{name}.{pname}: expected numpy.{ty.__name__}, got {type(a).__name__} "
                              "(CuPy passes Python int as int64 and float as float64)")
    assert 1 <= len(grid) <= 3 and 1 <= len(block) <= 3
    assert 1 <= grid[0] <= 2**31 - 1 and all(1 <= g <= 65535 for g in grid[1:])
    assert int(np.prod(block)) <= 1024
    tmpl = re.findall(r"\d+", name.split("<", 1)[1]) if "<" in name else []
    if base == "bm25_score":
        assert block == (int(tmpl[1]),), "bm25_score strides by its THREADS template argument"
    if base == "topk_rows":
        assert block == (int(tmpl[0]),)
        kpad = int(args[7])
        assert shared_mem == 8 * kpad
        assert shared_mem + _TOPK_STATIC_SMEM <= STATIC_SMEM_LIMIT
    else:
        assert shared_mem == 0


class FakeOOM(Exception):
    pass


def make_fake_cupy(oom_if=None):
    """A stand-in for ``cupy``: NumPy-backed arrays, the emulated kernels, a launch log."""
    cp = types.SimpleNamespace()
    cp.float32, cp.uint32, cp.int64, cp.uint64 = np.float32, np.uint32, np.int64, np.uint64
    cp.asarray = _dev
    cp.zeros = lambda shape, dtype=float: np.zeros(shape, dtype).view(DevArray)
    cp.empty = lambda shape, dtype=float: _garbage(shape, dtype)
    cp.full = lambda shape, v, dtype=float: np.full(shape, v, dtype).view(DevArray)
    cp.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(DevArray)

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    class Device:
        def __init__(self, i=0):
            self.id = i

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def synchronize(self):
            pass

    class Pool:
        def free_all_blocks(self):
            cp.freed += 1

        def free_bytes(self):
            return 0

    cp.freed = 0
    cp.cuda = types.SimpleNamespace(
        Event=Event, Device=Device, get_elapsed_time=lambda a, b: 0.0,
        memory=types.SimpleNamespace(OutOfMemoryError=FakeOOM),
        runtime=types.SimpleNamespace(memGetInfo=lambda: (8 << 30, 16 << 30),
                                      getDeviceProperties=lambda i: {"name": b"Emulated"}),
    )
    pool = Pool()
    cp.get_default_memory_pool = lambda: pool
    cp.launches = []

    def kernel(filename, name, device_id=None):
        assert name in K.NAME_EXPRESSIONS[filename], name

        def launch(grid, block, args, shared_mem=0, stream=None):
            check_launch(name, grid, block, args, shared_mem)
            cp.launches.append((name, grid, block, shared_mem))
            if oom_if is not None and oom_if(name, args):
                raise FakeOOM(f"emulated OOM in {name}")
            base = name.split("<")[0]
            tmpl = [int(x) for x in re.findall(r"\d+", name.split("<", 1)[1])] if "<" in name else []
            host = [np.asarray(a).view(np.ndarray) if isinstance(a, DevArray) else a for a in args]
            if base == "bm25_score":
                _EMU[base](tmpl[0], *host, threads=tmpl[1], per_thread=tmpl[2])
            elif base == "topk_rows":
                _EMU[base](*host, threads=tmpl[0])
            else:
                _EMU[base](*host)

        return launch

    cp.kernel = kernel
    return cp


def _garbage(shape, dtype):
    """cupy.empty: uninitialised memory (here NaN / huge values), never zeros."""
    a = np.empty(shape, dtype)
    a.view(np.uint8)[...] = 0xFF
    return a.view(DevArray)


@pytest.fixture
def fake_cupy(monkeypatch):
    def install(**kw):
        from gpuir.backends import cupy_backend as cb

        cp = make_fake_cupy(**kw)
        monkeypatch.setitem(sys.modules, "cupy", cp)
        monkeypatch.setattr(cb, "cuda_device", lambda: (True, ""))
        monkeypatch.setattr(K, "kernel", cp.kernel)
        return cp

    return install


# This module's data: term 1 in 2500 documents, queries of at most 6 terms.
HEAVY_DF, MAX_TERMS = 2500, 6


def _exact(a, b):
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(a.scores, b.scores)


@pytest.mark.parametrize("method", METHODS)
def test_scorer_host_path_with_emulated_kernels(fake_cupy, method):
    cp = fake_cupy()
    from gpuir.backends.cupy_backend import CupyScorer

    N, V = 2501, 80
    idx = random_index(N, V, seed=11, heavy_df=HEAVY_DF)
    p = BM25Params(method=method)
    ref, gpu = NumpyScorer(idx, p), CupyScorer(idx, p)
    qs = random_queries(V, 9, seed=12, max_terms=MAX_TERMS)
    rng = np.random.default_rng(13)
    allow = [None, np.zeros(0, np.int64), np.sort(rng.choice(N, 40, replace=False)), None,
             np.arange(0, N, 3), np.array([N - 1]), None, np.arange(N), None]
    for k in (1, 10, 300):
        _exact(ref.search(qs, k), gpu.search(qs, k))
        _exact(ref.search(qs, k, allow), gpu.search(qs, k, allow))
    a, b = ref.score_matrix(qs, allow), gpu.score_matrix(qs, allow)
    assert np.array_equal(a, b)
    names = {n.split("<")[0] for n, *_ in cp.launches}
    assert names == {"bm25_score", "scatter_allow_bits", "topk_rows", "finalize_dense"}


def test_sort_path_and_k_beyond_the_collection(fake_cupy):
    fake_cupy()
    from gpuir.backends.cupy_backend import CupyScorer

    idx = random_index(5003, 60, seed=21, heavy_df=HEAVY_DF)
    p = BM25Params(method="bm25+")
    ref, gpu = NumpyScorer(idx, p), CupyScorer(idx, p)
    qs = random_queries(60, 5, seed=22, max_terms=MAX_TERMS)
    for k in (4096, 4097, 6000):  # the shared-memory limit, then the sort path (k > N too)
        _exact(ref.search(qs, k), gpu.search(qs, k))


def test_oom_halves_the_chunk_then_gives_up(fake_cupy):
    # Any launch over more than 2 rows "runs out of memory".
    cp = fake_cupy(oom_if=lambda name, args: name.startswith("topk_rows") and args[0].shape[0] > 2)
    from gpuir.backends.cupy_backend import CupyScorer

    idx = random_index(1500, 40, seed=31, heavy_df=HEAVY_DF)
    ref, gpu = NumpyScorer(idx, BM25Params()), CupyScorer(idx, BM25Params())
    qs = random_queries(40, 11, seed=32, max_terms=MAX_TERMS)
    res = gpu.search(qs, 7)
    _exact(ref.search(qs, 7), res)
    assert cp.freed >= 1 and res.meta["n_chunks"] >= 6
    cp2 = fake_cupy(oom_if=lambda name, args: True)
    gpu2 = CupyScorer(idx, BM25Params())
    with pytest.raises(MemoryError, match="even one query"):
        gpu2.search(qs, 7)
    assert cp2.freed >= 1


def test_memory_budget_chunks(fake_cupy):
    fake_cupy()
    from gpuir.backends.cupy_backend import CupyScorer

    idx = random_index(3001, 50, seed=41, heavy_df=HEAVY_DF)
    per_row = CupyScorer(idx, BM25Params()).row_bytes(25)
    gpu = CupyScorer(idx, BM25Params(), memory_budget_bytes=3 * per_row)
    qs = random_queries(50, 10, seed=42, max_terms=MAX_TERMS)
    res = gpu.search(qs, 25)
    assert res.meta["rows_per_chunk"] == 3 and res.meta["n_chunks"] == 4
    _exact(NumpyScorer(idx, BM25Params()).search(qs, 25), res)


def test_launch_checker_rejects_python_scalars_and_wrong_dtypes():
    a32 = _dev(np.zeros(4, np.int32))
    f32 = _dev(np.zeros(4, np.float32))
    args = [a32, a32, np.int64(4), _dev(np.zeros(4, np.uint32)), np.int32(1)]
    check_launch("scatter_allow_bits", (1,), (256,), args)
    with pytest.raises(LaunchError, match="Python int"):
        check_launch("scatter_allow_bits", (1,), (256,), [a32, a32, 4, args[3], np.int32(1)])
    with pytest.raises(LaunchError, match="int32"):
        check_launch("scatter_allow_bits", (1,), (256,), [_dev(np.zeros(4, np.int64)), *args[1:]])
    with pytest.raises(LaunchError, match="contiguous"):
        check_launch("scatter_allow_bits", (1,), (256,), [a32, _dev(np.zeros(8, np.int32))[::2], *args[2:]])
    with pytest.raises(LaunchError, match="device array"):
        check_launch("scatter_allow_bits", (1,), (256,), [np.zeros(4, np.int32), *args[1:]])
    assert f32.dtype == np.float32
