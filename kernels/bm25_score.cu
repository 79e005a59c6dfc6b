// kernels/bm25_score.cu -- batched BM25 scoring of B queries into B dense rows.
//
// Decomposition
// -------------
// The host turns a batch of B queries into M "pairs" (query b, distinct term t,
// multiplicity m): a term repeated in a query is one pair whose posting weight
// is multiplied by m. Pair p covers the postings offsets[t] .. offsets[t+1] of
// its term, cut into chunks of CHUNK = THREADS * PER_THREAD postings; pair p owns
// the global chunk numbers chunk_start[p] .. chunk_start[p+1]-1 (an exclusive
// prefix sum over ceil(df(t) / CHUNK), computed on the host).
//
// One thread block handles one chunk at a time (grid-stride over all chunks),
// finds its pair by binary search in chunk_start, and its threads stride over
// the chunk's postings. So the grid is split over (query, term, chunk of
// postings): a term with a long posting list is spread over many blocks and
// SMs instead of serialising on one, and one launch scores the whole batch --
// there is no per-term or per-query Python loop.
//
// For each posting (doc d, raw tf) of pair p = (b, t, m):
//     contrib = (idf[t] * tfc(tf, |d|) - w0[t]) * m        (float32, no FMA)
//     scores[b, d]  += contrib                             (atomicAdd)
//     touched[b, d] := 1                                   (atomicOr on a bit)
// tfc is computed in the kernel from the raw tf and document length (see
// common.cuh), exactly as gpuir.bm25.tfc does in NumPy; w0 is the absent-term
// weight (non-zero for bm25l/bm25+ only, whose per-row constant sum_t w0[t]*m
// is added later, by the top-k or finalize kernel).
//
// Candidates: `touched` is a B x ceil(N/32) bitmap of 32-bit words. A document
// is a candidate iff its bit is set, so a document whose sum is exactly 0.0 is
// still told apart from an untouched one, and top-k can skip 32 untouched
// documents with one word read.
//
// Filters: per-query allow-lists become an allow bitmap of the same layout,
// one row per *filtered* query (allow_row[b] = row number, or -1 for "no
// filter"), built on the device by scatter_allow_bits from the concatenated
// sorted allow-lists (8 bytes uploaded per allowed document). A posting of a
// filtered query whose bit is clear is skipped before the atomics, so filtered
// documents are never touched and never reach top-k. The check is O(1) per
// posting (one cached word read) where a per-query binary search would be
// O(log m); the cost is B_filtered * N / 8 bytes of device memory.
//
// Determinism: float atomics add in no fixed order, so a row's sums may
// differ from the NumPy reference by float32 rounding (a few ulp per term);
// compare scores within tolerance and top-k sets up to ties.
//
// Instantiations (name_expressions, see gpuir/backends/kernels.py):
//   bm25_score<METHOD, 256, 4>  for METHOD in 0..4
//   scatter_allow_bits, finalize_dense
#include "common.cuh"

template <int METHOD, int THREADS, int PER_THREAD>
__global__ void __launch_bounds__(THREADS) bm25_score(
    const long long* __restrict__ offsets,      // (V+1,) int64: postings of term t
    const int* __restrict__ doc_ids,            // (P,) int32
    const int* __restrict__ tfs,                // (P,) int32, raw tf >= 1
    const int* __restrict__ doc_lens,           // (N,) int32
    const int* __restrict__ pair_query,         // (M,) int32: row b within the batch
    const int* __restrict__ pair_term,          // (M,) int32: term id t
    const float* __restrict__ pair_mult,        // (M,) float32: multiplicity m
    const long long* __restrict__ chunk_start,  // (M+1,) int64: first global chunk of each pair
    int n_pairs,
    const float* __restrict__ idf,              // (V,) float32
    const float* __restrict__ w0,               // (V,) float32: absent-term weight
    const unsigned int* __restrict__ allow_bits,  // (F, W) uint32, or null when F = 0
    const int* __restrict__ allow_row,          // (B,) int32: row of allow_bits, -1 = unfiltered
    float* __restrict__ scores,                 // (B, N) float32, zeroed by the caller
    unsigned int* __restrict__ touched,         // (B, W) uint32, zeroed by the caller
    long long n_docs, int words_per_row,
    float k1, float b, float delta, float avgdl) {
    const long long n_chunks = chunk_start[n_pairs];
    const long long chunk = (long long)THREADS * PER_THREAD;
    for (long long c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        // Pair owning chunk c: the last p with chunk_start[p] <= c.
        int lo = 0, hi = n_pairs - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (chunk_start[mid] <= c) lo = mid; else hi = mid - 1;
        }
        const int p = lo;
        const int q = pair_query[p];
        const int t = pair_term[p];
        const float m = pair_mult[p];
        const float w = idf[t];
        const float z = w0[t];
        const long long begin = offsets[t] + (c - chunk_start[p]) * chunk;
        long long end = begin + chunk;
        if (end > offsets[t + 1]) end = offsets[t + 1];
        const int arow = allow_row[q];
        const unsigned int* allow = arow >= 0 ? allow_bits + (long long)arow * words_per_row : nullptr;
        float* srow = scores + (long long)q * n_docs;
        unsigned int* trow = touched + (long long)q * words_per_row;
        for (long long i = begin + threadIdx.x; i < end; i += THREADS) {
            const int d = doc_ids[i];
            if (allow != nullptr && !gpuir::test_bit(allow, d)) continue;
            const float tc = gpuir::tfc<METHOD>((float)tfs[i], (float)doc_lens[d], k1, b, delta, avgdl);
            atomicAdd(srow + d, gpuir::posting_weight(w, tc, z, m));
            atomicOr(trow + (d >> 5), 1u << (d & 31));
        }
    }
}

// Set the allow bits of the filtered queries: for i < n, bit docs[i] of row
// rows[i]. `bits` is (F, W) uint32, zeroed by the caller.
__global__ void scatter_allow_bits(const int* __restrict__ docs,  // (n,) int32
                                   const int* __restrict__ rows,  // (n,) int32
                                   long long n, unsigned int* __restrict__ bits,
                                   int words_per_row) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int d = docs[i];
        atomicOr(bits + (long long)rows[i] * words_per_row + (d >> 5), 1u << (d & 31));
    }
}

// Dense rows for score_matrix / parity: in place, scores[b, d] becomes
// scores[b, d] + row_const[b] where touched, -inf elsewhere.
__global__ void finalize_dense(float* __restrict__ scores,              // (B, N) float32
                               const unsigned int* __restrict__ touched,  // (B, W) uint32
                               const float* __restrict__ row_const,      // (B,) float32
                               int n_rows, long long n_docs, int words_per_row) {
    const long long total = (long long)n_rows * n_docs;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / n_docs;
        const long long d = i - r * n_docs;
        const bool hit = gpuir::test_bit(touched + r * words_per_row, d);
        scores[i] = hit ? __fadd_rn(scores[i], row_const[r]) : __int_as_float(0xff800000);
    }
}
