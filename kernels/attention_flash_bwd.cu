// attention_flash_bwd.cu: the backward of the distance-biased attention (FlashAttention-2's scheme), and a
// forward with log-sum-exp on CUDA cores for the inputs the tensor-core forward does not take.
//
// Logits (natural log): l_ij = scale q_i . k_j - gamma |x_i - x_j|^2, -inf for masked keys or pairs past
// the cutoff. Given the forward's out and lse (per row, natural log, -inf for a row with no key) and
// dO = d loss / d out:
//   P_ij = exp(l_ij - lse_i)          (recomputed here from q, k, coords and lse; never stored in global)
//   Dlt_i = dO_i . out_i              (flash_bwd_delta_*, which also zeroes the accumulators below)
//   dS_ij = P_ij (dO_i . v_j - Dlt_i)
//   dV_j = sum_i P_ij dO_i,  dK_j = scale sum_i dS_ij q_i,  dQ_i = scale sum_j dS_ij k_j
//   dgamma_h = -sum_ij dS_ij |x_i - x_j|^2
//   G_ij = -2 gamma dS_ij (x_i - x_j): dcoords_i += G_ij (query side), dcoords_j -= G_ij (key side)
// The cutoff and the mask are steps: no gradient flows through them.
//
// flash_bwd_*: one block per (key tile of BW_BN keys, head, batch entry). K and V of the tile stay in
// shared memory; query tiles of BW_BM rows stream through; P and dS of a (query tile x key tile) pair go
// through shared memory. dK and dV accumulate in registers (each block owns its keys), as do the key
// side of dcoords and the block's share of dgamma; dQ and the query side of dcoords are summed over the
// key tiles with atomics into accumulators of the arithmetic type (float32, or float64 for float64
// inputs); dgamma and the key side of dcoords also meet other blocks (heads) there. Device memory beyond
// the inputs: O(B L H d) (the dQ accumulator for 16-bit inputs, Dlt and lse).
//
// Arithmetic on CUDA cores (FMA), in float32 for 16-bit and float32 inputs, float64 for float64 inputs:
// simple and exact enough for gradcheck; 16-bit values travel as raw bits (no CUDA headers under NVRTC).
#include "common.cuh"

typedef unsigned short __nv_bfloat16;  // raw bfloat16 bits
typedef unsigned short __half;          // raw IEEE binary16 bits

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef BW_BM  // query rows per tile of the backward
#define BW_BM 32
#endif
#ifndef BW_BN  // keys per block of the backward
#define BW_BN 32
#endif
#define BW_THREADS 128
#define BW_LDS (HEAD_DIM + 1)  // odd row stride (even d): a warp reading column c of 32 rows hits 32 banks
#define BW_FWD_WARPS 4         // flash_bwd_fwd_*: one warp per query row

#define BW_BF16 0
#define BW_F16 1
#define BW_F32 2
#define BW_F64 3
#ifndef BW_KIND  // which entry points have bodies (the others are empty): one dtype per module, so that the
#define BW_KIND BW_BF16  // tiles can be sized to its arithmetic type and compiling costs one dtype
#endif

// Storage type S of q, k, v, out, dO, dq, dk, dv and arithmetic type A of everything else.
template <int KIND> struct Bw { typedef float A; typedef unsigned short S; };
template <> struct Bw<BW_F32> { typedef float A; typedef float S; };
template <> struct Bw<BW_F64> { typedef double A; typedef double S; };

template <int KIND> __device__ __forceinline__ typename Bw<KIND>::A bw_ld(const typename Bw<KIND>::S* p);
template <> __device__ __forceinline__ float bw_ld<BW_BF16>(const unsigned short* p) {
    return __uint_as_float((unsigned)*p << 16);  // bfloat16 is the top half of a float32
}
template <> __device__ __forceinline__ float bw_ld<BW_F16>(const unsigned short* p) {
    float y;
    asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(*p));
    return y;
}
template <> __device__ __forceinline__ float bw_ld<BW_F32>(const float* p) { return *p; }
template <> __device__ __forceinline__ double bw_ld<BW_F64>(const double* p) { return *p; }

