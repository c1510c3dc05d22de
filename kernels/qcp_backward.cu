// qcp_backward.cu: the backward pass of RMSD / superposition to one reference (protgpu/superpose/
// differentiable.py; the maths in its docstring and docs/design/differentiable.md). The torch-ops backward
// there (`_backward_torch`) is the twin, branch for branch.
//
//   qcp_bwd_frames_*     one warp per frame: the upstream gradients of the RMSD, the rotation, the
//                        translation and the moved coordinates turned into the gradient of the frame's
//                        coordinates (one or two passes over the fitted atoms, one over the others
//                        when the moved coordinates have a gradient and atoms are selected), and the
//                        frame's 13 numbers for the reference's gradient
//   qcp_bwd_reference_*  the reference's gradient: one thread per fitted atom and chunk of frames sums
//                        the chunk's frames (deterministic: no atomics; the caller sums the chunks)
//
// Shared arguments (those of qcp.cu's frame_moments_* where they are the same):
//   x:       (n_frames, n_atoms, 3) mobile frames, float32 or float64
//   idx:     (n,) int32 fitted atoms of each frame (no repeats), or NULL for all (then n == n_atoms)
//   ref:     (4, n) float64: the reference centred with the fit weights (rows x, y, z) and the weights
//            (row 3; read only when weighted != 0)
//   rot:     (n_frames, 9) row-major optimal rotations; trans: (n_frames, 3) = cy - rot @ c_x
//   frame:   (n_frames, 13) float64 = C (9, row-major), coef, d (3): the reference's gradient is
//            w_k (sum_f C_f x_fk + d_f + coef_f yc_k)
#include "common.cuh"

#ifndef QB_TILE
#define QB_TILE 64  // frames of qcp_bwd_reference_*'s per-frame numbers held in shared memory at once
#endif

__device__ __forceinline__ i64 qb_warp_id() { return ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; }
__device__ __forceinline__ i64 qb_warps() { return ((i64)gridDim.x * blockDim.x) >> 5; }

template <int K>
__device__ __forceinline__ void qb_warp_sum(double (&v)[K]) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < K; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], off);
    }
}

// Cyclic Jacobi of a symmetric 3x3 matrix a (overwritten: its diagonal ends as the eigenvalues); v gets
// the eigenvectors as columns. Three rotations a sweep; stops once the off-diagonal part is below
// rounding of the whole (at most 16 sweeps: converges quadratically, ~4 in practice).
__device__ void qb_jacobi3(double a[3][3], double v[3][3]) {
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) v[i][j] = i == j ? 1.0 : 0.0;
    for (int sweep = 0; sweep < 16; ++sweep) {
        const double off = a[0][1] * a[0][1] + a[0][2] * a[0][2] + a[1][2] * a[1][2];
        const double diag = a[0][0] * a[0][0] + a[1][1] * a[1][1] + a[2][2] * a[2][2];
        if (!(off > 1e-36 * diag)) break;  // (also leaves on NaN)
        for (int r = 0; r < 3; ++r) {
            const int p = r == 2 ? 1 : 0, q = r == 0 ? 1 : 2;  // (0,1), (0,2), (1,2)
            const double apq = a[p][q];
            if (apq == 0.0) continue;
            const double theta = (a[q][q] - a[p][p]) / (2.0 * apq);
            const double t = copysign(1.0, theta) / (fabs(theta) + hypot(1.0, theta));
            const double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
            a[p][p] -= t * apq;
            a[q][q] += t * apq;
            a[p][q] = a[q][p] = 0.0;
            const int o = 3 - p - q;
            const double aop = a[o][p], aoq = a[o][q];
            a[o][p] = a[p][o] = c * aop - s * aoq;
            a[o][q] = a[q][o] = s * aop + c * aoq;
            for (int k = 0; k < 3; ++k) {
                const double vp = v[k][p], vq = v[k][q];
                v[k][p] = c * vp - s * vq;
                v[k][q] = s * vp + c * vq;
            }
        }
    }
}

