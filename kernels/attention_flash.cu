// attention_flash.cu: fused, flash-style distance-biased attention on tensor cores (float16 / bfloat16
// inputs, float32 accumulation). The L x L logit matrix is never stored: each block keeps 16 query rows
// per warp in registers, streams tiles of K and V through shared memory (cp.async, double-buffered),
// computes S = Q K^T and O += P V with mma.sync m16n8k16, and keeps a running (online) softmax.
//
// Logit of query i and key j in head h (log2 units, so that exp2 is the exponential):
//   log2(e) * (scale * q_i . k_j - gamma_h |x_i - x_j|^2), -inf for masked keys or |x_i - x_j| > cutoff.
// Without a cutoff the bias is expanded as 2 gamma x_i . x_j - gamma |x_j|^2 - gamma |x_i|^2; the last
// term is constant along a softmax row and is dropped, so the bias costs 3 FMAs per logit, in float32.
// Coordinates are taken relative to one query residue of the block, so that the expanded terms stay
// near the size of the distances themselves. With a cutoff the squared distance is needed anyway and
// comes from the difference.
//
// No CUDA headers are included: NVRTC from the PyPI wheels ships none (no cuda_bf16.h, no mma.h). The
// 16-bit values travel as raw bits (unsigned short), and conversions, ldmatrix, mma and cp.async are
// inline PTX (sm_80 or newer). The typedefs below only name the entry points' element types for the
// loader, which type-checks launches from these signatures.
#include "common.cuh"

typedef unsigned short __nv_bfloat16;  // raw bfloat16 bits
typedef unsigned short __half;          // raw IEEE binary16 bits
typedef unsigned int u32;

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef FA_WARPS  // warps per block; each owns 16 query rows
#define FA_WARPS 4
#endif
#ifndef FA_BLOCK_N  // keys per tile, a multiple of 16
#define FA_BLOCK_N 64
#endif
#ifndef FA_STAGES  // 2: load tile t+1 while computing tile t; 1: no overlap (less shared memory)
#define FA_STAGES 2
#endif

#ifndef FA_MIN_BLOCKS  // blocks per SM asked of the register allocator (__launch_bounds__)
#define FA_MIN_BLOCKS 1
#endif

#define FA_BLOCK_M (16 * FA_WARPS)
#define FA_THREADS (32 * FA_WARPS)
// Shared-memory row stride in 16-bit elements: 8 extra (16 bytes) keep every row 16-byte aligned for
// cp.async / ldmatrix and shift consecutive rows by 4 banks, so the 8 row addresses of an ldmatrix
// phase fall in 8 different bank groups.
#define FA_LDS (HEAD_DIM + 8)

static_assert(HEAD_DIM % 16 == 0, "the tensor-core path needs HEAD_DIM to be a multiple of 16");
static_assert(FA_BLOCK_N % 16 == 0, "FA_BLOCK_N must be a multiple of 16");
static_assert(FA_STAGES == 1 || FA_STAGES == 2, "FA_STAGES is 1 or 2");

#define FA_NEG_INF __int_as_float(0xff800000)
#define FA_LOG2E 1.4426950408889634f

// ---- PTX helpers -----------------------------------------------------------------------------------

__device__ __forceinline__ u32 fa_smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 writes zeros (rows past the end of the sequence).
__device__ __forceinline__ void fa_cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem_addr(dst)), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void fa_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fa_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void fa_ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(fa_smem_addr(p)));
}
__device__ __forceinline__ void fa_ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(fa_smem_addr(p)));
}