template <int KIND> __device__ __forceinline__ void bw_st(typename Bw<KIND>::S* p, typename Bw<KIND>::A x);
template <> __device__ __forceinline__ void bw_st<BW_BF16>(unsigned short* p, float x) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));  // round to nearest even (sm_80)
    *p = r;
}
template <> __device__ __forceinline__ void bw_st<BW_F16>(unsigned short* p, float x) {
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
    *p = r;
}
template <> __device__ __forceinline__ void bw_st<BW_F32>(float* p, float x) { *p = x; }
template <> __device__ __forceinline__ void bw_st<BW_F64>(double* p, double x) { *p = x; }

__device__ __forceinline__ float bw_exp(float x) { return expf(x); }
__device__ __forceinline__ double bw_exp(double x) { return exp(x); }
__device__ __forceinline__ float bw_log(float x) { return logf(x); }
__device__ __forceinline__ double bw_log(double x) { return log(x); }
template <class A> __device__ __forceinline__ A bw_neg_inf();
template <> __device__ __forceinline__ float bw_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double bw_neg_inf<double>() { return __longlong_as_double(0xfff0000000000000ll); }

// Squared distance, in the forward kernel's order of operations (the cutoff test agrees bit for bit).
__device__ __forceinline__ float bw_d2(float dx, float dy, float dz) { return fmaf(dx, dx, fmaf(dy, dy, dz * dz)); }
__device__ __forceinline__ double bw_d2(double dx, double dy, double dz) { return fma(dx, dx, fma(dy, dy, dz * dz)); }

template <class A> __device__ __forceinline__ A bw_warp_sum(A x) {
#pragma unroll
    for (int sh = 16; sh >= 1; sh >>= 1) x += __shfl_xor_sync(0xffffffffu, x, sh);
    return x;
}
template <class A> __device__ __forceinline__ A bw_warp_max(A x) {
#pragma unroll
    for (int sh = 16; sh >= 1; sh >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, sh));
    return x;
}

// Element (b, i, h, 0) of a (B, L, H, HEAD_DIM) array.
__device__ __forceinline__ i64 bw_row(int b, int i, int h, int L, int H) {
    return (((i64)b * L + i) * H + h) * HEAD_DIM;
}

