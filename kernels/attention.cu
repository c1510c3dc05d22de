// attention.cu: distance-biased attention, float32 / float64 kernels.
//
//   logit(i, j, h) = scale * q_i . k_j - gamma_h |x_i - x_j|^2, -inf where key j is masked or
//                    |x_i - x_j| > cutoff; weights = softmax over j; a row with no key left is all zero.
//
// Two entry-point families:
//   bias_softmax_*: the materialised path's fused step. cuBLAS has written S = Q K^T (unscaled) for a
//     chunk of (batch, head) pairs; one block per row adds scale, bias, mask and cutoff and overwrites
//     the row with its softmax (two passes over the row: an online max/sum, then the normalised write).
//   flash_simt_*: the fused path without tensor cores (float32 / float64, or 16-bit inputs whose head
//     dimension the tensor-core kernel does not take, upcast by the host). Tiles of 32 keys go through
//     shared memory; each warp owns SM_ROWS query rows and keeps a running (online) softmax, so the
//     L x L matrix is never stored. Lane = key for the scores, lane = feature for P V.
// The squared distance always comes from the coordinate difference (exact to rounding), never from an
// expansion, so that float32 results match a float32 NumPy run.
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef SM_WARPS  // warps per block of flash_simt
#define SM_WARPS 4
#endif
#ifndef SM_ROWS  // query rows per warp of flash_simt
#define SM_ROWS 4
#endif
#ifndef SOFTMAX_THREADS  // block size of bias_softmax
#define SOFTMAX_THREADS 256
#endif

#define SM_KEYS 32  // keys per tile: one per lane
#define SM_FPL ((HEAD_DIM + 31) / 32)  // output features per lane

template <typename T> __device__ __forceinline__ T att_neg_inf();
template <> __device__ __forceinline__ float att_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double att_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000LL);
}

// Accurate exponentials (not the __expf intrinsic): float32 results are held to a float32 NumPy run.
__device__ __forceinline__ float att_exp(float v) { return expf(v); }
__device__ __forceinline__ double att_exp(double v) { return exp(v); }

// Combine two (max, sum of exp(t - max)) pairs of an online softmax.
template <typename T>
__device__ __forceinline__ void att_combine(T& m, T& z, T m2, T z2) {
    const T mx = m > m2 ? m : m2;
    if (mx == att_neg_inf<T>()) {  // both empty
        m = mx;
        z = T(0);
        return;
    }
    z = z * att_exp(m - mx) + z2 * att_exp(m2 - mx);
    m = mx;
}

