// kernels/bm25_score.cu -- BM25 over one sealed segment with the search's statistics applied
// per query: tile bounds, best-first seeding, a list of the tiles that can still matter, fused
// tile scoring with candidate emission, dense rows for parity, haystack (forward-layout) scoring.
//
// Segment (device, uploaded once per scorer by gpuir/backends/cupy_backend.py; never re-weighted)
// -------------------------------------------------------------------------------------------------
//   offsets (V+1,) int64, doc_ids (P,) int32   the CSR posting lists, doc ids strictly increasing per term
//   tfs (P,) int32                             raw term frequencies
//   doc_lens (N,) int32                        document lengths
//   dir_row (V,) int32                         row of t in the tile directory, -1 if none
//   dir_start (H, n_tiles+1) int32             first posting of tile j, relative to offsets[t]
//   dir_imp_off (H*n_tiles+1,) int64,          the impacts of t's postings in tile j: the (tf, document
//     dir_imp uint32                           length) pairs no other posting of the block dominates, each
//                                              packed tf (low 16 bits, 0xFFFF = >= 65535) | length << 16
//                                              (capped at 65535); none for an empty block
//   term_imp_off (V+1,) int64, term_imp        the impacts of a light term's whole list
//   live (ceil(N/32),) uint32                  bit d: document d exists (has_live = 0: all do)
// Tile j holds documents [j*TILE, (j+1)*TILE). Terms with many postings (the long lists that
// dominate the work) get a directory row: their sub-range in a tile is two loads, their bound
// per tile comes from the tile's summary. Other terms ("light") are found in a tile by binary
// search in doc_ids and bounded by their whole list's impacts. Impacts do not depend on the
// collection statistics, so they stay valid as the collection grows, and the largest weight of a
// block is the weight of one of its impacts whatever the statistics (Lucene's impacts).
//
// Search (per call): row q has distinct terms qt_term[qt_off[q]..qt_off[q+1]) in ascending term
// id with multiplicities qt_mult, and their float32 idf (qt_idf) and absent-term weights (qt_w0)
// under the search's statistics; row_const[q] is C (bm25l/bm25+, added when has_w0); the
// arithmetic constants (method, k1, b, 1 - b, k1 + 1, delta, avgdl) are float32 values the host
// computed exactly as gpuir/backends/weights.py does. Optionally a sorted allow-list
// allow_docs[allow_off[q]..allow_off[q+1]).
//
// Exact arithmetic (= the NumPy reference, gpuir/backends/weights.py)
// -------------------------------------------------------------------
// A posting's weight is computed when it is read (common.cuh: bm25_weight), with the reference's
// float32 operations in its order (__fadd_rn/__fmul_rn/__fdiv_rn, no contraction). A document's
// score starts from 0.0f and adds its terms' weights in ascending term id (w, or w * float32(m)
// for a repeated term), then C for bm25l/bm25+. tile_score/tile_dense accumulate a tile in shared
// memory ONE TERM PER ROUND, rounds separated by __syncthreads: a term's list holds each document
// at most once (checked on the host before upload), so in a round every accumulator slot is
// written by at most one thread: no atomics, no race, the reference's order of adds.
//
// Bounds. A block's bound is the largest bound_of(impact, idf, w0) over its impacts: bound_of(pair)
// >= the float32 weight of every posting with tf <= the pair's and length >= the pair's (tfc grows
// with tf and shrinks with the document length; evaluated in double, widened by a relative and an
// absolute slack, rounded up; >= 0: an absent term adds nothing), and every posting of the block
// is dominated by one of its impacts. The tile bound
//   U = ((0 + scaled(b_1)) + scaled(b_2)) + ... [+ C]
// is a float32 sum in the scoring order over the terms present in the tile; float32 addition and
// multiplication by m > 0 are non-decreasing, so by induction every score in the tile is <= U.
//
// The pipeline (host: CupyScorer._run_rows)
// -----------------------------------------
// light_marks   one thread per posting of a light (row, term) pair with term index i < 64 in its
//               row: sets bit i of lmask[q, tile(d)] -- which tiles hold the row's light terms,
//               from the postings, with no search per tile.
// tile_bounds   one thread per (row, tile): U as a key (0 = no query term in the tile, or no
//               allowed document), into ukey; best[q] = atomicMax of (key << 32 | ~tile): the
//               row's best tile (ties: the lower tile).
// tile_score    mode 0 (seed): block-item i scores row i's best tile. mode 1 (list): items[i] =
//               (q << 32 | j) for i < *n_items. Persistent blocks take items i = blockIdx.x,
//               + gridDim.x, ... For (q, j):
//                 1. skip when key(U) < theta[q] (strictly);
//                 2. filter: the tile's part of the allow-list as a shared bitmask;
//                 3. accumulate the rounds; untouched slots keep a NaN marker (a sum of exactly
//                    0 is still a candidate); deleted documents (live) are never touched;
//                 4. tile bound L: when the tile has >= k candidates, two histogram passes (key
//                    bits 31..21, then 20..10 inside the chosen bin) find L with >= k of the
//                    tile's candidates >= L; theta[q] = atomicMax(theta[q], L);
//                 5. emit every candidate with key >= max(L, theta[q]) -- ties included -- into
//                    q's slots (warp-aggregated atomicAdd on counts[q], which counts past the
//                    capacity).
// tile_list     one thread per (row, tile): after the seed, appends (q, j) to items when
//               key(U) >= theta[q] and j is not the seed tile (warp-aggregated atomicAdd on
//               n_items). Tiles whose bound is below the seed's threshold never become work.
// Exactness: let s_k be q's true k-th best score and T its true top k (ties at s_k broken by
// document number). theta[q] only ever holds values L with >= k real candidates at or above
// them, so theta[q] <= s_k always. Every d in T has score(d) >= s_k >= theta and >= L of its
// tile, and its tile has U >= score(d) >= s_k >= theta: it is the seed tile or in the list and
// never skipped, so d is emitted. The exact selection (topk.cu) over the emitted keys returns T.
// If counts[q] exceeds the capacity, the host reruns q with theta[q] set to the value this run
// ended with: every document >= it was emitted by this run (its tile was visited and every
// threshold it met was <= the final theta), so the rerun emits at most counts[q] keys and fits a
// buffer of that size.
//
// tile_dense: grid (tiles, rows): steps 2 and 3 for every tile, then the final scores (or -inf)
// into a dense (rows, N) float32 array, for score_matrix.
//
// haystack_score: one thread per (row, allowed document) of the rows on the haystack path:
// merges the document's forward list (its terms ascending with their tf: fwd_off (N+1,) int64,
// fwd_terms (P,) int32, fwd_tfs (P,) int32) with the query's terms by binary search, adding the
// weights in ascending term id. O(allowed documents x query terms x log), not O(postings of the
// query terms). One composite key per allowed document (0 = no query term, or deleted).
//
// Instantiations (name_expressions, gpuir/backends/kernels.py):
//   light_marks<256, 4096>, tile_bounds<256, 4096>, tile_score<256, 4096>, tile_list<256>,
//   tile_dense<256, 4096>, haystack_score<256>
#include "common.cuh"

