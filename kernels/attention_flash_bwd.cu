// attention_flash_bwd.cu: the backward of the distance-biased attention (FlashAttention-2's scheme), and a
// forward with log-sum-exp on CUDA cores for the inputs the tensor-core forward does not take.
//
// Logits (natural log): l_ij = scale q_i . k_j - gamma |x_i - x_j|^2, -inf for masked keys or pairs past
// the cutoff. Given the forward's out and lse (per row, natural log, -inf for a row with no key) and
// dO = d loss / d out:
//   P_ij = exp(l_ij - lse_i)          (recomputed here from q, k, coords and lse; never stored in global)
//   Dlt_i = dO_i . out_i              (flash_bwd_delta_*)
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
                                         typename Bw<KIND>::A* delta, int L, int H, i64 rows) {
    typedef typename Bw<KIND>::A A;
    PG_GRID_STRIDE_LOOP(r, rows) {
        const typename Bw<KIND>::S* o = out + r * HEAD_DIM;
        const typename Bw<KIND>::S* d = dout + r * HEAD_DIM;
        A s = 0;
        for (int c = 0; c < HEAD_DIM; ++c) s += bw_ld<KIND>(o + c) * bw_ld<KIND>(d + c);
        const i64 h = r % H, bi = r / H;  // bi = b L + i
        const i64 b = bi / L, i = bi - b * L;
        delta[(b * H + h) * L + i] = s;
    }
}

// ---- the backward ----------------------------------------------------------------------------------
//   q, k, v, dout: (B, L, H, HEAD_DIM) in S; coords (x, y, z) of batch entry b at coords + b xstride
//   (xstride 0: shared), and dcoords with the same layout (accumulated with atomics, zeroed by the host);
//   gamma (H,); mask: bytes, batch entry b at mask + b mstride, or NULL; lse, delta: (B, H, L);
//   dq_acc: (B, L, H, HEAD_DIM) in A, zeroed by the host; dk, dv: (B, L, H, HEAD_DIM) in S, written;
//   dgamma: (H,), zeroed by the host; cutoff2 < 0: no cutoff.
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

// ---- the backward on tensor cores (float16 / bfloat16, HEAD_DIM a multiple of 16 up to 64) --------------
// One block of 4 warps per (tile of BWM_BN = 64 keys, head, batch entry); warp w owns keys 16 w .. 16 w + 15
// of the tile. Query tiles of BWM_BM = 64 rows stream through shared memory (Q, dO by cp.async). Per tile:
//   1. each warp: S^T = K_w Q^T and dP^T = V_w dO^T on mma.sync m16n8k16 (K_w, V_w: A fragments kept in
//      registers, loaded once; Q, dO: B operands by ldmatrix, as K in the forward), float32 accumulators
//      of 16 keys x 64 queries; then per element P^T, dS^T (float32), dgamma's share; dS^T is also written
//      (float32) to shared memory, transposed, as dS[query][key];
//   2. each warp: dV_w += P^T dO and dK_w += dS^T Q (P^T, dS^T packed to 16-bit A fragments in registers,
//      as P in the forward's P V; dO, Q by ldmatrix.trans, as V there), accumulated over all query tiles;
//   -- barrier --
//   3. each warp: dQ for queries 16 w .. 16 w + 15 = dS K (A from the float32 dS in shared memory, rounded to
//      16-bit; K by ldmatrix.trans), added to the float32 accumulator by atomics;
//      all threads: the coordinates' gradient from the float32 dS in shared memory (thread t: query, then
//      key, t / 2, half t % 2 of the 64 partners), query side by atomics, key side summed in registers.
// dS rounded to 16-bit feeds the dQ and dK products (FlashAttention-2 does the same); dcoords and dgamma
// use the float32 dS.
#define BWM_BM 64
#define BWM_BN 64
#define BWM_THREADS 128
#define BWM_LDS (HEAD_DIM + 8)    // 16-bit rows padded by 16 bytes (as the forward's FA_LDS)
#define BWM_DLD (BWM_BN + 1)      // float32 dS rows

#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 64 && BW_KIND <= BW_F16
#define BWM_ENABLED 1
#include "mma_ptx.cuh"
#else
#define BWM_ENABLED 0
#endif