// ---- forward with lse on CUDA cores -----------------------------------------------------------------
// Grid (ceil(L / BW_FWD_WARPS), H, B), block 32 BW_FWD_WARPS: warp w takes query row
// blockIdx.x BW_FWD_WARPS + w. Each step, lane l computes the logit of key j0 + l (its own dot product over
// d), the warp updates the online softmax (maximum m, per-lane partial sums), and then every lane adds
// the 32 keys' p_j v_j to its channels lane, lane + 32, ... of the output. lse = m + log(sum).
template <int KIND>
__device__ __forceinline__ void bw_forward(const typename Bw<KIND>::S* q, const typename Bw<KIND>::S* k,
                                           const typename Bw<KIND>::S* v, const typename Bw<KIND>::A* coords,
                                           const typename Bw<KIND>::A* gamma, const unsigned char* mask,
                                           typename Bw<KIND>::S* out, typename Bw<KIND>::A* lse, int L, int H,
                                           int xstride, int mstride, typename Bw<KIND>::A scale,
                                           typename Bw<KIND>::A cutoff2) {
    typedef typename Bw<KIND>::A A;
    constexpr int NC = (HEAD_DIM + 31) / 32;  // output channels per lane
    __shared__ A qs[BW_FWD_WARPS][HEAD_DIM];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, b = blockIdx.z;
    const int i = blockIdx.x * BW_FWD_WARPS + warp;
    if (i >= L) return;  // warp-uniform; no block barrier below
    const A* xb = coords + (i64)b * xstride;
    const unsigned char* mb = mask ? mask + (i64)b * mstride : nullptr;
    const A g = gamma[h];
    for (int c = lane; c < HEAD_DIM; c += 32) qs[warp][c] = bw_ld<KIND>(q + bw_row(b, i, h, L, H) + c);
    __syncwarp();
    const A xi = xb[3 * i], yi = xb[3 * i + 1], zi = xb[3 * i + 2];
    A m = bw_neg_inf<A>(), lsum = 0;
    A o[NC];
#pragma unroll
    for (int u = 0; u < NC; ++u) o[u] = 0;
    for (int j0 = 0; j0 < L; j0 += 32) {
        const int j = j0 + lane;
        A logit = bw_neg_inf<A>();
        if (j < L && (mb == nullptr || mb[j])) {
            const A dx = xi - xb[3 * j], dy = yi - xb[3 * j + 1], dz = zi - xb[3 * j + 2];
            const A d2 = bw_d2(dx, dy, dz);
            if (cutoff2 < 0 || d2 <= cutoff2) {
                const typename Bw<KIND>::S* kj = k + bw_row(b, j, h, L, H);
                A s = 0;
                for (int c = 0; c < HEAD_DIM; ++c) s += qs[warp][c] * bw_ld<KIND>(kj + c);
                logit = scale * s - g * d2;
            }
        }
        const A mt = bw_warp_max(logit);
        if (mt == bw_neg_inf<A>()) continue;  // no key of this step counts (warp-uniform)
        const A mn = fmax(m, mt);
        const A corr = bw_exp(m - mn);  // m = -inf: 0
        lsum *= corr;
#pragma unroll
        for (int u = 0; u < NC; ++u) o[u] *= corr;
        m = mn;
        const A p = bw_exp(logit - m);  // -inf: 0
        lsum += p;
        const int nk = min(32, L - j0);
        for (int jj = 0; jj < nk; ++jj) {
            const A pj = __shfl_sync(0xffffffffu, p, jj);
            if (pj == 0) continue;  // (warp-uniform) excluded keys: nothing to read
            const typename Bw<KIND>::S* vj = v + bw_row(b, j0 + jj, h, L, H);
#pragma unroll
            for (int u = 0; u < NC; ++u) {
                const int c = lane + 32 * u;
                if (c < HEAD_DIM) o[u] += pj * bw_ld<KIND>(vj + c);
            }
        }
    }
    const A l = bw_warp_sum(lsum);
    const A inv = l > 0 ? (A)1 / l : (A)0;  // a row with no key: output 0, lse -inf
#pragma unroll
    for (int u = 0; u < NC; ++u) {
        const int c = lane + 32 * u;
        if (c < HEAD_DIM) bw_st<KIND>(out + bw_row(b, i, h, L, H) + c, o[u] * inv);
    }
    if (lane == 0) lse[((i64)b * H + h) * L + i] = l > 0 ? m + bw_log(l) : bw_neg_inf<A>();
}

// ---- Dlt = rowsum(dO * out) ----------------------------------------------------------------------------
// One thread per (b, i, h) row r = (b L + i) H + h; delta is (B, H, L). Grid-stride over B L H rows.
template <int KIND>
__device__ __forceinline__ void bw_delta(const typename Bw<KIND>::S* out, const typename Bw<KIND>::S* dout,
                                         typename Bw<KIND>::A* delta, typename Bw<KIND>::A* dq_acc,
                                         typename Bw<KIND>::A* dcoords, typename Bw<KIND>::A* dgamma, i64 ndc,
                                         int L, int H, i64 rows) {
    // One warp per row (lanes along the row: coalesced), which also zeroes the row's dQ accumulator; the
    // first threads zero dcoords and dgamma: the accumulators of the main kernel, with no fill of their own.
    typedef typename Bw<KIND>::A A;
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const typename Bw<KIND>::S* o = out + r * HEAD_DIM;
        const typename Bw<KIND>::S* d = dout + r * HEAD_DIM;
        A s = 0;
        for (int c = lane; c < HEAD_DIM; c += 32) {
            s += bw_ld<KIND>(o + c) * bw_ld<KIND>(d + c);
            dq_acc[r * HEAD_DIM + c] = 0;
        }
        s = bw_warp_sum(s);
        if (lane == 0) {
            const i64 h = r % H, bi = r / H;  // bi = b L + i
            const i64 b = bi / L, i = bi - b * L;
            delta[(b * H + h) * L + i] = s;
        }
    }
    PG_GRID_STRIDE_LOOP(t, ndc + H) {
        if (t < ndc) dcoords[t] = 0;
        else dgamma[t - ndc] = 0;
    }
}

