// qcp.cu: RMSD after optimal superposition by Theobald's QCP (quaternion characteristic polynomial).
//
// Every job ends in the same float64 QCP step (protgpu/superpose/ is the NumPy twin, constant for
// constant and branch for branch):
//   frame_moments_*  one warp per frame, one pass: G_A and M = sum w (x - c) yc^T against a centred
//                    reference, and the centroid, accumulated in float64
//   qcp_frames       one thread per frame: l_max, the quaternion, the rotation, the translation, the RMSD
//   frame_direct_*   near-identical frames only: the RMSD re-measured on the coordinates
//   centre_frames_*  one warp per frame: the centred (weighted) frames stacked as the GEMM's rows, and G
//   qcp_pairs_*      one thread per pair of an all-vs-all tile: reads the pair's 3x3 block of the
//                    cuBLAS product A B^T of the stacked centred frames, writes the RMSD
//   qcp_refine_*     the rare pairs at a near-repeated root, by the quaternion path
// The Python side passes the numerical constants (QCP_* here and in qcp.cuh) as #defines (the defaults
// in the sources are the same).
#include "common.cuh"
#include "qcp.cuh"  // the per-pair QCP math (QcpKey, qcp_largest, qcp_solve, qcp_rotation, ...)

#ifndef QCP_SLOW_ITERS
#define QCP_SLOW_ITERS 12
#endif

// Output modes of qcp_pairs (bit flags; same values in protgpu/superpose/kernels.py).
#define PAIR_MIRROR 1     // also write out[j, i]
#define PAIR_ZERO_DIAG 2  // global i == j -> exactly 0 (a frame against itself)
#define PAIR_UPPER_ONLY 4 // skip pairs with global i > j (diagonal tiles of a symmetric run)
#define PAIR_CONDENSED 8  // out is SciPy's condensed vector over n_total frames; only i < j written

// ----------------------------------------------------------------------------------------------------
// Warp helpers. Every per-frame kernel below gives one warp to one frame (grid-stride over frames):
// the lanes stride over the atoms, and one butterfly reduction per frame (no __syncthreads, no shared
// memory) leaves the totals in every lane.

template <int K>
__device__ __forceinline__ void warp_sum(double (&v)[K]) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < K; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], off);
    }
}

__device__ __forceinline__ i64 warp_global_id() { return ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; }
__device__ __forceinline__ i64 warp_count() { return ((i64)gridDim.x * blockDim.x) >> 5; }

// ----------------------------------------------------------------------------------------------------
// RMSD / superposition against one reference: frame_moments_* -> qcp_frames -> frame_direct_*.
//
// Shared arguments:
//   x:       (n_frames, n_atoms, 3) frames, float32 or float64 (read once, in their dtype)
//   idx:     (n,) int32 fitted atoms of each frame, or NULL for all (then n == n_atoms)
//   ref:     (4, n) float64, struct of arrays: the reference centred with the fit weights (x, y, z rows,
//            lined up with idx) and the weights (row 3; read only when weighted != 0)
//   moments: (n_frames, 13) float64 = M (9, row-major M_ab = sum w (x_a - c_a) yc_b), G_A, centroid (3)

// One pass over each frame: with s the frame's first fitted atom (any point near the frame would do; it
// keeps sum w |x - s|^2 from cancelling far from the origin) and d = x - s,
//   S = sum w d,  P = sum w d yc^T,  Q = sum w |d|^2   (float64, whatever the input dtype)
// then c - s = S / W, M = P - (c - s) (sum w yc)^T (the reference is centred, so only its rounding
// residual wyc = sum w yc is left) and G_A = Q - W |c - s|^2. No centroid pass: the frame is read once.
// MOMENT_LANES lanes share a frame (32 / MOMENT_LANES frames per warp at once: a shorter butterfly per
// frame, and the groups of a warp read the same reference atoms in one L1 access). MOMENT_UNROLL atoms
// per lane per step keep 3 * MOMENT_UNROLL loads per lane in flight.
// Whole-warp frames of float32 without an index array (the common case: all atoms fitted) whose rows
// are 16-byte aligned (n_atoms % 4 == 0) take the vector path (MOMENT_VEC): a lane reads 4 atoms as 3
// float4 and the matching reference atoms as double2, a quarter and a half of the load instructions of
// the scalar path.
// Measured on the H200 (100,000 x 1,000 float32 frames, 128-thread blocks): the vector path with 2 quads
// per lane per step 0.37 ms (3.3 TB/s of frames; 4 quads 0.38 ms, 8 quads 0.42 ms; a CuPy sum over the
// same array takes 0.31 ms); the scalar path with a whole warp per frame and 8 atoms per lane in flight
// 0.46 ms (0.50-0.55 ms with 2 or 4 atoms in flight, 0.64-0.91 ms with 8 or 16 lanes per frame). A
// reduce-scatter of the 13 sums (16 double shuffles per frame instead of 65) was slower: 0.63-0.78 ms.
#ifndef MOMENT_UNROLL
#define MOMENT_UNROLL 8
#endif
#ifndef MOMENT_LANES
#define MOMENT_LANES 32
#endif
#ifndef MOMENT_VEC
#define MOMENT_VEC 1
#endif
#ifndef MOMENT_VEC_UNROLL  // quads of atoms (3 float4) per lane per step on the vector path
#define MOMENT_VEC_UNROLL 2
#endif
static_assert(MOMENT_LANES == 8 || MOMENT_LANES == 16 || MOMENT_LANES == 32, "MOMENT_LANES is 8, 16 or 32");