#if BWM_ENABLED
// p[0] += a, p[1] += b by atomics (p 8-byte aligned): one vector reduction on sm_90 (half the
// instructions and sectors of two scalar ones), else two atomicAdd; zeros are skipped.
__device__ __forceinline__ void bwm_red2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    if (a != 0.f || b != 0.f)
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    if (a != 0.f) atomicAdd(p, a);
    if (b != 0.f) atomicAdd(p + 1, b);
#endif
}

struct __align__(16) BwmSmem {
    unsigned short qs[BWM_BM * BWM_LDS];
    unsigned short dos[BWM_BM * BWM_LDS];
    unsigned short ks[BWM_BN * BWM_LDS];
    float ds[BWM_BM * BWM_DLD];
    float4 xq[BWM_BM];  // query x, y, z, lse (-inf past the end)
    float dl[BWM_BM];   // query Dlt
    float4 xk[BWM_BN];  // key x, y, z (0 if it does not count), 1 / 0: whether it counts
};

template <bool BF16>
__device__ __forceinline__ void bwm_backward(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                                             const unsigned short* __restrict__ v, const float* __restrict__ coords,
                                             const float* __restrict__ gamma, const unsigned char* __restrict__ mask,
                                             const unsigned short* __restrict__ dout, const float* __restrict__ lse,
                                             const float* __restrict__ delta, float* __restrict__ dq_acc,
                                             unsigned short* __restrict__ dk, unsigned short* __restrict__ dv,
                                             float* __restrict__ dcoords, float* __restrict__ dgamma, int L, int H,
                                             int xstride, int mstride, float scale, float cutoff2) {
    __shared__ BwmSmem sm;
    constexpr int KD = HEAD_DIM / 16;  // 16-wide steps along d
    constexpr int ND = HEAD_DIM / 8;   // 8-wide output tiles along d
    constexpr int NQ = BWM_BM / 8;     // 8-wide query tiles of S^T
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int grp = lane >> 2, tig = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int h = blockIdx.y, b = blockIdx.z;
    const int j0 = blockIdx.x * BWM_BN;
    const i64 rs = (i64)H * HEAD_DIM;  // elements between consecutive residues
    const i64 base = (i64)b * L * rs + (i64)h * HEAD_DIM;
    const float* xb = coords + (i64)b * xstride;
    float* dxb = dcoords + (i64)b * xstride;
    const unsigned char* mb = mask ? mask + (i64)b * mstride : nullptr;
    const float g = gamma[h];
    const float* lse_bh = lse + ((i64)b * H + h) * L;
    const float* dl_bh = delta + ((i64)b * H + h) * L;
    const float NEG_INF = __int_as_float(0xff800000);
    const float LOG2E = 1.4426950408889634f;

    // This warp's keys (rows grp and grp + 8 of its 16) and their K, V A fragments, straight from global.
    int key[2];
    key[0] = j0 + warp * 16 + grp;
    key[1] = key[0] + 8;
    u32 kf[KD][4], vf[KD][4];
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // r: 0 (row grp, cols 2 tig..), 1 (row grp + 8), 2 and 3 (cols + 8)
            const int kr = key[r & 1];
            const i64 off = base + (i64)kr * rs + kk * 16 + tig * 2 + (r >> 1) * 8;
            kf[kk][r] = kr < L ? fa_ld32(k + off) : 0u;
            vf[kk][r] = kr < L ? fa_ld32(v + off) : 0u;
        }
    }
    // The key tile's K in shared memory (for dQ = dS K) and its coordinates.
    constexpr int CPR = HEAD_DIM / 8;  // 16-byte chunks per row
    for (int c = tid; c < BWM_BN * CPR; c += BWM_THREADS) {
        const int r = c / CPR, cc = c - r * CPR;
        const bool in = j0 + r < L;
        fa_cp_async16(fa_smem_addr(&sm.ks[r * BWM_LDS + cc * 8]), k + base + (in ? (i64)(j0 + r) * rs : 0) + cc * 8,
                      in ? 16 : 0);
    }
    fa_cp_async_commit();
    if (tid < BWM_BN) {
        const int kj = j0 + tid;
        const bool ok = kj < L && (mb == nullptr || mb[kj]);
        sm.xk[tid] = ok ? make_float4(xb[3 * kj], xb[3 * kj + 1], xb[3 * kj + 2], 1.f) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();
    float kx[2], ky[2], kz[2];
    bool kok[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float4 e = sm.xk[warp * 16 + grp + 8 * hh];
        kx[hh] = e.x, ky[hh] = e.y, kz[hh] = e.z, kok[hh] = e.w != 0.f;
    }

    float dva[ND][4], dka[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dva[n][e] = dka[n][e] = 0.f;
    float gacc = 0.f;                  // this thread's share of -sum dS |x_i - x_j|^2
    float cgx = 0.f, cgy = 0.f, cgz = 0.f;  // key tid / 2 (phase 3): sum over its half of dS (x_j - x_i)

    // ldmatrix lane addresses (as the forward's kld, vld): non-transposed B from rows (Q, dO for S^T, dP^T)
    // and transposed B (dO, Q for dV, dK; K for dQ).
    const u32 boff = (u32)((((lane >> 4) & 1) * 8 + (lane & 7)) * BWM_LDS + ((lane >> 3) & 1) * 8) * 2u;
    const u32 toff = (u32)((((lane >> 3) & 1) * 8 + (lane & 7)) * BWM_LDS + ((lane >> 4) & 1) * 8) * 2u;
    const u32 qs_a = fa_smem_addr(sm.qs), dos_a = fa_smem_addr(sm.dos), ks_a = fa_smem_addr(sm.ks);

    for (int i0 = 0; i0 < L; i0 += BWM_BM) {
        __syncthreads();  // every warp is done with the previous tile's Q, dO, dS
        for (int c = tid; c < BWM_BM * CPR; c += BWM_THREADS) {
            const int r = c / CPR, cc = c - r * CPR;
            const bool in = i0 + r < L;
            const i64 off = base + (in ? (i64)(i0 + r) * rs : 0) + cc * 8;
            fa_cp_async16(qs_a + (u32)((r * BWM_LDS + cc * 8) * 2), q + off, in ? 16 : 0);
            fa_cp_async16(dos_a + (u32)((r * BWM_LDS + cc * 8) * 2), dout + off, in ? 16 : 0);
        }
        fa_cp_async_commit();
        if (tid < BWM_BM) {
            const int r = i0 + tid;
            const bool in = r < L;
            sm.xq[tid] = in ? make_float4(xb[3 * r], xb[3 * r + 1], xb[3 * r + 2], lse_bh[r])
                            : make_float4(0.f, 0.f, 0.f, NEG_INF);
            sm.dl[tid] = in ? dl_bh[r] : 0.f;
        }
        fa_cp_async_wait_all();
        __syncthreads();

        // ---- 1. S^T = K_w Q^T, dP^T = V_w dO^T (16 keys x 64 queries each)
        float st[NQ][4], dpt[NQ][4];
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
#pragma unroll
            for (int np = 0; np < NQ / 2; ++np) {
                const u32 o = boff + (u32)((np * 16 * BWM_LDS + kk * 16) * 2);
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4(b00, b01, b10, b11, qs_a + o);
                fa_mma<BF16>(st[2 * np], kf[kk], b00, b01);
                fa_mma<BF16>(st[2 * np + 1], kf[kk], b10, b11);
                fa_ldmatrix_x4(b00, b01, b10, b11, dos_a + o);
                fa_mma<BF16>(dpt[2 * np], vf[kk], b00, b01);
                fa_mma<BF16>(dpt[2 * np + 1], vf[kk], b10, b11);
            }
        }
        // P^T = exp(scale S - gamma d2 - lse) and dS^T = P^T (dP^T - Dlt) in place of S^T and dP^T.
        // Element e of tile n: key row grp + 8 (e >> 1), query column 8 n + 2 tig + (e & 1).
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hh = e >> 1, qc = 8 * n + 2 * tig + (e & 1);
                const float4 xq = sm.xq[qc];
                const float dx = xq.x - kx[hh], dy = xq.y - ky[hh], dz = xq.z - kz[hh];
                const float d2 = fmaf(dx, dx, fmaf(dy, dy, dz * dz));
                const bool ok = kok[hh] && xq.w != NEG_INF && (cutoff2 < 0.f || d2 <= cutoff2);
                float p = 0.f, ds = 0.f;
                if (ok) {
                    p = fa_exp2((fmaf(scale, st[n][e], -g * d2) - xq.w) * LOG2E);
                    ds = p * (dpt[n][e] - sm.dl[qc]);
                    gacc -= ds * d2;
                }
                st[n][e] = p;
                dpt[n][e] = ds;
                sm.ds[qc * BWM_DLD + warp * 16 + grp + 8 * hh] = ds;
            }
        }
        // ---- 2. dV_w += P^T dO, dK_w += dS^T Q (k = the 64 queries, 16 at a time)
