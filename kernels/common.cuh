// kernels/common.cuh -- helpers shared by the gpuir kernels.
//
// Included textually by gpuir/backends/kernels.py (the loader replaces the
// `#include "common.cuh"` line with this file, framed by #line directives), so
// NVRTC needs no include path and CuPy's on-disk cache sees header changes.
//
// Conventions (see docs/gpu.md):
//   * No <cstdint>: NVRTC ships without the C++ standard library, so 64-bit
//     integers are spelled `long long` / `unsigned long long`.
//   * Float arithmetic uses the explicit round-to-nearest intrinsics
//     (__fadd_rn, __fmul_rn through add_rn / mul_rn below) so that no
//     multiply-add is contracted into an FMA and every operation rounds exactly
//     as NumPy's float32 does. The loader also passes --fmad=false. CuPy's
//     RawModule always appends -ftz=true (subnormals flush to zero); BM25
//     weights are never subnormal, see gpuir/backends/kernels.py.
//   * The posting weights are NOT computed here: the kernels read the float32
//     weights of gpuir/backends/weights.py (their one home), uploaded once.
//   * Helpers marked __host__ __device__ are also compiled into a host program
//     by tests/test_kernel_logic.py and checked against NumPy bit for bit.
//   * Host-emulation subset (the C++ shim of the gpu-hostemu work runs these
//     kernel bodies on the CPU): dynamic shared memory only through
//     GPUIR_EXTERN_SHARED; static __shared__ declarations at kernel-body scope
//     without initialisers; only full-mask *_sync warp intrinsics called by all
//     32 lanes of a converged warp; atomics on int / unsigned / unsigned long
//     long; no __syncthreads in divergent code; block sizes are template
//     parameters.
#pragma once

#define GPUIR_WARP 32
#define GPUIR_FULL_MASK 0xFFFFFFFFu

// Dynamic shared memory of a kernel: `GPUIR_EXTERN_SHARED(T, name);` declares
// `name` as the launch's dynamic shared buffer of T. The host test build
// (tests/cuda_host/cuda_host_shim.h) defines it first, to its own buffer.
#ifndef GPUIR_EXTERN_SHARED
#define GPUIR_EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

namespace gpuir {

// ---------------------------------------------------------------------------
// Round-to-nearest float32 operations that are never contracted into an FMA:
// the intrinsics on the device; plain float arithmetic on the host (x86-64 SSE
// rounds every float operation to float32, as NumPy does), where the host test
// program of tests/test_kernel_logic.py compiles them.
// ---------------------------------------------------------------------------
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

__host__ __device__ __forceinline__ float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
// 1 / b in double to within ~2^-52 (relative), for b > 0 a normal float: a float reciprocal
// estimate (MUFU, ~2^-21) and two Newton steps in double. No division instruction, so no
// slow-path subroutine call (whose ABI spills registers in the kernels that use it).
__host__ __device__ __forceinline__ double recip_f64(float b) {
#ifdef __CUDA_ARCH__
    const double bd = (double)b;
    double y = (double)__fdividef(1.0f, b);
    y = __fma_rn(y, __fma_rn(-bd, y, 1.0), y);
    y = __fma_rn(y, __fma_rn(-bd, y, 1.0), y);
    return y;
#else
    return 1.0 / (double)b;
#endif
}

// The correctly rounded float32 quotient a / b (= IEEE division, as NumPy's), for normal,
// non-overflowing operands -- the range of the BM25 arithmetic. A float quotient that is not a
// float itself lies at least 2^-49 (relative) away from every midpoint between two floats (its
// numerator and denominator have 24-bit significands), so rounding a double approximation
// within 2^-51 of it (recip_f64, one product) to float gives the correctly rounded quotient;
// a quotient that is a float is recovered exactly. On the host: plain division.
__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return (float)__dmul_rn((double)a, recip_f64(b));
#else
    return a / b;
#endif
}

// A posting's contribution to one query: its weight w times the query-term
// multiplicity m, the multiplication skipped when m == 1 -- exactly as the
// NumPy reference (`w if c == 1 else w * np.float32(c)`). Non-decreasing in w
// for m > 0, which the tile bounds rely on (see bm25_score.cu).
__host__ __device__ __forceinline__ float scaled(float w, float m) {
    return m != 1.0f ? mul_rn(w, m) : w;
}