// D += A B for one m16n8k16 tile: A 16x16 row-major (4 regs), B 16x8 column-major (2 regs), D f32.
template <bool BF16>
__device__ __forceinline__ void fa_mma(float* d, const u32* a, u32 b0, u32 b1) {
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two floats -> two 16-bit values in one register, lo in the low half (round to nearest even).
template <bool BF16>
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    u32 r;
    if (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

__device__ __forceinline__ float fa_exp2(float x) {  // 2^x; exp2(-inf) = 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ u32 fa_ld32(const unsigned short* p) { return *reinterpret_cast<const u32*>(p); }

// ---- the kernel --------------------------------------------------------------------------------------
//   q, k, v, out: (B, L, H, HEAD_DIM) raw 16-bit, C-contiguous; base pointers 16-byte aligned
//   coords: (B, L, 3) float32, Angstrom
//   gamma: (H,) float32, per Angstrom^2; mask: (B, L) uint8 (0 = padding key) or NULL
//   scale: multiplies q . k; cutoff2: squared cutoff in Angstrom^2, or < 0 for none
// Grid: (ceil(L / FA_BLOCK_M), H, B); block: FA_THREADS.
// Shared memory, declared once in each entry point: static __shared__ arrays inside the templated body
// would be allocated once per instantiation (two per entry point) and overflow the 48 KB static limit.
struct __align__(16) FaSmem {
    unsigned short ks[FA_STAGES][FA_BLOCK_N * FA_LDS];
    unsigned short vs[FA_STAGES][FA_BLOCK_N * FA_LDS];
    // Per key: (x, y, z, w), relative to the block's origin. No cutoff: w = -gamma log2e |x_j|^2;
    // cutoff: w = 0. Masked or past the end: w = -inf, which carries through the FMAs into the logit.
    float4 xs[FA_STAGES][FA_BLOCK_N];
};

template <bool BF16, bool CUTOFF>
__device__ __forceinline__ void flash_attention_mma(FaSmem& sm, const unsigned short* __restrict__ q,
                                                    const unsigned short* __restrict__ k,
                                                    const unsigned short* __restrict__ v,
                                                    const float* __restrict__ coords,
                                                    const float* __restrict__ gamma,
                                                    const unsigned char* __restrict__ mask,
                                                    unsigned short* __restrict__ out, int L, int H,
                                                    float scale, float cutoff2) {
    auto& ks = sm.ks;
    auto& vs = sm.vs;
    auto& xs = sm.xs;

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int grp = lane >> 2, tig = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int h = blockIdx.y, b = blockIdx.z;
    const i64 rs = (i64)H * HEAD_DIM;  // elements between consecutive residues
    const i64 base = (i64)b * L * rs + (i64)h * HEAD_DIM;
    const unsigned short* qb = q + base;
    const unsigned short* kb = k + base;
    const unsigned short* vb = v + base;
    unsigned short* ob = out + base;
    const float* xb = coords + (i64)b * L * 3;
    const unsigned char* mb = mask ? mask + (i64)b * L : nullptr;
    const float gl2 = gamma[h] * FA_LOG2E;
    const float sl2 = scale * FA_LOG2E;

    // This thread's two query rows (fragment rows grp and grp + 8 of the warp's 16).
    const int row0 = blockIdx.x * FA_BLOCK_M + warp * 16 + grp;
    const int row1 = row0 + 8;
    const bool ok0 = row0 < L, ok1 = row1 < L;

    // Q fragments stay in registers for the whole key loop.
    u32 qf[HEAD_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        const int c = kk * 16 + tig * 2;
        qf[kk][0] = ok0 ? fa_ld32(qb + row0 * rs + c) : 0u;
        qf[kk][1] = ok1 ? fa_ld32(qb + row1 * rs + c) : 0u;
        qf[kk][2] = ok0 ? fa_ld32(qb + row0 * rs + c + 8) : 0u;
        qf[kk][3] = ok1 ? fa_ld32(qb + row1 * rs + c + 8) : 0u;
    }
    // Origin of the expanded bias (no cutoff): the first real query residue of the block. Any origin
    // gives the same distances; a near one keeps the expanded terms, and their float32 rounding, small.
    // Padding residues may hold any coordinates, so they are never the origin.
    float cx = 0.f, cy = 0.f, cz = 0.f;
    if (!CUTOFF) {
        const int first = blockIdx.x * FA_BLOCK_M;
        const int last = min(L, first + FA_BLOCK_M);
        int o = -1;
        for (int i = first; i < last; ++i) {
            if (mb == nullptr || mb[i]) {
                o = i;
                break;
            }
        }
        if (o >= 0) {
            cx = xb[3 * o];
            cy = xb[3 * o + 1];
            cz = xb[3 * o + 2];
            if (!isfinite(cx + cy + cz)) cx = cy = cz = 0.f;
        }
    }
    // Query coordinates: raw (cutoff) or relative to the origin and pre-multiplied by 2 gamma log2e.
    float a0x = 0.f, a0y = 0.f, a0z = 0.f, a1x = 0.f, a1y = 0.f, a1z = 0.f;
    {
        const float f = CUTOFF ? 1.f : 2.f * gl2;
        if (ok0) {
            a0x = f * (xb[3 * row0] - cx);
            a0y = f * (xb[3 * row0 + 1] - cy);
            a0z = f * (xb[3 * row0 + 2] - cz);
        }
        if (ok1) {
            a1x = f * (xb[3 * row1] - cx);
            a1y = f * (xb[3 * row1 + 1] - cy);
            a1z = f * (xb[3 * row1 + 2] - cz);
        }
    }

    float o[HEAD_DIM / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = FA_NEG_INF, m1 = FA_NEG_INF;  // running row maxima (log2 units)
    float l0 = 0.f, l1 = 0.f;                // this thread's part of the running row sums

    const int ntiles = (L + FA_BLOCK_N - 1) / FA_BLOCK_N;

    // K and V tiles travel by cp.async. The key coordinates (and mask) of a tile are read into registers
    // one iteration before they are written to shared memory, so that their global-load latency hides
    // behind a tile of compute instead of stalling the loop.
    constexpr int KPT = (FA_BLOCK_N + FA_THREADS - 1) / FA_THREADS;  // keys per thread
    float4 pf[KPT];  // prefetched (x, y, z, 1 = real key / 0 = masked or past the end)

    auto load_kv = [&](int t, int st) {
        const int n0 = t * FA_BLOCK_N;
        constexpr int CPR = HEAD_DIM / 8;  // 16-byte chunks per row
        for (int c = tid; c < FA_BLOCK_N * CPR; c += FA_THREADS) {
            const int r = c / CPR, cc = c - r * CPR;
            const int key = n0 + r;
            const bool ok = key < L;
            const i64 off = (i64)(ok ? key : 0) * rs + cc * 8;
            fa_cp_async16(&ks[st][r * FA_LDS + cc * 8], kb + off, ok ? 16 : 0);
            fa_cp_async16(&vs[st][r * FA_LDS + cc * 8], vb + off, ok ? 16 : 0);
        }
        fa_cp_async_commit();
    };
    auto fetch_coords = [&](int t) {
#pragma unroll
        for (int i = 0; i < KPT; ++i) {
            const int r = tid + i * FA_THREADS;
            const int key = t * FA_BLOCK_N + r;
            pf[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < FA_BLOCK_N && key < L && (mb == nullptr || mb[key]))
                pf[i] = make_float4(xb[3 * key], xb[3 * key + 1], xb[3 * key + 2], 1.f);
        }
    };
    auto store_coords = [&](int st) {
#pragma unroll
        for (int i = 0; i < KPT; ++i) {
            const int r = tid + i * FA_THREADS;
            if (r >= FA_BLOCK_N) continue;
            float4 e = make_float4(0.f, 0.f, 0.f, FA_NEG_INF);
            if (pf[i].w != 0.f) {
                const float x = pf[i].x - cx, y = pf[i].y - cy, z = pf[i].z - cz;
                e = make_float4(x, y, z, CUTOFF ? 0.f : -gl2 * (x * x + y * y + z * z));
            }
            xs[st][r] = e;
        }
    };

    load_kv(0, 0);
    fetch_coords(0);
    store_coords(0);
    if (ntiles > 1) fetch_coords(1);

    for (int t = 0; t < ntiles; ++t) {
        const int st = (FA_STAGES == 2) ? (t & 1) : 0;
        if (FA_STAGES == 2) {
            if (t + 1 < ntiles) {
                // The other stage was last read in iteration t - 1, which ended with __syncthreads.
                load_kv(t + 1, st ^ 1);
                store_coords(st ^ 1);  // tile t + 1, fetched during iteration t - 1
                if (t + 2 < ntiles) fetch_coords(t + 2);
                fa_cp_async_wait<1>();  // tile t has landed; tile t + 1 may still be in flight
            } else {
                fa_cp_async_wait<0>();
            }
        } else {
            if (t > 0) {  // one stage: tile t is loaded only now (tile 0 was issued before the loop)
                load_kv(t, 0);
                store_coords(0);  // tile t, fetched during iteration t - 1
                if (t + 1 < ntiles) fetch_coords(t + 1);
            }
            fa_cp_async_wait<0>();
        }
        __syncthreads();

        // ---- S = Q K^T for this warp's 16 rows and FA_BLOCK_N keys
        float s[FA_BLOCK_N / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BLOCK_N / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        const unsigned short* kst = ks[st];
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < FA_BLOCK_N / 16; ++np) {
                // 8x8 matrices: (keys np*16 + 0..7 | 8..15) x (features kk*16 + 0..7 | 8..15);
                // lane l addresses row l & 7 of matrix l >> 3 = (key half, feature half).
                const int mi = lane >> 3;
                const unsigned short* p =
                    kst + (np * 16 + (mi >> 1) * 8 + (lane & 7)) * FA_LDS + kk * 16 + (mi & 1) * 8;
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4(b00, b01, b10, b11, p);
                fa_mma<BF16>(s[2 * np], qf[kk], b00, b01);
                fa_mma<BF16>(s[2 * np + 1], qf[kk], b10, b11);
            }
        }

        // ---- bias, mask, cutoff -> logits (log2 units); tile row maxima
        float tm0 = FA_NEG_INF, tm1 = FA_NEG_INF;
#pragma unroll
        for (int n = 0; n < FA_BLOCK_N / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float4 xj = xs[st][n * 8 + tig * 2 + e];
                float t0, t1;
                if (CUTOFF) {
                    const float dx0 = a0x - xj.x, dy0 = a0y - xj.y, dz0 = a0z - xj.z;
                    const float dx1 = a1x - xj.x, dy1 = a1y - xj.y, dz1 = a1z - xj.z;
                    const float d20 = dx0 * dx0 + dy0 * dy0 + dz0 * dz0;
                    const float d21 = dx1 * dx1 + dy1 * dy1 + dz1 * dz1;
                    t0 = fmaf(s[n][e], sl2, fmaf(-gl2, d20, xj.w));
                    t1 = fmaf(s[n][2 + e], sl2, fmaf(-gl2, d21, xj.w));
                    if (d20 > cutoff2) t0 = FA_NEG_INF;
                    if (d21 > cutoff2) t1 = FA_NEG_INF;
                } else {
                    t0 = fmaf(s[n][e], sl2, fmaf(a0x, xj.x, fmaf(a0y, xj.y, fmaf(a0z, xj.z, xj.w))));
                    t1 = fmaf(s[n][2 + e], sl2, fmaf(a1x, xj.x, fmaf(a1y, xj.y, fmaf(a1z, xj.z, xj.w))));
                }
                s[n][e] = t0;
                s[n][2 + e] = t1;
                tm0 = fmaxf(tm0, t0);
                tm1 = fmaxf(tm1, t1);
            }
        }
        // A row's values sit in the 4 threads of a quad.
        tm0 = fmaxf(tm0, __shfl_xor_sync(0xffffffffu, tm0, 1));
        tm0 = fmaxf(tm0, __shfl_xor_sync(0xffffffffu, tm0, 2));
        tm1 = fmaxf(tm1, __shfl_xor_sync(0xffffffffu, tm1, 1));
        tm1 = fmaxf(tm1, __shfl_xor_sync(0xffffffffu, tm1, 2));

        // ---- online softmax: rescale what came before, exponentiate this tile
        const float mn0 = fmaxf(m0, tm0), mn1 = fmaxf(m1, tm1);
        // A row with every key so far masked keeps max -inf; subtracting 0 instead keeps exp2 at 0
        // rather than NaN (-inf - -inf).
        const float mu0 = (mn0 == FA_NEG_INF) ? 0.f : mn0;
        const float mu1 = (mn1 == FA_NEG_INF) ? 0.f : mn1;
        const float c0 = fa_exp2(m0 - mu0), c1 = fa_exp2(m1 - mu1);
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
        for (int n = 0; n < FA_BLOCK_N / 8; ++n) {
            s[n][0] = fa_exp2(s[n][0] - mu0);
            s[n][1] = fa_exp2(s[n][1] - mu0);
            s[n][2] = fa_exp2(s[n][2] - mu1);
            s[n][3] = fa_exp2(s[n][3] - mu1);
            ps0 += s[n][0] + s[n][1];
            ps1 += s[n][2] + s[n][3];
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }

        // ---- O += P V. The accumulator layout of S (two adjacent key columns per register pair) is
        // the A-operand layout of the next mma, so P never leaves registers.
        const unsigned short* vst = vs[st];
#pragma unroll
        for (int kc = 0; kc < FA_BLOCK_N / 16; ++kc) {
            u32 pa[4];
            pa[0] = fa_pack<BF16>(s[2 * kc][0], s[2 * kc][1]);
            pa[1] = fa_pack<BF16>(s[2 * kc][2], s[2 * kc][3]);
            pa[2] = fa_pack<BF16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pa[3] = fa_pack<BF16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int fp = 0; fp < HEAD_DIM / 16; ++fp) {
                // Transposed 8x8 loads of V (rows = keys): matrices (key half, feature half) =
                // (0,0), (1,0), (0,1), (1,1) give b0, b1 of feature tile 2fp, then of 2fp + 1.
                const int mi = lane >> 3;
                const unsigned short* p =
                    vst + (kc * 16 + (mi & 1) * 8 + (lane & 7)) * FA_LDS + fp * 16 + (mi >> 1) * 8;
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4_trans(b00, b01, b10, b11, p);
                fa_mma<BF16>(o[2 * fp], pa, b00, b01);
                fa_mma<BF16>(o[2 * fp + 1], pa, b10, b11);
            }
        }
        __syncthreads();  // every warp is done with stage st before it is refilled
    }

    // ---- normalise and store; a row whose keys are all masked has l = 0 and gets zeros
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
    const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) {
        const int c = n * 8 + tig * 2;
        if (ok0) *reinterpret_cast<u32*>(ob + row0 * rs + c) = fa_pack<BF16>(o[n][0] * inv0, o[n][1] * inv0);
        if (ok1) *reinterpret_cast<u32*>(ob + row1 * rs + c) = fa_pack<BF16>(o[n][2] * inv1, o[n][3] * inv1);
    }
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, __nv_bfloat16* out, int L, int H, float scale, float cutoff2) {
    __shared__ FaSmem sm;
    if (cutoff2 >= 0.f)
        flash_attention_mma<true, true>(sm, q, k, v, coords, gamma, mask, out, L, H, scale, cutoff2);
    else
        flash_attention_mma<true, false>(sm, q, k, v, coords, gamma, mask, out, L, H, scale, cutoff2);
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, __half* out, int L, int H, float scale, float cutoff2) {
    __shared__ FaSmem sm;
    if (cutoff2 >= 0.f)
        flash_attention_mma<false, true>(sm, q, k, v, coords, gamma, mask, out, L, H, scale, cutoff2);
    else
        flash_attention_mma<false, false>(sm, q, k, v, coords, gamma, mask, out, L, H, scale, cutoff2);
}
