// Segmented reduction of score rows: pools turn scores into session scores.
//
// values  : (B, T) row-major, turn scores of B queries (turns grouped by session)
// offsets : (S + 1,) int64, session s owns turns [offsets[s], offsets[s+1])
// out     : (B, S) row-major, pooled session scores
//
// One block per (session s = blockIdx.x, query b = blockIdx.y). Operators:
//   0 mean   : sum / n
//   1 max    : max
//   2 topk   : mean of the min(k, n) largest values
//   3 lse    : (1 / beta) * log(sum exp(beta * v))         (log-sum-exp)
//   4 lme    : (1 / beta) * log(mean exp(beta * v))        (log-mean-exp)
// An empty session gives -inf. Accumulation is in double for mean/lse/lme, so
// results match the NumPy reference to float32 rounding regardless of the
// order threads add in (the reduction order itself is fixed: no atomics).
// Top-k ties are broken by lower turn index, which does not change the mean.

// NVRTC has no <math.h> INFINITY: build it from its bit pattern.
#define SR_INF (__longlong_as_double(0x7ff0000000000000LL))

#ifndef SEGMENT_REDUCE_BLOCK
#define SEGMENT_REDUCE_BLOCK 128
#endif

template <typename A>
__device__ __forceinline__ A block_sum(A v, A* sh) {
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

template <typename A>
__device__ __forceinline__ A block_max(A v, A* sh) {
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] = sh[t + s] > sh[t] ? sh[t + s] : sh[t];
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

// Block arg-max under (value desc, index asc), restricted to entries that come
// strictly after (pv, pi) in that order.
template <typename T>
__device__ __forceinline__ void block_argmax_after(const T* row, long long lo, long long hi,
                                                   double pv, long long pi,
                                                   double* shv, long long* shi,
                                                   double* out_v, long long* out_i) {
    const int t = threadIdx.x;
    double bv = -SR_INF;
    long long bi = -1;
    for (long long j = lo + t; j < hi; j += blockDim.x) {
        double v = (double)row[j];
        bool after = (v < pv) || (v == pv && j > pi);
        if (!after) continue;
        if (bi < 0 || v > bv || (v == bv && j < bi)) { bv = v; bi = j; }
    }
    shv[t] = bv;
    shi[t] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            double v2 = shv[t + s];
            long long i2 = shi[t + s];
            if (i2 >= 0 && (shi[t] < 0 || v2 > shv[t] || (v2 == shv[t] && i2 < shi[t]))) {
                shv[t] = v2;
                shi[t] = i2;
            }
        }
        __syncthreads();
    }
    *out_v = shv[0];
    *out_i = shi[0];
    __syncthreads();
}

template <typename T>
__global__ void segment_reduce(const T* __restrict__ values,
                               const long long* __restrict__ offsets,
                               T* __restrict__ out,
                               long long n_turns, int n_sessions,
                               int op, int k, double beta) {
    __shared__ double shd[SEGMENT_REDUCE_BLOCK];
    __shared__ long long shi[SEGMENT_REDUCE_BLOCK];
    const int s = blockIdx.x;
    const long long b = blockIdx.y;
    if (s >= n_sessions) return;
    const long long lo = offsets[s], hi = offsets[s + 1];
    const long long n = hi - lo;
    const T* row = values + b * n_turns;
    const int t = threadIdx.x;
    double result;
    if (n <= 0) {
        result = -SR_INF;
    } else if (op == 0) {  // mean
        double acc = 0.0;
        for (long long j = lo + t; j < hi; j += blockDim.x) acc += (double)row[j];
        result = block_sum(acc, shd) / (double)n;
    } else if (op == 1) {  // max
        double m = -SR_INF;
        for (long long j = lo + t; j < hi; j += blockDim.x) m = fmax(m, (double)row[j]);
        result = block_max(m, shd);
    } else if (op == 2) {  // top-k mean
        const long long kk = (long long)k < n ? (long long)k : n;
        double pv = SR_INF, acc = 0.0;
        long long pi = -1;
        for (long long r = 0; r < kk; ++r) {
            double v;
            long long i;
            block_argmax_after(row, lo, hi, pv, pi, shd, shi, &v, &i);
            acc += v;
            pv = v;
            pi = i;
        }
        result = acc / (double)kk;
    } else {  // lse (3) / lme (4): stable two-pass log-sum-exp
        double m = -SR_INF;
        for (long long j = lo + t; j < hi; j += blockDim.x) m = fmax(m, beta * (double)row[j]);
        m = block_max(m, shd);
        double acc = 0.0;
        for (long long j = lo + t; j < hi; j += blockDim.x) acc += exp(beta * (double)row[j] - m);
        acc = block_sum(acc, shd);
        double lse = m + log(acc);
        if (op == 4) lse -= log((double)n);
        result = lse / beta;
    }
    if (t == 0) out[b * (long long)n_sessions + s] = (T)result;
}

template __global__ void segment_reduce<float>(const float*, const long long*, float*, long long, int, int, int, double);
template __global__ void segment_reduce<double>(const double*, const long long*, double*, long long, int, int, int, double);
