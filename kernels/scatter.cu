// kernels/scatter.cu -- the design card's kernel: batched term-at-a-time BM25 scoring by scatter.
//
// A second, independent scoring engine beside the pruned tiles of bm25_score.cu (no tiles, no
// bounds, no thresholds): every posting of every query term is added into a dense float32 score
// buffer with atomicAdd, then every touched slot becomes a candidate key for select_topk
// (topk.cu). gpuir/backends/cupy_scatter.py drives it; tests/test_scatter_kernel.py runs these
// bodies on the CPU (tests/cuda_host) bit for bit against NumPy.
//
// Determinism by construction (no float atomics race):
//   * the buffer acc (rows x width float32) is zero-initialised by the host (a memset), and the
//     touched bitmap (rows x words uint32) too;
//   * terms are applied in ROUNDS, one launch of scatter_round each, in ascending term order: round
//     r adds the r-th term (ascending) of every query row. Launches on one stream run in order, so
//     every add of round r happens after every add of round r - 1;
//   * within a round, each (row, document) slot receives AT MOST ONE add: a round holds, per row,
//     one posting list per segment (the row's r-th term in each segment that has it), segments
//     cover disjoint document rows, and a posting list holds a document once. So the atomicAdd
//     never races with another add to the same slot, and each slot's float32 sum is
//     ((0 + w_0) + w_1) + ... in ascending term order -- exactly the NumPy reference's order
//     (np.add.at into a zeroed accumulator, terms ascending), operation for operation.
//   * scatter_keys adds the row constant C (bm25l/bm25+) after the sum, as the reference does, and
//     writes each slot's composite key (common.cuh) -- or the sentinel 0 (id -1, score -inf) for a
//     slot that is not a candidate (untouched, deleted, or outside the row's allow-list). Every slot
//     is written, so nothing of an earlier batch survives in the reused key buffer.
//
// The document space is chunked: a launch covers the window [doc0, doc0 + width) of global rows, so
// the buffers fit the device memory budget whatever N is. With several windows, scatter_clip first cuts
// each span to the window (binary searches), so each window walks only its own postings; a posting
// outside the window is skipped all the same.
//
// A "span" is a contiguous slice of the concatenated posting arrays: one query row's posting list
// of one term in one segment (rows [base, base + n) of the document space). The host lists each
// round's spans; threads walk the round's postings as one flat range (sp_cum: prefix sums of the
// span lengths), finding a posting's span by binary search.
//
// Weights: the cached float32 weight of each posting (has_weights, the static index's
// StaticWeights), else gpuir::bm25_weight of (tf, the document's length) with the span's idf and
// w0 under the search's statistics -- the operations of gpuir/backends/weights.py, in its order.
// A posting's contribution is gpuir::scaled(w, mult), as the reference's `w * c` for repeats.
//
// Instantiations (name_expressions): scatter_round<256>, scatter_clip<256>, scatter_keys<256>.
#include "common.cuh"

template <int THREADS>
__global__ void __launch_bounds__(THREADS) scatter_round(
    const int* __restrict__ doc_ids,         // (P,) int32: each posting's row in its segment
    const int* __restrict__ tfs,             // (P,) int32: term frequencies
    const float* __restrict__ weights,       // (P,) float32 cached weights (read only if has_weights)
    const int* __restrict__ doc_lens,        // (N,) int32: each global row's length
    const long long* __restrict__ sp_start,  // (S,) int64: first posting of each span
    const long long* __restrict__ sp_cum,    // (S+1,) int64: prefix sums of the span lengths
    const int* __restrict__ sp_row,          // (S,) int32: the span's row in this launch's buffer
    const int* __restrict__ sp_base,         // (S,) int32: global row of its segment's row 0
    const float* __restrict__ sp_idf,        // (S,) float32
    const float* __restrict__ sp_w0,         // (S,) float32
    const float* __restrict__ sp_mult,       // (S,) float32: occurrences of the term in the query
    int n_spans, int has_weights,
    long long doc0, int width,               // the window of global rows this launch scores
    float* __restrict__ acc,                 // (rows, width) float32, zeroed before round 0
    unsigned int* __restrict__ touched,      // (rows, words) uint32 bitmap, zeroed before round 0
    int words,                               // ceil(width / 32)
    GPUIR_BM25_PARAMS) {
    const long long total = sp_cum[n_spans];
    const long long stride = (long long)gridDim.x * THREADS;
    for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < total; i += stride) {
        // the span holding flat posting i: the last s with sp_cum[s] <= i (empty spans skipped)
        const int s = gpuir::lower_bound(sp_cum, 0, n_spans + 1, i + 1) - 1;
        const long long p = sp_start[s] + (i - sp_cum[s]);
        const long long g = (long long)sp_base[s] + doc_ids[p];
        const long long d = g - doc0;
        if (d < 0 || d >= width) continue;
        const float w = has_weights ? weights[p]
                                    : gpuir::bm25_weight(tfs[p], doc_lens[g], sp_idf[s], sp_w0[s], GPUIR_BM25_ARGS);
        const long long r = sp_row[s];
        atomicAdd(&acc[r * width + d], gpuir::scaled(w, sp_mult[s]));  // the slot's only add this round
        atomicOr(&touched[r * words + (d >> 5)], 1u << (unsigned)(d & 31));
    }
}