// ---- the backward ----------------------------------------------------------------------------------
//   q, k, v, dout: (B, L, H, HEAD_DIM) in S; coords (x, y, z) of batch entry b at coords + b xstride
//   (xstride 0: shared), and dcoords with the same layout (accumulated with atomics; zeroed by
//   flash_bwd_delta_*, as dq_acc and dgamma);
//   gamma (H,); mask: bytes, batch entry b at mask + b mstride, or NULL; lse, delta: (B, H, L);
//   dq_acc: (B, L, H, HEAD_DIM) in A; dk, dv: (B, L, H, HEAD_DIM) in S, written;
//   dgamma: (H,); cutoff2 < 0: no cutoff.
// Grid (ceil(L / BW_BN), H, B); block BW_THREADS.
template <int KIND>
__device__ __forceinline__ void bw_backward(const typename Bw<KIND>::S* q, const typename Bw<KIND>::S* k,
                                            const typename Bw<KIND>::S* v, const typename Bw<KIND>::A* coords,
                                            const typename Bw<KIND>::A* gamma, const unsigned char* mask,
                                            const typename Bw<KIND>::S* dout, const typename Bw<KIND>::A* lse,
                                            const typename Bw<KIND>::A* delta, typename Bw<KIND>::A* dq_acc,
                                            typename Bw<KIND>::S* dk, typename Bw<KIND>::S* dv,
                                            typename Bw<KIND>::A* dcoords, typename Bw<KIND>::A* dgamma, int L,
                                            int H, int xstride, int mstride, typename Bw<KIND>::A scale,
                                            typename Bw<KIND>::A cutoff2) {
    typedef typename Bw<KIND>::A A;
    constexpr int NKD = (BW_BN * HEAD_DIM + BW_THREADS - 1) / BW_THREADS;  // (key, channel) pairs a thread
    constexpr int NQD = (BW_BM * HEAD_DIM + BW_THREADS - 1) / BW_THREADS;  // (query, channel) pairs a thread
    __shared__ A ks[BW_BN][BW_LDS], vs[BW_BN][BW_LDS], qs[BW_BM][BW_LDS], dos[BW_BM][BW_LDS];
    __shared__ A ps[BW_BM][BW_BN + 1], dss[BW_BM][BW_BN + 1];
    __shared__ A xk[BW_BN][3], xq[BW_BM][3], lq[BW_BM], dl[BW_BM];
    __shared__ bool kok[BW_BN];
    __shared__ A red[BW_THREADS / 32];
    const int tid = threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int j0 = blockIdx.x * BW_BN;
    const A* xb = coords + (i64)b * xstride;
    A* dxb = dcoords + (i64)b * xstride;
    const unsigned char* mb = mask ? mask + (i64)b * mstride : nullptr;
    const A g = gamma[h];
    const A* lse_bh = lse + ((i64)b * H + h) * L;
    const A* dl_bh = delta + ((i64)b * H + h) * L;

    // The key tile: K, V (zeros past the end), coordinates (zeros for masked keys and past the end, so
    // that padding keys without coordinates contribute 0, not NaN), and which keys count.
    for (int e = tid; e < BW_BN * HEAD_DIM; e += BW_THREADS) {
        const int j = e / HEAD_DIM, c = e - j * HEAD_DIM;
        const bool in = j0 + j < L;
        ks[j][c] = in ? bw_ld<KIND>(k + bw_row(b, j0 + j, h, L, H) + c) : (A)0;
        vs[j][c] = in ? bw_ld<KIND>(v + bw_row(b, j0 + j, h, L, H) + c) : (A)0;
    }
    if (tid < BW_BN) {
        const int key = j0 + tid;
        const bool ok = key < L && (mb == nullptr || mb[key]);
        kok[tid] = ok;
        xk[tid][0] = ok ? xb[3 * key] : (A)0;
        xk[tid][1] = ok ? xb[3 * key + 1] : (A)0;
        xk[tid][2] = ok ? xb[3 * key + 2] : (A)0;
    }
    A adk[NKD], adv[NKD];
#pragma unroll
    for (int u = 0; u < NKD; ++u) adk[u] = adv[u] = 0;
    A kgx = 0, kgy = 0, kgz = 0;  // key tid (tid < BW_BN): sum_i dS_ij (x_j - x_i)
    A gacc = 0;                   // this thread's share of -sum dS_ij |x_i - x_j|^2

    for (int i0 = 0; i0 < L; i0 += BW_BM) {
        __syncthreads();  // the previous query tile's readers are done (first pass: the key tile is stored)
        for (int e = tid; e < BW_BM * HEAD_DIM; e += BW_THREADS) {
            const int i = e / HEAD_DIM, c = e - i * HEAD_DIM;
            const bool in = i0 + i < L;
            qs[i][c] = in ? bw_ld<KIND>(q + bw_row(b, i0 + i, h, L, H) + c) : (A)0;
            dos[i][c] = in ? bw_ld<KIND>(dout + bw_row(b, i0 + i, h, L, H) + c) : (A)0;
        }
        if (tid < BW_BM) {
            const int r = i0 + tid;
            const bool in = r < L;
            xq[tid][0] = in ? xb[3 * r] : (A)0;
            xq[tid][1] = in ? xb[3 * r + 1] : (A)0;
            xq[tid][2] = in ? xb[3 * r + 2] : (A)0;
            lq[tid] = in ? lse_bh[r] : bw_neg_inf<A>();  // past the end: no key, P = 0
            dl[tid] = in ? dl_bh[r] : (A)0;
        }
        __syncthreads();

        // P and dS of the BW_BM x BW_BN pairs.
        for (int p = tid; p < BW_BM * BW_BN; p += BW_THREADS) {
            const int i = p / BW_BN, j = p - i * BW_BN;
            const A dx = xq[i][0] - xk[j][0], dy = xq[i][1] - xk[j][1], dz = xq[i][2] - xk[j][2];
            const A d2 = bw_d2(dx, dy, dz);
            const bool ok = kok[j] && lq[i] != bw_neg_inf<A>() && (cutoff2 < 0 || d2 <= cutoff2);
            A pv = 0, ds = 0;
            if (ok) {
                A s = 0, dp = 0;
#pragma unroll 8
                for (int c = 0; c < HEAD_DIM; ++c) {
                    s += qs[i][c] * ks[j][c];
                    dp += dos[i][c] * vs[j][c];
                }
                pv = bw_exp(scale * s - g * d2 - lq[i]);
                ds = pv * (dp - dl[i]);
                gacc -= ds * d2;
            }
            ps[i][j] = pv;
            dss[i][j] = ds;
        }
        __syncthreads();

        // dV_j += sum_i P_ij dO_i, dK_j += sum_i dS_ij q_i (scale at the end); pair (j, c) = e.
#pragma unroll
        for (int u = 0; u < NKD; ++u) {
            const int e = tid + u * BW_THREADS;
            if (e < BW_BN * HEAD_DIM) {
                const int j = e / HEAD_DIM, c = e - j * HEAD_DIM;
                A av = adv[u], ak = adk[u];
                for (int i = 0; i < BW_BM; ++i) {
                    av += ps[i][j] * dos[i][c];
                    ak += dss[i][j] * qs[i][c];
                }
                adv[u] = av, adk[u] = ak;
            }
        }
        if (tid < BW_BN) {  // key side of dcoords (dS = 0 skips pairs whose coordinates may be NaN)
            for (int i = 0; i < BW_BM; ++i) {
                const A ds = dss[i][tid];
                if (ds != 0) {
                    kgx += ds * (xk[tid][0] - xq[i][0]);
                    kgy += ds * (xk[tid][1] - xq[i][1]);
                    kgz += ds * (xk[tid][2] - xq[i][2]);
                }
            }
        }
        // dQ_i += scale sum_j dS_ij k_j (atomics: every key block adds to the same rows); pair (i, c) = e.
#pragma unroll
        for (int u = 0; u < NQD; ++u) {
            const int e = tid + u * BW_THREADS;
            if (e < BW_BM * HEAD_DIM) {
                const int i = e / HEAD_DIM, c = e - i * HEAD_DIM;
                if (i0 + i < L) {
                    A a = 0;
                    for (int j = 0; j < BW_BN; ++j) a += dss[i][j] * ks[j][c];
                    if (a != 0) atomicAdd(dq_acc + bw_row(b, i0 + i, h, L, H) + c, scale * a);
                }
            }
        }
        if (tid < BW_BM && i0 + tid < L) {  // query side of dcoords: -2 gamma sum_j dS_ij (x_i - x_j)
            A sx = 0, sy = 0, sz = 0;
            for (int j = 0; j < BW_BN; ++j) {
                const A ds = dss[tid][j];
                if (ds != 0) {
                    sx += ds * (xq[tid][0] - xk[j][0]);
                    sy += ds * (xq[tid][1] - xk[j][1]);
                    sz += ds * (xq[tid][2] - xk[j][2]);
                }
            }
            const A f = -2 * g;
            A* d = dxb + 3 * (i64)(i0 + tid);
            if (sx != 0) atomicAdd(d, f * sx);
            if (sy != 0) atomicAdd(d + 1, f * sy);
            if (sz != 0) atomicAdd(d + 2, f * sz);
        }
    }

    // dK, dV of the block's keys (owned: plain stores), the key side of dcoords, dgamma.
#pragma unroll
    for (int u = 0; u < NKD; ++u) {
        const int e = tid + u * BW_THREADS;
        if (e < BW_BN * HEAD_DIM) {
            const int j = e / HEAD_DIM, c = e - j * HEAD_DIM;
            if (j0 + j < L) {
                bw_st<KIND>(dk + bw_row(b, j0 + j, h, L, H) + c, scale * adk[u]);
                bw_st<KIND>(dv + bw_row(b, j0 + j, h, L, H) + c, adv[u]);
            }
        }
    }
    if (tid < BW_BN && j0 + tid < L) {
        const A f = -2 * g;
        A* d = dxb + 3 * (i64)(j0 + tid);
        if (kgx != 0) atomicAdd(d, f * kgx);
        if (kgy != 0) atomicAdd(d + 1, f * kgy);
        if (kgz != 0) atomicAdd(d + 2, f * kgz);
    }
    gacc = bw_warp_sum(gacc);
    if ((tid & 31) == 0) red[tid >> 5] = gacc;
    __syncthreads();
    if (tid == 0) {
        A t = 0;
#pragma unroll
        for (int w = 0; w < BW_THREADS / 32; ++w) t += red[w];
        if (t != 0) atomicAdd(dgamma + h, t);
    }
}

