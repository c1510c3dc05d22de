// attention_flash_bwd_wg.cuh: the attention backward on Hopper warpgroup MMA (flash_bwd_wg_* of
// attention_flash_bwd.cu, which inlines this header; bodies only when BWG_ENABLED: sm_90a, 16-bit,
// HEAD_DIM = 64). Needs the .cu's HEAD_DIM, i64, bw_warp_sum and wgmma.cuh.
//
// One block = one warpgroup (4 warps) per (tile of 64 keys, head, batch entry); warp w owns keys
// 16 w .. 16 w + 15, the rows of every m64 product below. Query tiles of 64 rows stream through shared
// memory (Q, dO by cp.async into 128-byte rows in the 128-byte swizzle, the forward's K / V layout).
// Per query tile, all five products on wgmma m64n64k16 (FlashAttention-3's backward, one warpgroup):
//   1. S^T = K Q^T, dP^T = V dO^T: A = K, V fragments in registers (loaded once), B = Q, dO K-major from
//      shared memory: the forward's S = Q K^T shape; one commit group, waited;
//   then per element P^T, dS^T (float32), dgamma's share, the key side of dcoords in registers and the
//   query side as per-thread partials, reduced over the warp's 16 keys by shuffles (reduce-scatter) and
//   left in shared memory per warp;
//   2. dV += P^T dO, dK += dS^T Q: A = P^T, dS^T packed to 16-bit in registers (the forward's P V),
//      B = dO, Q N-major from shared memory; while they run, dS^T (16-bit) goes to shared memory in the
//      128-byte swizzle (keys as rows);
//   -- barrier (every warp's dS^T stored; every wgmma reading Q, dO done) --
//   the next query tile's Q, dO are issued (cp.async) into the same buffers, overlapping 3. (its
//   coordinates, lse and Dlt, double-buffered by tile parity, are loaded after 3. is issued);
//   3. dQ = dS K: A = dS^T from shared memory read transposed (M-major), B = K N-major, both by
//      descriptor (no register operand: every warp's dS is needed); the query side of dcoords (four
//      warps' partials summed, atomics) overlaps it; dQ added to the float32 accumulator by red.global
//      (16-byte vectors).
// Two block barriers per tile (one above, one at the top for the cp.async data), as the mma.sync kernel,
// but the shared-memory operands are read once per warpgroup instead of once per warp (ldmatrix).
// Numerics as flash_bwd_mma_*: dS rounded to 16-bit for dK and dQ, float32 for dcoords and dgamma.
// BWG_KEYS = 128 (a knob; 64 is the default above): two such warpgroups per block (8 warps, 256 threads,
// warp w: keys 16 w ..), each doing 1. and 2. for its own 64 keys exactly as above, with the query tile's
// Q, dO, coordinates, lse and Dlt loaded once for both (half the Q / dO traffic a key); dS^T of all 128
// keys goes to shared memory, and 3. runs once for the block: dQ (64 queries x 64 d) = dS (64 x 128 keys)
// K (128 x 64), split between the warpgroups by output columns (m64n32k16, k-steps over 128 keys,
// warpgroup g: columns 32 g ..), so each query row's dQ gets half the red.global operations a key. One
// block per SM (256 threads at up to 255 registers); its ~58 KB of shared memory is dynamic (opt-in
// above 48 KB, BWG_DYN_SMEM bytes requested by the host).
#define BWG_TILE 64  // query rows per tile; keys per warpgroup
#define BWG_WGS (BWG_KEYS / 64)  // warpgroups per block (BWG_KEYS, BWG_THREADS: attention_flash_bwd.cu)
#define BWG_WARPS (4 * BWG_WGS)
#define BWG_DYN_SMEM (60 * 1024)  // dynamic shared memory of the 128-key variant (flash_backward._WG128_SMEM)
#if BWG_KEYS != 64 && BWG_KEYS != 128
#error "BWG_KEYS is 64 or 128"
#endif
#ifndef BWG_DQ_MMA     // 1: dQ = dS K on mma.sync + ldmatrix from the same shared-memory tiles (a fallback,
#define BWG_DQ_MMA 0   // should the transposed shared-memory A operand of wgmma misbehave)
#endif
#ifndef BWG_DQ_BULK    // 1: dQ added by bulk reductions of 256-byte rows staged in shared memory (cp.reduce.
#define BWG_DQ_BULK 0  // async.bulk, as FlashAttention-3) instead of red.global.v4: 16x fewer operations
#endif
#if BWG_DQ_BULK && BWG_KEYS != 64
#error "BWG_DQ_BULK takes BWG_KEYS = 64"
#endif
#define BWG_DQS_LD 72  // staged dQ rows: 64 floats + 8 (float2 stores of 16 lanes hit 32 banks)