#define GPUIR_ROW_FILTERED 1   // row_flags: the row has an allow-list
#define GPUIR_ROW_OFF_TILES 2  // row_flags: the row is not scored by the tile kernels
#define GPUIR_EMPTY_SLOT 0x7FC00001u  // accumulator marker: a NaN no sum produces
#define GPUIR_LIGHT_BITS 64    // light terms 0..63 of a row are marked from their postings
#ifndef GPUIR_ILP
#define GPUIR_ILP 4            // postings per thread whose loads are in flight at once (accumulate_tile)
#endif

// The per-search arithmetic constants (GPUIR_BM25_PARAMS, common.cuh) close every kernel's
// parameter list: int method, float k1, float b, float one_minus_b, float k1p1, float delta,
// float avgdl, int has_w0.

namespace gpuir {

__device__ __forceinline__ bool bit_set(const unsigned int* __restrict__ bits, long long i) {
    return (bits[i >> 5] >> (i & 31)) & 1u;
}

// Posting sub-ranges of the terms qt_term[tb .. tb+n) of a row in tile j (documents
// [base, end)), one term per thread, into s_lo / s_len.
__device__ __forceinline__ void term_ranges(
    const long long* __restrict__ offsets, const int* __restrict__ doc_ids,
    const int* __restrict__ dir_row, const int* __restrict__ dir_start, int n_tiles,
    const int* __restrict__ qt_term, int tb, int n, long long j, int base, int end,
    long long* s_lo, int* s_len) {
    const int i = threadIdx.x;
    if (i < n) {
        const int t = qt_term[tb + i];
        const long long o0 = offsets[t], o1 = offsets[t + 1];
        const int r = dir_row[t];
        long long lo, hi;
        if (r >= 0) {
            const int* st = dir_start + (long long)r * (n_tiles + 1);
            lo = o0 + st[j];
            hi = o0 + st[j + 1];
        } else {
            lo = lower_bound(doc_ids, o0, o1, base);
            hi = lower_bound(doc_ids, lo, o1, end);
        }
        s_lo[i] = lo;
        s_len[i] = (int)(hi - lo);
    }
}

// The tile's allowed documents as a bitmask (TILE/32 words). Returns false (uniformly) when
// none is allowed. Starts and ends with a barrier.
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

// The rounds. s_val[0..TILE) ends holding the float bits of each document's sum, or
// GPUIR_EMPTY_SLOT. The ranges are computed batch by batch (s_lo/s_len hold one batch of
// THREADS terms). Ends with a barrier.
template <int THREADS, int TILE>
__device__ __forceinline__ void accumulate_tile(
    const long long* __restrict__ offsets, const int* __restrict__ doc_ids, const int* __restrict__ tfs,
    const int* __restrict__ doc_lens, const int* __restrict__ dir_row, const int* __restrict__ dir_start,
    int n_tiles, const unsigned int* __restrict__ live, int has_live,
    const int* __restrict__ qt_term, const float* __restrict__ qt_mult, const float* __restrict__ qt_idf,
    const float* __restrict__ qt_w0, int t0, int nt, long long j, int base, int end, bool filtered,
    const unsigned int* s_allow, unsigned int* s_val, long long* s_lo, int* s_len, GPUIR_BM25_PARAMS) {
    for (int i = threadIdx.x; i < TILE; i += THREADS) s_val[i] = GPUIR_EMPTY_SLOT;
    for (int tb = 0; tb < nt; tb += THREADS) {
        const int n = nt - tb < THREADS ? nt - tb : THREADS;
        __syncthreads();
        term_ranges(offsets, doc_ids, dir_row, dir_start, n_tiles, qt_term, t0 + tb, n, j, base, end, s_lo, s_len);
        __syncthreads();
        for (int i = 0; i < n; ++i) {
            const int len = s_len[i];
            if (len == 0) continue;  // uniform: shared value read after a barrier
            const long long lo = s_lo[i];
            const int u = t0 + tb + i;
            const float m = qt_mult[u], idf = qt_idf[u], w0 = qt_w0[u];
            // GPUIR_ILP postings per thread at a time: their loads are issued together (the document
            // lengths are a dependent gather), so a round waits for one memory latency, not GPUIR_ILP.
            for (int p0 = threadIdx.x; p0 < len; p0 += GPUIR_ILP * THREADS) {
                int dd[GPUIR_ILP], tf[GPUIR_ILP], dl[GPUIR_ILP];
#pragma unroll
                for (int v = 0; v < GPUIR_ILP; ++v) {
                    const int p = p0 + v * THREADS;
                    dd[v] = -1;
                    if (p < len) {
                        const int d = doc_ids[lo + p] - base;
                        const bool keep = (!filtered || ((s_allow[d >> 5] >> (d & 31)) & 1u)) &&
                                          (!has_live || bit_set(live, (long long)base + d));
                        if (keep) {
                            dd[v] = d;
                            tf[v] = tfs[lo + p];
                        }
                    }
                }
#pragma unroll
                for (int v = 0; v < GPUIR_ILP; ++v) dl[v] = dd[v] >= 0 ? doc_lens[base + dd[v]] : 0;
#pragma unroll
                for (int v = 0; v < GPUIR_ILP; ++v) {
                    if (dd[v] < 0) continue;
                    const float w = bm25_weight(tf[v], dl[v], idf, w0, GPUIR_BM25_ARGS);
                    const unsigned int old = s_val[dd[v]];
                    s_val[dd[v]] = float_bits(add_rn(old == GPUIR_EMPTY_SLOT ? 0.0f : bits_float(old), scaled(w, m)));
                }
            }
            __syncthreads();  // round boundary: the next term may add to the same documents
        }
    }
}

}  // namespace gpuir

