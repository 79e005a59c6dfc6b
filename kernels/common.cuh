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
//     (__fadd_rn, __fmul_rn, __fdiv_rn, through add_rn/mul_rn/div_rn below) so
//     that no multiply-add is contracted into an FMA and every operation rounds
//     exactly as NumPy's float32 does. The loader also passes --fmad=false.
//     CuPy's RawModule always appends -ftz=true (subnormals flush to zero);
//     BM25 values are never subnormal, see gpuir/backends/kernels.py.
//   * Helpers marked __host__ __device__ are also compiled into a host program
//     by tests/test_kernel_logic.py and checked against NumPy bit for bit.
//   * Method codes follow gpuir.bm25.METHODS:
//       0 lucene, 1 robertson, 2 atire, 3 bm25l, 4 bm25+.
#pragma once

#define GPUIR_WARP 32

// Dynamic shared memory of a kernel: `GPUIR_EXTERN_SHARED(T, name);` declares
// `name` as the launch's dynamic shared buffer of T. The host test build
// (tests/cuda_host/cuda_host_shim.h) defines it first, to its own buffer.
#ifndef GPUIR_EXTERN_SHARED
#define GPUIR_EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

namespace gpuir {

// ---------------------------------------------------------------------------
// BM25 term-frequency component, float32, as gpuir.bm25.tfc computes it:
//   norm = (1 - b) + b * (dl / avgdl)
//   lucene, robertson : tf / (k1 * norm + tf)
//   atire             : (tf * (k1 + 1)) / (tf + k1 * norm)
//   bm25l             : c = tf / norm; ((k1 + 1) * (c + delta)) / ((k1 + c) + delta)
//   bm25+             : ((k1 + 1) * tf) / (k1 * norm + tf) + delta
// ---------------------------------------------------------------------------
// Round-to-nearest float32 operations that are never contracted into an FMA:
// the intrinsics on the device; plain float arithmetic on the host (x86-64 SSE
// rounds every float operation to float32, as NumPy does), where the host test
// program of tests/test_kernel_logic.py compiles them.
__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

template <int METHOD>
__host__ __device__ __forceinline__ float tfc(float tf, float dl, float k1, float b,
                                              float delta, float avgdl) {
    const float norm = add_rn(add_rn(1.0f, -b), mul_rn(b, div_rn(dl, avgdl)));
    const float k1p1 = add_rn(k1, 1.0f);
    if (METHOD == 0 || METHOD == 1) {
        return div_rn(tf, add_rn(mul_rn(k1, norm), tf));
    } else if (METHOD == 2) {
        return div_rn(mul_rn(tf, k1p1), add_rn(tf, mul_rn(k1, norm)));
    } else if (METHOD == 3) {
        const float c = div_rn(tf, norm);
        return div_rn(mul_rn(k1p1, add_rn(c, delta)), add_rn(add_rn(k1, c), delta));
    } else {
        return add_rn(div_rn(mul_rn(k1p1, tf), add_rn(mul_rn(k1, norm), tf)), delta);
    }
}

// A posting's contribution: (idf * tfc - w0) * m, the multiplication by the
// query-term multiplicity m skipped when m == 1 (as the NumPy reference does).
__host__ __device__ __forceinline__ float posting_weight(float idf, float tc, float w0, float m) {
    const float v = add_rn(mul_rn(idf, tc), -w0);
    return m != 1.0f ? mul_rn(v, m) : v;
}

// ---------------------------------------------------------------------------
// Bit casts usable on the host too (tests/test_kernel_logic.py compiles these
// helpers into a host program with nvcc and checks them against NumPy).
// ---------------------------------------------------------------------------
__host__ __device__ __forceinline__ unsigned int float_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    unsigned int u;
    __builtin_memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

__host__ __device__ __forceinline__ float bits_float(unsigned int u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

// ---------------------------------------------------------------------------
// Order-preserving float -> uint32 map: a < b  <=>  key(a) < key(b), and
// a == b  <=>  key(a) == key(b), for all non-NaN floats, as NumPy compares them:
//   * -0.0 is mapped as +0.0 (NumPy's tie rule treats them as equal, so two
//     documents scoring -0.0 and +0.0 must be ordered by document number);
//   * NaN (never produced from a valid index) maps to 0, below every other
//     score, as NumPy's sorts put NaN last; it decodes back to a NaN.
// key(-inf) = 0x007FFFFF and the low word of a composite key (~doc, doc < 2^31)
// is >= 2^31, so every candidate's 64-bit key is > 0: 0 is the sentinel.
// ---------------------------------------------------------------------------
__host__ __device__ __forceinline__ unsigned int float_to_ordered(float f) {
    unsigned int u = float_bits(f);
    if (u == 0x80000000u) u = 0u;                            // -0.0 -> +0.0
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0u;          // NaN -> lowest
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__host__ __device__ __forceinline__ float ordered_to_float(unsigned int k) {
    unsigned int u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
    return bits_float(u);
}

// Composite key: score in the high word, the bit-inverted document number in
// the low word. Larger key = better under the tie rule (score desc, doc asc),
// and keys of distinct documents are distinct. Requires 0 <= doc < 2^31.
__host__ __device__ __forceinline__ unsigned long long composite_key(float score, long long doc) {
    return ((unsigned long long)float_to_ordered(score) << 32) |
           (unsigned long long)(~(unsigned int)doc);
}

__host__ __device__ __forceinline__ long long key_doc(unsigned long long key) {
    return (long long)(~(unsigned int)(key & 0xFFFFFFFFull));
}

__host__ __device__ __forceinline__ float key_score(unsigned long long key) {
    return ordered_to_float((unsigned int)(key >> 32));
}

// ---------------------------------------------------------------------------
// Radix-select digit schedule over a composite key (topk.cu): pass p covers
// key bits [shift, shift + width).
//   passes 0, 1, 2: the score word, bits 63..53, 52..42, 41..32 (11 + 11 + 10);
//   passes 3, 4, ...: the low doc_bits bits of ~doc, 11 at a time from the top
//   (bits doc_bits..31 of ~doc are 1 for every doc < 2^doc_bits: constant).
// Every bit of [32, 64) and [0, doc_bits) is covered exactly once.
// ---------------------------------------------------------------------------
#define GPUIR_RADIX_BITS 11
#define GPUIR_RADIX_BINS (1 << GPUIR_RADIX_BITS)

__host__ __device__ __forceinline__ int radix_passes(int doc_bits) {
    return 3 + (doc_bits + GPUIR_RADIX_BITS - 1) / GPUIR_RADIX_BITS;
}

__host__ __device__ __forceinline__ void radix_digit(int pass, int doc_bits, int* shift, int* width) {
    if (pass < 2) {
        *shift = 64 - GPUIR_RADIX_BITS * (pass + 1);  // 53, 42
        *width = GPUIR_RADIX_BITS;
    } else if (pass == 2) {
        *shift = 32;                                   // the 10 bits left of the score word
        *width = 64 - 2 * GPUIR_RADIX_BITS - 32;
    } else {
        const int top = doc_bits - GPUIR_RADIX_BITS * (pass - 3);
        *shift = top > GPUIR_RADIX_BITS ? top - GPUIR_RADIX_BITS : 0;
        *width = top - *shift;
    }
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