#if BWG_ENABLED
// d = A (descriptor) B (descriptor) (+ d): both operands from shared memory, both MN-major (transposed).
template <bool F16>
__device__ __forceinline__ void bwg_wgmma_ss_tt(float* d, unsigned long long a_desc, unsigned long long b_desc,
                                                int accumulate) {
#define BWG_SS(TYPES)                                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " FA_WG_D32 ", %32, %33, p, 1, 1, 1, 1;\n}\n" \
                 : FA_WG_D32_OPERANDS                                                                            \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
    if (F16) BWG_SS("f16.f16");
    else BWG_SS("bf16.bf16");
#undef BWG_SS
}

#define FA_WG_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FA_WG_D16_OPERANDS                                                                                      \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
// The same on m64n32k16 (d: the warp's 16 x 32, four m16n8 tiles): BWG_KEYS = 128's half of dQ.
template <bool F16>
__device__ __forceinline__ void bwg_wgmma_ss_tt32(float* d, unsigned long long a_desc, unsigned long long b_desc,
                                                  int accumulate) {
#define BWG_SS32(TYPES)                                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES " " FA_WG_D16 ", %16, %17, p, 1, 1, 1, 1;\n}\n" \
                 : FA_WG_D16_OPERANDS                                                                            \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
    if (F16) BWG_SS32("f16.f16");
    else BWG_SS32("bf16.bf16");
#undef BWG_SS32
}

// Orders this thread's generic-proxy shared-memory writes (st.shared, cp.async) before later reads by
// the async proxy (wgmma operands from descriptors).
__device__ __forceinline__ void bwg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// p[0..3] += a, b, c, e by one vector reduction (p 16-byte aligned; sm_90); all zeros are skipped.
__device__ __forceinline__ void bwg_red4(float* p, float a, float b, float c, float e) {
    if (a != 0.f || b != 0.f || c != 0.f || e != 0.f)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(e)
                     : "memory");
}

