// kernels/bm25_score.cu -- fused document-tile BM25 scoring with candidate
// emission, dense rows for parity, and haystack (forward-layout) scoring.
//
// Data (device, uploaded once per scorer by gpuir/backends/cupy_backend.py)
// --------------------------------------------------------------------------
//   offsets (V+1,) int64, doc_ids (P,) int32   the CSR posting lists, doc-sorted
//   weights (P,) float32                       posting weights (backends/weights.py)
//   term_ub (V,) float32                       max(0, largest weight of term t)
//   dir_row (V,) int32                         row of t in the block-max directory, -1 if none
//   dir_start (H, n_tiles+1) int32             first posting of tile j, relative to offsets[t]
//   dir_max (H, n_tiles) float32               max(0, largest weight of t in tile j)
// Tile j holds documents [j*TILE, (j+1)*TILE). Terms with many postings (the
// long lists that dominate the work) get a directory row: their sub-range in a
// tile is two loads. Other terms find it by binary search in doc_ids (their
// lists are short) and are bounded by term_ub when the sub-range is not empty.
//
// Batch (per call): a row q has distinct terms qt_term[qt_off[q]..qt_off[q+1])
// in ascending term id with multiplicities qt_mult (float32), a row constant
// row_const[q] (sum of the absent-term weights, bm25l/bm25+, added when has_w0)
// and optionally a sorted allow-list allow_docs[allow_off[q]..allow_off[q+1]).
//
// Exact summation order (= the NumPy reference, gpuir/backends/numpy_backend.py)
// ------------------------------------------------------------------------------
// A document's score starts from 0.0f; the query's terms are added in
// ascending term id, one float32 add each (__fadd_rn), the contribution being
// w or w * float32(m) (common.cuh: scaled); then, for bm25l/bm25+ only, the
// float32 row constant is added once. tile_score/tile_dense accumulate a tile
// in shared memory ONE TERM PER ROUND, rounds separated by __syncthreads: a
// term's posting list holds each document at most once, so in a round every
// accumulator slot is written by at most one thread. No atomics are needed,
// there is no race, and the order of adds per document is the term order: the
// sums are bit for bit the reference's, the same on every run.
//
// tile_score: grid (S stripes, query groups), THREADS threads
// -----------------------------------------------------------
// Block (s, g) takes the rows q of group g one after the other and, for each,
// the tiles j = s, s + S, s + 2S, ... For (q, j):
//   1. Filter: the tile's part of the allow-list (two binary searches) becomes
//      a shared bitmask; an empty part skips the tile.
//   2. Bound: each query term's posting sub-range in the tile and its block max
//      b_t = max(0, max weight of t in tile j); the tile bound is
//        U = ((0 + scaled(b_t1)) + scaled(b_t2)) + ... [+ row constant]
//      in float32, in the same order as a score. Float32 addition and
//      multiplication by m > 0 are monotone (round-to-nearest is
//      non-decreasing) and b_t >= 0 covers a term absent from the document, so
//      by induction over the terms every score in the tile is <= U, exactly,
//      with no slack. The tile is skipped when key(U) < theta[q] (strictly).
//   3. Accumulate the rounds (above); untouched slots keep a NaN marker, so a
//      document whose sum is exactly 0 is still a candidate.
//   4. Thresholds. theta[q] is a running LOWER BOUND of the final k-th best
//      score of q, as an ordered key (common.cuh), raised with atomicMax:
//        * tile bound: when the tile has >= k candidates, two histogram passes
//          (key bits 31..21, then 20..10 inside the chosen bin) find a value L
//          with at least k of the tile's candidates >= L;
//        * block bound: the block keeps a histogram (bits 31..21) of every
//          candidate it has scored for q; the lower edge R of the bin where
//          the count from the top reaches k has >= k candidates above it.
//      Both count real documents with their final scores, so the k-th best
//      score of q over the whole collection is >= L and >= R: publishing them
//      keeps theta a lower bound.
//   5. Emit every candidate whose key is >= max(L, R, theta[q]) -- ties
//      included -- into q's candidate slots (composite keys, warp-aggregated
//      atomicAdd on counts[q]); counts[q] keeps counting past the capacity.
// Exactness: let s_k be q's true k-th best score and T its true top k (the
// tie rule breaks ties at s_k by document number). Every d in T has
// score(d) >= s_k >= theta (at any time) and >= L, R of its tile and block;
// its tile is never skipped (U >= score(d) >= s_k >= theta); so d is emitted.
// A skipped tile or a not-emitted document scores < s_k, or is at s_k only
// through a tie at key level that is still emitted. Hence the emitted set
// contains T, and the exact selection (topk.cu: select_topk) over it returns T.
// If counts[q] exceeds the capacity, the host reruns q with theta[q] set to
// the value this run ended with: every document >= it was emitted by this run
// (its tile was not skipped and every threshold it met was <= the final
// theta), so the rerun emits at most counts[q] keys and fits a buffer of that
// size (cupy_backend.CupyScorer._run_tiles).
//
// tile_dense: grid (tiles, rows): steps 1 and 3 for every tile, then the final
// scores (or -inf) into a dense (rows, N) float32 array, for score_matrix.
//
// haystack_score: one thread per (row, allowed document) of the rows on the
// haystack path: merges the document's forward list (its terms ascending with
// their posting weights: fwd_off (N+1,) int64, fwd_terms (P,) int32,
// fwd_weights (P,) float32) with the query's terms by binary search, adding in
// ascending term id. Costs O(allowed documents x query terms x log), not
// O(postings of the query terms). Writes one composite key per allowed
// document (0 = no query term), so candidates never overflow.
//
// Registers (tile_score): no spill, no stack, with CUDA 12 and 13
// -----------------------------------------------------------------
// ptxas 13.1+ sizes tile_score's registers for the blocks per SM its static
// shared memory allows (~37.5 KB: 6 blocks of 256 threads on sm_90, so <= 40
// registers) and spilled to local memory to get there (40 registers, 28 B of
// spill stores, 72 B of spill loads; ptxas 12.9 and 13.0 took 48). The
// register peak was thread 0's serial bound sum (unrolled and vectorised by
// the compiler), with about 20 registers live across the whole tile loop:
// the row's values and the 64-bit addresses the compiler hoisted from q
// (theta + q, counts + q, tiles_scored + q, cand + c0). So:
//   * the row's values (q, t0, nt, filtered, row constant, candidate slots)
//     live in shared memory, written by thread 0 at the row's start and read
//     where used, after a barrier, so nothing about the row is hoisted;
//   * term_ranges scales each term's block max by its multiplicity (in
//     parallel), and thread 0's sum over the terms is not unrolled;
//   * the posting loop of accumulate_tile is unrolled twice, not four times.
// The peak is then ~30 live registers on sm_90 (35 allocated: 7 blocks by
// registers, 6 by shared memory) and ~33 on sm_80 (39), with every NVRTC
// 12.9 and 13.0-13.5 and nvcc 13.0 (docs/gpu.md has the table). The order of
// the float32 additions is unchanged. tests/test_kernels_compile.py fails if
// any instantiation spills with either NVRTC.
//
// Instantiations (name_expressions, gpuir/backends/kernels.py):
//   tile_score<256, 4096>, tile_dense<256, 4096>, haystack_score<256>
#include "common.cuh"