// dL/dB (gb, 3x3 row-major) from dL/dR (g) for the rotation r optimal for b = sum w yc xc^T: gb = R [z]_x
// with (A^2 + eps^2 I) z = A vee(K - K^T), A = tr(P) I - P, P = sym(R^T B), K = R^T G, solved in P's
// eigenbasis (A shares it): z = V diag(a / (a^2 + eps^2)) V^T kappa, a_k = tr P - p_k. Bounded by
// |kappa| / (2 eps) whatever the rounding of a near-zero a_k (where the twin's LU solve is as noisy).
__device__ void qb_rotation_backward(const double* r, const double* b, const double* g, double rot_eps,
                                     double eps_abs, double* gb) {
    double p[3][3], k[3][3];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
            double sp = 0.0, sk = 0.0;
            for (int m = 0; m < 3; ++m) {
                sp += r[3 * m + i] * b[3 * m + j];
                sk += r[3 * m + i] * g[3 * m + j];
            }
            p[i][j] = sp;
            k[i][j] = sk;
        }
    double a[3][3];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) a[i][j] = 0.5 * (p[i][j] + p[j][i]);
    const double tr = a[0][0] + a[1][1] + a[2][2];
    const double eps = rot_eps * fabs(tr) + eps_abs;
    const double kap[3] = {k[2][1] - k[1][2], k[0][2] - k[2][0], k[1][0] - k[0][1]};
    double v[3][3];
    qb_jacobi3(a, v);
    double u[3];
    for (int j = 0; j < 3; ++j) {
        const double aj = tr - a[j][j];
        u[j] = (v[0][j] * kap[0] + v[1][j] * kap[1] + v[2][j] * kap[2]) * (aj / (aj * aj + eps * eps));
    }
    double z[3];
    for (int i = 0; i < 3; ++i) z[i] = v[i][0] * u[0] + v[i][1] * u[1] + v[i][2] * u[2];
    const double sk[9] = {0.0, -z[2], z[1], z[2], 0.0, -z[0], -z[1], z[0], 0.0};  // [z]_x
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) gb[3 * i + j] = r[3 * i] * sk[j] + r[3 * i + 1] * sk[3 + j] + r[3 * i + 2] * sk[6 + j];
}

