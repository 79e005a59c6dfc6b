// kernels/bm25_score.cu -- BM25 over one sealed segment with the search's statistics applied
// per query: tile bounds, a seed over each row's best tiles, a list of the tiles that can still
// matter, fused tile scoring cut to the sub-blocks that can still matter, with candidate emission,
// dense rows for parity, haystack (forward-layout) scoring.
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
//   dir_sub_off (H*n_tiles+1,) int64,          the impacts of t's postings in each of tile j's 16
//     dir_sub_cnt (H*n_tiles,) uint64,         sub-blocks of TILE/16 documents, sub-block by sub-block;
//     dir_sub_imp uint32                       bits 4s..4s+3 of the count word: how many sub-block s has
//                                              (<= 15: a longer frontier keeps 14 and merges the rest
//                                              into one dominating pair; 0 = no posting there)
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
// A sub-block's bound ub[s] is the same sum over the terms with a posting in sub-block s, each
// bounded by its sub-block impacts (a directory term) or its whole list's (a light term); a term's
// postings in a tile are one sorted run, so the sub-block boundaries are binary searches in it.
//
// The pipeline (host: CupyScorer._run_rows)
// -----------------------------------------
// light_marks   one thread per posting of a light (row, term) pair with term index i < 64 in its
//               row: sets bit i of lmask[q, tile(d)] -- which tiles hold the row's light terms,
//               from the postings, with no search per tile.
// tile_bounds   one thread per (row, tile): U as a key (0 = no query term in the tile, or no
//               allowed document), into ukey.
// seed_tiles    one block per row: its GPUIR_SEEDS (16) best tiles, (key(U) << 32 | ~tile)
//               descending (ties: the lower tile), into seeds.
// tile_score    mode 0 (seeds): item i scores seeds[i] (row i / 16) and zeroes its ukey (so the list
//               never holds it). mode 1 (list): items[i] = (q << 32 | j) for i < *n_items.
//               Persistent blocks take items i = blockIdx.x, + gridDim.x, ... For (q, j):
//                 1. skip when key(U) < theta[q] (strictly);
//                 2. filter: the tile's part of the allow-list as a shared bitmask;
//                 2b. the sub-block cut: thread (i, s) bounds term i in sub-block s, thread s sums
//                    its sub-block's bounds in term order [+ C]; the sub-blocks with a posting whose
//                    key(ub[s]) >= theta[q] (read now) are kept, the others are never read;
//                 3. accumulate the rounds over the kept sub-blocks' postings (one index space per
//                    term: a kept posting's place is found by a 4-step search of the kept prefix
//                    sums); untouched slots keep a NaN marker (a sum of exactly 0 is still a
//                    candidate); deleted documents (live) are never touched;
//                 4. tile bound L: when the tile has >= k candidates, two histogram passes (key
//                    bits 31..21, then 20..10 inside the chosen bin) find L with >= k of the
//                    tile's candidates >= L; theta[q] = atomicMax(theta[q], L);
//                 5. emit every candidate with key >= max(L, theta[q]) -- ties included -- into
//                    q's slots (warp-aggregated atomicAdd on counts[q], which counts past the
//                    capacity).
// (select_topk, raw keys, then seed_theta: theta[q] = max(theta[q], the k-th best key the seeds
//               emitted) -- the seeds' k-th best together, not only each tile's own L; k <= 4096.)
// tile_list     one thread per (row, tile): after the seeds, appends (q, j) to items when
//               key(U) >= theta[q] (the seeds' keys are 0 by now; warp-aggregated atomicAdd on
//               n_items). Tiles whose bound is below the seeds' threshold never become work.
// Exactness: let s_k be q's true k-th best score and T its true top k (ties at s_k broken by
// document number). theta[q] only ever holds values L with >= k real candidates at or above
// them (a tile's L: >= k of its scored documents; seed_theta: k emitted documents of distinct
// seed tiles), so theta[q] <= s_k always. Every d in T has score(d) >= s_k >= theta, and its tile
// has U >= score(d) >= theta: it is a seed or in the list and never skipped; its sub-block has
// ub >= score(d) >= theta: never cut, so d gets all its adds in term order; score(d) >= L of its
// tile (else k scored documents of the tile beat it), so d is emitted. The exact selection
// (topk.cu) over the emitted keys returns T.
// If counts[q] exceeds the capacity, the host reruns q with theta[q] set to the value this run
// ended with: every document >= it was emitted by this run (its tile was visited, its sub-block
// kept, and every threshold it met -- L of its tile included, which went into theta -- was <= the
// final theta), so the rerun emits at most counts[q] keys and fits a buffer of that size. (The
// rerun's L may be lower, its cut having removed more sub-blocks, but it emits only documents >=
// the final theta.) The rerun is planned again from its rows: bounds, seeds, list, grid.
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
//   light_marks<256, 4096>, tile_bounds<256, 4096>, seed_tiles<256>, tile_score<256, 4096>,
//   seed_theta, tile_list<256>, tile_dense<256, 4096>, haystack_score<256>
#include "common.cuh"