#define GPUIR_ROW_FILTERED 1   // row_flags: the row has an allow-list
#define GPUIR_ROW_OFF_TILES 2  // row_flags: the row is not scored by tile_score
#define GPUIR_EMPTY_SLOT 0x7FC00001u  // accumulator marker: a NaN no sum produces

namespace gpuir {

// Posting sub-ranges of the terms qt_term[tb .. tb+n) of a row in tile j
// (documents [base, end)), one term per thread, into s_lo / s_len / s_bnd.
template <int THREADS>
__device__ __forceinline__ void term_ranges(
    const long long* __restrict__ offsets, const int* __restrict__ doc_ids,
    const float* __restrict__ term_ub, const int* __restrict__ dir_row,
    const int* __restrict__ dir_start, const float* __restrict__ dir_max, int n_tiles,
    const int* __restrict__ qt_term, const float* __restrict__ qt_mult, int tb, int n, long long j, int base,
    int end, long long* s_lo, int* s_len, float* s_bnd) {
    const int i = threadIdx.x;
    if (i < n) {
        const int t = qt_term[tb + i];
        const long long o0 = offsets[t], o1 = offsets[t + 1];
        const int r = dir_row[t];
        long long lo, hi;
        float bm;
        if (r >= 0) {
            const int* st = dir_start + (long long)r * (n_tiles + 1);
            lo = o0 + st[j];
            hi = o0 + st[j + 1];
            bm = dir_max[(long long)r * n_tiles + j];
        } else {
            lo = lower_bound(doc_ids, o0, o1, base);
            hi = lower_bound(doc_ids, lo, o1, end);
            bm = hi > lo ? term_ub[t] : 0.0f;
        }
        s_lo[i] = lo;
        s_len[i] = (int)(hi - lo);
        s_bnd[i] = scaled(bm, qt_mult[tb + i]);
    }
}

// Step 1: the tile's allowed documents as a bitmask (TILE/32 words). Returns
// false (uniformly) when none is allowed. Starts and ends with a barrier.
template <int THREADS, int TILE>
__device__ __forceinline__ bool load_allow(const long long* __restrict__ allow_off,
                                           const int* __restrict__ allow_docs, int q, int base, int end,
                                           unsigned int* s_allow, long long* s_range) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const long long a0 = lower_bound(allow_docs, allow_off[q], allow_off[q + 1], base);
        s_range[0] = a0;
        s_range[1] = lower_bound(allow_docs, a0, allow_off[q + 1], end);
    }
    __syncthreads();
    const long long a0 = s_range[0], a1 = s_range[1];
    if (a0 == a1) return false;
    for (int i = threadIdx.x; i < TILE / 32; i += THREADS) s_allow[i] = 0u;
    __syncthreads();
    for (long long p = a0 + threadIdx.x; p < a1; p += THREADS) {
        const int d = allow_docs[p] - base;
        atomicOr(&s_allow[d >> 5], 1u << (d & 31));
    }
    __syncthreads();
    return true;
}

