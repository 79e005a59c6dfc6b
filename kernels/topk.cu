// kernels/topk.cu -- per-query top-k over dense score rows, by radix select.
//
// Algorithm (topk_rows: one thread block per query row)
// -----------------------------------------------------
// Every candidate document d (its bit set in the `touched` bitmap, see
// bm25_score.cu) gets a 64-bit composite key
//     key = ordered(score) << 32 | ~d        (common.cuh: composite_key)
// where score = scores[b, d] + row_const[b]. A larger key is better under the
// tie rule (higher score first, then lower document number) and keys of
// different documents differ, so "top-k under the tie rule" is exactly "the k
// largest keys" and there are no ties left to break.
//
// 1. Radix select finds the k-th largest key digit by digit (11-bit digits,
//    2048-bin shared-memory histogram; schedule: radix_digit in common.cuh):
//    three passes over the score word (bits 63..53, 52..42, 41..32), then --
//    only when documents with equal scores straddle the k-th place -- passes
//    over the ceil(log2 N) document bits. Each pass histograms the keys that still match the prefix chosen
//    so far; a block-wide scan over the bins (largest first) picks the bin that
//    holds the k-th key. It stops as soon as the chosen bin holds exactly the
//    number of keys still needed, so ties at the boundary cost extra passes
//    only when they occur. A row with at most k candidates takes them all
//    after the first pass.
// 2. Gather: every candidate whose key, masked to the resolved bits, is >= the
//    selected prefix goes to a shared-memory buffer of kpad = next_pow2(k)
//    slots through a shared atomic counter: exactly min(k, #candidates) keys.
//    All kpad slots are set to the sentinel 0 (id -1, score -inf) BEFORE the
//    pass that reads them (a stale slot from another row can never appear).
// 3. Bitonic sort of the kpad keys (descending) in shared memory; the first k
//    are written out as (doc, score), sentinels as (-1, -inf).
//
// Passes read the row warp by warp: a warp reads one 32-bit touched word and,
// if it is non-zero, the 32 scores it covers (coalesced). Untouched documents
// cost 1/32 of a word read per pass and are never histogrammed.
//
// Cost per row with N documents, C candidates: passes P = 3 (+ ceil(log2 N / 11)
// only with boundary ties, + 1 gather); memory traffic P * (N/8 + 4C) bytes,
// shared atomics P * C, sort O(kpad log^2 kpad) shared-memory compare-swaps.
// Compared with a serial merge (O(C * k) per row) or a full sort (O(N log N)),
// this is linear in N with a small constant. Shared memory: 8 KiB histogram +
// 8 * kpad bytes, so k <= 4096 (kpad <= 4096 -> 40 KiB < 48 KiB).
//
// Known limit: one block per row, so a batch with fewer rows than SMs leaves
// SMs idle (B = 1 runs on one SM). For k > 4096 the host uses the slow path
// composite_keys + a device sort per row + decode_keys.
//
// Instantiations (name_expressions): topk_rows<512>, composite_keys, decode_keys.
#include "common.cuh"

template <int THREADS>
__global__ void __launch_bounds__(THREADS) topk_rows(
    const float* __restrict__ scores,           // (B, N) float32, raw sums
    const unsigned int* __restrict__ touched,   // (B, W) uint32 candidate bitmap
    const float* __restrict__ row_const,        // (B,) float32, added to every candidate
    long long n_docs, int words_per_row,
    int doc_bits,                               // ceil(log2 N), >= 1
    int k, int kpad,                            // kpad = next_pow2(k) <= 4096
    long long* __restrict__ out_ids,            // (B, k) int64
    float* __restrict__ out_scores) {           // (B, k) float32
    GPUIR_EXTERN_SHARED(unsigned long long, sbuf);  // (kpad,) composite keys
    __shared__ int hist[GPUIR_RADIX_BINS];
    __shared__ int warp_sums[GPUIR_WARP];
    __shared__ unsigned long long s_prefix, s_mask;
    __shared__ int s_krem, s_done, s_count;

    constexpr int NWARPS = THREADS / GPUIR_WARP;
    constexpr int BPT = GPUIR_RADIX_BINS / THREADS;  // bins per thread in the scan
    static_assert(GPUIR_RADIX_BINS % THREADS == 0, "THREADS must divide the bin count");

    const int tid = threadIdx.x, lane = tid & (GPUIR_WARP - 1), warp = tid / GPUIR_WARP;
    const long long row = blockIdx.x;
    const float* srow = scores + row * n_docs;
    const unsigned int* trow = touched + row * words_per_row;
    const float c = row_const[row];

    // Every slot of the sort buffer holds the sentinel before anything reads it.
    for (int i = tid; i < kpad; i += THREADS) sbuf[i] = 0ull;
    if (tid == 0) {
        s_prefix = 0ull;
        s_mask = 0ull;
        s_krem = k;
        s_done = 0;
        s_count = 0;
    }
    __syncthreads();

    // Digit schedule: gpuir::radix_digit (common.cuh), checked on the host by
    // tests/test_kernel_logic.py (every key bit that varies is covered once).
    const int n_passes = gpuir::radix_passes(doc_bits);
    for (int pass = 0; pass < n_passes; ++pass) {
        if (s_done) break;  // uniform: written before the last __syncthreads
        int shift, width;
        gpuir::radix_digit(pass, doc_bits, &shift, &width);
        const int nb = 1 << width;
        const unsigned long long digit_mask = (unsigned long long)(nb - 1);
        const unsigned long long prefix = s_prefix, mask = s_mask;
        const int krem = s_krem;
        for (int i = tid; i < GPUIR_RADIX_BINS; i += THREADS) hist[i] = 0;
        __syncthreads();

        for (int w = warp; w < words_per_row; w += NWARPS) {
            const unsigned int bits = trow[w];
            if (bits == 0u) continue;  // warp-uniform skip of 32 untouched docs
            if ((bits >> lane) & 1u) {
                const long long d = (long long)w * 32 + lane;
                const unsigned long long key = gpuir::composite_key(__fadd_rn(srow[d], c), d);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & digit_mask], 1);
            }
        }
        __syncthreads();

        // Thread t owns bin ranks t*BPT .. t*BPT+BPT-1 counted from the top bin.
        int local = 0;