// Sums of the first K values over each group of MOMENT_LANES lanes (butterfly: every lane gets them).
template <int K, int N>
__device__ __forceinline__ void group_sum(double (&v)[N]) {
#pragma unroll
    for (int off = MOMENT_LANES / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < K; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], off);
    }
}

// One atom's terms: d = x - s, weighted by bw when WEIGHTED, against the centred reference atom b.
template <bool WEIGHTED>
__device__ __forceinline__ void moment_atom(double (&acc)[13], double x0, double x1, double x2, double s0, double s1,
                                            double s2, double bx, double by, double bz, double bw) {
    double wx = x0 - s0, wy = x1 - s1, wz = x2 - s2;
    const double dx = wx, dy = wy, dz = wz;
    if (WEIGHTED) {
        wx *= bw;
        wy *= bw;
        wz *= bw;
    }
    acc[0] += wx;
    acc[1] += wy;
    acc[2] += wz;
    acc[3] = fma(wx, bx, acc[3]);
    acc[4] = fma(wx, by, acc[4]);
    acc[5] = fma(wx, bz, acc[5]);
    acc[6] = fma(wy, bx, acc[6]);
    acc[7] = fma(wy, by, acc[7]);
    acc[8] = fma(wy, bz, acc[8]);
    acc[9] = fma(wz, bx, acc[9]);
    acc[10] = fma(wz, by, acc[10]);
    acc[11] = fma(wz, bz, acc[11]);
    acc[12] = fma(wx, dx, fma(wy, dy, fma(wz, dz, acc[12])));
}

// Output number j (0..12) of a frame from its 13 sums (S = acc[0..2], P = acc[3..11], Q = acc[12]);
// c = S / W (the centroid minus s).
__device__ __forceinline__ double moment_output(int j, double pj, double c0, double c1, double c2, double s0,
                                                double s1, double s2, double inv_w, double wyc0, double wyc1,
                                                double wyc2) {
    if (j < 9) {
        const double ca = j < 3 ? c0 : (j < 6 ? c1 : c2);
        const int b = j % 3;
        return pj - ca * (b == 0 ? wyc0 : (b == 1 ? wyc1 : wyc2));
    }
    if (j == 9) {
        const double ga = pj - (c0 * c0 + c1 * c1 + c2 * c2) / inv_w;
        return (ga > 0.0 || isnan(ga)) ? ga : 0.0;  // as numpy.maximum(ga, 0): NaN stays NaN
    }
    return j == 10 ? c0 + s0 : (j == 11 ? c1 + s1 : c2 + s2);
}