// Step 3: the rounds. s_val[0..TILE) ends holding the float bits of each
// document's sum, or GPUIR_EMPTY_SLOT. When nt > THREADS the ranges are
// recomputed batch by batch (s_lo/s_len hold one batch). Ends with a barrier.
template <int THREADS, int TILE>
__device__ __forceinline__ void accumulate_tile(
    const long long* __restrict__ offsets, const int* __restrict__ doc_ids,
    const float* __restrict__ weights, const float* __restrict__ term_ub,
    const int* __restrict__ dir_row, const int* __restrict__ dir_start,
    const float* __restrict__ dir_max, int n_tiles,
    const int* __restrict__ qt_term, const float* __restrict__ qt_mult, int t0, int nt,
    long long j, int base, int end, bool filtered, const unsigned int* s_allow,
    unsigned int* s_val, long long* s_lo, int* s_len, float* s_bnd, bool ranges_loaded) {
    for (int i = threadIdx.x; i < TILE; i += THREADS) s_val[i] = GPUIR_EMPTY_SLOT;
    for (int tb = 0; tb < nt; tb += THREADS) {
        const int n = nt - tb < THREADS ? nt - tb : THREADS;
        if (!ranges_loaded) {
            __syncthreads();
            term_ranges<THREADS>(offsets, doc_ids, term_ub, dir_row, dir_start, dir_max, n_tiles,
                                 qt_term, qt_mult, t0 + tb, n, j, base, end, s_lo, s_len, s_bnd);
        }
        __syncthreads();
        for (int i = 0; i < n; ++i) {
            const int len = s_len[i];
            if (len == 0) continue;  // uniform: shared value read after a barrier
            const long long lo = s_lo[i];
            const float m = qt_mult[t0 + tb + i];
            // Unrolled twice, not the compiler's four times: see "Registers" at the top.
#pragma unroll 2
            for (int p = threadIdx.x; p < len; p += THREADS) {
                const int d = doc_ids[lo + p] - base;
                if (filtered && !((s_allow[d >> 5] >> (d & 31)) & 1u)) continue;
                const float v = scaled(weights[lo + p], m);
                const unsigned int old = s_val[d];
                s_val[d] = float_bits(add_rn(old == GPUIR_EMPTY_SLOT ? 0.0f : bits_float(old), v));
            }
            __syncthreads();  // round boundary: the next term may add to the same documents
        }
    }
}

}  // namespace gpuir

