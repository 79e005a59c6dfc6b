// kernels/topk.cu -- the final selection: exact top-k of each row's candidates.
//
// Input: the candidates bm25_score.cu emitted, as 64-bit composite keys
//     key = ordered(score) << 32 | ~doc          (common.cuh: composite_key)
// in row r's slots cand[cand_off[r] .. cand_off[r+1]), of which the first
// min(counts[r], capacity) are written, and the row's final threshold
// theta[r] (an ordered score key, a lower bound of the row's k-th best score).
// A key is valid when it is not the sentinel 0 and its score word is >=
// theta[r]; every document of the row's true top k has a valid key (see the
// exactness argument in bm25_score.cu), and a larger key is better under the
// tie rule (score desc, doc asc). Keys of distinct documents are distinct, so
// "top-k under the tie rule" is exactly "the k largest valid keys".
//
// select_topk: one block per (row, segment) (grid = rows x segs)
// ---------------------------------------------------------------
// With segs = 1 a block selects a whole row. With segs > 1 (a batch smaller
// than the number of SMs, rows with many candidates) block b takes segment
// b % segs of row b / segs -- an equal share of the row's written slots -- and
// writes its segment's top k as raw keys (raw_keys = 1: the key bits into
// out_ids, sentinels 0); a second launch with segs = 1 over those rows x segs x
// k keys selects the row's top k. Exact: each segment's top k holds every
// document of the row's top k that lies in the segment.
// 1. Radix select of the k-th largest valid key, 11-bit digits, a 2048-bin
//    shared histogram (schedule: common.cuh radix_digit): three passes over
//    the score word (bits 63..53, 52..42, 41..32), then -- only when equal
//    scores straddle the k-th place -- passes over the ceil(log2 N) document
//    bits. It stops as soon as the chosen bin holds exactly the keys still
//    needed; a row with at most k valid keys takes them all after one pass.
// 2. Gather the selected keys (exactly min(k, valid)) into a shared buffer of
//    kpad = next_pow2(k) slots, every slot set to the sentinel 0 (id -1, score
//    -inf) BEFORE the barrier that precedes any read.
// 3. Bitonic sort (descending) in shared memory; write the first k.
// Cost per row with C candidates: about 4 passes over 8C bytes plus an
// O(kpad log^2 kpad) shared sort. Shared memory: 8 KiB histogram + 8 kpad
// bytes (dynamic, GPUIR_EXTERN_SHARED), so k <= 4096.
//
// k > 4096: pack_candidates copies each row's valid keys (others 0) into a
// dense (rows, width) matrix; the host sorts it row-wise on the device and
// decode_keys turns the first k keys into (doc, score).
//
// Instantiations (name_expressions): select_topk<512>, pack_candidates<256>, decode_keys.
#include "common.cuh"

template <int THREADS>
__global__ void __launch_bounds__(THREADS) select_topk(
    const unsigned long long* __restrict__ cand,  // composite keys
    const long long* __restrict__ cand_off,       // (R+1,) int64
    const int* __restrict__ counts,               // (R,) int32: keys written (may exceed capacity)
    const unsigned int* __restrict__ theta,       // (R,) uint32 ordered-score thresholds
    int doc_bits,                                 // ceil(log2 N), >= 1
    int k, int kpad,                              // kpad = next_pow2(k) <= 4096
    int segs,                                     // blocks per row (>= 1)
    int raw_keys,                                 // 1: write keys (as int64 bits) to out_ids only
    long long* __restrict__ out_ids,              // (R * segs, k) int64: ids, or keys
    float* __restrict__ out_scores) {             // (R * segs, k) float32 (unused when raw_keys)
    GPUIR_EXTERN_SHARED(unsigned long long, sbuf);  // (kpad,) composite keys
    __shared__ int hist[GPUIR_RADIX_BINS];
    __shared__ int warp_sums[GPUIR_WARP];
    __shared__ int s_bin, s_above, s_binc, s_count;

    const int tid = threadIdx.x;
    const long long ob = blockIdx.x;  // output row
    const long long r = ob / segs;
    const long long c0 = cand_off[r], cap = cand_off[r + 1] - c0;
    long long n = counts[r];
    if (n > cap) n = cap;
    if (n < 0) n = 0;
    const long long seg_len = (n + segs - 1) / segs;
    long long s0 = (ob % segs) * seg_len;
    if (s0 > n) s0 = n;
    n = n - s0 < seg_len ? n - s0 : seg_len;
    const unsigned int th = theta[r];
    const unsigned long long* row = cand + c0 + s0;

    // Every slot of the sort buffer holds the sentinel before anything reads it.
    for (int i = tid; i < kpad; i += THREADS) sbuf[i] = 0ull;
    if (tid == 0) s_count = 0;

    unsigned long long prefix = 0ull, mask = 0ull;
    int krem = k;
    const int n_passes = gpuir::radix_passes(doc_bits);
    for (int pass = 0; pass < n_passes; ++pass) {
        int shift, width;
        gpuir::radix_digit(pass, doc_bits, &shift, &width);
        const int nb = 1 << width;
        const unsigned long long dmask = (unsigned long long)(nb - 1);
        for (int i = tid; i < GPUIR_RADIX_BINS; i += THREADS) hist[i] = 0;
        __syncthreads();
        for (long long i = tid; i < n; i += THREADS) {
            const unsigned long long key = row[i];
            if (key != 0ull && (unsigned int)(key >> 32) >= th && (key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & dmask], 1);
        }
        __syncthreads();
        int total;
        gpuir::find_bin<THREADS>(hist, nb, krem, warp_sums, &s_bin, &s_above, &s_binc, &total);
        if (pass == 0 && total <= krem) break;  // at most k valid keys: take them all (prefix = mask = 0)
        prefix |= (unsigned long long)s_bin << shift;
        mask |= dmask << shift;
        krem -= s_above;
        if (s_binc == krem) break;  // the chosen bin holds exactly the keys still needed
    }  // uniform: every thread computed the same prefix, mask, krem

    // Gather exactly min(k, #valid) keys.
    for (long long i = tid; i < n; i += THREADS) {
        const unsigned long long key = row[i];
        if (key != 0ull && (unsigned int)(key >> 32) >= th && (key & mask) >= prefix) {
            const int slot = atomicAdd(&s_count, 1);
            if (slot < kpad) sbuf[slot] = key;  // slot < k always; guard anyway
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
        if (raw_keys) {
            out_ids[ob * k + i] = (long long)key;
        } else {
            out_ids[ob * k + i] = key ? gpuir::key_doc(key) : -1ll;
            out_scores[ob * k + i] = key ? gpuir::key_score(key) : __int_as_float(0xff800000);
        }
    }
}

// k > 4096: row r's valid keys into out[r, 0 .. width) (out zeroed by the
// caller, width >= every row's capacity). Grid (x blocks, rows).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) pack_candidates(
    const unsigned long long* __restrict__ cand,  // composite keys
    const long long* __restrict__ cand_off,       // (R+1,) int64
    const int* __restrict__ counts,               // (R,) int32
    const unsigned int* __restrict__ theta,       // (R,) uint32
    long long width,
    unsigned long long* __restrict__ out) {       // (R, width) uint64
    const long long r = blockIdx.y;
    const long long c0 = cand_off[r], cap = cand_off[r + 1] - c0;
    long long n = counts[r];
    if (n > cap) n = cap;
    const unsigned int th = theta[r];
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n; i += (long long)gridDim.x * THREADS) {
        const unsigned long long key = cand[c0 + i];
        out[r * width + i] = (key != 0ull && (unsigned int)(key >> 32) >= th) ? key : 0ull;
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