#pragma unroll
        for (int kc = 0; kc < BWM_BM / 16; ++kc) {
            u32 pa[4], sa[4];
            pa[0] = fa_pack<BF16>(st[2 * kc][0], st[2 * kc][1]);
            pa[1] = fa_pack<BF16>(st[2 * kc][2], st[2 * kc][3]);
            pa[2] = fa_pack<BF16>(st[2 * kc + 1][0], st[2 * kc + 1][1]);
            pa[3] = fa_pack<BF16>(st[2 * kc + 1][2], st[2 * kc + 1][3]);
            sa[0] = fa_pack<BF16>(dpt[2 * kc][0], dpt[2 * kc][1]);
            sa[1] = fa_pack<BF16>(dpt[2 * kc][2], dpt[2 * kc][3]);
            sa[2] = fa_pack<BF16>(dpt[2 * kc + 1][0], dpt[2 * kc + 1][1]);
            sa[3] = fa_pack<BF16>(dpt[2 * kc + 1][2], dpt[2 * kc + 1][3]);
#pragma unroll
            for (int fp = 0; fp < HEAD_DIM / 16; ++fp) {
                const u32 o = toff + (u32)((kc * 16 * BWM_LDS + fp * 16) * 2);
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4_trans(b00, b01, b10, b11, dos_a + o);
                fa_mma<BF16>(dva[2 * fp], pa, b00, b01);
                fa_mma<BF16>(dva[2 * fp + 1], pa, b10, b11);
                fa_ldmatrix_x4_trans(b00, b01, b10, b11, qs_a + o);
                fa_mma<BF16>(dka[2 * fp], sa, b00, b01);
                fa_mma<BF16>(dka[2 * fp + 1], sa, b10, b11);
            }
        }
        __syncthreads();  // dS of every warp is in shared memory

        // ---- 3. dQ for this warp's 16 queries = dS (16 x 64 keys) K (64 keys x d), added by atomics
        {
            float dqa[ND][4];
#pragma unroll
            for (int n = 0; n < ND; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f;
            const float* d0 = sm.ds + (warp * 16 + grp) * BWM_DLD + 2 * tig;  // row grp
            const float* d1 = d0 + 8 * BWM_DLD;                                // row grp + 8
#pragma unroll
            for (int kc = 0; kc < BWM_BN / 16; ++kc) {
                u32 a[4];
                a[0] = fa_pack<BF16>(d0[16 * kc], d0[16 * kc + 1]);
                a[1] = fa_pack<BF16>(d1[16 * kc], d1[16 * kc + 1]);
                a[2] = fa_pack<BF16>(d0[16 * kc + 8], d0[16 * kc + 9]);
                a[3] = fa_pack<BF16>(d1[16 * kc + 8], d1[16 * kc + 9]);
#pragma unroll
                for (int fp = 0; fp < HEAD_DIM / 16; ++fp) {
                    u32 b00, b01, b10, b11;
                    fa_ldmatrix_x4_trans(b00, b01, b10, b11, ks_a + toff + (u32)((kc * 16 * BWM_LDS + fp * 16) * 2));
                    fa_mma<BF16>(dqa[2 * fp], a, b00, b01);
                    fa_mma<BF16>(dqa[2 * fp + 1], a, b10, b11);
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int qi = i0 + warp * 16 + grp + 8 * hh;
                if (qi < L) {
                    float* dst = dq_acc + base + (i64)qi * rs + 2 * tig;
#pragma unroll
                    for (int n = 0; n < ND; ++n) bwm_red2(dst + 8 * n, scale * dqa[n][2 * hh], scale * dqa[n][2 * hh + 1]);
                }
            }
        }
        // The coordinates' gradient from the float32 dS (pairs with dS = 0 skipped: their coordinates may
        // be those of padding). Thread tid: query tid / 2 with keys of half tid % 2, then key tid / 2 with
        // queries of half tid % 2.
        {
            const int who = tid >> 1, half = tid & 1;
            const float4 xq = sm.xq[who];
            float sx = 0.f, sy = 0.f, sz = 0.f;
            for (int jj = 0; jj < BWM_BN / 2; ++jj) {
                const int j = half * (BWM_BN / 2) + jj;
                const float ds = sm.ds[who * BWM_DLD + j];
                if (ds != 0.f) {
                    const float4 xk = sm.xk[j];
                    sx = fmaf(ds, xq.x - xk.x, sx);
                    sy = fmaf(ds, xq.y - xk.y, sy);
                    sz = fmaf(ds, xq.z - xk.z, sz);
                }
            }
            sx += __shfl_xor_sync(0xffffffffu, sx, 1);
            sy += __shfl_xor_sync(0xffffffffu, sy, 1);
            sz += __shfl_xor_sync(0xffffffffu, sz, 1);
            const int qi = i0 + who;
            if (half == 0 && qi < L) {
                float* d = dxb + 3 * (i64)qi;
                if (sx != 0.f) atomicAdd(d, -2.f * g * sx);
                if (sy != 0.f) atomicAdd(d + 1, -2.f * g * sy);
                if (sz != 0.f) atomicAdd(d + 2, -2.f * g * sz);
            }
            const float4 xk = sm.xk[who];
            for (int ii = 0; ii < BWM_BM / 2; ++ii) {
                const int i = half * (BWM_BM / 2) + ii;
                const float ds = sm.ds[i * BWM_DLD + who];
                if (ds != 0.f) {
                    const float4 xi = sm.xq[i];
                    cgx = fmaf(ds, xk.x - xi.x, cgx);
                    cgy = fmaf(ds, xk.y - xi.y, cgy);
                    cgz = fmaf(ds, xk.z - xi.z, cgz);
                }
            }
        }
    }

    // dK (times scale) and dV of the warp's 16 keys: rows grp, grp + 8, columns 8 n + 2 tig (+ 1).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        if (key[hh] < L) {
            const i64 off = base + (i64)key[hh] * rs + 2 * tig;
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                *reinterpret_cast<u32*>(dk + off + 8 * n) =
                    fa_pack<BF16>(scale * dka[n][2 * hh], scale * dka[n][2 * hh + 1]);
                *reinterpret_cast<u32*>(dv + off + 8 * n) = fa_pack<BF16>(dva[n][2 * hh], dva[n][2 * hh + 1]);
            }
        }
    }
    // Key side of dcoords (thread pairs), dgamma (block reduction through the dS area, free now).
    cgx += __shfl_xor_sync(0xffffffffu, cgx, 1);
    cgy += __shfl_xor_sync(0xffffffffu, cgy, 1);
    cgz += __shfl_xor_sync(0xffffffffu, cgz, 1);
    {
        const int kj = j0 + (tid >> 1);
        if ((tid & 1) == 0 && kj < L) {
            float* d = dxb + 3 * (i64)kj;
            if (cgx != 0.f) atomicAdd(d, -2.f * g * cgx);
            if (cgy != 0.f) atomicAdd(d + 1, -2.f * g * cgy);
            if (cgz != 0.f) atomicAdd(d + 2, -2.f * g * cgz);
        }
    }
    gacc = bw_warp_sum(gacc);
    __syncthreads();  // (the last tile's readers of sm.ds are done)
    if (lane == 0) sm.ds[warp] = gacc;
    __syncthreads();
    if (tid == 0) {
        const float t = sm.ds[0] + sm.ds[1] + sm.ds[2] + sm.ds[3];
        if (t != 0.f) atomicAdd(dgamma + h, t);
    }
}
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
                                                int L, int H, long long rows) {
#if BW_KIND == BW_BF16
    bw_delta<BW_BF16>(out, dout, delta, L, H, rows);
#endif
}
extern "C" __global__ void flash_bwd_delta_f16(const __half* out, const __half* dout, float* delta, int L, int H,
                                               long long rows) {
#if BW_KIND == BW_F16
    bw_delta<BW_F16>(out, dout, delta, L, H, rows);
#endif
}
extern "C" __global__ void flash_bwd_delta_f32(const float* out, const float* dout, float* delta, int L, int H,
                                               long long rows) {
#if BW_KIND == BW_F32
    bw_delta<BW_F32>(out, dout, delta, L, H, rows);
#endif
}
extern "C" __global__ void flash_bwd_delta_f64(const double* out, const double* dout, double* delta, int L, int H,
                                               long long rows) {
#if BW_KIND == BW_F64
    bw_delta<BW_F64>(out, dout, delta, L, H, rows);
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