template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS) tile_score(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const float* __restrict__ weights,        // (P,) float32
    const float* __restrict__ term_ub,        // (V,) float32
    const int* __restrict__ dir_row,          // (V,) int32
    const int* __restrict__ dir_start,        // (H, n_tiles+1) int32
    const float* __restrict__ dir_max,        // (H, n_tiles) float32
    int n_tiles, long long n_docs,
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    int has_w0,
    const int* __restrict__ row_flags,        // (R,) int32
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    unsigned int* __restrict__ theta,         // (R,) uint32 ordered keys, in/out
    int* __restrict__ counts,                 // (R,) int32, zeroed by the caller
    int* __restrict__ tiles_scored,           // (R,) int32, zeroed by the caller
    const long long* __restrict__ cand_off,   // (R+1,) int64
    unsigned long long* __restrict__ cand,    // (cand_off[R],) uint64 composite keys
    int n_rows, int group, int k) {
    constexpr int BINS = GPUIR_RADIX_BINS;
    static_assert(TILE % THREADS == 0 && TILE % 32 == 0, "TILE must be a multiple of THREADS and 32");
    __shared__ unsigned int s_val[TILE];
    __shared__ unsigned int s_allow[TILE / 32];
    __shared__ long long s_lo[THREADS];
    __shared__ int s_len[THREADS];
    __shared__ float s_bnd[THREADS];
    __shared__ int s_hist[BINS];
    __shared__ int s_run[BINS];
    __shared__ int s_warp[GPUIR_WARP];
    __shared__ long long s_range[2];
    // The row being scored (block-uniform), read where used: see "Registers" at the top.
    __shared__ long long s_c0, s_cap;
    __shared__ int s_q, s_t0, s_nt, s_filtered;
    __shared__ float s_rc;
    __shared__ int s_go, s_bin, s_above, s_binc;
    __shared__ unsigned int s_thr;

    const int tid = threadIdx.x, lane = tid & (GPUIR_WARP - 1);
    for (int gi = 0; gi < group; ++gi) {
        const int q = blockIdx.y * group + gi;
        if (q >= n_rows) break;
        if ((row_flags[q] & GPUIR_ROW_OFF_TILES) || qt_off[q + 1] == qt_off[q]) continue;  // uniform
        __syncthreads();  // the previous row's readers of s_run and the row state are done
        if (tid == 0) {
            s_q = q;
            s_t0 = qt_off[q];
            s_nt = qt_off[q + 1] - qt_off[q];
            s_filtered = (row_flags[q] & GPUIR_ROW_FILTERED) != 0;
            s_rc = row_const[q];
            s_c0 = cand_off[q];
            s_cap = cand_off[q + 1] - cand_off[q];
        }
        for (int i = tid; i < BINS; i += THREADS) s_run[i] = 0;
        __syncthreads();

        for (int j = blockIdx.x; j < n_tiles; j += gridDim.x) {
            const int base = (int)((long long)j * TILE);
            const int end = (long long)base + TILE < n_docs ? base + TILE : (int)n_docs;
            // 1. filter
            if (s_filtered &&
                !gpuir::load_allow<THREADS, TILE>(allow_off, allow_docs, s_q, base, end, s_allow, s_range))
                continue;
            // 2. bound, in the scoring order
            float bound = 0.0f;
            int npost = 0;
            const int t0 = s_t0, nt = s_nt;
            for (int tb = 0; tb < nt; tb += THREADS) {
                const int n = nt - tb < THREADS ? nt - tb : THREADS;
                __syncthreads();
                gpuir::term_ranges<THREADS>(offsets, doc_ids, term_ub, dir_row, dir_start, dir_max, n_tiles,
                                            qt_term, qt_mult, t0 + tb, n, j, base, end, s_lo, s_len, s_bnd);
                __syncthreads();
                if (tid == 0) {
#pragma unroll 1
                    for (int i = 0; i < n; ++i) {
                        bound = gpuir::add_rn(bound, s_bnd[i]);
                        npost += s_len[i];
                    }
                }
            }
            if (tid == 0) {
                if (has_w0) bound = gpuir::add_rn(bound, s_rc);
                const int go = npost > 0 && gpuir::float_to_ordered(bound) >= gpuir::atomic_read(&theta[s_q]);
                if (go) atomicAdd(&tiles_scored[s_q], 1);
                s_go = go;
            }
            __syncthreads();
            if (!s_go) continue;  // uniform
            // 3. accumulate
            gpuir::accumulate_tile<THREADS, TILE>(offsets, doc_ids, weights, term_ub, dir_row, dir_start, dir_max,
                                                  n_tiles, qt_term, qt_mult, s_t0, s_nt, j, base, end, s_filtered,
                                                  s_allow, s_val, s_lo, s_len, s_bnd, s_nt <= THREADS);
            // 4. final keys (0 = no candidate), candidate count, histogram of bits 31..21
            for (int i = tid; i < BINS; i += THREADS) s_hist[i] = 0;
            __syncthreads();
            int mine = 0;
            const float rc = s_rc;
            for (int i = tid; i < TILE; i += THREADS) {
                const unsigned int u = s_val[i];
                unsigned int key = 0u;
                if (u != GPUIR_EMPTY_SLOT) {
                    float s = gpuir::bits_float(u);
                    if (has_w0) s = gpuir::add_rn(s, rc);
                    key = gpuir::float_to_ordered(s);
                    ++mine;
                    atomicAdd(&s_hist[key >> 21], 1);
                }
                s_val[i] = key;
            }
            int ncand;
            gpuir::block_exclusive_sum<THREADS>(mine, s_warp, &ncand);  // barriers: s_hist complete
            for (int i = tid; i < BINS; i += THREADS) s_run[i] += s_hist[i];
            if (tid == 0) s_bin = -1;
            __syncthreads();
            // block bound R: >= k candidates of this block at or above it
            gpuir::find_bin<THREADS>(s_run, BINS, k, s_warp, &s_bin, &s_above, &s_binc, nullptr);
            unsigned int lb = s_bin >= 0 ? ((unsigned int)s_bin << 21) : 0u;
            if (ncand >= k) {  // uniform
                // tile bound L: bin b1 of bits 31..21, then b2 of bits 20..10 inside it
                __syncthreads();
                if (tid == 0) s_bin = -1;
                gpuir::find_bin<THREADS>(s_hist, BINS, k, s_warp, &s_bin, &s_above, &s_binc, nullptr);
                const unsigned int b1 = (unsigned int)s_bin;
                const int krem = k - s_above;
                for (int i = tid; i < BINS; i += THREADS) s_hist[i] = 0;
                __syncthreads();
                for (int i = tid; i < TILE; i += THREADS) {
                    const unsigned int key = s_val[i];
                    if (key != 0u && (key >> 21) == b1) atomicAdd(&s_hist[(key >> 10) & (BINS - 1)], 1);
                }
                if (tid == 0) s_bin = -1;
                __syncthreads();
                gpuir::find_bin<THREADS>(s_hist, BINS, krem, s_warp, &s_bin, &s_above, &s_binc, nullptr);
                const unsigned int l = (b1 << 21) | ((unsigned int)s_bin << 10);
                if (l > lb) lb = l;
            }
            if (tid == 0) {
                const unsigned int old = lb ? atomicMax(&theta[s_q], lb) : gpuir::atomic_read(&theta[s_q]);
                s_thr = old > lb ? old : lb;
            }
            __syncthreads();
            const unsigned int thr = s_thr;
            const int q_ = s_q;
            const long long c0 = s_c0, cap = s_cap;
            // 5. emit (TILE % THREADS == 0: all 32 lanes of a warp run every iteration)
            for (int i = tid; i < TILE; i += THREADS) {
                const unsigned int key = s_val[i];
                const bool pred = key != 0u && key >= thr;
                const unsigned int ballot = __ballot_sync(GPUIR_FULL_MASK, pred);
                int first = 0;
                if (lane == 0 && ballot != 0u) first = atomicAdd(&counts[q_], __popc(ballot));
                first = __shfl_sync(GPUIR_FULL_MASK, first, 0);
                if (pred) {
                    const long long slot = (long long)first + __popc(ballot & ((1u << lane) - 1u));
                    if (slot < cap) cand[c0 + slot] = gpuir::key_from_ordered(key, (long long)base + i);
                }
            }
        }
    }
}