template <typename T, bool WEIGHTED>
__device__ void frame_moments(const T* __restrict__ x, const int* __restrict__ idx, const double* __restrict__ ref,
                              double* __restrict__ out, i64 n_frames, int n_atoms, int n, double inv_w,
                              double wyc0, double wyc1, double wyc2) {
    constexpr int GROUPS = 32 / MOMENT_LANES;
    const int lane = threadIdx.x & 31;
    const int sub = lane % MOMENT_LANES, grp = lane / MOMENT_LANES;
    const double* __restrict__ rx = ref;
    const double* __restrict__ ry = ref + n;
    const double* __restrict__ rz = ref + 2 * (i64)n;
    const double* __restrict__ rw = ref + 3 * (i64)n;
    const i64 a0 = idx ? (i64)idx[0] : 0;
    // The vector path: whole-warp frames of float32, all atoms, rows (and the reference rows) aligned.
    const bool vec = MOMENT_VEC && MOMENT_LANES == 32 && sizeof(T) == 4 && idx == nullptr && (n_atoms & 3) == 0 &&
                     (((size_t)x | (size_t)ref) & 15) == 0;
    // Every group of the warp runs the same number of iterations (the shuffles need the whole warp); a
    // group past the last frame reads nothing and writes nothing.
    for (i64 f0 = warp_global_id() * GROUPS; f0 < n_frames; f0 += warp_count() * GROUPS) {
        const i64 f = f0 + grp;
        const bool live = f < n_frames;
        const T* __restrict__ xf = x + (live ? f : 0) * 3 * (i64)n_atoms;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0;
        if (live) {
            s0 = (double)xf[3 * a0];
            s1 = (double)xf[3 * a0 + 1];
            s2 = (double)xf[3 * a0 + 2];
        }
        // acc: S (3), P (9, row-major), Q
        double acc[13];
#pragma unroll
        for (int j = 0; j < 13; ++j) acc[j] = 0.0;
        const int stop = live ? n : 0;
        if (vec) {
            const float4* __restrict__ xq = reinterpret_cast<const float4*>(xf);
            const int nq = stop >> 2;
            for (int base = 0; base < nq; base += 32 * MOMENT_VEC_UNROLL) {
                float4 v[MOMENT_VEC_UNROLL][3];
#pragma unroll
                for (int u = 0; u < MOMENT_VEC_UNROLL; ++u) {
                    const int q = base + u * 32 + lane;
                    if (q < nq) {
                        v[u][0] = xq[3 * q];
                        v[u][1] = xq[3 * q + 1];
                        v[u][2] = xq[3 * q + 2];
                    }
                }
#pragma unroll
                for (int u = 0; u < MOMENT_VEC_UNROLL; ++u) {
                    const int q = base + u * 32 + lane;
                    if (q < nq) {
                        const double2 bx01 = reinterpret_cast<const double2*>(rx)[2 * q];
                        const double2 bx23 = reinterpret_cast<const double2*>(rx)[2 * q + 1];
                        const double2 by01 = reinterpret_cast<const double2*>(ry)[2 * q];
                        const double2 by23 = reinterpret_cast<const double2*>(ry)[2 * q + 1];
                        const double2 bz01 = reinterpret_cast<const double2*>(rz)[2 * q];
                        const double2 bz23 = reinterpret_cast<const double2*>(rz)[2 * q + 1];
                        double2 bw01 = make_double2(1.0, 1.0), bw23 = bw01;
                        if (WEIGHTED) {
                            bw01 = reinterpret_cast<const double2*>(rw)[2 * q];
                            bw23 = reinterpret_cast<const double2*>(rw)[2 * q + 1];
                        }
                        const float4 p = v[u][0], r = v[u][1], t = v[u][2];
                        moment_atom<WEIGHTED>(acc, p.x, p.y, p.z, s0, s1, s2, bx01.x, by01.x, bz01.x, bw01.x);
                        moment_atom<WEIGHTED>(acc, p.w, r.x, r.y, s0, s1, s2, bx01.y, by01.y, bz01.y, bw01.y);
                        moment_atom<WEIGHTED>(acc, r.z, r.w, t.x, s0, s1, s2, bx23.x, by23.x, bz23.x, bw23.x);
                        moment_atom<WEIGHTED>(acc, t.y, t.z, t.w, s0, s1, s2, bx23.y, by23.y, bz23.y, bw23.y);
                    }
                }
            }
        } else {
            for (int base = 0; base < stop; base += MOMENT_LANES * MOMENT_UNROLL) {
                T vx[MOMENT_UNROLL], vy[MOMENT_UNROLL], vz[MOMENT_UNROLL];
                // The frame's loads first (3 * MOMENT_UNROLL independent loads per lane in flight from
                // DRAM), then the arithmetic, which reads the reference (small, from L1/L2) as it goes.
#pragma unroll
                for (int u = 0; u < MOMENT_UNROLL; ++u) {
                    const int i = base + u * MOMENT_LANES + sub;
                    if (i < n) {
                        const i64 a = idx ? (i64)idx[i] : (i64)i;
                        vx[u] = xf[3 * a];
                        vy[u] = xf[3 * a + 1];
                        vz[u] = xf[3 * a + 2];
                    }
                }
#pragma unroll
                for (int u = 0; u < MOMENT_UNROLL; ++u) {
                    const int i = base + u * MOMENT_LANES + sub;
                    if (i < n)
                        moment_atom<WEIGHTED>(acc, (double)vx[u], (double)vy[u], (double)vz[u], s0, s1, s2, rx[i],
                                              ry[i], rz[i], WEIGHTED ? rw[i] : 1.0);
                }
            }
        }
        group_sum<13>(acc);
        if (live && sub == 0) {
            const double c0 = acc[0] * inv_w, c1 = acc[1] * inv_w, c2 = acc[2] * inv_w;  // centroid - s
            double* o = out + f * 13;
#pragma unroll
            for (int j = 0; j < 13; ++j)
                o[j] = moment_output(j, j < 10 ? acc[j + 3] : 0.0, c0, c1, c2, s0, s1, s2, inv_w, wyc0, wyc1, wyc2);
        }
    }
}

