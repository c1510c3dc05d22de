// consensus.cu: ensemble consensus score, fused over tiles of an all-vs-all RMSD matrix.
//
// Model i attends over the others (j != i) with weights w_ij = softmax_j(-r_ij^2 / T) and scores
// score_i = sum_j w_ij sim_ij, sim_ij = 1 / (1 + r_ij^2 / d0^2) (protgpu/scoring/consensus.py is the
// NumPy twin). Nothing M x M is kept: each model carries an online-softmax state in three float64
// arrays,
//   m[i]  running maximum of the logits l_ij = -r_ij^2 / T seen so far,
//   s[i]  sum of exp(l_ij - m[i]),
//   t[i]  sum of exp(l_ij - m[i]) * sim_ij,
// and consensus_tile_* folds one RMSD tile into the states of its rows and (for an off-diagonal tile
// of a symmetric, triangular schedule) of its columns, so every pair is computed once. At the end
// score_i = t[i] / s[i]. An empty state has s == 0 (any element contributes exp(0) = 1 at its max).
// NaN RMSDs make the state, hence the score, NaN.
//
// consensus_weights_* turns a full RMSD matrix and the final states into the (M, M) weights.
#include "common.cuh"

#ifndef CS_THREADS
#define CS_THREADS 256  // threads per block of both kernels; a multiple of 32
#endif

#define CS_ROWS 1  // fold each tile row into the state of its row (model row0 + a)
#define CS_COLS 2  // fold each tile column into the state of its column (model col0 + b)

#define CS_WARPS (CS_THREADS / 32)

// -infinity (NVRTC has no <cmath> INFINITY): the max of an empty state.
__device__ __forceinline__ double cs_neg_inf() { return __longlong_as_double(0xfff0000000000000LL); }

// Fold one element (r2 = r^2) into a thread's state. The max only moves on the first elements of a
// row as a rule, so the common case costs one exp.
__device__ __forceinline__ void cs_push(double& m, double& s, double& t, double r2, double inv_t, double inv_d0sq) {
    const double l = -r2 * inv_t;
    const double sim = 1.0 / (1.0 + r2 * inv_d0sq);
    if (l > m) {
        const double c = exp(m - l);  // exp(-inf) = 0 for the first element
        s = s * c + 1.0;
        t = t * c + sim;
        m = l;
    } else {
        const double e = exp(l - m);  // NaN for a NaN r: the state becomes NaN, as it should
        s += e;
        t += e * sim;
    }
}

// (m, s, t) <- merge of two partial states. s == 0 marks an empty state (its m is -inf, and exp(-inf -
// -inf) would be NaN). NaN compares unequal to 0, so a NaN state stays NaN through merges.
__device__ __forceinline__ void cs_merge(double& m, double& s, double& t, double m2, double s2, double t2) {
    if (s2 == 0.0) return;
    if (s == 0.0) {
        m = m2;
        s = s2;
        t = t2;
        return;
    }
    const double mn = fmax(m, m2);
    const double a = exp(m - mn), b = exp(m2 - mn);
    s = s * a + s2 * b;
    t = t * a + t2 * b;
    m = mn;
}

__device__ __forceinline__ void cs_warp_merge(double& m, double& s, double& t) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const double m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const double s2 = __shfl_xor_sync(0xffffffffu, s, off);
        const double t2 = __shfl_xor_sync(0xffffffffu, t, off);
        cs_merge(m, s, t, m2, s2, t2);
    }
}

