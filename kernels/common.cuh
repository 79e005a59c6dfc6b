// kernels/common.cuh -- helpers shared by the gpuir kernels.
//
// Included textually by gpuir/backends/kernels.py (the loader replaces the
// `#include "common.cuh"` line with this file, framed by #line directives), so
// NVRTC needs no include path and CuPy's on-disk cache sees header changes.
//
// Conventions (see docs/gpu.md):
//   * No <cstdint>: NVRTC ships without the C++ standard library, so 64-bit
//     integers are spelled `long long` / `unsigned long long`.
//   * BM25 arithmetic uses the explicit round-to-nearest intrinsics
//     (__fadd_rn, __fmul_rn, __fdiv_rn) so that no multiply-add is contracted
//     into an FMA and every operation rounds exactly as NumPy's float32 does.
//     The loader also passes --fmad=false.
//   * Method codes follow gpuir.bm25.METHODS:
//       0 lucene, 1 robertson, 2 atire, 3 bm25l, 4 bm25+.
#pragma once

#define GPUIR_WARP 32

namespace gpuir {

// ---------------------------------------------------------------------------
// BM25 term-frequency component, float32, as gpuir.bm25.tfc computes it:
//   norm = (1 - b) + b * (dl / avgdl)
//   lucene, robertson : tf / (k1 * norm + tf)
//   atire             : (tf * (k1 + 1)) / (tf + k1 * norm)
//   bm25l             : c = tf / norm; ((k1 + 1) * (c + delta)) / ((k1 + c) + delta)
//   bm25+             : ((k1 + 1) * tf) / (k1 * norm + tf) + delta
// ---------------------------------------------------------------------------
template <int METHOD>
__device__ __forceinline__ float tfc(float tf, float dl, float k1, float b,
                                     float delta, float avgdl) {
    const float norm = __fadd_rn(__fadd_rn(1.0f, -b), __fmul_rn(b, __fdiv_rn(dl, avgdl)));
    const float k1p1 = __fadd_rn(k1, 1.0f);
    if (METHOD == 0 || METHOD == 1) {
        return __fdiv_rn(tf, __fadd_rn(__fmul_rn(k1, norm), tf));
    } else if (METHOD == 2) {
        return __fdiv_rn(__fmul_rn(tf, k1p1), __fadd_rn(tf, __fmul_rn(k1, norm)));
    } else if (METHOD == 3) {
        const float c = __fdiv_rn(tf, norm);
        return __fdiv_rn(__fmul_rn(k1p1, __fadd_rn(c, delta)),
                         __fadd_rn(__fadd_rn(k1, c), delta));
    } else {
        return __fadd_rn(__fdiv_rn(__fmul_rn(k1p1, tf), __fadd_rn(__fmul_rn(k1, norm), tf)),
                         delta);
    }
}

// ---------------------------------------------------------------------------
// Order-preserving float <-> uint32 map: a < b  <=>  key(a) < key(b) for all
// non-NaN floats (-0.0 sorts just below +0.0). key(-inf) = 0x007FFFFF > 0, so a
// 64-bit composite key of 0 is below every real candidate: it is the sentinel.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned int float_to_ordered(float f) {
    unsigned int u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float ordered_to_float(unsigned int k) {
    unsigned int u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
    return __uint_as_float(u);
}

// Composite key: score in the high word, the bit-inverted document number in
// the low word. Larger key = better under the tie rule (score desc, doc asc),
// and keys of distinct documents are distinct.
__device__ __forceinline__ unsigned long long composite_key(float score, long long doc) {
    return ((unsigned long long)float_to_ordered(score) << 32) |
           (unsigned long long)(~(unsigned int)doc);
}

__device__ __forceinline__ long long key_doc(unsigned long long key) {
    return (long long)(~(unsigned int)(key & 0xFFFFFFFFull));
}

__device__ __forceinline__ float key_score(unsigned long long key) {
    return ordered_to_float((unsigned int)(key >> 32));
}

// Bit test in a row-major bitmap of 32-bit words (bit j of word w = doc 32w+j).
__device__ __forceinline__ bool test_bit(const unsigned int* row, long long d) {
    return (row[d >> 5] >> (d & 31)) & 1u;
}

// Inclusive warp scan (sum) of an int.
__device__ __forceinline__ int warp_inclusive_sum(int v) {
    const int lane = threadIdx.x & (GPUIR_WARP - 1);
#pragma unroll
    for (int o = 1; o < GPUIR_WARP; o <<= 1) {
        int n = __shfl_up_sync(0xFFFFFFFFu, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

// Exclusive block scan (sum) of one int per thread; `warp_sums` is shared
// scratch of at least THREADS/32 ints. Every thread of the block must call it.
template <int THREADS>
__device__ __forceinline__ int block_exclusive_sum(int v, int* warp_sums, int* total) {
    const int lane = threadIdx.x & (GPUIR_WARP - 1);
    const int warp = threadIdx.x / GPUIR_WARP;
    const int inc = warp_inclusive_sum(v);
    if (lane == GPUIR_WARP - 1) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int s = (lane < THREADS / GPUIR_WARP) ? warp_sums[lane] : 0;
        s = warp_inclusive_sum(s);
        if (lane < THREADS / GPUIR_WARP) warp_sums[lane] = s;
    }
    __syncthreads();
    const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + inc - v;
    if (total) *total = warp_sums[THREADS / GPUIR_WARP - 1];
    __syncthreads();
    return before;
}

}  // namespace gpuir