// ---- the backward on tensor cores: attention_flash_bwd_mma.cuh (16-bit, HEAD_DIM a multiple of 16 up to 64)
#define BWM_THREADS 128
#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 64 && BW_KIND <= BW_F16
#define BWM_ENABLED 1
#include "wgmma.cuh"  // (and mma_ptx.cuh)
#include "attention_flash_bwd_mma.cuh"
#else
#define BWM_ENABLED 0
#endif
// ---- the backward on warpgroup MMA: attention_flash_bwd_wg.cuh (sm_90a, 16-bit, HEAD_DIM = 64)
#ifndef BWG_KEYS  // keys per block: 64 (one warpgroup, 2 blocks an SM) or 128 (two warpgroups, 1 block an SM)
#define BWG_KEYS 64
#endif
#define BWG_THREADS (2 * BWG_KEYS)
#define BWG_MIN_BLOCKS (128 / BWG_KEYS)
#if BWM_ENABLED && HEAD_DIM == 64 && FA_HAS_WGMMA
#define BWG_ENABLED 1
#include "attention_flash_bwd_wg.cuh"
#else
#define BWG_ENABLED 0
#endif

// dq (16-bit) from its float32 accumulator, n elements.
template <int KIND>
__device__ __forceinline__ void bw_cast(const float* acc, typename Bw<KIND>::S* dst, i64 n) {
    PG_GRID_STRIDE_LOOP(i, n) bw_st<KIND>(dst + i, acc[i]);
}