// ---- materialised path: bias + mask + cutoff + softmax, in place ------------------------------------
//   s: (nbh, L, L) scores q . k of (batch, head) pairs bh0 .. bh0 + nbh - 1 (bh = b * H + h)
//   coords: (B, L, 3) float32, Angstrom; gamma: (H,); mask: (B, L) uint8 or NULL; cutoff2 < 0: none
// Grid: nbh * L blocks (one per row), SOFTMAX_THREADS threads.
template <typename T>
__device__ __forceinline__ void bias_softmax(T* __restrict__ s, const float* __restrict__ coords,
                                             const T* __restrict__ gamma, const unsigned char* __restrict__ mask,
                                             T scale, T cutoff2, int L, int H, int bh0) {
    __shared__ T red_m[SOFTMAX_THREADS / 32];
    __shared__ T red_z[SOFTMAX_THREADS / 32];
    const i64 row = blockIdx.x;
    const i64 bhl = row / L;
    const int i = (int)(row - bhl * L);
    const int bh = bh0 + (int)bhl;
    const int b = bh / H, h = bh - (bh / H) * H;
    T* srow = s + row * L;
    const float* xb = coords + (i64)b * L * 3;
    const unsigned char* mb = mask ? mask + (i64)b * L : nullptr;
    const T g = gamma[h];
    const T xi = xb[3 * i], yi = xb[3 * i + 1], zi = xb[3 * i + 2];
    const T ninf = att_neg_inf<T>();

    auto logit = [&](int j) -> T {
        if (mb && !mb[j]) return ninf;
        const T dx = xi - (T)xb[3 * j], dy = yi - (T)xb[3 * j + 1], dz = zi - (T)xb[3 * j + 2];
        const T d2 = dx * dx + dy * dy + dz * dz;
        if (cutoff2 >= T(0) && d2 > cutoff2) return ninf;
        return scale * srow[j] - g * d2;
    };

    // Pass 1: each thread's online (max, sum), then the block's.
    T m = ninf, z = T(0);
    for (int j = threadIdx.x; j < L; j += SOFTMAX_THREADS) {
        const T t = logit(j);
        if (t == ninf) continue;
        if (t > m) {
            z = z * att_exp(m - t) + T(1);
            m = t;
        } else {
            z += att_exp(t - m);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const T m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const T z2 = __shfl_xor_sync(0xffffffffu, z, off);
        att_combine(m, z, m2, z2);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        red_m[warp] = m;
        red_z[warp] = z;
    }
    __syncthreads();
    m = red_m[0];
    z = red_z[0];
    for (int w = 1; w < SOFTMAX_THREADS / 32; ++w) att_combine(m, z, red_m[w], red_z[w]);

    // Pass 2: normalised weights; a row with every key masked becomes zeros (not NaN).
    const bool empty = (m == ninf);
    const T inv = empty ? T(0) : T(1) / z;
    for (int j = threadIdx.x; j < L; j += SOFTMAX_THREADS) {
        const T t = logit(j);
        srow[j] = (empty || t == ninf) ? T(0) : att_exp(t - m) * inv;
    }
}

extern "C" __global__ __launch_bounds__(SOFTMAX_THREADS) void bias_softmax_f32(
    float* s, const float* coords, const float* gamma, const unsigned char* mask, float scale, float cutoff2,
    int L, int H, int bh0) {
    bias_softmax<float>(s, coords, gamma, mask, scale, cutoff2, L, H, bh0);
}

extern "C" __global__ __launch_bounds__(SOFTMAX_THREADS) void bias_softmax_f64(
    double* s, const float* coords, const double* gamma, const unsigned char* mask, double scale, double cutoff2,
    int L, int H, int bh0) {
    bias_softmax<double>(s, coords, gamma, mask, scale, cutoff2, L, H, bh0);
}

// ---- fused path without tensor cores -----------------------------------------------------------------
//   q, k, v, out: (B, L, H, HEAD_DIM), C-contiguous; coords (B, L, 3) float32; gamma (H,);
//   mask (B, L) uint8 or NULL; cutoff2 < 0: none.
// Grid: (ceil(L / (SM_WARPS * SM_ROWS)), H, B); block: 32 * SM_WARPS threads.
template <typename T>
struct SimtSmem {
    T ks[SM_KEYS][HEAD_DIM + 1];  // +1: lane j reads row j, so consecutive lanes hit consecutive banks
    T vs[SM_KEYS][HEAD_DIM];
    T qs[SM_WARPS * SM_ROWS][HEAD_DIM];
    T ps[SM_WARPS][SM_ROWS][SM_KEYS];
    float kx[SM_KEYS], ky[SM_KEYS], kz[SM_KEYS];
    unsigned char kvalid[SM_KEYS];
};

template <typename T>
__device__ __forceinline__ void flash_simt(SimtSmem<T>& sm, const T* __restrict__ q, const T* __restrict__ k,
                                           const T* __restrict__ v, const float* __restrict__ coords,
                                           const T* __restrict__ gamma, const unsigned char* __restrict__ mask,
                                           T* __restrict__ out, int L, int H, T scale, T cutoff2) {
    constexpr int ROWS = SM_WARPS * SM_ROWS;
    constexpr int THREADS = 32 * SM_WARPS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y, b = blockIdx.z;
    const i64 rs = (i64)H * HEAD_DIM;
    const i64 base = (i64)b * L * rs + (i64)h * HEAD_DIM;
    const float* xb = coords + (i64)b * L * 3;
    const unsigned char* mb = mask ? mask + (i64)b * L : nullptr;
    const T g = gamma[h];
    const T ninf = att_neg_inf<T>();
    const int r0 = blockIdx.x * ROWS;  // first query row of the block

    for (int idx = tid; idx < ROWS * HEAD_DIM; idx += THREADS) {
        const int r = idx / HEAD_DIM, f = idx - r * HEAD_DIM;
        const int i = r0 + r;
        sm.qs[r][f] = i < L ? q[base + (i64)i * rs + f] : T(0);
    }
    T xi[SM_ROWS], yi[SM_ROWS], zi[SM_ROWS];
#pragma unroll
    for (int r = 0; r < SM_ROWS; ++r) {
        const int i = r0 + warp * SM_ROWS + r;
        const int ic = i < L ? i : 0;
        xi[r] = xb[3 * ic];
        yi[r] = xb[3 * ic + 1];
        zi[r] = xb[3 * ic + 2];
    }
    T m[SM_ROWS], l[SM_ROWS], acc[SM_ROWS][SM_FPL];
#pragma unroll
    for (int r = 0; r < SM_ROWS; ++r) {
        m[r] = ninf;
        l[r] = T(0);
#pragma unroll
        for (int c = 0; c < SM_FPL; ++c) acc[r][c] = T(0);
    }

    for (int n0 = 0; n0 < L; n0 += SM_KEYS) {
        __syncthreads();  // the previous tile is consumed (and qs is written, on the first pass)
        for (int idx = tid; idx < SM_KEYS * HEAD_DIM; idx += THREADS) {
            const int r = idx / HEAD_DIM, f = idx - r * HEAD_DIM;
            const int j = n0 + r;
            const bool ok = j < L;
            sm.ks[r][f] = ok ? k[base + (i64)j * rs + f] : T(0);
            sm.vs[r][f] = ok ? v[base + (i64)j * rs + f] : T(0);
        }
        if (tid < SM_KEYS) {
            const int j = n0 + tid;
            const bool ok = j < L && (mb == nullptr || mb[j]);
            const int jc = j < L ? j : 0;
            sm.kx[tid] = xb[3 * jc];
            sm.ky[tid] = xb[3 * jc + 1];
            sm.kz[tid] = xb[3 * jc + 2];
            sm.kvalid[tid] = ok;
        }
        __syncthreads();

        // Scores: lane = key.
        T s[SM_ROWS];
#pragma unroll
        for (int r = 0; r < SM_ROWS; ++r) s[r] = T(0);
        for (int f = 0; f < HEAD_DIM; ++f) {
            const T kf = sm.ks[lane][f];
#pragma unroll
            for (int r = 0; r < SM_ROWS; ++r) s[r] += sm.qs[warp * SM_ROWS + r][f] * kf;
        }
        const bool valid = sm.kvalid[lane];
        const T kxj = sm.kx[lane], kyj = sm.ky[lane], kzj = sm.kz[lane];
#pragma unroll
        for (int r = 0; r < SM_ROWS; ++r) {
            const T dx = xi[r] - kxj, dy = yi[r] - kyj, dz = zi[r] - kzj;
            const T d2 = dx * dx + dy * dy + dz * dz;
            T t = scale * s[r] - g * d2;
            if (!valid || (cutoff2 >= T(0) && d2 > cutoff2)) t = ninf;
            T tmax = t;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const T o2 = __shfl_xor_sync(0xffffffffu, tmax, off);
                tmax = tmax > o2 ? tmax : o2;
            }
            const T mn = m[r] > tmax ? m[r] : tmax;
            const T mu = (mn == ninf) ? T(0) : mn;  // all keys so far masked: keep exp at 0, not NaN
            const T p = att_exp(t - mu);
            const T corr = att_exp(m[r] - mu);
            T psum = p;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
            l[r] = l[r] * corr + psum;
            m[r] = mn;
#pragma unroll
            for (int c = 0; c < SM_FPL; ++c) acc[r][c] *= corr;
            sm.ps[warp][r][lane] = p;
        }
        __syncwarp();

        // P V: lane = feature.
        for (int j = 0; j < SM_KEYS; ++j) {
#pragma unroll
            for (int c = 0; c < SM_FPL; ++c) {
                const int f = lane + 32 * c;
                const T vj = (f < HEAD_DIM) ? sm.vs[j][f] : T(0);
#pragma unroll
                for (int r = 0; r < SM_ROWS; ++r) acc[r][c] += sm.ps[warp][r][j] * vj;
            }
        }
    }

#pragma unroll
    for (int r = 0; r < SM_ROWS; ++r) {
        const int i = r0 + warp * SM_ROWS + r;
        if (i >= L) continue;
        const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
#pragma unroll
        for (int c = 0; c < SM_FPL; ++c) {
            const int f = lane + 32 * c;
            if (f < HEAD_DIM) out[base + (i64)i * rs + f] = acc[r][c] * inv;
        }
    }
}

extern "C" __global__ __launch_bounds__(32 * SM_WARPS) void flash_simt_f32(
    const float* q, const float* k, const float* v, const float* coords, const float* gamma,
    const unsigned char* mask, float* out, int L, int H, float scale, float cutoff2) {
    __shared__ SimtSmem<float> sm;
    flash_simt<float>(sm, q, k, v, coords, gamma, mask, out, L, H, scale, cutoff2);
}

// float64 tiles of HEAD_DIM > 64 exceed the 48 KB of static shared memory; the host sends those to the
// materialised path and never asks for this entry point then.
#if HEAD_DIM <= 64
extern "C" __global__ __launch_bounds__(32 * SM_WARPS) void flash_simt_f64(
    const double* q, const double* k, const double* v, const float* coords, const double* gamma,
    const unsigned char* mask, double* out, int L, int H, double scale, double cutoff2) {
    __shared__ SimtSmem<double> sm;
    flash_simt<double>(sm, q, k, v, coords, gamma, mask, out, L, H, scale, cutoff2);
}
#endif