extern "C" __global__ void frame_moments_f32(const float* x, const int* idx, const double* ref, double* out, long long n_frames, int n_atoms, int n, int weighted, double inv_w, double wyc0, double wyc1, double wyc2) {
    if (weighted)
        frame_moments<float, true>(x, idx, ref, out, n_frames, n_atoms, n, inv_w, wyc0, wyc1, wyc2);
    else
        frame_moments<float, false>(x, idx, ref, out, n_frames, n_atoms, n, inv_w, wyc0, wyc1, wyc2);
}

extern "C" __global__ void frame_moments_f64(const double* x, const int* idx, const double* ref, double* out, long long n_frames, int n_atoms, int n, int weighted, double inv_w, double wyc0, double wyc1, double wyc2) {
    if (weighted)
        frame_moments<double, true>(x, idx, ref, out, n_frames, n_atoms, n, inv_w, wyc0, wyc1, wyc2);
    else
        frame_moments<double, false>(x, idx, ref, out, n_frames, n_atoms, n, inv_w, wyc0, wyc1, wyc2);
}

// QCP per frame with the rotation and the translation:
//   moments: (n_frames, 13) from frame_moments; gb = G_B of the reference; cy: the reference's centroid
//   rmsd: (n_frames,); rot: (n_frames, 9) row-major rotation (reference ~ rot @ mobile + trans);
//   trans: (n_frames, 3) = cy - rot @ centroid, or NULL
// The RMSD is that of the returned rotation (Rayleigh quotient of its quaternion).
extern "C" __global__ void qcp_frames(const double* moments, double* rmsd, double* rot, double* trans, long long n_frames, double gb, double inv_w, double cy0, double cy1, double cy2) {
    PG_GRID_STRIDE_LOOP(f, n_frames) {
        const double* mo = moments + f * 13;
        double s[9];
#pragma unroll
        for (int j = 0; j < 9; ++j) s[j] = mo[j];
        double q[4];
        rmsd[f] = qcp_solve(s, mo[9], gb, inv_w, q);
        double r[9];
        qcp_rotation(q, r);
        double* ro = rot + f * 9;
#pragma unroll
        for (int j = 0; j < 9; ++j) ro[j] = r[j];
        if (trans) {
            const double cx = mo[10], cy = mo[11], cz = mo[12];
            trans[3 * f] = cy0 - (r[0] * cx + r[1] * cy + r[2] * cz);
            trans[3 * f + 1] = cy1 - (r[3] * cx + r[4] * cy + r[5] * cz);
            trans[3 * f + 2] = cy2 - (r[6] * cx + r[7] * cy + r[8] * cz);
        }
    }
}

// Near-identical frames: where rmsd^2 <= tau (G_A + G_B) / W the QCP formula has cancelled away most of
// its digits; measure sqrt(sum w |R (x - c) - yc|^2 / W) on the coordinates instead (float64). Every other
// frame's warp leaves after reading two numbers, so the pass costs next to nothing when (as usual) no
// frame qualifies, and it needs no host synchronisation to find out.
template <typename T>
__device__ void frame_direct(const T* __restrict__ x, const int* __restrict__ idx, const double* __restrict__ ref,
                             const double* __restrict__ moments, const double* __restrict__ rot,
                             double* __restrict__ rmsd, i64 n_frames, int n_atoms, int n, int weighted, double gb,
                             double inv_w, double tau) {
    const int lane = threadIdx.x & 31;
    const double* __restrict__ rx = ref;
    const double* __restrict__ ry = ref + n;
    const double* __restrict__ rz = ref + 2 * (i64)n;
    const double* __restrict__ rw = ref + 3 * (i64)n;
    for (i64 f = warp_global_id(); f < n_frames; f += warp_count()) {
        const double r0 = rmsd[f];
        const double* mo = moments + f * 13;
        if (!(r0 * r0 <= tau * (mo[9] + gb) * inv_w)) continue;  // the whole warp: same f
        const double c0 = mo[10], c1 = mo[11], c2 = mo[12];
        const double* R = rot + f * 9;
        const double r00 = R[0], r01 = R[1], r02 = R[2], r10 = R[3], r11 = R[4], r12 = R[5], r20 = R[6],
                     r21 = R[7], r22 = R[8];
        const T* __restrict__ xf = x + f * 3 * (i64)n_atoms;
        double acc[1] = {0.0};
        for (int i = lane; i < n; i += 32) {
            const i64 a = idx ? (i64)idx[i] : (i64)i;
            const double dx = (double)xf[3 * a] - c0, dy = (double)xf[3 * a + 1] - c1, dz = (double)xf[3 * a + 2] - c2;
            const double ex = r00 * dx + r01 * dy + r02 * dz - rx[i];
            const double ey = r10 * dx + r11 * dy + r12 * dz - ry[i];
            const double ez = r20 * dx + r21 * dy + r22 * dz - rz[i];
            const double sq = ex * ex + ey * ey + ez * ez;
            acc[0] += weighted ? rw[i] * sq : sq;
        }
        warp_sum<1>(acc);
        if (lane == 0) rmsd[f] = sqrt(acc[0] * inv_w);
    }
}

