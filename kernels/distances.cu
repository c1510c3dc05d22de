// distances.cu: exact distance matrices and pair distances, from direct coordinate differences
// (never |a|^2 + |b|^2 - 2 a.b, which loses ~1e-2 Angstrom to cancellation far from the origin).
//
// float32 entry points take the differences and the squared norm in double (the difference of two
// floats is exact in double), round the squared distance to float and take sqrtf: the result is
// within ~6e-5 Angstrom of the float64 distance up to 1,000 Angstrom, and the few double operations
// per element hide under the memory-bound stores. The NumPy twin does the same arithmetic.
#include "common.cuh"

template <typename T> struct pg_acc { typedef T type; };
template <> struct pg_acc<float> { typedef double type; };

// |b - a| from coordinates already in the arithmetic type A (double for float data), rounded to T.
template <typename T, typename A>
__device__ __forceinline__ T pg_distance(const A* a, const A* b, const double* box, const double* inv, int pbc) {
    A dx = b[0] - a[0], dy = b[1] - a[1], dz = b[2] - a[2];
    if (pbc) pg_minimum_image<A, double>(dx, dy, dz, box, inv, pbc);
    return pg_sqrt<T>((T)(dx * dx + dy * dy + dz * dz));
}

// One block = ROWS_PER_BLOCK rows (i) of one frame; each thread owns 4 consecutive columns (j), loads
// their coordinates once and reuses them for every row, and writes each row's 4 results as one
// 16-byte streaming store when the row is 16-byte aligned (m % 4 == 0 for float), else 4 scalar
// stores. The stores of a warp cover 512 contiguous bytes of a row.
//   x: (F, N, 3), y: (Fy, M, 3) with Fy = F (y_frame_step = 1) or 1 (y_frame_step = 0)
//   box, inv: (Fb, 9) doubles with Fb = F (box_step = 1) or 1 (box_step = 0); ignored when pbc == 0
//   out: (F, N, M); grid.x = F * ceil(N / ROWS_PER_BLOCK)
#ifndef ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 8
#endif

template <typename T> struct pg_vec4 { static const bool ok = false; };
template <> struct pg_vec4<float> { static const bool ok = true; };

template <typename T>
__device__ void distance_matrix(const T* __restrict__ x, const T* __restrict__ y, const double* __restrict__ box,
                                const double* __restrict__ inv, T* __restrict__ out, int n_frames, int n, int m,
                                int y_frame_step, int box_step, int pbc) {
    typedef typename pg_acc<T>::type A;
    const int tiles = (n + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    const int f = blockIdx.x / tiles;
    if (f >= n_frames) return;
    const int i0 = (blockIdx.x - f * tiles) * ROWS_PER_BLOCK;
    const int rows = min(ROWS_PER_BLOCK, n - i0);
    const T* xf = x + ((i64)f * n + i0) * 3;
    const T* yf = y + (i64)f * y_frame_step * m * 3;
    const double* bf = box + (i64)f * box_step * 9;
    const double* inf = inv + (i64)f * box_step * 9;
    T* of = out + ((i64)f * n + i0) * m;
    const bool vec = pg_vec4<T>::ok && (m % 4 == 0);
    for (int j0 = 4 * (blockIdx.y * blockDim.x + threadIdx.x); j0 < m; j0 += 4 * blockDim.x * gridDim.y) {
        // The 4 columns' coordinates, converted to the arithmetic type once and reused for every row
        // (conversions, not the double arithmetic, would otherwise bound the float32 kernel).
        A yc[4][3];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int j = min(j0 + c, m - 1);  // clamp: the extra columns are computed, never stored
            yc[c][0] = (A)yf[3 * (i64)j];
            yc[c][1] = (A)yf[3 * (i64)j + 1];
            yc[c][2] = (A)yf[3 * (i64)j + 2];
        }
#pragma unroll 4
        for (int r = 0; r < rows; ++r) {
            const A a[3] = {(A)xf[3 * r], (A)xf[3 * r + 1], (A)xf[3 * r + 2]};
            T d[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) d[c] = pg_distance<T, A>(a, yc[c], bf, inf, pbc);
            T* o = of + (i64)r * m + j0;
            bool stored = false;
            if constexpr (pg_vec4<T>::ok) {
                if (vec) {  // j0 + 3 < m holds here because m % 4 == 0
                    __stcs(reinterpret_cast<float4*>(o), make_float4(d[0], d[1], d[2], d[3]));
                    stored = true;
                }
            }
            if (!stored) {
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    if (j0 + c < m) o[c] = d[c];
            }
        }
    }
}

extern "C" __global__ void distance_matrix_f32(const float* x, const float* y, const double* box, const double* inv,
                                               float* out, int n_frames, int n, int m, int y_frame_step,
                                               int box_step, int pbc) {
    distance_matrix<float>(x, y, box, inv, out, n_frames, n, m, y_frame_step, box_step, pbc);
}

extern "C" __global__ void distance_matrix_f64(const double* x, const double* y, const double* box,
                                               const double* inv, double* out, int n_frames, int n, int m,
                                               int y_frame_step, int box_step, int pbc) {
    distance_matrix<double>(x, y, box, inv, out, n_frames, n, m, y_frame_step, box_step, pbc);
}

// Selected pairs: out[f, k] = |x[f, pairs[k, 1]] - x[f, pairs[k, 0]]|, one thread per (f, k).
template <typename T>
__device__ void pair_distances(const T* __restrict__ x, const long long* __restrict__ pairs,
                               const double* __restrict__ box, const double* __restrict__ inv, T* __restrict__ out,
                               int n_frames, int n, int n_pairs, int box_step, int pbc) {
    PG_GRID_STRIDE_LOOP(idx, (i64)n_frames * n_pairs) {
        const i64 f = idx / n_pairs;
        const i64 k = idx - f * n_pairs;
        typedef typename pg_acc<T>::type A;
        const T* p = x + f * n * 3 + 3 * pairs[2 * k];
        const T* q = x + f * n * 3 + 3 * pairs[2 * k + 1];
        const A a[3] = {(A)p[0], (A)p[1], (A)p[2]};
        const A b[3] = {(A)q[0], (A)q[1], (A)q[2]};
        out[idx] = pg_distance<T, A>(a, b, box + f * box_step * 9, inv + f * box_step * 9, pbc);
    }
}

extern "C" __global__ void pair_distances_f32(const float* x, const long long* pairs, const double* box,
                                              const double* inv, float* out, int n_frames, int n, int n_pairs,
                                              int box_step, int pbc) {
    pair_distances<float>(x, pairs, box, inv, out, n_frames, n, n_pairs, box_step, pbc);
}

extern "C" __global__ void pair_distances_f64(const double* x, const long long* pairs, const double* box,
                                              const double* inv, double* out, int n_frames, int n, int n_pairs,
                                              int box_step, int pbc) {
    pair_distances<double>(x, pairs, box, inv, out, n_frames, n, n_pairs, box_step, pbc);
}