template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS) light_marks(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const int* __restrict__ lt_row,           // (L,) int32: row of each light (row, term) pair
    const int* __restrict__ lt_term,          // (L,) int32: its term
    const int* __restrict__ lt_bit,           // (L,) int32: the term's index in its row (< 64)
    const long long* __restrict__ lt_start,   // (L+1,) int64: prefix sum of the pairs' posting counts
    int n_lt, int n_tiles,
    unsigned long long* __restrict__ lmask) { // (R, n_tiles) uint64, zeroed by the caller
    const long long total = lt_start[n_lt];
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < total;
         i += (long long)gridDim.x * THREADS) {
        int lo = 0, hi = n_lt - 1;  // the last h with lt_start[h] <= i
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (lt_start[mid] <= i) lo = mid; else hi = mid - 1;
        }
        const int d = doc_ids[offsets[lt_term[lo]] + (i - lt_start[lo])];
        atomicOr(&lmask[(long long)lt_row[lo] * n_tiles + d / TILE], 1ull << lt_bit[lo]);
    }
}

template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS, 2) tile_bounds(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const long long* __restrict__ term_imp_off,  // (V+1,) int64: a light term's impacts
    const unsigned int* __restrict__ term_imp,   // uint32 (tf, length) pairs
    const int* __restrict__ dir_row,          // (V,) int32
    const int* __restrict__ dir_start,        // (H, n_tiles+1) int32
    const long long* __restrict__ dir_imp_off,   // (H*n_tiles+1,) int64: a (row, tile)'s impacts
    const unsigned int* __restrict__ dir_imp,    // uint32 (tf, length) pairs
    int n_tiles, long long n_docs,
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ qt_idf,         // (T,) float32
    const float* __restrict__ qt_w0,          // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    const int* __restrict__ row_flags,        // (R,) int32
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    const unsigned long long* __restrict__ lmask,  // (R, n_tiles) uint64 from light_marks
    unsigned int* __restrict__ ukey,          // (R, n_tiles) uint32 out: bound keys, 0 = nothing
    unsigned long long* __restrict__ best,    // (R,) uint64, zeroed by the caller: (key << 32 | ~tile)
    int n_rows, GPUIR_BM25_PARAMS) {
    const int q = blockIdx.y;
    const long long j = blockIdx.x * (long long)THREADS + threadIdx.x;
    if (q >= n_rows || j >= n_tiles) return;
    const int flags = row_flags[q];
    const int t0 = qt_off[q], nt = qt_off[q + 1] - t0;
    unsigned int key = 0u;
    if (!(flags & GPUIR_ROW_OFF_TILES) && nt > 0) {
        const int base = (int)(j * TILE);
        const int end = (long long)base + TILE < n_docs ? base + TILE : (int)n_docs;
        bool allowed = true;
        if (flags & GPUIR_ROW_FILTERED) {
            const long long a0 = gpuir::lower_bound(allow_docs, allow_off[q], allow_off[q + 1], base);
            allowed = a0 < allow_off[q + 1] && allow_docs[a0] < end;
        }
        if (allowed) {
            const unsigned long long marks = lmask[(long long)q * n_tiles + j];
            const double K1 = (double)k1, B = (double)b, D = (double)delta, inv_avgdl = gpuir::recip_f64(avgdl);
            float bound = 0.0f;
            bool any = false;
            for (int i = 0; i < nt; ++i) {
                const int t = qt_term[t0 + i];
                const int r = dir_row[t];
                long long i0, i1;  // the block's impacts
                if (r >= 0) {
                    const long long cell = (long long)r * n_tiles + j;
                    i0 = dir_imp_off[cell];
                    i1 = dir_imp_off[cell + 1];
                    if (i0 == i1) continue;  // no posting of t in the tile
                } else {
                    bool present;
                    if (i < GPUIR_LIGHT_BITS) {
                        present = (marks >> i) & 1ull;
                    } else {
                        const long long o1 = offsets[t + 1];
                        const long long p = gpuir::lower_bound(doc_ids, offsets[t], o1, base);
                        present = p < o1 && doc_ids[p] < end;
                    }
                    if (!present) continue;
                    i0 = term_imp_off[t];
                    i1 = term_imp_off[t + 1];
                }
                any = true;
                const unsigned int* imp = r >= 0 ? dir_imp : term_imp;
                float bt = 0.0f;
                const float idf = qt_idf[t0 + i], w0 = qt_w0[t0 + i];
#pragma unroll 1
                for (long long h = i0; h < i1; ++h) {
                    const float b1 = gpuir::bound_of(imp[h], idf, w0, method, K1, B, D, inv_avgdl, has_w0);
                    bt = b1 > bt ? b1 : bt;
                }
                bound = gpuir::add_rn(bound, gpuir::scaled(bt, qt_mult[t0 + i]));
            }
            if (any) {
                if (has_w0) bound = gpuir::add_rn(bound, row_const[q]);
                key = gpuir::float_to_ordered(bound);  // > 0 for every real bound
                atomicMax(&best[q], ((unsigned long long)key << 32) | (unsigned long long)(~(unsigned int)j));
            }
        }
    }
    ukey[(long long)q * n_tiles + j] = key;
}