// ---------------------------------------------------------------------------
// Bit casts usable on the host too.
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
// BM25 with the search's statistics applied per query (gpuir/backends/weights.py is the
// reference; its module docstring lists these operations in this order). The constants are
// float32 values the host computed as the reference does: one_minus_b = 1 - b, k1p1 = k1 + 1.
// method: 0 lucene, 1 robertson, 2 atire, 3 bm25l, 4 bm25+ (gpuir.bm25.METHODS).
// ---------------------------------------------------------------------------
#define GPUIR_BM25_PARAMS int method, float k1, float b, float one_minus_b, float k1p1, float delta, \
    float avgdl, int has_w0
#define GPUIR_BM25_ARGS method, k1, b, one_minus_b, k1p1, delta, avgdl, has_w0

__host__ __device__ __forceinline__ float bm25_weight(int tf_i, int dl_i, float idf, float w0, GPUIR_BM25_PARAMS) {
    const float tf = (float)tf_i, dl = (float)dl_i;
    const float norm = add_rn(one_minus_b, mul_rn(b, div_rn(dl, avgdl)));
    float t;
    if (method <= 1) {
        t = div_rn(tf, add_rn(mul_rn(k1, norm), tf));
    } else if (method == 2) {
        t = div_rn(mul_rn(tf, k1p1), add_rn(tf, mul_rn(k1, norm)));
    } else if (method == 3) {
        const float c = div_rn(tf, norm);
        t = div_rn(mul_rn(k1p1, add_rn(c, delta)), add_rn(add_rn(k1, c), delta));
    } else {
        t = add_rn(div_rn(mul_rn(k1p1, tf), add_rn(mul_rn(k1, norm), tf)), delta);
    }
    const float w = mul_rn(idf, t);
    return has_w0 ? sub_rn(w, w0) : w;
}

// An upper bound of the float32 weight of every posting a summary covers: summary = max tf
// (low 16 bits; 0 = no posting, 0xFFFF = 65535 or more) | min document length << 16 (capped
// below at 65535, which only raises the bound). tfc grows with tf and shrinks with the length,
// so tfc(max tf, min length) bounds the block exactly; it is evaluated in double, widened by a
// relative slack of 1e-5 and an absolute one of 1e-5 * idf * (k1 + 1 + delta) (the float32
// rounding of a weight, and the cancellation in w - w0, are far smaller), and rounded up to a
// float32 >= the smallest normal one (so -ftz=true cannot flush it). 0 for an empty summary.
// Reciprocals instead of divisions (recip_d, within ~2^-50: far inside the slack).
// Mirrors gpuir.backends.weights.weight_bound (which the host tests check against every weight).
// K1, B, D are the float32 parameters as doubles; inv_avgdl = recip_f64(avgdl), computed once.
// 1 / x in double, to within a few units of 2^-52, for 1e-30 <= x <= 1e30 (bounds only: they
// carry a 1e-5 slack). A float estimate of 1/x, two Newton steps, and one for the rounding of x
// to float in the estimate.
__host__ __device__ __forceinline__ double recip_d(double x) {
#ifdef __CUDA_ARCH__
    double y = (double)__fdividef(1.0f, (float)x);
    y = __fma_rn(y, __fma_rn(-x, y, 1.0), y);
    y = __fma_rn(y, __fma_rn(-x, y, 1.0), y);
    return __fma_rn(y, __fma_rn(-x, y, 1.0), y);
#else
    return 1.0 / x;
#endif
}

__host__ __device__ __forceinline__ float bound_of(unsigned int summ, float idf, float w0, int method, double K1,
                                                   double B, double D, double inv_avgdl, int has_w0) {
    const unsigned int mtf = summ & 0xFFFFu;
    if (mtf == 0u) return 0.0f;
    const bool unbounded = mtf == 0xFFFFu;
    const double tf = (double)mtf;
    const double norm = (1.0 - B) + B * ((double)(summ >> 16) * inv_avgdl);
    double t;
    if (method <= 1) {
        t = unbounded ? 1.0 : tf * recip_d(K1 * norm + tf);
    } else if (method == 2) {
        t = unbounded ? K1 + 1.0 : tf * (K1 + 1.0) * recip_d(tf + K1 * norm);
    } else if (method == 3) {
        const double c = tf * recip_d(norm > 1e-30 ? norm : 1e-30);
        t = unbounded ? K1 + 1.0 : (K1 + 1.0) * (c + D) * recip_d(K1 + c + D);
    } else {
        t = unbounded ? K1 + 1.0 + D : (K1 + 1.0) * tf * recip_d(K1 * norm + tf) + D;
    }
    const double I = (double)idf;
    double w = I * t - (has_w0 ? (double)w0 : 0.0);
    w = w * (1.0 + 1e-5) + 1e-5 * (I < 0.0 ? -I : I) * (K1 + 1.0 + D);
    if (!(w > 0.0)) return 0.0f;
    float f = (float)w;
    if ((double)f < w) f = bits_float(float_bits(f) + 1u);
    return f < 1.17549435e-38f ? 1.17549435e-38f : f;
}