// A window's share of each span: the postings whose global row lies in [doc0, doc0 + width), found by
// two binary searches in the span's (ascending) rows -- so a round of a window walks only its own
// postings. Writes each span's first posting and count there; the host turns the counts into the
// prefix sums scatter_round reads (a device cumsum: no copy back).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) scatter_clip(
    const int* __restrict__ doc_ids,          // (P,) int32
    const long long* __restrict__ sp_start,   // (S,) int64: the span's first posting (all windows)
    const long long* __restrict__ sp_cum,     // (S+1,) int64: prefix sums of the spans' lengths
    const int* __restrict__ sp_base,          // (S,) int32
    int n_spans, long long doc0, int width,
    long long* __restrict__ out_start,        // (S,) int64: the window's first posting of each span
    long long* __restrict__ out_len) {        // (S,) int64: its postings in the window
    for (long long s = (long long)blockIdx.x * THREADS + threadIdx.x; s < n_spans;
         s += (long long)gridDim.x * THREADS) {
        const long long a = sp_start[s], e = a + (sp_cum[s + 1] - sp_cum[s]);
        const long long lo_row = doc0 - sp_base[s], hi_row = doc0 + width - sp_base[s];
        const int lo = lo_row < 0 ? 0 : (lo_row > 2147483647ll ? 2147483647 : (int)lo_row);
        const int hi = hi_row < 0 ? 0 : (hi_row > 2147483647ll ? 2147483647 : (int)hi_row);
        const long long p0 = gpuir::lower_bound(doc_ids, a, e, lo);
        const long long p1 = gpuir::lower_bound(doc_ids, p0, e, hi);
        out_start[s] = p0;
        out_len[s] = p1 - p0;
    }
}

// One composite key per (row, slot) of the window: the candidate's key, or the sentinel 0.
// Grid (x blocks over the window, rows). Bitmaps (live, allow) cover global rows, bit g of word g/32.
template <int THREADS>
__global__ void __launch_bounds__(THREADS) scatter_keys(
    const float* __restrict__ acc,            // (rows, width) float32
    const unsigned int* __restrict__ touched,  // (rows, words) uint32
    int words,
    long long doc0, int width,
    const unsigned int* __restrict__ live,    // (ceil(N/32),) uint32 (read only if has_live)
    int has_live,
    const unsigned int* __restrict__ allow,   // (A, allow_words) uint32 bitmaps of allow-lists
    long long allow_words,
    const int* __restrict__ row_allow,        // (rows,) int32: the row's allow bitmap, -1: none
    const int* __restrict__ row_key,          // (N,) int32: the key's document number of a row (if has_key)
    int has_key,
    const float* __restrict__ row_const,      // (rows,) float32: C, added when has_w0
    int has_w0,
    unsigned long long* __restrict__ keys) {  // (rows, width) uint64
    const long long r = blockIdx.y;
    const int ar = row_allow[r];
    const float c = row_const[r];
    for (long long d = (long long)blockIdx.x * THREADS + threadIdx.x; d < width; d += (long long)gridDim.x * THREADS) {
        const long long g = doc0 + d;
        unsigned long long key = 0ull;  // the sentinel: id -1, score -inf
        bool ok = (touched[r * words + (d >> 5)] >> (unsigned)(d & 31)) & 1u;
        if (ok && has_live) ok = (live[g >> 5] >> (unsigned)(g & 31)) & 1u;
        if (ok && ar >= 0) ok = (allow[(long long)ar * allow_words + (g >> 5)] >> (unsigned)(g & 31)) & 1u;
        if (ok) {
            float s = acc[r * width + d];
            if (has_w0) s = gpuir::add_rn(s, c);
            key = gpuir::composite_key(s, has_key ? (long long)row_key[g] : g);
        }
        keys[r * width + d] = key;
    }
}