template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS, 5) tile_score(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const int* __restrict__ tfs,              // (P,) int32
    const int* __restrict__ doc_lens,         // (N,) int32
    const int* __restrict__ dir_row,          // (V,) int32
    const int* __restrict__ dir_start,        // (H, n_tiles+1) int32
    int n_tiles, long long n_docs,
    const unsigned int* __restrict__ live,    // (ceil(N/32),) uint32 live bits
    int has_live,
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ qt_idf,         // (T,) float32
    const float* __restrict__ qt_w0,          // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    const int* __restrict__ row_flags,        // (R,) int32
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    const unsigned int* __restrict__ ukey,    // (R, n_tiles) uint32 from tile_bounds
    const unsigned long long* __restrict__ best,   // (R,) uint64 from tile_bounds
    const unsigned long long* __restrict__ items,  // mode 1: (q << 32 | j) work items
    const int* __restrict__ n_items,          // mode 1: (1,) int32 item count
    int mode,                                 // 0: seed (item q = row q's best tile), 1: the list
    unsigned int* __restrict__ theta,         // (R,) uint32 ordered keys, in/out
    int* __restrict__ counts,                 // (R,) int32 (may exceed the capacity)
    int* __restrict__ tiles_scored,           // (R,) int32
    const long long* __restrict__ cand_off,   // (R+1,) int64
    unsigned long long* __restrict__ cand,    // (cand_off[R],) uint64 composite keys
    int n_rows, int k, GPUIR_BM25_PARAMS) {
    constexpr int BINS = GPUIR_RADIX_BINS;
    static_assert(TILE % THREADS == 0 && TILE % 32 == 0, "TILE must be a multiple of THREADS and 32");
    __shared__ unsigned int s_val[TILE];
    __shared__ unsigned int s_allow[TILE / 32];
    __shared__ long long s_lo[THREADS];
    __shared__ int s_len[THREADS];
    __shared__ int s_hist[BINS];
    __shared__ int s_warp[GPUIR_WARP];
    __shared__ long long s_range[2];
    __shared__ int s_q, s_go, s_bin, s_above, s_binc;
    __shared__ long long s_j;
    __shared__ unsigned int s_thr;

    const int tid = threadIdx.x, lane = tid & (GPUIR_WARP - 1);
    const int n_work = mode == 0 ? n_rows : n_items[0];
    for (int it = blockIdx.x; it < n_work; it += gridDim.x) {
        __syncthreads();  // the previous item's readers of s_q, s_j, s_thr are done
        if (tid == 0) {
            int q;
            long long j;
            bool ok;
            if (mode == 0) {
                q = it;
                const unsigned long long b = best[q];
                ok = b != 0ull;
                j = (long long)(~(unsigned int)(b & 0xFFFFFFFFull));
            } else {
                const unsigned long long item = items[it];
                q = (int)(item >> 32);
                j = (long long)(item & 0xFFFFFFFFull);
                ok = true;
            }
            int go = 0;
            if (ok) {
                const unsigned int u = ukey[(long long)q * n_tiles + j];
                go = u != 0u && u >= gpuir::atomic_read(&theta[q]);
                if (go) atomicAdd(&tiles_scored[q], 1);
            }
            s_q = q;
            s_j = j;
            s_go = go;
        }
        __syncthreads();
        if (!s_go) continue;  // uniform
        const int q = s_q;
        const long long j = s_j;
        const int flags = row_flags[q];
        const int t0 = qt_off[q], nt = qt_off[q + 1] - t0;
        const bool filtered = (flags & GPUIR_ROW_FILTERED) != 0;
        const float rc = row_const[q];
        const long long c0 = cand_off[q], cap = cand_off[q + 1] - c0;
        const int base = (int)(j * TILE);
        const int end = (long long)base + TILE < n_docs ? base + TILE : (int)n_docs;
        // filter
        if (filtered && !gpuir::load_allow<THREADS, TILE>(allow_off, allow_docs, q, base, end, s_allow, s_range))
            continue;
        // accumulate
        gpuir::accumulate_tile<THREADS, TILE>(offsets, doc_ids, tfs, doc_lens, dir_row, dir_start, n_tiles, live,
                                              has_live, qt_term, qt_mult, qt_idf, qt_w0, t0, nt, j, base, end,
                                              filtered, s_allow, s_val, s_lo, s_len, GPUIR_BM25_ARGS);
        // final keys (0 = no candidate), candidate count, histogram of bits 31..21
        for (int i = tid; i < BINS; i += THREADS) s_hist[i] = 0;
        __syncthreads();
        int mine = 0;
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
        unsigned int lb = 0u;
        if (ncand >= k) {  // uniform
            // tile bound L: bin b1 of bits 31..21, then b2 of bits 20..10 inside it
            if (tid == 0) s_bin = -1;
            __syncthreads();
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
            lb = (b1 << 21) | ((unsigned int)s_bin << 10);
        }
        if (tid == 0) {
            const unsigned int old = lb ? atomicMax(&theta[q], lb) : gpuir::atomic_read(&theta[q]);
            s_thr = old > lb ? old : lb;
        }
        __syncthreads();
        const unsigned int thr = s_thr;
        // emit (TILE % THREADS == 0: all 32 lanes of a warp run every iteration)
        for (int i = tid; i < TILE; i += THREADS) {
            const unsigned int key = s_val[i];
            const bool pred = key != 0u && key >= thr;
            const unsigned int ballot = __ballot_sync(GPUIR_FULL_MASK, pred);
            int first = 0;
            if (lane == 0 && ballot != 0u) first = atomicAdd(&counts[q], __popc(ballot));
            first = __shfl_sync(GPUIR_FULL_MASK, first, 0);
            if (pred) {
                const long long slot = (long long)first + __popc(ballot & ((1u << lane) - 1u));
                if (slot < cap) cand[c0 + slot] = gpuir::key_from_ordered(key, (long long)base + i);
            }
        }
    }
}