// ---- entry points (written out: the loader reads their signatures from this text) ---------------------
extern "C" __global__ void flash_bwd_fwd_bf16(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                              const float* coords, const float* gamma, const unsigned char* mask,
                                              __nv_bfloat16* out, float* lse, int L, int H, int xstride, int mstride,
                                              float scale, float cutoff2) {
#if BW_KIND == BW_BF16
    bw_forward<BW_BF16>(q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride, scale, cutoff2);
#endif
}
extern "C" __global__ void flash_bwd_fwd_f16(const __half* q, const __half* k, const __half* v, const float* coords,
                                             const float* gamma, const unsigned char* mask, __half* out, float* lse,
                                             int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BW_KIND == BW_F16
    bw_forward<BW_F16>(q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride, scale, cutoff2);
#endif
}
extern "C" __global__ void flash_bwd_fwd_f32(const float* q, const float* k, const float* v, const float* coords,
                                             const float* gamma, const unsigned char* mask, float* out, float* lse,
                                             int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BW_KIND == BW_F32
    bw_forward<BW_F32>(q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride, scale, cutoff2);
#endif
}
extern "C" __global__ void flash_bwd_fwd_f64(const double* q, const double* k, const double* v, const double* coords,
                                             const double* gamma, const unsigned char* mask, double* out, double* lse,
                                             int L, int H, int xstride, int mstride, double scale, double cutoff2) {
#if BW_KIND == BW_F64
    bw_forward<BW_F64>(q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride, scale, cutoff2);
#endif
}