// dst[0..63] += the 64 floats at shared address src (16-byte aligned), element-wise atomically, by one
// asynchronous bulk reduction in this thread's bulk group; then the group is committed.
__device__ __forceinline__ void bwg_bulk_add256(float* dst, u32 src) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 256;\n"
                 "cp.async.bulk.commit_group;\n" ::"l"(dst), "r"(src)
                 : "memory");
}
// Until this thread's bulk operations have read their shared-memory sources / have completed.
__device__ __forceinline__ void bwg_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bwg_bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void bwg_st32(u32 addr, u32 v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Reduce-scatter of one step over lanes `mask` apart: 2N values in, N out (the half `hi` keeps, plus the
// partner's copy of that half).
template <int N>
__device__ __forceinline__ void bwg_halve(const float* v, float* w, bool hi, int mask) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float keep = hi ? v[i + N] : v[i], send = hi ? v[i] : v[i + N];
        w[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
}

// 16-bit tiles of 64 (ks, dst: BWG_KEYS) rows, 128-byte rows, 16-byte chunk c of row r at chunk c ^ (r & 7);
// each 1024-byte aligned.
struct __align__(16) BwgSmem {
    unsigned short qs[BWG_TILE * 64];
    unsigned short dos[BWG_TILE * 64];
    unsigned short ks[BWG_KEYS * 64];
    unsigned short dst[BWG_KEYS * 64];  // dS^T, keys as rows
    float4 xq[2][BWG_TILE];             // per parity of the query tile: x, y, z, lse log2(e) (-inf past the end)
    float dl[2][BWG_TILE];              // Dlt
    float qg[BWG_WARPS][3][BWG_TILE];   // per warp: sum over its 16 keys of dS_ij (x_i - x_j), per query
    float gred[BWG_WARPS];
    float4 org;                         // the block's origin for dgamma (below)
#if BWG_DQ_BULK
    float dqs[4][8 * BWG_DQS_LD];  // per warp: 8 rows of dQ staged for the bulk reductions
#endif
};
#define BWG_SMEM_BYTES (sizeof(BwgSmem) + 1024)
#if BWG_KEYS == 64
#define BWG_SMEM_DECL __shared__ __align__(128) unsigned char raw[BWG_SMEM_BYTES]
#else
#define BWG_SMEM_DECL extern __shared__ __align__(128) unsigned char raw[]
#endif

template <bool BF16, bool CUT>
__device__ __forceinline__ void bwg_backward(unsigned char* raw, const unsigned short* __restrict__ q,
                                             const unsigned short* __restrict__ k, const unsigned short* __restrict__ v,
                                             const float* __restrict__ coords, const float* __restrict__ gamma,
                                             const unsigned char* __restrict__ mask,
                                             const unsigned short* __restrict__ dout, const float* __restrict__ lse,
                                             const float* __restrict__ delta, float* __restrict__ dq_acc,
                                             unsigned short* __restrict__ dk, unsigned short* __restrict__ dv,
                                             float* __restrict__ dcoords, float* __restrict__ dgamma, int L, int H,
                                             int xstride, int mstride, float scale, float cutoff2) {
    static_assert(HEAD_DIM == 64, "the wgmma backward takes 128-byte rows");
    static_assert(BWG_KEYS == 64 || BWG_SMEM_BYTES <= BWG_DYN_SMEM, "raise BWG_DYN_SMEM and _WG128_SMEM");
#if BWG_KEYS != 64
    {  // the host's dynamic shared memory must hold the tiles (a wrong launch fails loudly, not silently)
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < BWG_SMEM_BYTES) __trap();
    }
#endif
    BwgSmem& sm = *reinterpret_cast<BwgSmem*>(raw + ((1024u - (fa_smem_addr(raw) & 1023u)) & 1023u));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int grp = lane >> 2, tig = lane & 3;  // accumulator coordinates: row group, thread in group
    const int h = blockIdx.y, b = blockIdx.z;
    const int j0 = blockIdx.x * BWG_KEYS;
    const int wg = BWG_WGS == 1 ? 0 : warp >> 2, wq = BWG_WGS == 1 ? warp : warp & 3;  // warpgroup, warp in it
    const i64 rs = (i64)H * HEAD_DIM;
    const i64 base = (i64)b * L * rs + (i64)h * HEAD_DIM;
    const float* xb = coords + (i64)b * xstride;
    float* dxb = dcoords + (i64)b * xstride;
    const unsigned char* mb = mask ? mask + (i64)b * mstride : nullptr;
    const float g = gamma[h];
    const float* lse_bh = lse + ((i64)b * H + h) * L;
    const float* dl_bh = delta + ((i64)b * H + h) * L;
    const float NEG_INF = __int_as_float(0xff800000);
    const float LOG2E = 1.4426950408889634f;
    const float scale_l2 = scale * LOG2E, g_l2 = g * LOG2E;

    // This warp's keys (rows grp, grp + 8 of its 16): K, V A fragments and coordinates, from global.
    int key[2];
    key[0] = j0 + warp * 16 + grp;
    key[1] = key[0] + 8;
    u32 kf[4][4], vf[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // r: 0 (row grp, cols 2 tig..), 1 (row grp + 8), 2 and 3 (cols + 8)
            const int kr = key[r & 1];
            const i64 off = base + (i64)kr * rs + kk * 16 + tig * 2 + (r >> 1) * 8;
            kf[kk][r] = kr < L ? fa_ld32(k + off) : 0u;
            vf[kk][r] = kr < L ? fa_ld32(v + off) : 0u;
        }
    }
    // Keys in no pair (masked, past the end, and under a cutoff without finite coordinates, which the
    // forward's cutoff test excludes): kok false (P = 0, dS = 0) and coordinates 0 (padding may be NaN), so
    // that every product below stays finite with no test of dS.
    float kx[2], ky[2], kz[2];
    bool kok[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int kj = key[hh];
        bool ok = kj < L && (mb == nullptr || mb[kj]);
        const float x0 = ok ? xb[3 * kj] : 0.f, x1 = ok ? xb[3 * kj + 1] : 0.f, x2 = ok ? xb[3 * kj + 2] : 0.f;
        if (CUT) ok = ok && isfinite(x0) && isfinite(x1) && isfinite(x2);
        kx[hh] = ok ? x0 : 0.f, ky[hh] = ok ? x1 : 0.f, kz[hh] = ok ? x2 : 0.f;
        kok[hh] = ok;
    }

    // Copies: thread tid moves 16-byte chunk tid % 8 of rows tid / 8 + 16 BWG_WGS p (one swizzle phase per
    // thread).
    const int lr = tid >> 3, lc = tid & 7;
    constexpr u32 PSTEP = 2048u * BWG_WGS;  // bytes between a thread's rows
    const u32 soff = (u32)(lr * 128 + ((lc ^ (lr & 7)) << 4));
    const u32 qs_a = fa_smem_addr(sm.qs), dos_a = fa_smem_addr(sm.dos);
    const u32 ks_a = fa_smem_addr(sm.ks), dst_a = fa_smem_addr(sm.dst);
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // (BWG_KEYS rows)
        const int r = lr + 16 * BWG_WGS * p;
        const bool in = j0 + r < L;  // rows past the end: zeros, from a valid address
        fa_cp_async16(ks_a + soff + p * PSTEP, k + base + (in ? (i64)(j0 + r) * rs : 0) + lc * 8, in ? 16 : 0);
    }
    auto load_q = [&](int i0) {  // Q, dO of the query tile at i0 (cp.async)
#pragma unroll
        for (int p = 0; p < 4 / BWG_WGS; ++p) {
            const int r = lr + 16 * BWG_WGS * p;
            const bool in = i0 + r < L;
            const i64 off = base + (in ? (i64)(i0 + r) * rs : 0) + lc * 8;
            fa_cp_async16(qs_a + soff + p * PSTEP, q + off, in ? 16 : 0);
            fa_cp_async16(dos_a + soff + p * PSTEP, dout + off, in ? 16 : 0);
        }
        fa_cp_async_commit();
    };
    // Its coordinates, lse, Dlt (threads < 64: plain loads). Rows in no pair (past the end, or lse = -inf: no
    // key, and under a cutoff also rows without finite coordinates) are staged as coordinates 0 and
    // lse = +inf: P = 0 and finite products, as for the keys above.
    auto load_xq = [&](int i0, int par) {
        if (tid < BWG_TILE) {
            const int r = i0 + tid;
            const float l = r < L ? lse_bh[r] : NEG_INF;
            const bool in = l != NEG_INF;
            sm.xq[par][tid] = in ? make_float4(xb[3 * r], xb[3 * r + 1], xb[3 * r + 2], l * LOG2E)
                                 : make_float4(0.f, 0.f, 0.f, -NEG_INF);
            sm.dl[par][tid] = in ? dl_bh[r] : 0.f;
        }
    };
    load_q(0);
    load_xq(0, 0);

    float dva[32], dka[32];  // dV, dK (unscaled) of the warp's 16 keys x 64 features: eight m16n8 tiles