extern "C" __global__ void frame_direct_f32(const float* x, const int* idx, const double* ref, const double* moments, const double* rot, double* rmsd, long long n_frames, int n_atoms, int n, int weighted, double gb, double inv_w, double tau) {
    frame_direct<float>(x, idx, ref, moments, rot, rmsd, n_frames, n_atoms, n, weighted, gb, inv_w, tau);
}

extern "C" __global__ void frame_direct_f64(const double* x, const int* idx, const double* ref, const double* moments, const double* rot, double* rmsd, long long n_frames, int n_atoms, int n, int weighted, double gb, double inv_w, double tau) {
    frame_direct<double>(x, idx, ref, moments, rot, rmsd, n_frames, n_atoms, n, weighted, gb, inv_w, tau);
}

// ----------------------------------------------------------------------------------------------------
// All-vs-all: centre_frames_* stacks the centred frames for the GEMM, qcp_pairs_* turns the GEMM's 3x3
// blocks into RMSDs.

// One warp per frame: the (weighted) centroid c in float64 (first pass), then the rows
//   a[3 f + k, i] = sqrt(w_i) (x_ik - c_k)  in the GEMM's precision B  and  g[f] = sum w |x - c|^2 (float64)
// (second pass; the frame is still in L1/L2). The twin is superpose.pairwise_cpu.centre_frames_numpy.
//   x: (n_frames, n_atoms, 3); idx: (n,) int32 fitted atoms or NULL; w, sw: (n,) weights and their square
//   roots, or NULL (unweighted); a: (3 n_frames, n); g: (n_frames,)
template <typename T, typename B>
__device__ void centre_frames(const T* __restrict__ x, const int* __restrict__ idx, const double* __restrict__ w,
                              const double* __restrict__ sw, B* __restrict__ a, double* __restrict__ g, i64 n_frames,
                              int n_atoms, int n, double inv_w) {
    const int lane = threadIdx.x & 31;
    for (i64 f = warp_global_id(); f < n_frames; f += warp_count()) {
        const T* __restrict__ xf = x + f * 3 * (i64)n_atoms;
        double c[3] = {0.0, 0.0, 0.0};
        for (int i = lane; i < n; i += 32) {
            const i64 at = idx ? (i64)idx[i] : (i64)i;
            const double wi = w ? w[i] : 1.0;
            c[0] += wi * (double)xf[3 * at];
            c[1] += wi * (double)xf[3 * at + 1];
            c[2] += wi * (double)xf[3 * at + 2];
        }
        warp_sum<3>(c);
        const double c0 = c[0] * inv_w, c1 = c[1] * inv_w, c2 = c[2] * inv_w;
        B* __restrict__ ax = a + 3 * f * (i64)n;
        B* __restrict__ ay = ax + n;
        B* __restrict__ az = ay + n;
        double gs[1] = {0.0};
        for (int i = lane; i < n; i += 32) {
            const i64 at = idx ? (i64)idx[i] : (i64)i;
            const double s = sw ? sw[i] : 1.0;
            const double dx = s * ((double)xf[3 * at] - c0);
            const double dy = s * ((double)xf[3 * at + 1] - c1);
            const double dz = s * ((double)xf[3 * at + 2] - c2);
            ax[i] = (B)dx;
            ay[i] = (B)dy;
            az[i] = (B)dz;
            gs[0] += dx * dx + dy * dy + dz * dz;
        }
        warp_sum<1>(gs);
        if (lane == 0) g[f] = gs[0];
    }
}

extern "C" __global__ void centre_frames_f32_b32(const float* x, const int* idx, const double* w, const double* sw, float* a, double* g, long long n_frames, int n_atoms, int n, double inv_w) {
    centre_frames<float, float>(x, idx, w, sw, a, g, n_frames, n_atoms, n, inv_w);
}

extern "C" __global__ void centre_frames_f32_b64(const float* x, const int* idx, const double* w, const double* sw, double* a, double* g, long long n_frames, int n_atoms, int n, double inv_w) {
    centre_frames<float, double>(x, idx, w, sw, a, g, n_frames, n_atoms, n, inv_w);
}

extern "C" __global__ void centre_frames_f64_b32(const double* x, const int* idx, const double* w, const double* sw, float* a, double* g, long long n_frames, int n_atoms, int n, double inv_w) {
    centre_frames<double, float>(x, idx, w, sw, a, g, n_frames, n_atoms, n, inv_w);
}

extern "C" __global__ void centre_frames_f64_b64(const double* x, const int* idx, const double* w, const double* sw, double* a, double* g, long long n_frames, int n_atoms, int n, double inv_w) {
    centre_frames<double, double>(x, idx, w, sw, a, g, n_frames, n_atoms, n, inv_w);
}