template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS) tile_dense(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const float* __restrict__ weights,        // (P,) float32
    const float* __restrict__ term_ub,        // (V,) float32
    const int* __restrict__ dir_row,          // (V,) int32
    const int* __restrict__ dir_start,        // (H, n_tiles+1) int32
    const float* __restrict__ dir_max,        // (H, n_tiles) float32
    int n_tiles, long long n_docs,
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    int has_w0,
    const int* __restrict__ row_flags,        // (R,) int32 (GPUIR_ROW_FILTERED)
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    float* __restrict__ out,                  // (R, N) float32: score, or -inf
    int n_rows) {
    static_assert(TILE % THREADS == 0 && TILE % 32 == 0, "TILE must be a multiple of THREADS and 32");
    __shared__ unsigned int s_val[TILE];
    __shared__ unsigned int s_allow[TILE / 32];
    __shared__ long long s_lo[THREADS];
    __shared__ int s_len[THREADS];
    __shared__ float s_bnd[THREADS];
    __shared__ long long s_range[2];

    const long long j = blockIdx.x;
    const int q = blockIdx.y;
    if (q >= n_rows || j >= n_tiles) return;  // uniform
    const int base = (int)(j * TILE);
    const int end = (long long)base + TILE < n_docs ? base + TILE : (int)n_docs;
    const int t0 = qt_off[q], nt = qt_off[q + 1] - t0;
    const bool filtered = (row_flags[q] & GPUIR_ROW_FILTERED) != 0;
    bool any = nt > 0;
    if (any && filtered) any = gpuir::load_allow<THREADS, TILE>(allow_off, allow_docs, q, base, end, s_allow, s_range);
    if (any) {
        gpuir::accumulate_tile<THREADS, TILE>(offsets, doc_ids, weights, term_ub, dir_row, dir_start, dir_max,
                                              n_tiles, qt_term, qt_mult, t0, nt, j, base, end, filtered,
                                              s_allow, s_val, s_lo, s_len, s_bnd, false);
    }
    float* row = out + (long long)q * n_docs;
    const float rc = row_const[q];
    for (int i = threadIdx.x; i < end - base; i += THREADS) {
        const unsigned int u = any ? s_val[i] : GPUIR_EMPTY_SLOT;
        float s = __int_as_float(0xff800000);  // -inf
        if (u != GPUIR_EMPTY_SLOT) s = has_w0 ? gpuir::add_rn(gpuir::bits_float(u), rc) : gpuir::bits_float(u);
        row[base + i] = s;
    }
}