// ---------------------------------------------------------------------------
// Order-preserving float -> uint32 map: a < b  <=>  key(a) < key(b), and
// a == b  <=>  key(a) == key(b), for all non-NaN floats, as NumPy compares them:
//   * -0.0 is mapped as +0.0 (NumPy's tie rule treats them as equal, so two
//     documents scoring -0.0 and +0.0 must be ordered by document number);
//   * NaN (never produced from a valid index) maps to 0, below every other
//     score, as NumPy's sorts put NaN last; it decodes back to a NaN.
// key(-inf) = 0x007FFFFF, so every real score has a key > 0: the key 0 means
// "no candidate" wherever a 32-bit score key is stored, and a threshold of 0
// lets everything through. The low word of a composite key (~doc, doc < 2^31)
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
__host__ __device__ __forceinline__ unsigned long long key_from_ordered(unsigned int skey, long long doc) {
    return ((unsigned long long)skey << 32) | (unsigned long long)(~(unsigned int)doc);
}

__host__ __device__ __forceinline__ unsigned long long composite_key(float score, long long doc) {
    return key_from_ordered(float_to_ordered(score), doc);
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

// First index i in [lo, hi) with a[i] >= x (hi if none); a sorted ascending.
template <typename T, typename I>
__host__ __device__ __forceinline__ I lower_bound(const T* a, I lo, I hi, T x) {
    while (lo < hi) {
        const I mid = lo + ((hi - lo) >> 1);
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// An atomic read of a word other blocks update with atomics (a plain or
// volatile load would be a data race under the host emulation).
__device__ __forceinline__ unsigned int atomic_read(unsigned int* p) { return atomicOr(p, 0u); }

// Inclusive warp scan (sum) of an int. All 32 lanes must call it.
__device__ __forceinline__ int warp_inclusive_sum(int v) {
    const int lane = threadIdx.x & (GPUIR_WARP - 1);
#pragma unroll
    for (int o = 1; o < GPUIR_WARP; o <<= 1) {
        int n = __shfl_up_sync(GPUIR_FULL_MASK, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

// Exclusive block scan (sum) of one int per thread; `warp_sums` is shared
// scratch of at least THREADS/32 ints. Every thread of the block must call it.
template <int THREADS>
__device__ __forceinline__ int block_exclusive_sum(int v, int* warp_sums, int* total) {
    static_assert(THREADS % GPUIR_WARP == 0 && THREADS / GPUIR_WARP <= GPUIR_WARP, "1..32 full warps");
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

// The histogram bin holding the krem-th largest element (1-based, counted from
// the top bin nb-1 downwards), given hist[0..nb) in shared memory. Exactly one
// thread (the owner of that bin) writes *bin = the bin, *above = the number of
// elements in higher bins and *bin_count = hist[bin]; when the histogram holds
// fewer than krem elements nobody writes (the caller presets *bin). If total is
// not null, every thread gets the histogram's total there. Every thread of the
// block must call it; it ends with a barrier, after which *bin etc. are visible.
template <int THREADS>
__device__ __forceinline__ void find_bin(const int* hist, int nb, int krem, int* warp_sums,
                                         int* bin, int* above, int* bin_count, int* total) {
    constexpr int BPT = GPUIR_RADIX_BINS / THREADS;  // bin ranks per thread
    static_assert(GPUIR_RADIX_BINS % THREADS == 0, "THREADS must divide the bin count");
    const int tid = threadIdx.x;
    int local = 0;
#pragma unroll
    for (int j = 0; j < BPT; ++j) {
        const int r = tid * BPT + j;
        if (r < nb) local += hist[nb - 1 - r];
    }
    int cum = block_exclusive_sum<THREADS>(local, warp_sums, total);
#pragma unroll
    for (int j = 0; j < BPT; ++j) {
        const int r = tid * BPT + j;
        if (r < nb) {
            const int b = nb - 1 - r;
            const int h = hist[b];
            if (cum < krem && krem <= cum + h) {  // at most one thread, one bin
                *bin = b;
                *above = cum;
                *bin_count = h;
            }
            cum += h;
        }
    }
    __syncthreads();
}

}  // namespace gpuir