// Per frame, with c_x = R^T (cy - t), xc = x - c_x, the upstream gradients g_r (F,), g_rot (F, 9),
// g_t (F, 3), g_c (F, n_atoms, 3) (each NULL when absent) and coef = g_r / (W rmsd) (0 where
// rmsd <= floor):
//   T = g_t + sum_i g_c,i                          (everything that reaches the translation)
//   G = g_rot + sum_i g_c,i xc_i^T - g_t c_x^T     (everything that reaches the rotation)
//   gb = dL/dB from G (qb_rotation_backward; skipped when G is absent)
//   gx_i = R^T g_c,i  (every atom)  +  w_i (coef (xc_i - R^T yc_i) + gb^T yc_i - R^T T / W)  (fitted)
// gx: (n_frames, n_atoms, 3) or NULL (no gradient wanted); with idx and no g_c the caller zeroes it.
// frame (or NULL): C = gb - coef R, coef, d = -C c_x + T / W.
template <typename T>
__device__ void qcp_bwd_frames(const T* __restrict__ x, const int* __restrict__ idx, const double* __restrict__ ref,
                               const double* __restrict__ rot, const double* __restrict__ trans,
                               const double* __restrict__ rmsd, const double* __restrict__ g_r,
                               const double* __restrict__ g_rot, const double* __restrict__ g_t,
                               const T* __restrict__ g_c, T* gx, double* __restrict__ frame, i64 n_frames,
                               int n_atoms, int n, int weighted, double inv_w, double cy0, double cy1, double cy2,
                               double floor_r, double rot_eps, double eps_abs) {
    const int lane = threadIdx.x & 31;
    const bool has_rot = g_rot || g_t || g_c;
    for (i64 f = qb_warp_id(); f < n_frames; f += qb_warps()) {
        double r[9];
        for (int j = 0; j < 9; ++j) r[j] = rot[9 * f + j];
        const double dy[3] = {cy0 - trans[3 * f], cy1 - trans[3 * f + 1], cy2 - trans[3 * f + 2]};
        double cx[3];
        for (int j = 0; j < 3; ++j) cx[j] = r[j] * dy[0] + r[3 + j] * dy[1] + r[6 + j] * dy[2];
        double coef = 0.0;
        if (g_r) {
            const double rf = rmsd[f];
            if (rf > floor_r) coef = g_r[f] * inv_w / rf;  // (NaN: not live, as in the twin)
        }
        const T* xf = x + f * (i64)n_atoms * 3;
        double G[9], tt[3];
        for (int j = 0; j < 9; ++j) G[j] = g_rot ? g_rot[9 * f + j] : 0.0;
        for (int j = 0; j < 3; ++j) tt[j] = g_t ? g_t[3 * f + j] : 0.0;
        if (g_c) {
            double acc[12];
            for (int j = 0; j < 12; ++j) acc[j] = 0.0;
            const T* gf = g_c + f * (i64)n_atoms * 3;
            for (int a = lane; a < n_atoms; a += 32) {
                const double gv[3] = {(double)gf[3 * a], (double)gf[3 * a + 1], (double)gf[3 * a + 2]};
                const double xv[3] = {(double)xf[3 * a] - cx[0], (double)xf[3 * a + 1] - cx[1],
                                      (double)xf[3 * a + 2] - cx[2]};
                for (int i = 0; i < 3; ++i) {
                    acc[9 + i] += gv[i];
                    for (int j = 0; j < 3; ++j) acc[3 * i + j] += gv[i] * xv[j];
                }
            }
            qb_warp_sum(acc);
            for (int j = 0; j < 9; ++j) G[j] += acc[j];
            for (int j = 0; j < 3; ++j) tt[j] += acc[9 + j];
        }
        if (g_t)
            for (int i = 0; i < 3; ++i)
                for (int j = 0; j < 3; ++j) G[3 * i + j] -= g_t[3 * f + i] * cx[j];
        double gb[9];
        for (int j = 0; j < 9; ++j) gb[j] = 0.0;
        if (has_rot) {
            double b[9];
            for (int j = 0; j < 9; ++j) b[j] = 0.0;
            for (int k = lane; k < n; k += 32) {
                const int a = idx ? idx[k] : k;
                const double w = weighted ? ref[3 * (i64)n + k] : 1.0;
                const double yv[3] = {w * ref[k], w * ref[(i64)n + k], w * ref[2 * (i64)n + k]};
                const double xv[3] = {(double)xf[3 * a] - cx[0], (double)xf[3 * a + 1] - cx[1],
                                      (double)xf[3 * a + 2] - cx[2]};
                for (int i = 0; i < 3; ++i)
                    for (int j = 0; j < 3; ++j) b[3 * i + j] += yv[i] * xv[j];
            }
            qb_warp_sum(b);
            qb_rotation_backward(r, b, G, rot_eps, eps_abs, gb);
        }
        // R^T T / W, the translation's share of each fitted atom (times its weight)
        double rt[3];
        for (int j = 0; j < 3; ++j) rt[j] = (r[j] * tt[0] + r[3 + j] * tt[1] + r[6 + j] * tt[2]) * inv_w;
        if (frame && lane == 0) {
            double* fo = frame + 13 * f;
            double cm[9];
            for (int j = 0; j < 9; ++j) cm[j] = gb[j] - coef * r[j];
            for (int j = 0; j < 9; ++j) fo[j] = cm[j];
            fo[9] = coef;
            for (int i = 0; i < 3; ++i)
                fo[10 + i] = tt[i] * inv_w - (cm[3 * i] * cx[0] + cm[3 * i + 1] * cx[1] + cm[3 * i + 2] * cx[2]);
        }
        if (!gx) continue;
        T* of = gx + f * (i64)n_atoms * 3;
        if (g_c && idx) {  // atoms outside the fit: only the moved coordinates' share
            const T* gf = g_c + f * (i64)n_atoms * 3;
            for (int a = lane; a < n_atoms; a += 32)
                for (int j = 0; j < 3; ++j)
                    of[3 * a + j] = (T)(r[j] * (double)gf[3 * a] + r[3 + j] * (double)gf[3 * a + 1] +
                                        r[6 + j] * (double)gf[3 * a + 2]);
            __syncwarp();  // the pass below adds to what other lanes wrote
        }
        for (int k = lane; k < n; k += 32) {
            const int a = idx ? idx[k] : k;
            const double w = weighted ? ref[3 * (i64)n + k] : 1.0;
            const double yv[3] = {ref[k], ref[(i64)n + k], ref[2 * (i64)n + k]};
            double o[3];
            for (int j = 0; j < 3; ++j) {
                const double xc = (double)xf[3 * a + j] - cx[j];
                const double rty = r[j] * yv[0] + r[3 + j] * yv[1] + r[6 + j] * yv[2];
                const double gby = gb[j] * yv[0] + gb[3 + j] * yv[1] + gb[6 + j] * yv[2];
                o[j] = w * (coef * (xc - rty) + gby - rt[j]);
            }
            if (g_c && !idx) {
                const T* gv = g_c + f * (i64)n_atoms * 3 + 3 * a;
                for (int j = 0; j < 3; ++j)
                    o[j] += r[j] * (double)gv[0] + r[3 + j] * (double)gv[1] + r[6 + j] * (double)gv[2];
            } else if (idx) {
                for (int j = 0; j < 3; ++j) o[j] += (double)of[3 * a + j];
            }
            for (int j = 0; j < 3; ++j) of[3 * a + j] = (T)o[j];
        }
    }
}