// Near-repeated root of the quartic at Newton's result: Newton needed more than QCP_SLOW_ITERS steps,
// or stopped where |P'(l)| <= QCP_ADJ_TINY hi^3 (rounding noise then moves l by ~eps hi^4 / |P'|).
__device__ __forceinline__ bool qcp_needs_refine(double lam, double c2, double c1, double hi, int iters) {
    const double dp = (4.0 * lam * lam + 2.0 * c2) * lam + c1;
    const double thr = QCP_ADJ_TINY * hi * hi * hi;
    return iters > QCP_SLOW_ITERS || (!(fabs(dp) > thr) && hi > 0.0);
}

// What qcp_pairs_* writes for a pair that qcp_refine_* must finish (an RMSD is >= 0 or NaN).
#define PAIR_REFINE (-1.0)

// The pair's RMSD the long way: l_max as the Rayleigh quotient of the quaternion (adjugate column, or
// Jacobi), accurate at a near-repeated root.
template <typename T>
__device__ double qcp_pair_refined(const T* __restrict__ blk, i64 ld, double gai, double gbj, double inv_w) {
    double s[9];
#pragma unroll
    for (int p = 0; p < 3; ++p)
#pragma unroll
        for (int q = 0; q < 3; ++q) s[3 * p + q] = (double)blk[p * ld + q];
    double qv[4];
    return qcp_solve(s, gai, gbj, inv_w, qv);
}

// QCP for a tile of pairs. Blocks of PAIR_BX x PAIR_BY threads, one pair each: x over the tile's columns,
// y over its rows (so a warp reads 32 neighbouring 3x3 blocks of the same block row: coalesced).
//   blocks: the (3 ti, 3 tj) part of a row-major GEMM product of the stacked centred frames, element
//           (r, c) at blocks[r * ld + boff + c] (boff: the tile's first column within a wider panel)
//   ga, gb: G of every frame of x and y (global arrays, indexed by row0 + a and col0 + b)
//   out:    dense: pair (a, b) of the tile at out[(out_row0 + a) * out_ld + out_col0 + b];
//           condensed (PAIR_CONDENSED): pair (i, j), i < j, of n_total frames at i n - i(i+1)/2 + j-i-1
//           minus out_row0 (the condensed index of out[0]: 0 for a whole vector, or a row strip's start)
//   mode:   PAIR_* flags. PAIR_MIRROR (symmetric runs: row0 == col0 frames of one set) also writes
//           the pair at out[(out_col0 + b) * out_ld + out_row0 + a]; the block's results go through
//           shared memory so that the mirrored rows are written as whole 32-byte segments rather than
//           one scattered element per thread.
// Blocks wholly below the diagonal under PAIR_UPPER_ONLY / PAIR_CONDENSED leave at once. Launch with
// blockDim (PAIR_BX, PAIR_BY) and grid (ceil(tj / PAIR_BX), ceil(ti / PAIR_BY)); pairs at a near-repeated
// root get PAIR_REFINE, which qcp_refine_* (same arguments and geometry) then replaces.
#define PAIR_BX 32
#ifndef PAIR_BY
#define PAIR_BY 8
#endif