#pragma unroll
    for (int e = 0; e < 32; ++e) dva[e] = dka[e] = 0.f;
    // dgamma = -sum dS |x_i - x_j|^2 comes from the coordinate gradients' partial sums, with no work per pair:
    // = -(sum_i (x_i - o) . Q_i + sum_j (x_j - o) . C_j), Q_i = sum_j dS (x_i - x_j) (query side), C_j =
    // sum_i dS (x_j - x_i) (key side), for any point o (sum_i Q_i + sum_j C_j = 0); o = the block's first
    // key (0 if not finite) keeps the terms near the size of the distances.
    if (tid == 0) {
        const float ox = xb[3 * j0], oy = xb[3 * j0 + 1], oz = xb[3 * j0 + 2];
        const bool fin = isfinite(ox) && isfinite(oy) && isfinite(oz);
        sm.org = fin ? make_float4(ox, oy, oz, 0.f) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float gacc = 0.f;  // this thread's share of dgamma
    float cgx[2] = {0.f, 0.f}, cgy[2] = {0.f, 0.f}, cgz[2] = {0.f, 0.f};  // keys grp (+ 8): sum dS (x_j - x_i)
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;

    int par = 0;
    for (int i0 = 0; i0 < L; i0 += BWG_TILE, par ^= 1) {
        fa_cp_async_wait_all();
        bwg_fence_proxy_async();
        __syncthreads();  // this tile's Q, dO, coordinates are in; every warp is done with the last tile's dS^T

        // ---- 1. S^T = K Q^T, dP^T = V dO^T (K-major B: k-step kk 32 bytes along the rows)
        float st[32], dpt[32];
        fa_reg_fence<32>(st);
        fa_reg_fence<32>(dpt);
        fa_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            fa_wgmma64<!BF16, false>(st, kf[kk], fa_wg_desc(qs_a + 32 * kk, 16, 8 * 128, FA_SWIZZLE_128B), kk > 0);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            fa_wgmma64<!BF16, false>(dpt, vf[kk], fa_wg_desc(dos_a + 32 * kk, 16, 8 * 128, FA_SWIZZLE_128B), kk > 0);
        fa_wg_commit();
        fa_wg_wait<0>();
        fa_reg_fence<32>(st);
        fa_reg_fence<32>(dpt);

        // P^T, dS^T in place; element e of tile n: key row grp + 8 (e >> 1), query column 8 n + 2 tig + (e & 1).
        // The query side of dcoords, per half of the columns (n in 4 hf .. 4 hf + 3): partials over the two
        // key rows, then reduce-scattered over the 8 row groups: lane ends with query 32 hf + 8 (grp >> 1) +
        // 2 tig + (grp & 1), summed over the warp's 16 keys.
        u32 pa[4][4], sa[4][4];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float qp[3][8];
#pragma unroll
            for (int nn = 0; nn < 4; ++nn) {
                const int n = 4 * hf + nn;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int hh = e >> 1, qc = 8 * n + 2 * tig + (e & 1), c = 2 * nn + (e & 1);
                    const float4 xq = sm.xq[par][qc];
                    const float dx = xq.x - kx[hh], dy = xq.y - ky[hh], dz = xq.z - kz[hh];
                    const float d2 = fmaf(dx, dx, fmaf(dy, dy, dz * dz));
                    const float arg = fmaf(scale_l2, st[4 * n + e], fmaf(-g_l2, d2, -xq.w));  // (base 2)
                    const float p = kok[hh] && (!CUT || d2 <= cutoff2) ? fa_exp2(arg) : 0.f;
                    const float ds = p * (dpt[4 * n + e] - sm.dl[par][qc]);
                    st[4 * n + e] = p;
                    dpt[4 * n + e] = ds;
                    cgx[hh] = fmaf(-ds, dx, cgx[hh]), cgy[hh] = fmaf(-ds, dy, cgy[hh]);
                    cgz[hh] = fmaf(-ds, dz, cgz[hh]);
                    if (hh == 0) qp[0][c] = ds * dx, qp[1][c] = ds * dy, qp[2][c] = ds * dz;
                    else
                        qp[0][c] = fmaf(ds, dx, qp[0][c]), qp[1][c] = fmaf(ds, dy, qp[1][c]), qp[2][c] = fmaf(ds, dz, qp[2][c]);
                }
            }
#pragma unroll
            for (int comp = 0; comp < 3; ++comp) {
                float r1[4], r2[2], r3[1];
                bwg_halve<4>(qp[comp], r1, b4, 16);
                bwg_halve<2>(r1, r2, b3, 8);
                bwg_halve<1>(r2, r3, b2, 4);
                sm.qg[warp][comp][32 * hf + 8 * (grp >> 1) + 2 * tig + (grp & 1)] = r3[0];
            }
        }
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            pa[kc][0] = fa_pack<BF16>(st[8 * kc], st[8 * kc + 1]);
            pa[kc][1] = fa_pack<BF16>(st[8 * kc + 2], st[8 * kc + 3]);
            pa[kc][2] = fa_pack<BF16>(st[8 * kc + 4], st[8 * kc + 5]);
            pa[kc][3] = fa_pack<BF16>(st[8 * kc + 6], st[8 * kc + 7]);
            sa[kc][0] = fa_pack<BF16>(dpt[8 * kc], dpt[8 * kc + 1]);
            sa[kc][1] = fa_pack<BF16>(dpt[8 * kc + 2], dpt[8 * kc + 3]);
            sa[kc][2] = fa_pack<BF16>(dpt[8 * kc + 4], dpt[8 * kc + 5]);
            sa[kc][3] = fa_pack<BF16>(dpt[8 * kc + 6], dpt[8 * kc + 7]);
        }

        // ---- 2. dV += P^T dO, dK += dS^T Q (N-major B: 16 queries a k-step, 2048 bytes apart)
        fa_reg_fence<32>(dva);
        fa_reg_fence<32>(dka);
        fa_wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            fa_wgmma64<!BF16, true>(dva, pa[kc], fa_wg_desc(dos_a + 2048 * kc, 8 * 1024, 8 * 128, FA_SWIZZLE_128B), 1);
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            fa_wgmma64<!BF16, true>(dka, sa[kc], fa_wg_desc(qs_a + 2048 * kc, 8 * 1024, 8 * 128, FA_SWIZZLE_128B), 1);
        fa_wg_commit();
        // dS^T (16-bit, as the dK product rounds it) to shared memory while they run: row = key in the tile,
        // the pair of queries 8 n + 2 tig (+ 1) in chunk n of the row, swizzled (conflict-free: n ^ grp).
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int row = warp * 16 + grp + 8 * hh;
                bwg_st32(dst_a + (u32)(row * 128 + ((n ^ (row & 7)) << 4) + 4 * tig), sa[n >> 1][(n & 1) * 2 + hh]);
            }
        }
        fa_wg_wait<0>();  // (pa, sa and this warp's reads of Q, dO are done)
        fa_reg_fence<32>(dva);
        fa_reg_fence<32>(dka);
        bwg_fence_proxy_async();
        __syncthreads();  // every warp's dS^T and query partials are stored; Q, dO are free

        const bool more = i0 + BWG_TILE < L;
        if (more) load_q(i0 + BWG_TILE);  // (overlaps 3.)

        // ---- 3. dQ = dS K for the 64 queries (warp w: queries 16 (w & 3) ..; warpgroup g: columns
        // 64 g / BWG_WGS ..), k-steps of 16 keys = 16 rows of both
        constexpr int DQN = 32 / BWG_WGS;  // accumulator registers: 8 / BWG_WGS m16n8 tiles
        float dqa[DQN];
        if (!BWG_DQ_MMA) {
            fa_reg_fence<DQN>(dqa);
            fa_wg_fence();
#pragma unroll
            for (int kc = 0; kc < BWG_KEYS / 16; ++kc) {
                const unsigned long long ad = fa_wg_desc(dst_a + 2048 * kc, 8 * 1024, 8 * 128, FA_SWIZZLE_128B);
#if BWG_KEYS == 64
                bwg_wgmma_ss_tt<!BF16>(dqa, ad, fa_wg_desc(ks_a + 2048 * kc, 8 * 1024, 8 * 128, FA_SWIZZLE_128B),
                                       kc > 0);
#else
                // B: the warpgroup's 32 columns of K, 64 bytes into each swizzled row (the swizzle applies
                // to the address, as the K-major k-steps' 32-byte advance relies on)
                bwg_wgmma_ss_tt32<!BF16>(
                    dqa, ad, fa_wg_desc(ks_a + 2048 * kc + 64 * wg, 8 * 1024, 8 * 128, FA_SWIZZLE_128B), kc > 0);
#endif
            }
            fa_wg_commit();
        } else {
            // BWG_DQ_MMA: the same product on mma.sync, operands by ldmatrix.trans from the swizzled tiles
            // (matrix m = lane / 8 of an x4: rows + 8 (m & 1), columns + 8 (m >> 1) of A^T = dS^T, B = K).
#pragma unroll
            for (int e = 0; e < DQN; ++e) dqa[e] = 0.f;
            const int mrow = ((lane >> 3) & 1) * 8 + (lane & 7), mcol = (lane >> 4) & 1;
            constexpr int NFP = 4 / BWG_WGS;  // pairs of 8-column tiles a warp
#pragma unroll
            for (int kc = 0; kc < BWG_KEYS / 16; ++kc) {
                const int row = 16 * kc + mrow;  // (row & 7) = lane & 7
                u32 a[4];
                fa_ldmatrix_x4_trans(a[0], a[2], a[1], a[3],
                                     dst_a + (u32)(row * 128 + (((2 * wq + mcol) ^ (lane & 7)) << 4)));
#pragma unroll
                for (int f = 0; f < NFP; ++f) {
                    const int fp = NFP * wg + f;
                    u32 b00, b01, b10, b11;
                    fa_ldmatrix_x4_trans(b00, b01, b10, b11,
                                         ks_a + (u32)(row * 128 + (((2 * fp + mcol) ^ (lane & 7)) << 4)));
                    fa_mma<BF16>(&dqa[8 * f], a, b00, b01);
                    fa_mma<BF16>(&dqa[8 * f + 4], a, b10, b11);
                }
            }
        }
        // (after the issue: threads < 64 wait for these global loads while the warpgroups' dQ runs; with two
        // warpgroups the query side of dcoords goes to the second one's first 64 threads)
        if (more) load_xq(i0 + BWG_TILE, par ^ 1);
        // query side of dcoords: -2 gamma sum_j dS_ij (x_i - x_j)
        const int qt = BWG_WGS == 1 ? tid : tid - 128;
        if ((BWG_WGS == 1 || qt >= 0) && qt < BWG_TILE && i0 + qt < L) {
            float sx = 0.f, sy = 0.f, sz = 0.f;
#pragma unroll
            for (int w = 0; w < BWG_WARPS; ++w) sx += sm.qg[w][0][qt], sy += sm.qg[w][1][qt], sz += sm.qg[w][2][qt];
            const float4 xq = sm.xq[par][qt], o = sm.org;
            gacc -= (xq.x - o.x) * sx + (xq.y - o.y) * sy + (xq.z - o.z) * sz;
            float* d = dxb + 3 * (i64)(i0 + qt);
            if (sx != 0.f) atomicAdd(d, -2.f * g * sx);
            if (sy != 0.f) atomicAdd(d + 1, -2.f * g * sy);
            if (sz != 0.f) atomicAdd(d + 2, -2.f * g * sz);
        }
        if (!BWG_DQ_MMA) {
            fa_wg_wait<0>();
            fa_reg_fence<DQN>(dqa);
        }