extern "C" __global__ void qcp_bwd_frames_f32(const float* x, const int* idx, const double* ref, const double* rot, const double* trans, const double* rmsd, const double* g_r, const double* g_rot, const double* g_t, const float* g_c, float* gx, double* frame, long long n_frames, int n_atoms, int n, int weighted, double inv_w, double cy0, double cy1, double cy2, double floor_r, double rot_eps, double eps_abs) {
    qcp_bwd_frames<float>(x, idx, ref, rot, trans, rmsd, g_r, g_rot, g_t, g_c, gx, frame, n_frames, n_atoms, n, weighted, inv_w, cy0, cy1, cy2, floor_r, rot_eps, eps_abs);
}

extern "C" __global__ void qcp_bwd_frames_f64(const double* x, const int* idx, const double* ref, const double* rot, const double* trans, const double* rmsd, const double* g_r, const double* g_rot, const double* g_t, const double* g_c, double* gx, double* frame, long long n_frames, int n_atoms, int n, int weighted, double inv_w, double cy0, double cy1, double cy2, double floor_r, double rot_eps, double eps_abs) {
    qcp_bwd_frames<double>(x, idx, ref, rot, trans, rmsd, g_r, g_rot, g_t, g_c, gx, frame, n_frames, n_atoms, n, weighted, inv_w, cy0, cy1, cy2, floor_r, rot_eps, eps_abs);
}

// The reference's gradient, chunk by chunk: block (blockIdx.x, blockIdx.y) takes fitted atoms
// [blockIdx.x * blockDim.x, ...) and frames [blockIdx.y * chunk, ...) and writes
// partial[blockIdx.y, k, :] = w_k (sum_f C_f x_fk + d_f + coef_f yc_k) over its frames; the frames'
// 13 numbers pass through shared memory QB_TILE frames at a time (every thread reads all of them).
template <typename T>
__device__ void qcp_bwd_reference(const T* __restrict__ x, const int* __restrict__ idx, const double* __restrict__ ref,
                                  const double* __restrict__ frame, double* __restrict__ partial, i64 n_frames,
                                  int n_atoms, int n, int weighted, i64 chunk) {
    __shared__ double fs[QB_TILE * 13];
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = k < n;
    const int a = live ? (idx ? idx[k] : k) : 0;
    const i64 f0 = (i64)blockIdx.y * chunk;
    const i64 f1 = f0 + chunk < n_frames ? f0 + chunk : n_frames;
    double acc[3] = {0.0, 0.0, 0.0}, s = 0.0;
    for (i64 t0 = f0; t0 < f1; t0 += QB_TILE) {
        const int nt = (int)(f1 - t0 < QB_TILE ? f1 - t0 : QB_TILE);
        __syncthreads();
        for (int j = threadIdx.x; j < 13 * nt; j += blockDim.x) fs[j] = frame[13 * t0 + j];
        __syncthreads();
        if (!live) continue;
        for (int t = 0; t < nt; ++t) {
            const double* c = fs + 13 * t;
            const T* xa = x + (t0 + t) * (i64)n_atoms * 3 + 3 * (i64)a;
            const double xv[3] = {(double)xa[0], (double)xa[1], (double)xa[2]};
            for (int i = 0; i < 3; ++i) acc[i] += c[3 * i] * xv[0] + c[3 * i + 1] * xv[1] + c[3 * i + 2] * xv[2] + c[10 + i];
            s += c[9];
        }
    }
    if (!live) return;
    const double w = weighted ? ref[3 * (i64)n + k] : 1.0;
    double* out = partial + ((i64)blockIdx.y * n + k) * 3;
    for (int i = 0; i < 3; ++i) out[i] = w * (acc[i] + s * ref[(i64)i * n + k]);
}

extern "C" __global__ void qcp_bwd_reference_f32(const float* x, const int* idx, const double* ref, const double* frame, double* partial, long long n_frames, int n_atoms, int n, int weighted, long long chunk) {
    qcp_bwd_reference<float>(x, idx, ref, frame, partial, n_frames, n_atoms, n, weighted, chunk);
}

extern "C" __global__ void qcp_bwd_reference_f64(const double* x, const int* idx, const double* ref, const double* frame, double* partial, long long n_frames, int n_atoms, int n, int weighted, long long chunk) {
    qcp_bwd_reference<double>(x, idx, ref, frame, partial, n_frames, n_atoms, n, weighted, chunk);
}