template <int THREADS>
__global__ void __launch_bounds__(THREADS) tile_list(
    const unsigned int* __restrict__ ukey,    // (R, n_tiles) uint32
    const unsigned long long* __restrict__ best,  // (R,) uint64
    const unsigned int* __restrict__ theta,   // (R,) uint32, after the seed
    int n_tiles, int n_rows,
    unsigned long long* __restrict__ items,   // (R * n_tiles,) out: (q << 32 | j)
    int* __restrict__ n_items) {              // (1,) int32, zeroed by the caller
    const int q = blockIdx.y;
    const long long j = blockIdx.x * (long long)THREADS + threadIdx.x;
    const int lane = threadIdx.x & (GPUIR_WARP - 1);
    bool pred = false;
    if (q < n_rows && j < n_tiles) {
        const unsigned int u = ukey[(long long)q * n_tiles + j];
        const unsigned long long b = best[q];
        const long long seed = (long long)(~(unsigned int)(b & 0xFFFFFFFFull));
        pred = u != 0u && u >= theta[q] && j != seed;
    }
    // every lane reaches the ballot: the block is a whole number of warps and nobody returned
    const unsigned int ballot = __ballot_sync(GPUIR_FULL_MASK, pred);
    int first = 0;
    if (lane == 0 && ballot != 0u) first = atomicAdd(n_items, __popc(ballot));
    first = __shfl_sync(GPUIR_FULL_MASK, first, 0);
    if (pred) items[first + __popc(ballot & ((1u << lane) - 1u))] = ((unsigned long long)q << 32) | (unsigned long long)j;
}

