// distances.cu: exact distance matrices and pair distances, from direct coordinate differences
// (never |a|^2 + |b|^2 - 2 a.b, which loses ~1e-2 Angstrom to cancellation far from the origin).
//
// float32 entry points take the differences and the squared norm in double (the difference of two
// floats is exact in double), round the squared distance to float and take sqrtf: the result is
// within ~6e-5 Angstrom of the float64 distance up to 1,000 Angstrom, and the few double operations
// per element hide under the memory-bound stores. The NumPy twin does the same arithmetic.
#include "common.cuh"

#ifndef COLS_PER_THREAD
#define COLS_PER_THREAD 4
#endif

template <typename T> struct pg_acc { typedef T type; };
template <> struct pg_acc<float> { typedef double type; };

template <typename T>
__device__ __forceinline__ T pg_distance(const T* a, const T* b, const double* box, const double* inv, int pbc) {
    typedef typename pg_acc<T>::type A;
    A dx = (A)b[0] - (A)a[0], dy = (A)b[1] - (A)a[1], dz = (A)b[2] - (A)a[2];
    if (pbc) pg_minimum_image<A, double>(dx, dy, dz, box, inv, pbc);
    return pg_sqrt<T>((T)(dx * dx + dy * dy + dz * dz));
}

// One block row = one (frame, i); threads run along j so that the stores of a warp are contiguous.
//   x: (F, N, 3), y: (Fy, M, 3) with Fy = F (y_frame_step = 1) or 1 (y_frame_step = 0)
//   box, inv: (Fb, 9) doubles with Fb = F (box_step = 1) or 1 (box_step = 0); ignored when pbc == 0
//   out: (F, N, M)
template <typename T>
__device__ void distance_matrix(const T* __restrict__ x, const T* __restrict__ y, const double* __restrict__ box,
                                const double* __restrict__ inv, T* __restrict__ out, int n_frames, int n, int m,
                                int y_frame_step, int box_step, int pbc) {
    const i64 row = blockIdx.x;  // f * n + i
    const int f = (int)(row / n);
    if (f >= n_frames) return;
    const T* xi = x + row * 3;
    const T a[3] = {xi[0], xi[1], xi[2]};
    const T* yf = y + (i64)f * y_frame_step * m * 3;
    const double* bf = box + (i64)f * box_step * 9;
    const double* inf = inv + (i64)f * box_step * 9;
    T* orow = out + row * m;
    const int j0 = blockIdx.y * blockDim.x * COLS_PER_THREAD + threadIdx.x;
#pragma unroll
    for (int c = 0; c < COLS_PER_THREAD; ++c) {
        const int j = j0 + c * blockDim.x;
        if (j < m) orow[j] = pg_distance<T>(a, yf + 3 * (i64)j, bf, inf, pbc);
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
        const T* xf = x + f * n * 3;
        out[idx] = pg_distance<T>(xf + 3 * pairs[2 * k], xf + 3 * pairs[2 * k + 1], box + f * box_step * 9,
                                  inv + f * box_step * 9, pbc);
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