#if BWG_DQ_BULK
        {
            // Staged per warp, 8 rows at a time, and added by bulk reductions of whole 256-byte rows (lane r
            // < 8 issues row r): 16 operations a warp and tile instead of 256 red.global.v4.
            float* stg = sm.dqs[warp];
            const u32 stg_a = fa_smem_addr(stg);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                bwg_bulk_wait_read();  // (the issuing lanes) the staging rows have been read
                __syncwarp();
#pragma unroll
                for (int n = 0; n < 8; ++n)
                    *reinterpret_cast<float2*>(stg + grp * BWG_DQS_LD + 8 * n + 2 * tig) =
                        make_float2(scale * dqa[4 * n + 2 * hh], scale * dqa[4 * n + 2 * hh + 1]);
                bwg_fence_proxy_async();
                __syncwarp();
                const int qi = i0 + warp * 16 + lane + 8 * hh;
                if (lane < 8 && qi < L)
                    bwg_bulk_add256(dq_acc + base + (i64)qi * rs, stg_a + (u32)(lane * BWG_DQS_LD * 4));
            }
        }
#else
        // Added by 16-byte reductions (half the operations of 8-byte ones): thread pairs (tig, tig ^ 1) swap
        // halves, the even one then holds 4 columns of row grp, the odd one 4 of row grp + 8.
        {
            const bool odd = tig & 1;
            const int qi = i0 + wq * 16 + grp + (odd ? 8 : 0);
            float* dst = dq_acc + base + (i64)qi * rs + 32 * wg + 2 * (tig & ~1);
#pragma unroll
            for (int n = 0; n < DQN / 4; ++n) {
                const float a0 = dqa[4 * n], a1 = dqa[4 * n + 1], b0 = dqa[4 * n + 2], b1 = dqa[4 * n + 3];
                const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
                const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
                if (qi < L) {
                    if (odd) bwg_red4(dst + 8 * n, scale * r0, scale * r1, scale * b0, scale * b1);
                    else bwg_red4(dst + 8 * n, scale * a0, scale * a1, scale * r0, scale * r1);
                }
            }
        }