#pragma unroll
        for (int j = 0; j < BPT; ++j) {
            const int r = tid * BPT + j;
            if (r < nb) local += hist[nb - 1 - r];
        }
        int total;
        int cum = gpuir::block_exclusive_sum<THREADS>(local, warp_sums, &total);
        if (pass == 0 && total <= krem) {
            // At most k candidates: take them all (prefix = mask = 0 selects all).
            break;  // uniform: every thread saw the same total
        }
#pragma unroll
        for (int j = 0; j < BPT; ++j) {
            const int r = tid * BPT + j;
            if (r < nb) {
                const int bin = nb - 1 - r;
                const int h = hist[bin];
                if (cum < krem && krem <= cum + h) {  // exactly one thread, one bin
                    s_prefix = prefix | ((unsigned long long)bin << shift);
                    s_mask = mask | (digit_mask << shift);
                    s_krem = krem - cum;
                    if (h == krem - cum) s_done = 1;
                }
                cum += h;
            }
        }
        __syncthreads();
    }
    __syncthreads();

    // Gather exactly min(k, #candidates) keys.
    {
        const unsigned long long prefix = s_prefix, mask = s_mask;
        for (int w = warp; w < words_per_row; w += NWARPS) {
            const unsigned int bits = trow[w];
            if (bits == 0u) continue;
            if ((bits >> lane) & 1u) {
                const long long d = (long long)w * 32 + lane;
                const unsigned long long key = gpuir::composite_key(__fadd_rn(srow[d], c), d);
                if ((key & mask) >= prefix) {
                    const int slot = atomicAdd(&s_count, 1);
                    if (slot < kpad) sbuf[slot] = key;  // slot < kpad always; guard anyway
                }
            }
        }
    }
    __syncthreads();

    // Bitonic sort, descending.
    for (int size = 2; size <= kpad; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < (kpad >> 1); i += THREADS) {
                const int lo = 2 * i - (i & (stride - 1));
                const int hi = lo + stride;
                const bool desc = (lo & size) == 0;
                const unsigned long long a = sbuf[lo], b = sbuf[hi];
                if ((a < b) == desc) {
                    sbuf[lo] = b;
                    sbuf[hi] = a;
                }
            }
            __syncthreads();
        }
    }

    for (int i = tid; i < k; i += THREADS) {
        const unsigned long long key = sbuf[i];
        out_ids[row * k + i] = key ? gpuir::key_doc(key) : -1ll;
        out_scores[row * k + i] = key ? gpuir::key_score(key) : __int_as_float(0xff800000);
    }
}

// Slow path for k > 4096: composite keys of every (row, doc), 0 for
// non-candidates; the host sorts each row on the device and decodes the top k.
__global__ void composite_keys(const float* __restrict__ scores,           // (B, N) float32
                               const unsigned int* __restrict__ touched,   // (B, W) uint32
                               const float* __restrict__ row_const,        // (B,) float32
                               int n_rows, long long n_docs, int words_per_row,
                               unsigned long long* __restrict__ keys) {    // (B, N) uint64
    const long long total = (long long)n_rows * n_docs;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / n_docs;
        const long long d = i - r * n_docs;
        keys[i] = gpuir::test_bit(touched + r * words_per_row, d)
                      ? gpuir::composite_key(__fadd_rn(scores[i], row_const[r]), d)
                      : 0ull;
    }
}

// Keys -> (doc, score); the sentinel 0 -> (-1, -inf).
__global__ void decode_keys(const unsigned long long* __restrict__ keys,  // (n,) uint64
                            long long n,
                            long long* __restrict__ ids,                  // (n,) int64
                            float* __restrict__ out) {                    // (n,) float32
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const unsigned long long key = keys[i];
        ids[i] = key ? gpuir::key_doc(key) : -1ll;
        out[i] = key ? gpuir::key_score(key) : __int_as_float(0xff800000);
    }
}