template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS, 5) tile_dense(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const int* __restrict__ tfs,              // (P,) int32
    const int* __restrict__ doc_lens,         // (N,) int32
    const int* __restrict__ dir_row,          // (V,) int32
    const int* __restrict__ dir_start,        // (H, n_tiles+1) int32
    int n_tiles, long long n_docs,
    const unsigned int* __restrict__ live,    // (ceil(N/32),) uint32
    int has_live,
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ qt_idf,         // (T,) float32
    const float* __restrict__ qt_w0,          // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    const int* __restrict__ row_flags,        // (R,) int32 (GPUIR_ROW_FILTERED)
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    float* __restrict__ out,                  // (R, N) float32: score, or -inf
    int n_rows, GPUIR_BM25_PARAMS) {
    static_assert(TILE % THREADS == 0 && TILE % 32 == 0, "TILE must be a multiple of THREADS and 32");
    __shared__ unsigned int s_val[TILE];
    __shared__ unsigned int s_allow[TILE / 32];
    __shared__ long long s_lo[THREADS];
    __shared__ int s_len[THREADS];
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
        gpuir::accumulate_tile<THREADS, TILE>(offsets, doc_ids, tfs, doc_lens, dir_row, dir_start, n_tiles, live,
                                              has_live, qt_term, qt_mult, qt_idf, qt_w0, t0, nt, j, base, end,
                                              filtered, s_allow, s_val, s_lo, s_len, GPUIR_BM25_ARGS);
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
    const int* __restrict__ fwd_tfs,          // (P,) int32
    const int* __restrict__ doc_lens,         // (N,) int32
    const unsigned int* __restrict__ live,    // (ceil(N/32),) uint32
    int has_live,
    const int* __restrict__ qt_off,           // (R+1,) int32
    const int* __restrict__ qt_term,          // (T,) int32
    const float* __restrict__ qt_mult,        // (T,) float32
    const float* __restrict__ qt_idf,         // (T,) float32
    const float* __restrict__ qt_w0,          // (T,) float32
    const float* __restrict__ row_const,      // (R,) float32
    const long long* __restrict__ allow_off,  // (R+1,) int64
    const int* __restrict__ allow_docs,       // (A,) int32
    const int* __restrict__ hs_rows,          // (H,) int32: the rows on this path
    const long long* __restrict__ hs_start,   // (H+1,) int64: prefix sum of their allow-list sizes
    int n_hs,
    const long long* __restrict__ cand_off,   // (R+1,) int64: row q's slots; >= its allow-list size
    unsigned long long* __restrict__ cand,    // composite keys, 0 = no query term
    GPUIR_BM25_PARAMS) {
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
        unsigned long long key = 0ull;
        if (!has_live || gpuir::bit_set(live, d)) {
            long long p = fwd_off[d];
            const long long pe = fwd_off[d + 1];
            const int dl = doc_lens[d];
            float acc = 0.0f;
            bool hit = false;
            for (int u = qt_off[row]; u < qt_off[row + 1] && p < pe; ++u) {
                const int t = qt_term[u];
                p = gpuir::lower_bound(fwd_terms, p, pe, t);
                if (p < pe && fwd_terms[p] == t) {
                    const float w = gpuir::bm25_weight(fwd_tfs[p], dl, qt_idf[u], qt_w0[u], GPUIR_BM25_ARGS);
                    acc = gpuir::add_rn(acc, gpuir::scaled(w, qt_mult[u]));
                    hit = true;
                    ++p;
                }
            }
            if (hit) key = gpuir::composite_key(has_w0 ? gpuir::add_rn(acc, row_const[row]) : acc, d);
        }
        cand[cand_off[row] + local] = key;
    }
}