template <int THREADS>
__global__ void __launch_bounds__(THREADS) haystack_score(
    const long long* __restrict__ fwd_off,    // (N+1,) int64
    const int* __restrict__ fwd_terms,        // (P,) int32, ascending within a document
    const float* __restrict__ fwd_weights,    // (P,) float32
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    int has_w0,
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    const int* __restrict__ hs_rows,          // (H,) int32: the rows on this path
    const long long* __restrict__ hs_start,   // (H+1,) int64: prefix sum of their allow-list sizes
    int n_hs,
    const long long* __restrict__ cand_off,   // (R+1,) int64: row q's slots; >= its allow-list size
    unsigned long long* __restrict__ cand) {  // composite keys, 0 = no query term
    const long long total = hs_start[n_hs];
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < total;
         i += (long long)gridDim.x * THREADS) {
        int lo = 0, hi = n_hs - 1;  // the last h with hs_start[h] <= i
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (hs_start[mid] <= i) lo = mid; else hi = mid - 1;
        }
        const int row = hs_rows[lo];
        const long long local = i - hs_start[lo];
        const int d = allow_docs[allow_off[row] + local];
        long long p = fwd_off[d];
        const long long pe = fwd_off[d + 1];
        float acc = 0.0f;
        bool hit = false;
        for (int u = qt_off[row]; u < qt_off[row + 1] && p < pe; ++u) {
            const int t = qt_term[u];
            p = gpuir::lower_bound(fwd_terms, p, pe, t);
            if (p < pe && fwd_terms[p] == t) {
                acc = gpuir::add_rn(acc, gpuir::scaled(fwd_weights[p], qt_mult[u]));
                hit = true;
                ++p;
            }
        }
        unsigned long long key = 0ull;
        if (hit) key = gpuir::composite_key(has_w0 ? gpuir::add_rn(acc, row_const[row]) : acc, d);
        cand[cand_off[row] + local] = key;
    }
}
