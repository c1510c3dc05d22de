// attention_flash_bwd_mma.cuh: the attention backward on tensor cores (flash_bwd_mma_* of
// attention_flash_bwd.cu, which inlines this header when BWM_ENABLED; the loader inlines it as text).
// Needs the .cu's HEAD_DIM, i64, bw_warp_sum and mma_ptx.cuh.

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
#define BWM_LDS (HEAD_DIM + 8)    // 16-bit rows padded by 16 bytes (as the forward's FA_LDS)
#define BWM_DLD (BWM_BN + 1)      // float32 dS rows


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