//   r:        the tile, (ti, tj) with row stride ld (elements); r[a * ld + b] = RMSD(row0 + a, col0 + b)
//   m, s, t:  states of all models (global arrays indexed by model)
//   mode:     CS_ROWS and/or CS_COLS. With both, the row and column models must be disjoint (an
//             off-diagonal tile, col0 >= row0 + ti): blocks of the two parts run concurrently.
//   n_row_blocks: blocks [0, n_row_blocks) do the rows (one warp per row), the rest the columns (32
//             columns per block, CS_WARPS row slices each, merged through shared memory).
// The pair of a model with itself (row0 + a == col0 + b) is always skipped.
template <typename T>
__device__ void consensus_tile(const T* __restrict__ r, i64 ld, int ti, int tj, i64 row0, i64 col0, double* __restrict__ m,
                               double* __restrict__ s, double* __restrict__ t, double inv_t, double inv_d0sq, int mode,
                               int n_row_blocks) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if ((int)blockIdx.x < n_row_blocks) {
        if (!(mode & CS_ROWS)) return;
        const i64 a = (i64)blockIdx.x * CS_WARPS + warp;
        if (a >= ti) return;  // whole warp leaves together: the shuffles below stay full-warp
        const i64 gi = row0 + a;
        const T* row = r + a * ld;
        double lm = cs_neg_inf(), ls = 0.0, lt = 0.0;
        for (int b = lane; b < tj; b += 32) {
            if (col0 + b == gi) continue;
            const double v = (double)row[b];
            cs_push(lm, ls, lt, v * v, inv_t, inv_d0sq);
        }
        cs_warp_merge(lm, ls, lt);
        if (lane == 0) {
            double gm = m[gi], gs = s[gi], gt = t[gi];
            cs_merge(gm, gs, gt, lm, ls, lt);
            m[gi] = gm;
            s[gi] = gs;
            t[gi] = gt;
        }
        return;
    }
    if (!(mode & CS_COLS)) return;
    __shared__ double part[3][CS_WARPS][32];
    const i64 b = (i64)(blockIdx.x - n_row_blocks) * 32 + lane;
    const i64 gj = col0 + b;
    double lm = cs_neg_inf(), ls = 0.0, lt = 0.0;
    if (b < tj) {
        // Each warp reads 32 consecutive columns of one row per step: coalesced.
        for (int a = warp; a < ti; a += CS_WARPS) {
            if (row0 + a == gj) continue;
            const double v = (double)r[(i64)a * ld + b];
            cs_push(lm, ls, lt, v * v, inv_t, inv_d0sq);
        }
    }
    part[0][warp][lane] = lm;
    part[1][warp][lane] = ls;
    part[2][warp][lane] = lt;
    __syncthreads();
    if (warp == 0 && b < tj) {
        for (int w = 1; w < CS_WARPS; ++w) cs_merge(lm, ls, lt, part[0][w][lane], part[1][w][lane], part[2][w][lane]);
        double gm = m[gj], gs = s[gj], gt = t[gj];
        cs_merge(gm, gs, gt, lm, ls, lt);
        m[gj] = gm;
        s[gj] = gs;
        t[gj] = gt;
    }
}

extern "C" __global__ __launch_bounds__(CS_THREADS) void consensus_tile_f32(const float* r, long long ld, int ti, int tj, long long row0, long long col0, double* m, double* s, double* t, double inv_t, double inv_d0sq, int mode, int n_row_blocks) {
    consensus_tile<float>(r, ld, ti, tj, row0, col0, m, s, t, inv_t, inv_d0sq, mode, n_row_blocks);
}

extern "C" __global__ __launch_bounds__(CS_THREADS) void consensus_tile_f64(const double* r, long long ld, int ti, int tj, long long row0, long long col0, double* m, double* s, double* t, double inv_t, double inv_d0sq, int mode, int n_row_blocks) {
    consensus_tile<double>(r, ld, ti, tj, row0, col0, m, s, t, inv_t, inv_d0sq, mode, n_row_blocks);
}

// Weights from a full (n, n) RMSD matrix and the final states: w[i, j] = exp(-r_ij^2 / T - m[i]) / s[i]
// for j != i, w[i, i] = 0. Row-major, one thread per element (grid-stride).
template <typename T>
__device__ void consensus_weights(const T* __restrict__ r, double* __restrict__ w, const double* __restrict__ m,
                                  const double* __restrict__ s, i64 n, double inv_t) {
    PG_GRID_STRIDE_LOOP(idx, n * n) {
        const i64 i = idx / n;
        const i64 j = idx - i * n;
        if (i == j) {
            w[idx] = 0.0;
        } else {
            const double v = (double)r[idx];
            w[idx] = exp(-v * v * inv_t - m[i]) / s[i];
        }
    }
}

extern "C" __global__ void consensus_weights_f32(const float* r, double* w, const double* m, const double* s, long long n, double inv_t) {
    consensus_weights<float>(r, w, m, s, n, inv_t);
}

extern "C" __global__ void consensus_weights_f64(const double* r, double* w, const double* m, const double* s, long long n, double inv_t) {
    consensus_weights<double>(r, w, m, s, n, inv_t);
}