#define GPUIR_ROW_FILTERED 1   // row_flags: the row has an allow-list
#define GPUIR_ROW_OFF_TILES 2  // row_flags: the row is not scored by the tile kernels
#define GPUIR_EMPTY_SLOT 0x7FC00001u  // accumulator marker: a NaN no sum produces
#define GPUIR_BLOCKED_SLOT 0x7FC00002u  // sub_score: a deleted or filtered-out document (never added to)
#define GPUIR_LIGHT_BITS 64    // light terms 0..63 of a row are marked from their postings
#define GPUIR_SUBS 16          // sub-blocks per tile; a directory cell's count word holds 16 4-bit counts
#define GPUIR_SEEDS 16         // tiles per row scored first (seed_tiles), best bound first
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

// Posting sub-ranges of the terms qt_term[tb .. tb+n) (n <= THREADS / GPUIR_SUBS) of a row in tile j
// (documents [base, end)), split at the starts of the tile's GPUIR_SUBS sub-blocks of TILE / GPUIR_SUBS
// documents. A term's postings in a tile are one sorted run, so each boundary is a binary search
// in that run: thread (i, s) = (tid / GPUIR_SUBS, tid % GPUIR_SUBS) finds term i's first posting
// at or after sub-block s; s_lo[i] = the run's first posting, s_off[i * (GPUIR_SUBS + 1) + s] the
// sub-block's first posting relative to it (entry GPUIR_SUBS: the run's length). No barrier.
template <int TILE>
__device__ __forceinline__ void sub_ranges(
    const long long* __restrict__ offsets, const int* __restrict__ doc_ids,
    const int* __restrict__ dir_row, const int* __restrict__ dir_start, int n_tiles,
    const int* __restrict__ qt_term, int tb, int n, long long j, int base, int end,
    long long* s_lo, int* s_off) {
    constexpr int SUB = TILE / GPUIR_SUBS;
    const int i = threadIdx.x / GPUIR_SUBS, s = threadIdx.x % GPUIR_SUBS;
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
        const long long p = s == 0 ? lo : lower_bound(doc_ids, lo, hi, base + s * SUB);
        s_off[i * (GPUIR_SUBS + 1) + s] = (int)(p - lo);
        if (s == 0) {
            s_lo[i] = lo;
            s_off[i * (GPUIR_SUBS + 1) + GPUIR_SUBS] = (int)(hi - lo);
        }
    }
}