extern "C" __global__ void flash_bwd_delta_bf16(const __nv_bfloat16* out, const __nv_bfloat16* dout, float* delta,
                        float* dq_acc, float* dcoords, float* dgamma, long long ndc, int L, int H,
                        long long rows) {
#if BW_KIND == BW_BF16
    bw_delta<BW_BF16>(out, dout, delta, dq_acc, dcoords, dgamma, ndc, L, H, rows);
#endif
}
extern "C" __global__ void flash_bwd_delta_f16(const __half* out, const __half* dout, float* delta,
                        float* dq_acc, float* dcoords, float* dgamma, long long ndc, int L, int H,
                        long long rows) {
#if BW_KIND == BW_F16
    bw_delta<BW_F16>(out, dout, delta, dq_acc, dcoords, dgamma, ndc, L, H, rows);
#endif
}
extern "C" __global__ void flash_bwd_delta_f32(const float* out, const float* dout, float* delta,
                        float* dq_acc, float* dcoords, float* dgamma, long long ndc, int L, int H,
                        long long rows) {
#if BW_KIND == BW_F32
    bw_delta<BW_F32>(out, dout, delta, dq_acc, dcoords, dgamma, ndc, L, H, rows);
#endif
}
extern "C" __global__ void flash_bwd_delta_f64(const double* out, const double* dout, double* delta,
                        double* dq_acc, double* dcoords, double* dgamma, long long ndc, int L, int H,
                        long long rows) {
#if BW_KIND == BW_F64
    bw_delta<BW_F64>(out, dout, delta, dq_acc, dcoords, dgamma, ndc, L, H, rows);
#endif
}

extern "C" __global__ __launch_bounds__(BW_THREADS) void flash_bwd_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __nv_bfloat16* dout, const float* lse, const float* delta, float* dq_acc,
    __nv_bfloat16* dk, __nv_bfloat16* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride,
    float scale, float cutoff2) {
#if BW_KIND == BW_BF16
    bw_backward<BW_BF16>(q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, L, H, xstride,
                         mstride, scale, cutoff2);
#endif
}
extern "C" __global__ __launch_bounds__(BW_THREADS) void flash_bwd_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __half* dout, const float* lse, const float* delta, float* dq_acc, __half* dk,
    __half* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BW_KIND == BW_F16
    bw_backward<BW_F16>(q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, L, H, xstride,
                        mstride, scale, cutoff2);