template <typename T, typename O>
__device__ void qcp_pairs(const T* __restrict__ blocks, i64 ld, i64 boff, const double* __restrict__ ga,
                          const double* __restrict__ gb, O* __restrict__ out, int ti, int tj, i64 row0, i64 col0,
                          i64 out_ld, i64 out_row0, i64 out_col0, i64 n_total, double inv_w, int mode) {
    __shared__ O tile[PAIR_BY][PAIR_BX + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const i64 a0 = (i64)blockIdx.y * PAIR_BY, b0 = (i64)blockIdx.x * PAIR_BX;
    const bool upper = (mode & (PAIR_UPPER_ONLY | PAIR_CONDENSED)) != 0;
    // Whole block below the diagonal (its largest column index is below its smallest row index).
    if (upper && col0 + b0 + PAIR_BX - 1 < row0 + a0) return;
    const i64 a = a0 + ty, b = b0 + tx;
    const i64 gi = row0 + a, gj = col0 + b;
    const bool inside = a < ti && b < tj;
    const bool wanted = inside && !(upper && gi > gj) && !((mode & PAIR_CONDENSED) && gi == gj);
    double v = 0.0;
    if (wanted && !((mode & PAIR_ZERO_DIAG) && gi == gj)) {
        double s[9];
        const T* __restrict__ blk = blocks + 3 * a * ld + boff + 3 * b;
#pragma unroll
        for (int p = 0; p < 3; ++p)
#pragma unroll
            for (int q = 0; q < 3; ++q) s[3 * p + q] = (double)blk[p * ld + q];
        const double gai = ga[gi], gbj = gb[gj];
        QcpKey k;
        double c2, c1, hi;
        int iters;
        const double lam = qcp_largest(s, gai, gbj, k, c2, c1, hi, iters);
        // Near-repeated root (Newton slow, or stopped where the polynomial is flat): leave the sentinel
        // PAIR_REFINE for qcp_refine_*, which keeps the quaternion path (and its registers) out of this
        // kernel; real conformations almost never get here.
        v = qcp_needs_refine(lam, c2, c1, hi, iters) ? PAIR_REFINE : qcp_rmsd_from(gai, gbj, lam, inv_w);
    }
    if (wanted) {
        if (mode & PAIR_CONDENSED) {
            out[gi * n_total - gi * (gi + 1) / 2 + (gj - gi - 1) - out_row0] = (O)v;
        } else {
            out[(out_row0 + a) * out_ld + out_col0 + b] = (O)v;
        }
    }
    if ((mode & PAIR_MIRROR) && !(mode & PAIR_CONDENSED)) {
        tile[ty][tx] = (O)v;
        __syncthreads();
        // Thread t writes mirrored element (column b0 + t / PAIR_BY, row a0 + t % PAIR_BY): PAIR_BY
        // consecutive values of one output row per group of threads.
        const int t = ty * PAIR_BX + tx;
        const int mb = t / PAIR_BY, ma = t % PAIR_BY;
        const i64 ra = a0 + ma, rb = b0 + mb;
        const i64 ri = row0 + ra, rj = col0 + rb;
        const bool ok = ra < ti && rb < tj && !(upper && ri > rj) && ri != rj;
        if (ok) out[(out_col0 + rb) * out_ld + out_row0 + ra] = tile[ma][mb];
    }
}

extern "C" __global__ void qcp_pairs_b32_o32(const float* blocks, long long ld, long long boff, const double* ga, const double* gb, float* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<float, float>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_pairs_b32_o64(const float* blocks, long long ld, long long boff, const double* ga, const double* gb, double* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<float, double>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_pairs_b64_o32(const double* blocks, long long ld, long long boff, const double* ga, const double* gb, float* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<double, float>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_pairs_b64_o64(const double* blocks, long long ld, long long boff, const double* ga, const double* gb, double* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<double, double>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

// Second pass over a tile qcp_pairs_* has written (same arguments and launch geometry): the pairs holding
// PAIR_REFINE get the quaternion path's RMSD (and its mirror). Costs one coalesced read of the tile.
template <typename T, typename O>
__device__ void qcp_refine(const T* __restrict__ blocks, i64 ld, i64 boff, const double* __restrict__ ga,
                           const double* __restrict__ gb, O* __restrict__ out, int ti, int tj, i64 row0, i64 col0,
                           i64 out_ld, i64 out_row0, i64 out_col0, i64 n_total, double inv_w, int mode) {
    const i64 a0 = (i64)blockIdx.y * PAIR_BY, b0 = (i64)blockIdx.x * PAIR_BX;
    const bool upper = (mode & (PAIR_UPPER_ONLY | PAIR_CONDENSED)) != 0;
    if (upper && col0 + b0 + PAIR_BX - 1 < row0 + a0) return;
    const i64 a = a0 + threadIdx.y, b = b0 + threadIdx.x;
    const i64 gi = row0 + a, gj = col0 + b;
    if (!(a < ti && b < tj) || (upper && gi > gj)) return;
    if ((mode & (PAIR_ZERO_DIAG | PAIR_CONDENSED)) && gi == gj) return;  // a frame against itself: 0 / absent
    O* dst = (mode & PAIR_CONDENSED) ? out + (gi * n_total - gi * (gi + 1) / 2 + (gj - gi - 1) - out_row0)
                                     : out + (out_row0 + a) * out_ld + out_col0 + b;
    if (!((double)*dst == PAIR_REFINE)) return;
    const double v = qcp_pair_refined(blocks + 3 * a * ld + boff + 3 * b, ld, ga[gi], gb[gj], inv_w);
    *dst = (O)v;
    if ((mode & PAIR_MIRROR) && !(mode & PAIR_CONDENSED)) out[(out_col0 + b) * out_ld + out_row0 + a] = (O)v;
}

extern "C" __global__ void qcp_refine_b32_o32(const float* blocks, long long ld, long long boff, const double* ga, const double* gb, float* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_refine<float, float>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_refine_b32_o64(const float* blocks, long long ld, long long boff, const double* ga, const double* gb, double* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_refine<float, double>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_refine_b64_o32(const double* blocks, long long ld, long long boff, const double* ga, const double* gb, float* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_refine<double, float>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_refine_b64_o64(const double* blocks, long long ld, long long boff, const double* ga, const double* gb, double* out, int ti, int tj, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_refine<double, double>(blocks, ld, boff, ga, gb, out, ti, tj, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

// ----------------------------------------------------------------------------------------------------
// aligned_rmsd_*: the RMSD after superposition of each model's aligned pairs (the scores' "RMSD" column):
//   x: (n_models, lmax, 3) model coordinates, pairs [0, n_ali[m]) aligned, the rest padding (ignored)
//   y: the matched reference coordinates, (n_models, lmax, 3), or (1, lmax, 3) shared (y_step 0)
//   out: (n_models,) float64 Angstrom (NaN for a model without pairs)
// One warp per model (grid-stride): lanes own pairs i = lane + 32 k and one butterfly reduction sums
// them, so a model's result depends on its own pairs only, never on how many models share the launch or
// on the batch's padded length (the scores of a resumed or re-batched run are bitwise the same).
// Two passes over the pairs (centroids, then centred moments) in float64, QCP for l_max with the
// quaternion's Rayleigh quotient, and the near-identical case re-measured on the coordinates as
// frame_direct does (tau as there).
template <typename T>
__device__ void aligned_rmsd(const T* __restrict__ x, const T* __restrict__ y, int y_step,
                             const int* __restrict__ n_ali, int lmax, i64 n_models, double tau,
                             double* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    for (i64 m = warp_global_id(); m < n_models; m += warp_count()) {
        const int n = n_ali[m];
        const T* __restrict__ xm = x + m * 3 * (i64)lmax;
        const T* __restrict__ ym = y + m * (i64)y_step * 3 * (i64)lmax;
        if (n < 1) {
            if (lane == 0) out[m] = nan("");  // nothing aligned
            continue;
        }
        double c[6] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        for (int i = lane; i < n; i += 32) {
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                c[a] += (double)xm[3 * i + a];
                c[3 + a] += (double)ym[3 * i + a];
            }
        }
        warp_sum<6>(c);
        const double inv_n = 1.0 / (double)n;
#pragma unroll
        for (int a = 0; a < 6; ++a) c[a] *= inv_n;
        // s: M (9, M_ab = sum (x_a - cx_a)(y_b - cy_b)), G_A, G_B
        double s[11];
#pragma unroll
        for (int j = 0; j < 11; ++j) s[j] = 0.0;
        for (int i = lane; i < n; i += 32) {
            double dx[3], dy[3];
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                dx[a] = (double)xm[3 * i + a] - c[a];
                dy[a] = (double)ym[3 * i + a] - c[3 + a];
            }
#pragma unroll
            for (int a = 0; a < 3; ++a)
#pragma unroll
                for (int b = 0; b < 3; ++b) s[3 * a + b] = fma(dx[a], dy[b], s[3 * a + b]);
            s[9] = fma(dx[0], dx[0], fma(dx[1], dx[1], fma(dx[2], dx[2], s[9])));
            s[10] = fma(dy[0], dy[0], fma(dy[1], dy[1], fma(dy[2], dy[2], s[10])));
        }
        warp_sum<11>(s);
        // Every lane holds the totals: every lane runs the (identical) QCP, so the warp stays converged
        // for the direct pass below.
        const double ga = s[9], gb = s[10];
        double q[4];
        double r = qcp_solve(s, ga, gb, inv_n, q);
        if (r * r <= tau * (ga + gb) * inv_n) {
            // Near-identical: the formula has cancelled most digits; measure |R (x - cx) - (y - cy)|.
            double rot[9];
            qcp_rotation(q, rot);
            const double r00 = rot[0], r01 = rot[1], r02 = rot[2], r10 = rot[3], r11 = rot[4], r12 = rot[5],
                         r20 = rot[6], r21 = rot[7], r22 = rot[8];
            double acc[1] = {0.0};
            for (int i = lane; i < n; i += 32) {
                const double dx = (double)xm[3 * i] - c[0], dy = (double)xm[3 * i + 1] - c[1],
                             dz = (double)xm[3 * i + 2] - c[2];
                const double ex = r00 * dx + r01 * dy + r02 * dz - ((double)ym[3 * i] - c[3]);
                const double ey = r10 * dx + r11 * dy + r12 * dz - ((double)ym[3 * i + 1] - c[4]);
                const double ez = r20 * dx + r21 * dy + r22 * dz - ((double)ym[3 * i + 2] - c[5]);
                acc[0] += ex * ex + ey * ey + ez * ez;
            }
            warp_sum<1>(acc);
            r = sqrt(acc[0] * inv_n);
        }
        if (lane == 0) out[m] = r;
    }
}

extern "C" __global__ void aligned_rmsd_f32(const float* x, const float* y, int y_step, const int* n_ali, int lmax, long long n_models, double tau, double* out) {
    aligned_rmsd<float>(x, y, y_step, n_ali, lmax, n_models, tau, out);
}

extern "C" __global__ void aligned_rmsd_f64(const double* x, const double* y, int y_step, const int* n_ali, int lmax, long long n_models, double tau, double* out) {
    aligned_rmsd<double>(x, y, y_step, n_ali, lmax, n_models, tau, out);
}