// Sum of the 4-bit counts of sub-blocks 0..s-1 in a directory cell's count word.
__device__ __forceinline__ long long nibble_prefix(unsigned long long w, int s) {
    w = s > 0 ? (w & (~0ull >> (64 - 4 * s))) : 0ull;
    w = (w & 0x0F0F0F0F0F0F0F0Full) + ((w >> 4) & 0x0F0F0F0F0F0F0F0Full);  // bytes <= 30
    return (long long)((w * 0x0101010101010101ull) >> 56);               // their sum <= 240
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

// The rounds over the sub-blocks whose bit is set in `keep` (every sub-block: tile_dense).
// s_val[0..TILE) ends holding the float bits of each document's sum, or GPUIR_EMPTY_SLOT. The
// terms go in batches of THREADS / GPUIR_SUBS (sub_ranges); when `ready`, the first batch's
// ranges are already in s_lo / s_off (the block-bound pass left them). A document of a kept
// sub-block gets every one of its terms' adds, in term order; one of a skipped sub-block gets
// none (its slot stays empty: no candidate). Ends with a barrier.
template <int THREADS, int TILE>
__device__ __forceinline__ void accumulate_tile(
    const long long* __restrict__ offsets, const int* __restrict__ doc_ids, const int* __restrict__ tfs,
    const int* __restrict__ doc_lens, const int* __restrict__ dir_row, const int* __restrict__ dir_start,
    int n_tiles, const unsigned int* __restrict__ live, int has_live,
    const int* __restrict__ qt_term, const float* __restrict__ qt_mult, const float* __restrict__ qt_idf,
    const float* __restrict__ qt_w0, int t0, int nt, long long j, int base, int end, bool filtered,
    unsigned int keep, bool ready, const unsigned int* s_allow, unsigned int* s_val, long long* s_lo, int* s_off,
    int* s_kpre, GPUIR_BM25_PARAMS) {
    constexpr int TB = THREADS / GPUIR_SUBS;  // terms per batch
    constexpr int W = GPUIR_SUBS + 1;
    for (int i = threadIdx.x; i < TILE; i += THREADS) s_val[i] = GPUIR_EMPTY_SLOT;
    for (int tb = 0; tb < nt; tb += TB) {
        const int n = nt - tb < TB ? nt - tb : TB;
        __syncthreads();
        if (!(ready && tb == 0))
            sub_ranges<TILE>(offsets, doc_ids, dir_row, dir_start, n_tiles, qt_term, t0 + tb, n, j, base, end, s_lo,
                             s_off);
        __syncthreads();
        if ((int)threadIdx.x < n) {  // the kept sub-blocks' postings of term i, as one index space
            const int i = threadIdx.x;
            int run = 0;
            for (int s = 0; s < GPUIR_SUBS; ++s) {
                s_kpre[i * W + s] = run;
                if ((keep >> s) & 1u) run += s_off[i * W + s + 1] - s_off[i * W + s];
            }
            s_kpre[i * W + GPUIR_SUBS] = run;
        }
        __syncthreads();
        for (int i = 0; i < n; ++i) {
            const int len = s_kpre[i * W + GPUIR_SUBS];
            if (len == 0) continue;  // uniform: shared value read after a barrier
            const bool whole = len == s_off[i * W + GPUIR_SUBS];  // no posting of a skipped sub-block
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
                        int at = p;  // the p-th kept posting's place in the run
                        if (!whole) {
                            int s = 0;  // the last sub-block whose kept postings start at or before p
#pragma unroll
                            for (int h = GPUIR_SUBS / 2; h > 0; h >>= 1)
                                if (s_kpre[i * W + s + h] <= p) s += h;
                            at = s_off[i * W + s] + (p - s_kpre[i * W + s]);
                        }
                        const int d = doc_ids[lo + at] - base;
                        const bool ok = (!filtered || ((s_allow[d >> 5] >> (d & 31)) & 1u)) &&
                                        (!has_live || bit_set(live, (long long)base + d));
                        if (ok) {
                            dd[v] = d;
                            tf[v] = tfs[lo + at];
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
            }
        }
    }
    ukey[(long long)q * n_tiles + j] = key;
}

// Each row's GPUIR_SEEDS best tiles: the largest (key(U) << 32 | ~tile) of its tiles with U > 0,
// descending, 0-padded, into seeds[q * GPUIR_SEEDS ..]. One block per row: the GPUIR_SEEDS-th
// largest key K by three histogram passes over the row's keys (bits 31..21, 20..10, 9..0), then
// the keys above K (any order) and the lowest tiles with key K, then thread 0 sorts them.
template <int THREADS>
__global__ void __launch_bounds__(THREADS, 1) seed_tiles(
    const unsigned int* __restrict__ ukey,    // (R, n_tiles) uint32 from tile_bounds
    int n_tiles, int n_rows,
    unsigned long long* __restrict__ seeds) { // (R * GPUIR_SEEDS,) out
    constexpr int BINS = GPUIR_RADIX_BINS;
    __shared__ int s_hist[BINS];
    __shared__ int s_warp[GPUIR_WARP];
    __shared__ int s_bin, s_above, s_binc, s_n, s_total;
    __shared__ unsigned long long s_top[GPUIR_SEEDS];
    const int q = blockIdx.x, tid = threadIdx.x;
    if (q >= n_rows) return;  // uniform
    const unsigned int* row = ukey + (long long)q * n_tiles;
    // K: the GPUIR_SEEDS-th largest nonzero key (0 when the row has fewer nonzero keys)
    unsigned int prefix = 0u, pmask = 0u;
    int krem = GPUIR_SEEDS;
    bool all = false;
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
        const int width = pass == 2 ? 10 : 11;
        for (int i = tid; i < BINS; i += THREADS) s_hist[i] = 0;
        if (tid == 0) s_bin = -1;
        __syncthreads();
        for (int j = tid; j < n_tiles; j += THREADS) {
            const unsigned int u = row[j];
            if (u != 0u && (u & pmask) == prefix) atomicAdd(&s_hist[(u >> shift) & ((1u << width) - 1u)], 1);
        }
        __syncthreads();
        gpuir::find_bin<THREADS>(s_hist, 1 << width, krem, s_warp, &s_bin, &s_above, &s_binc, &s_total);
        if (s_bin < 0) {  // uniform: fewer nonzero keys than GPUIR_SEEDS (only possible in pass 0)
            all = true;
            break;
        }
        prefix |= (unsigned int)s_bin << shift;
        pmask |= ((1u << width) - 1u) << shift;
        krem -= s_above;
        __syncthreads();  // everyone has read s_bin / s_above before the next pass resets them
    }
    const unsigned int kth = all ? 1u : prefix;  // take keys > kth, then keys == kth (lowest tiles first)
    if (tid == 0) s_n = 0;
    __syncthreads();
    for (int j = tid; j < n_tiles; j += THREADS) {
        const unsigned int u = row[j];
        if (u > kth || (all && u == kth)) {
            const int slot = atomicAdd(&s_n, 1);
            s_top[slot] = ((unsigned long long)u << 32) | (unsigned long long)(~(unsigned int)j);
        }
    }
    __syncthreads();
    if (!all) {  // krem tiles with key == kth, in tile order (uniform loop: block-wide scans)
        int taken = 0;
        for (int j0 = 0; j0 < n_tiles && taken < krem; j0 += THREADS) {
            const int j = j0 + tid;
            const bool pred = j < n_tiles && row[j] == kth;
            const int before = gpuir::block_exclusive_sum<THREADS>(pred ? 1 : 0, s_warp, nullptr);
            const int total = __syncthreads_count(pred);
            if (pred && taken + before < krem)
                s_top[GPUIR_SEEDS - krem + taken + before] =
                    ((unsigned long long)kth << 32) | (unsigned long long)(~(unsigned int)j);
            taken += total;
        }
        if (tid == 0) s_n = GPUIR_SEEDS;
        __syncthreads();
    }
    if (tid == 0) {  // insertion sort, descending
        const int n = s_n;
        for (int a = 1; a < n; ++a) {
            const unsigned long long x = s_top[a];
            int b = a - 1;
            while (b >= 0 && s_top[b] < x) {
                s_top[b + 1] = s_top[b];
                --b;
            }
            s_top[b + 1] = x;
        }
        for (int a = 0; a < GPUIR_SEEDS; ++a) seeds[(long long)q * GPUIR_SEEDS + a] = a < n ? s_top[a] : 0ull;
    }
}