#endif
    }
#if BWG_DQ_BULK
    bwg_bulk_wait_all();  // (every bulk reduction done before the block's memory goes)
#endif

    // dK (times scale) and dV of the warp's 16 keys: rows grp, grp + 8, columns 8 n + 2 tig (+ 1).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        if (key[hh] < L) {
            const i64 off = base + (i64)key[hh] * rs + 2 * tig;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                *reinterpret_cast<u32*>(dk + off + 8 * n) =
                    fa_pack<BF16>(scale * dka[4 * n + 2 * hh], scale * dka[4 * n + 2 * hh + 1]);
                *reinterpret_cast<u32*>(dv + off + 8 * n) = fa_pack<BF16>(dva[4 * n + 2 * hh], dva[4 * n + 2 * hh + 1]);
            }
        }
    }
    // Key side of dcoords: the four threads of a row group hold its two keys' partial sums.
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float sx = cgx[hh], sy = cgy[hh], sz = cgz[hh];
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {
            sx += __shfl_xor_sync(0xffffffffu, sx, m);
            sy += __shfl_xor_sync(0xffffffffu, sy, m);
            sz += __shfl_xor_sync(0xffffffffu, sz, m);
        }
        if (tig == 0 && key[hh] < L) {
            const float4 o = sm.org;
            gacc -= (kx[hh] - o.x) * sx + (ky[hh] - o.y) * sy + (kz[hh] - o.z) * sz;
            float* d = dxb + 3 * (i64)key[hh];
            if (sx != 0.f) atomicAdd(d, -2.f * g * sx);
            if (sy != 0.f) atomicAdd(d + 1, -2.f * g * sy);
            if (sz != 0.f) atomicAdd(d + 2, -2.f * g * sz);
        }
    }
    gacc = bw_warp_sum(gacc);
    if (lane == 0) sm.gred[warp] = gacc;
    __syncthreads();
    if (tid == 0) {
        float t = sm.gred[0];
#pragma unroll
        for (int w = 1; w < BWG_WARPS; ++w) t += sm.gred[w];
        if (t != 0.f) atomicAdd(dgamma + h, t);
    }
}
#endif