#endif
}
extern "C" __global__ __launch_bounds__(BW_THREADS) void flash_bwd_f32(
    const float* q, const float* k, const float* v, const float* coords, const float* gamma, const unsigned char* mask,
    const float* dout, const float* lse, const float* delta, float* dq_acc, float* dk, float* dv, float* dcoords,
    float* dgamma, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BW_KIND == BW_F32
    bw_backward<BW_F32>(q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, L, H, xstride,
                        mstride, scale, cutoff2);
#endif
}
extern "C" __global__ __launch_bounds__(BW_THREADS) void flash_bwd_f64(
    const double* q, const double* k, const double* v, const double* coords, const double* gamma,
    const unsigned char* mask, const double* dout, const double* lse, const double* delta, double* dq_acc, double* dk,
    double* dv, double* dcoords, double* dgamma, int L, int H, int xstride, int mstride, double scale,
    double cutoff2) {
#if BW_KIND == BW_F64
    bw_backward<BW_F64>(q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, L, H, xstride,
                        mstride, scale, cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(BWM_THREADS, 2) void flash_bwd_mma_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __nv_bfloat16* dout, const float* lse, const float* delta, float* dq_acc,
    __nv_bfloat16* dk, __nv_bfloat16* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride,
    float scale, float cutoff2) {
#if BWM_ENABLED && BW_KIND == BW_BF16
    bwm_backward<true>(q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, L, H, xstride,
                       mstride, scale, cutoff2);
#endif
}
extern "C" __global__ __launch_bounds__(BWM_THREADS, 2) void flash_bwd_mma_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __half* dout, const float* lse, const float* delta, float* dq_acc, __half* dk,
    __half* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BWM_ENABLED && BW_KIND == BW_F16
    bwm_backward<false>(q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, L, H, xstride,
                        mstride, scale, cutoff2);
#endif
}

// The wgmma entry points: bodies for sm_90a only (the host launches them on compute capability 9.0).
// flash_bwd_wg_cut_* take a cutoff (cutoff2 >= 0), flash_bwd_wg_* none: two kernels, so that neither pays
// for the other's registers (the cutoff's test per element, its key staging).
#define BWG_CALL(BF16, CUT)                                                                                   \
    BWG_SMEM_DECL;                                                                                            \
    bwg_backward<BF16, CUT>(raw, q, k, v, coords, gamma, mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma, \
                            L, H, xstride, mstride, scale, cutoff2)
extern "C" __global__ __launch_bounds__(BWG_THREADS, BWG_MIN_BLOCKS) void flash_bwd_wg_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __nv_bfloat16* dout, const float* lse, const float* delta, float* dq_acc,
    __nv_bfloat16* dk, __nv_bfloat16* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride,
    float scale, float cutoff2) {
#if BWG_ENABLED && BW_KIND == BW_BF16
    BWG_CALL(true, false);
#endif
}
extern "C" __global__ __launch_bounds__(BWG_THREADS, BWG_MIN_BLOCKS) void flash_bwd_wg_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __half* dout, const float* lse, const float* delta, float* dq_acc, __half* dk,
    __half* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BWG_ENABLED && BW_KIND == BW_F16
    BWG_CALL(false, false);
#endif
}
extern "C" __global__ __launch_bounds__(BWG_THREADS, BWG_MIN_BLOCKS) void flash_bwd_wg_cut_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __nv_bfloat16* dout, const float* lse, const float* delta, float* dq_acc,
    __nv_bfloat16* dk, __nv_bfloat16* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride,
    float scale, float cutoff2) {
#if BWG_ENABLED && BW_KIND == BW_BF16
    BWG_CALL(true, true);
#endif
}
extern "C" __global__ __launch_bounds__(BWG_THREADS, BWG_MIN_BLOCKS) void flash_bwd_wg_cut_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, const __half* dout, const float* lse, const float* delta, float* dq_acc, __half* dk,
    __half* dv, float* dcoords, float* dgamma, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if BWG_ENABLED && BW_KIND == BW_F16
    BWG_CALL(false, true);
#endif
}

extern "C" __global__ void flash_bwd_dq_bf16(const float* acc, __nv_bfloat16* dq, long long n) {
#if BW_KIND == BW_BF16
    bw_cast<BW_BF16>(acc, dq, n);
#endif
}
extern "C" __global__ void flash_bwd_dq_f16(const float* acc, __half* dq, long long n) {
#if BW_KIND == BW_F16
    bw_cast<BW_F16>(acc, dq, n);
#endif
}