// theta[q] = max(theta[q], score word of top[q * k + k - 1]) for the rows on the tile path: the
// k-th best key the seed tiles emitted (select_topk's raw keys; 0 = fewer than k), so k real
// candidates lie at or above it and it is <= s_k.
__global__ void seed_theta(const long long* __restrict__ top,  // (R, k) raw keys, descending
                           int k, int n_rows,
                           const int* __restrict__ row_flags,  // (R,) int32
                           unsigned int* __restrict__ theta) {  // (R,) uint32 in/out
    const int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= n_rows || (row_flags[q] & GPUIR_ROW_OFF_TILES)) return;
    const unsigned long long key = (unsigned long long)top[(long long)q * k + k - 1];
    const unsigned int sk = (unsigned int)(key >> 32);
    if (key != 0ull && sk > theta[q]) theta[q] = sk;
}

// The sub-block plan: thread (item, s) of a seed or list item (q, j) decides whether sub-block s of
// tile j (documents [j*TILE + s*SUB, + SUB), SUB = TILE / GPUIR_SUBS) can still matter, and writes
// sub_ub[item * GPUIR_SUBS + s] = key(ub[s] [+ C]), or 0 when it cannot: the tile's bound is below
// theta[q] (strictly), or the sub-block has no posting of the row's terms, no allowed document, or a
// bound below theta[q]. ub[s] is the float32 sum, in the scoring order, of each present term's
// largest impact bound in the sub-block (a directory term: the sub-block's own impacts; a light
// term: its whole list's) -- the same sum tile_score summed. Each thread sums its own sub-block's
// terms one after another: no barrier, no shuffle, no shared memory. The double arithmetic of the
// bounds lives here, so sub_score (the hot kernel) stays small in registers.
// mode 0 (seeds): item i = seeds[i] (row i / GPUIR_SEEDS; U is the seed's high word), and thread s = 0
// zeroes its ukey cell (so tile_list never lists it). mode 1 (list): items[i] = (q << 32 | j).
// theta is not written while this kernel runs (sub_score runs after it).
template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS, 2) sub_plan(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const int* __restrict__ dir_row,          // (V,) int32
    const long long* __restrict__ dir_sub_off,        // (H*n_tiles+1,) int64: a cell's sub-block impacts
    const unsigned long long* __restrict__ dir_sub_cnt,  // (H*n_tiles,) uint64: 16 4-bit counts per cell
    const unsigned int* __restrict__ dir_sub_imp,     // uint32 (tf, length) pairs, by sub-block
    const long long* __restrict__ term_imp_off,       // (V+1,) int64: a light term's impacts
    const unsigned int* __restrict__ term_imp,        // uint32 (tf, length) pairs
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
    unsigned int* __restrict__ ukey,          // (R, n_tiles) uint32 from tile_bounds; mode 0 zeroes its seeds'
    const unsigned long long* __restrict__ seeds,  // (R * GPUIR_SEEDS,) uint64 from seed_tiles
    const unsigned long long* __restrict__ items,  // mode 1: (q << 32 | j) work items
    const int* __restrict__ n_items,          // mode 1: (1,) int32 item count
    int mode,                                 // 0: the seeds, 1: the list
    const unsigned int* __restrict__ theta,   // (R,) uint32 ordered keys (read only here)
    int* __restrict__ tiles_scored,           // (R,) int32: items whose tile bound reaches theta
    int* __restrict__ blocks_skipped,         // (R,) int32: sub-blocks with postings, cut here
    unsigned int* __restrict__ sub_ub,        // (n_work * GPUIR_SUBS,) uint32 out: keys, 0 = cut
    int n_rows, GPUIR_BM25_PARAMS) {
    constexpr int SUB = TILE / GPUIR_SUBS;
    static_assert(TILE % GPUIR_SUBS == 0, "whole sub-blocks");
    const int n_work = mode == 0 ? n_rows * GPUIR_SEEDS : n_items[0];
    const long long total = (long long)n_work * GPUIR_SUBS;
    for (long long g = blockIdx.x * (long long)THREADS + threadIdx.x; g < total; g += (long long)gridDim.x * THREADS) {
        const int it = (int)(g / GPUIR_SUBS), s = (int)(g % GPUIR_SUBS);
        int q;
        long long j;
        unsigned int u;
        if (mode == 0) {
            q = it / GPUIR_SEEDS;
            const unsigned long long sd = seeds[it];
            j = (long long)(~(unsigned int)(sd & 0xFFFFFFFFull));
            u = (unsigned int)(sd >> 32);
            if (sd != 0ull && s == 0) ukey[(long long)q * n_tiles + j] = 0u;  // a seed is never listed again
        } else {
            const unsigned long long item = items[it];
            q = (int)(item >> 32);
            j = (long long)(item & 0xFFFFFFFFull);
            u = ukey[(long long)q * n_tiles + j];
        }
        unsigned int key = 0u;
        const unsigned int th = u != 0u ? theta[q] : 0u;
        if (u != 0u && u >= th) {
            if (s == 0) atomicAdd(&tiles_scored[q], 1);
            const long long sbase = j * TILE + (long long)s * SUB;
            const long long send = sbase + SUB < n_docs ? sbase + SUB : n_docs;
            bool ok = sbase < n_docs;
            if (ok && (row_flags[q] & GPUIR_ROW_FILTERED)) {
                const long long a1 = allow_off[q + 1];
                const long long a0 = gpuir::lower_bound(allow_docs, allow_off[q], a1, (int)sbase);
                ok = a0 < a1 && allow_docs[a0] < send;
            }
            if (ok) {
                const double K1 = (double)k1, B = (double)b, D = (double)delta, inv_avgdl = gpuir::recip_f64(avgdl);
                const int t0 = qt_off[q], nt = qt_off[q + 1] - t0;
                float ub = 0.0f;
                bool pres = false;
                for (int i = 0; i < nt; ++i) {
                    const int uu = t0 + i;
                    const int t = qt_term[uu];
                    const int r = dir_row[t];
                    const unsigned int* imp;
                    long long h0, h1;
                    if (r >= 0) {  // the sub-block's own impacts (none: no posting there)
                        const long long cell = (long long)r * n_tiles + j;
                        const unsigned long long w = dir_sub_cnt[cell];
                        h0 = dir_sub_off[cell] + gpuir::nibble_prefix(w, s);
                        h1 = h0 + (long long)((w >> (4 * s)) & 15ull);
                    } else {       // a light term: present when its list has a document in the sub-block
                        const long long o1 = offsets[t + 1];
                        const long long p = gpuir::lower_bound(doc_ids, offsets[t], o1, (int)sbase);
                        const bool here = p < o1 && doc_ids[p] < send;
                        h0 = term_imp_off[t];
                        h1 = here ? term_imp_off[t + 1] : h0;
                    }
                    if (h1 == h0) continue;
                    imp = r >= 0 ? dir_sub_imp : term_imp;
                    pres = true;
                    const float idf = qt_idf[uu], w0 = qt_w0[uu];
                    float bb = 0.0f;
#pragma unroll 1
                    for (long long h = h0; h < h1; ++h) {
                        const float b1 = gpuir::bound_of(imp[h], idf, w0, method, K1, B, D, inv_avgdl, has_w0);
                        bb = b1 > bb ? b1 : bb;
                    }
                    ub = gpuir::add_rn(ub, gpuir::scaled(bb, qt_mult[uu]));
                }
                if (pres) {
                    const float ubc = has_w0 ? gpuir::add_rn(ub, row_const[q]) : ub;
                    const unsigned int kk = gpuir::float_to_ordered(ubc);
                    if (kk >= th) key = kk;
                    else atomicAdd(&blocks_skipped[q], 1);
                }
            }
        }
        sub_ub[g] = key;
    }
}

// Blocks of sub_score per SM its registers must allow: 6 on sm_90 (40 registers a thread at 256
// threads; 8 KB of shared memory each), 5 on sm_80 (48 registers: at 40 ptxas spills 16 bytes there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define GPUIR_SUB_SCORE_BLOCKS 5
#else
#define GPUIR_SUB_SCORE_BLOCKS 6
#endif

// Scores the sub-blocks sub_plan kept: one warp per (item, sub-block s), warps persistent over
// g = item * GPUIR_SUBS + s. No block barrier: a warp owns SUB accumulator slots in shared memory.
//   1. skip when sub_ub[g] is 0 or below theta[q] (read now: it may have risen since the plan);
//   2. the slots start EMPTY, or BLOCKED for a deleted document (live) or one outside the row's
//      allow-list (two searches in it, then one store per allowed document);
//   3. the rounds, one per term in ascending term id, separated by __syncwarp: a directory term's
//      postings in the sub-block are read straight from the directory (offsets[t] + dir_start[r, j]
//      + dir_sub_end[cell, s - 1] .. dir_sub_end[cell, s]), a light term's by two searches in its
//      (short) list; lane i of a batch of 32 terms finds term i's range, shuffled to the warp. A
//      term's list holds a document at most once, so in a round every slot is written by at most
//      one lane: the reference's order of adds, no atomics. A BLOCKED slot is never read further;
//   4. L: when the sub-block has >= k candidates, the exact k-th largest of its keys (a greedy bit by
//      bit search, each bit one warp reduction); theta[q] = atomicMax(theta[q], L);
//   5. emit every candidate with key >= max(L, theta[q]) (ties included) with one atomicAdd on
//      counts[q] for the whole sub-block (which counts past the capacity).
// Exactness as for the tiles (see the top of this file): a sub-block holding a document of the top k
// has ub >= its score >= theta, so it is never cut; L is the k-th best of k scored documents, so
// theta stays <= s_k.
template <int THREADS, int TILE>
__global__ void __launch_bounds__(THREADS, GPUIR_SUB_SCORE_BLOCKS) sub_score(
    const long long* __restrict__ offsets,    // (V+1,) int64
    const int* __restrict__ doc_ids,          // (P,) int32
    const int* __restrict__ tfs,              // (P,) int32
    const int* __restrict__ doc_lens,         // (N,) int32
    const int* __restrict__ dir_row,          // (V,) int32
    const int* __restrict__ dir_start,        // (H, n_tiles+1) int32
    const unsigned short* __restrict__ dir_sub_end,  // (H*n_tiles, 16) uint16: postings of sub-blocks <= s
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
    const unsigned long long* __restrict__ seeds,  // (R * GPUIR_SEEDS,) uint64 from seed_tiles
    const unsigned long long* __restrict__ items,  // mode 1: (q << 32 | j) work items
    const int* __restrict__ n_items,          // mode 1: (1,) int32 item count
    int mode,                                 // 0: the seeds, 1: the list
    const unsigned int* __restrict__ sub_ub,  // (n_work * GPUIR_SUBS,) uint32 from sub_plan
    unsigned int* __restrict__ theta,         // (R,) uint32 ordered keys, in/out
    int* __restrict__ counts,                 // (R,) int32 (may exceed the capacity)
    int* __restrict__ blocks_scored,          // (R,) int32: sub-blocks scored
    int* __restrict__ blocks_skipped,         // (R,) int32: sub-blocks kept by the plan, cut here
    const long long* __restrict__ cand_off,   // (R+1,) int64
    unsigned long long* __restrict__ cand,    // (cand_off[R],) uint64 composite keys
    int n_rows, int k, GPUIR_BM25_PARAMS) {
    constexpr int SUB = TILE / GPUIR_SUBS;
    constexpr int WARPS = THREADS / GPUIR_WARP;
    constexpr int PER = (SUB + GPUIR_WARP - 1) / GPUIR_WARP;  // slots per lane
    static_assert(THREADS % GPUIR_WARP == 0 && TILE % GPUIR_SUBS == 0, "whole warps, whole sub-blocks");
    __shared__ unsigned int s_val[WARPS * SUB];
    const int lane = threadIdx.x & (GPUIR_WARP - 1), wib = threadIdx.x / GPUIR_WARP;
    unsigned int* val = s_val + wib * SUB;
    const int n_work = mode == 0 ? n_rows * GPUIR_SEEDS : n_items[0];
    const long long total = (long long)n_work * GPUIR_SUBS;
    for (long long g = blockIdx.x * (long long)WARPS + wib; g < total; g += (long long)gridDim.x * WARPS) {
        const unsigned int ubk = sub_ub[g];
        if (ubk == 0u) continue;  // uniform in the warp
        const int it = (int)(g / GPUIR_SUBS), s = (int)(g % GPUIR_SUBS);
        int q;
        long long j;
        if (mode == 0) {
            q = it / GPUIR_SEEDS;
            j = (long long)(~(unsigned int)(seeds[it] & 0xFFFFFFFFull));
        } else {
            const unsigned long long item = items[it];
            q = (int)(item >> 32);
            j = (long long)(item & 0xFFFFFFFFull);
        }
        // 1. the cut, with theta as it is now
        unsigned int th = 0u;
        if (lane == 0) th = gpuir::atomic_read(&theta[q]);
        th = __shfl_sync(GPUIR_FULL_MASK, th, 0);
        if (ubk < th) {
            if (lane == 0) atomicAdd(&blocks_skipped[q], 1);
            continue;  // uniform
        }
        if (lane == 0) atomicAdd(&blocks_scored[q], 1);
        const long long sbase = j * TILE + (long long)s * SUB;
        const long long send = sbase + SUB < n_docs ? sbase + SUB : n_docs;
        const bool filtered = (row_flags[q] & GPUIR_ROW_FILTERED) != 0;
        // 2. the slots
#pragma unroll
        for (int v = 0; v < PER; ++v) {
            const int d = lane + GPUIR_WARP * v;
            if (d < SUB) {
                const long long doc = sbase + d;
                const bool ok = !filtered && doc < send && (!has_live || gpuir::bit_set(live, doc));
                val[d] = ok ? GPUIR_EMPTY_SLOT : GPUIR_BLOCKED_SLOT;
            }
        }
        if (filtered) {
            long long a = 0;
            if (lane < 2) a = gpuir::lower_bound(allow_docs, allow_off[q], allow_off[q + 1], (int)(lane ? send : sbase));
            const long long a0 = __shfl_sync(GPUIR_FULL_MASK, a, 0), a1 = __shfl_sync(GPUIR_FULL_MASK, a, 1);
            __syncwarp();
            for (long long p = a0 + lane; p < a1; p += GPUIR_WARP) {
                const long long doc = allow_docs[p];
                if (!has_live || gpuir::bit_set(live, doc)) val[doc - sbase] = GPUIR_EMPTY_SLOT;
            }
        }
        __syncwarp();
        // 3. the rounds
        const int t0 = qt_off[q], nt = qt_off[q + 1] - t0;
        for (int tb = 0; tb < nt; tb += GPUIR_WARP) {
            const int n = nt - tb < GPUIR_WARP ? nt - tb : GPUIR_WARP;
            long long lo = 0;
            int len = 0;
            if (lane < n) {  // term tb + lane's postings in the sub-block
                const int t = qt_term[t0 + tb + lane];
                const int r = dir_row[t];
                const long long o0 = offsets[t];
                if (r >= 0) {
                    const long long cell = (long long)r * n_tiles + j;
                    const int e0 = s > 0 ? (int)dir_sub_end[cell * GPUIR_SUBS + s - 1] : 0;
                    lo = o0 + dir_start[(long long)r * (n_tiles + 1) + j] + e0;
                    len = (int)dir_sub_end[cell * GPUIR_SUBS + s] - e0;
                } else {
                    const long long o1 = offsets[t + 1];
                    lo = gpuir::lower_bound(doc_ids, o0, o1, (int)sbase);
                    len = (int)(gpuir::lower_bound(doc_ids, lo, o1, (int)send) - lo);
                }
            }
            for (int i = 0; i < n; ++i) {
                const long long plo = __shfl_sync(GPUIR_FULL_MASK, lo, i);
                const int plen = __shfl_sync(GPUIR_FULL_MASK, len, i);
                if (plen == 0) continue;  // uniform
                const int u = t0 + tb + i;
                const float m = qt_mult[u], idf = qt_idf[u], w0 = qt_w0[u];
                // A directory term has a few postings in a sub-block of SUB documents (about df / N * SUB):
                // mostly one or none a lane, so no unrolling; latency is hidden by the resident warps.
                for (int p = lane; p < plen; p += GPUIR_WARP) {
                    const int d = (int)(doc_ids[plo + p] - sbase);
                    const unsigned int old = val[d];
                    if (old != GPUIR_BLOCKED_SLOT) {
                        const float w = gpuir::bm25_weight(tfs[plo + p], doc_lens[sbase + d], idf, w0, GPUIR_BM25_ARGS);
                        val[d] = gpuir::float_bits(
                            gpuir::add_rn(old == GPUIR_EMPTY_SLOT ? 0.0f : gpuir::bits_float(old), gpuir::scaled(w, m)));
                    }
                }
                __syncwarp();  // round boundary: the next term may add to the same documents
            }
        }
        // 4. final keys (back into the lane's own slots: 0 = no candidate), L
        const float rc = row_const[q];
        int mine = 0;
#pragma unroll
        for (int v = 0; v < PER; ++v) {
            const int d = lane + GPUIR_WARP * v;
            if (d < SUB) {
                const unsigned int x = val[d];
                unsigned int key = 0u;
                if (x != GPUIR_EMPTY_SLOT && x != GPUIR_BLOCKED_SLOT) {
                    key = gpuir::float_to_ordered(has_w0 ? gpuir::add_rn(gpuir::bits_float(x), rc) : gpuir::bits_float(x));
                    ++mine;
                }
                val[d] = key;
            }
        }
        const int ncand = __reduce_add_sync(GPUIR_FULL_MASK, mine);
        unsigned int lb = 0u;
        if (ncand >= k) {  // uniform: the largest L with >= k keys >= L, bit by bit from the top (registers)
            unsigned int kr[PER];
#pragma unroll
            for (int v = 0; v < PER; ++v) {
                const int d = lane + GPUIR_WARP * v;
                kr[v] = d < SUB ? val[d] : 0u;
            }
#pragma unroll 1
            for (int bit = 31; bit >= 0; --bit) {
                const unsigned int c = lb | (1u << bit);
                int n = 0;
#pragma unroll
                for (int v = 0; v < PER; ++v) n += kr[v] >= c ? 1 : 0;
                if (__reduce_add_sync(GPUIR_FULL_MASK, n) >= k) lb = c;
            }
        }
        unsigned int thr = 0u;
        if (lane == 0) {
            const unsigned int old = lb ? atomicMax(&theta[q], lb) : gpuir::atomic_read(&theta[q]);
            thr = old > lb ? old : lb;
        }
        thr = __shfl_sync(GPUIR_FULL_MASK, thr, 0);
        // 5. emit, one atomicAdd for the sub-block
        int all = 0;
#pragma unroll
        for (int v = 0; v < PER; ++v) {
            const int d = lane + GPUIR_WARP * v;
            const unsigned int key = d < SUB ? val[d] : 0u;
            all += key != 0u && key >= thr ? 1 : 0;
        }
        all = __reduce_add_sync(GPUIR_FULL_MASK, all);
        if (all > 0) {  // uniform
            int first = 0;
            if (lane == 0) first = atomicAdd(&counts[q], all);
            first = __shfl_sync(GPUIR_FULL_MASK, first, 0);
            const long long c0 = cand_off[q], cap = cand_off[q + 1] - c0;
            const unsigned int below = (1u << lane) - 1u;
#pragma unroll
            for (int v = 0; v < PER; ++v) {
                const int d = lane + GPUIR_WARP * v;
                const unsigned int key = d < SUB ? val[d] : 0u;
                const bool pred = key != 0u && key >= thr;
                const unsigned int bal = __ballot_sync(GPUIR_FULL_MASK, pred);
                if (pred) {
                    const long long slot = (long long)first + __popc(bal & below);
                    if (slot < cap) cand[c0 + slot] = gpuir::key_from_ordered(key, sbase + d);
                }
                first += __popc(bal);
            }
        }
        __syncwarp();  // every lane has read the slots before the next item resets them
    }
}

template <int THREADS>
__global__ void __launch_bounds__(THREADS) tile_list(
    const unsigned int* __restrict__ ukey,    // (R, n_tiles) uint32; the seeds' keys zeroed by tile_score
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
        pred = u != 0u && u >= theta[q];
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
    static_assert(THREADS % GPUIR_SUBS == 0 && TILE % GPUIR_SUBS == 0, "whole sub-blocks");
    __shared__ unsigned int s_val[TILE];
    __shared__ unsigned int s_allow[TILE / 32];
    __shared__ long long s_lo[THREADS / GPUIR_SUBS];
    __shared__ int s_off[THREADS / GPUIR_SUBS * (GPUIR_SUBS + 1)];
    __shared__ int s_kpre[THREADS / GPUIR_SUBS * (GPUIR_SUBS + 1)];
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
                                              filtered, 0xFFFFu, false, s_allow, s_val, s_lo, s_off, s_kpre,
                                              GPUIR_BM25_ARGS);
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
