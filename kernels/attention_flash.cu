// attention_flash.cu: fused, flash-style distance-biased attention on tensor cores (float16 / bfloat16
// inputs, float32 accumulation). The L x L logit matrix is never stored: each warp keeps FA_MT slices
// of 16 query rows in registers, K and V tiles stream through shared memory (cp.async, double-buffered),
// S = Q K^T and O += P V run on mma.sync m16n8k16, and the softmax is computed online. On compute
// capability 9.0 (d = 64, no cutoff) the flash_attention_wg_* entry points run the same body with the
// two products on warpgroup wgmma instead (sm_90a; see wgmma.cuh).
//
// Logit of query i and key j in head h (log2 units, so that exp2 is the exponential):
//   log2(e) * (scale * q_i . k_j - gamma_h |x_i - x_j|^2), -inf for masked keys or |x_i - x_j| > cutoff.
// Without a cutoff the bias is expanded as 2 gamma x_i . x_j - gamma |x_j|^2 - gamma |x_i|^2; the last
// term is constant along a softmax row and is dropped. Coordinates are taken relative to one query
// residue of the block (the origin), so that the expanded terms stay near the size of the distances.
// What is left is a dot product of an 11-channel query vector with an 11-channel key vector, and it rides
// on the tensor cores as one more m16n8k16 (float16) mma per 8 keys, ahead of Q K^T in the same float32
// accumulator: each float32 value is split into float16 hi + lo parts, and hi*hi + hi*lo + lo*hi keeps
// ~22 bits (a single 16-bit channel would keep 8 or 11):
//   channel  0-2       3-5       6-8       9     10
//   query    u_hi      u_hi      u_lo      2^a   2^a      u = g (x_i - o) 2^-t,  g = 2 gamma / scale
//   key      v_hi      v_lo      v_hi      w_hi  w_lo     v = (x_j - o) 2^t,     w = -g/2 |x_j - o|^2 2^-a
// so that the accumulator holds q.k + bias / scale and a logit costs one FMA (inside the exponential),
// as in plain attention, instead of four. Per block, t and a (powers of two, exact) are chosen from the
// largest |x - o| of its query rows and of all keys, keeping every channel within float16's range; a
// block whose coordinates span too far for that (|bias| / scale of 2^26 or more), or a scale <= 0, takes
// the float32 path instead: 3 FMAs of bias per logit. Masked keys carry w_hi = -inf.
// With a cutoff the squared distance is needed anyway and comes from the difference; whole key tiles
// whose bounding box lies beyond the cutoff of a warp's query rows are skipped.
//
// Per key tile a warp does, in this order (FlashAttention-2 practice for mma.sync):
//   * S = Q K^T: Q fragments stay in registers for the whole kernel; each ldmatrix.x4 of K feeds
//     2 x FA_MT mma instructions (FA_MT = 2: every K and V fragment serves two 16-row slices);
//   * row maxima of S (which holds the bias already, tensor-core path) within the quad of threads that
//     holds a row (2 shuffles); on the float32 paths logits = S * scale * log2(e) + bias first;
//   * lazy rescaling: the reference maximum of a row moves only when the tile's maximum exceeds it by
//     more than FA_TAU (log2 units), so most tiles skip the rescaling of O (a warp-uniform branch);
//     P = 2^(logit - reference) is then at most 2^FA_TAU, harmless in float32 and in 16-bit P;
//   * O += P V: the accumulator layout of S is the A-operand layout of the next mma, so P is packed to
//     16-bit pairs in registers and never goes through shared memory; V comes by ldmatrix.trans. The
//     row sums of P come from one more mma per 16 keys, with a B operand of ones.
// The loads of tile t + 1 (cp.async) are issued right after the barrier that opens tile t, so they
// overlap the whole of tile t's compute; one barrier per tile.
//
// No CUDA headers are included: NVRTC from the PyPI wheels ships none (no cuda_bf16.h, no mma.h). The
// 16-bit values travel as raw bits (unsigned short), and conversions, ldmatrix, mma and cp.async are
// inline PTX (sm_80 or newer). The typedefs below only name the entry points' element types for the
// loader, which type-checks launches from these signatures.
#include "common.cuh"

typedef unsigned short __nv_bfloat16;  // raw bfloat16 bits
typedef unsigned short __half;          // raw IEEE binary16 bits

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef FA_WARPS  // warps per block
#define FA_WARPS 4
#endif
#ifndef FA_MT  // 16-row slices of queries per warp (1 or 2)
#define FA_MT 2
#endif
#ifndef FA_BLOCK_N  // keys per tile, a multiple of 16
#define FA_BLOCK_N 64
#endif
#ifndef FA_STAGES  // 2: load tile t+1 while computing tile t; 1: no overlap (less shared memory)
#define FA_STAGES 2
#endif
#ifndef FA_MIN_BLOCKS  // blocks per SM asked of the register allocator (__launch_bounds__)
#define FA_MIN_BLOCKS 2
#endif
#ifndef FA_TAU  // lazy-rescaling threshold in log2 units: P <= 2^FA_TAU (fits float16 and bfloat16)
#define FA_TAU 8.0f
#endif
#ifndef FA_WG_SPLIT  // wgmma kernel: 1 overlaps slice 0's softmax with slice 1's S (and so on); 0: one S
#define FA_WG_SPLIT 0  // group per tile (measured faster at L = 4096, d = 64)
#endif
#ifndef FA_BIAS_MMA  // 1: the distance bias (no cutoff) on the tensor cores; 0: always 3 FMAs per logit
#define FA_BIAS_MMA 1
#endif
#ifndef FA_WRITE_LSE  // 1: the *_lse_* entry points (which also write the log-sum-exp) have bodies and the
#define FA_WRITE_LSE 0  // others are empty; 0: the reverse. One module compiles one kind.
#endif

#define FA_ROWS_PER_WARP (16 * FA_MT)
#define FA_BLOCK_M (FA_ROWS_PER_WARP * FA_WARPS)
#define FA_THREADS (32 * FA_WARPS)
// Shared-memory row stride in 16-bit elements: 8 extra (16 bytes) keep every row 16-byte aligned for
// cp.async / ldmatrix and shift consecutive rows by 4 banks, so the 8 row addresses of an ldmatrix
// phase fall in 8 different bank groups.
#define FA_LDS (HEAD_DIM + 8)
#define FA_TILE_BYTES (FA_BLOCK_N * FA_LDS * 2)
// Bias channels of one key for the tensor-core bias: 16 float16 (32 bytes); the two 16-byte halves of a
// row are swapped on rows with bit 2 set, so that the 8 rows an ldmatrix phase reads hit 8 different
// groups of 4 banks.
#define FA_XB_HALVES 16
#define FA_XB_TILE_BYTES (FA_BLOCK_N * FA_XB_HALVES * 2)
// Bias mode of a block (decided per block, uniform): float32 with a cutoff, float32 without, tensor cores.
#define FA_MODE_CUTOFF 0
#define FA_MODE_F32 1
#define FA_MODE_MMA 2

static_assert(HEAD_DIM % 16 == 0, "the tensor-core path needs HEAD_DIM to be a multiple of 16");
static_assert(FA_BLOCK_N % 16 == 0, "FA_BLOCK_N must be a multiple of 16");
static_assert(FA_STAGES == 1 || FA_STAGES == 2, "FA_STAGES is 1 or 2");
static_assert(2 * FA_WARPS * 4 <= FA_BLOCK_N * 32, "the block reduction borrows the bias area of shared memory");
static_assert(FA_MT == 1 || FA_MT == 2, "FA_MT is 1 or 2");

#define FA_NEG_INF __int_as_float(0xff800000)
#define FA_INF __int_as_float(0x7f800000)
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

#include "mma_ptx.cuh"  // cp.async, ldmatrix, mma.sync, 16-bit packing (inline PTX)

#include "wgmma.cuh"  // Hopper warpgroup MMA (sm_90a; stubs elsewhere)

// Query-side bias channel c (0..15) of one row: see the table at the top.
__device__ __forceinline__ float fa_query_channel(int c, float hx, float hy, float hz, float lx, float ly, float lz,
                                                  float pa) {
    const int k = c < 9 ? c % 3 : 0;
    const float hi = k == 0 ? hx : (k == 1 ? hy : hz);
    const float lo = k == 0 ? lx : (k == 1 ? ly : lz);
    return c < 6 ? hi : (c < 9 ? lo : (c < 11 ? pa : 0.f));
}

// ---- the kernel --------------------------------------------------------------------------------------
//   q, k, v, out: (B, L, H, HEAD_DIM) raw 16-bit, C-contiguous; base pointers 16-byte aligned
//   coords: float32 Angstrom, batch entry b at coords + b * xstride, (L, 3) each (xstride 0: shared)
//   gamma: (H,) float32, per Angstrom^2
//   mask: uint8 / bool (0 = padding key), batch entry b at mask + b * mstride, (L,) each; or NULL
//   scale: multiplies q . k; cutoff2: squared cutoff in Angstrom^2, or < 0 for none
// Grid: (ceil(L / FA_BLOCK_M), H, B); block: FA_THREADS.
// Shared memory, declared once in each entry point: static __shared__ arrays inside the templated body
// would be allocated once per instantiation (two per entry point) and overflow the 48 KB static limit.
struct __align__(16) FaSmem {
    unsigned short ks[FA_STAGES][FA_BLOCK_N * FA_LDS];
    unsigned short vs[FA_STAGES][FA_BLOCK_N * FA_LDS];
    union {
        // float32 paths, per key: (x, y, z, w), relative to the block's origin. No cutoff:
        // w = -gamma log2e |x_j|^2; cutoff: w = 0. Masked or past the end: (0, 0, 0, -inf); -inf carries
        // through the FMAs.
        float4 xs[FA_STAGES][FA_BLOCK_N];
        // tensor-core path, per key: the 16 float16 bias channels (swizzled halves, FA_XB_HALVES).
        unsigned short xb[FA_STAGES][FA_BLOCK_N * FA_XB_HALVES];
    };
};
// The wgmma kernel's shared memory: unpadded 128-byte rows of K and V in the 128-byte swizzle (each
// stage's tile 1024-byte aligned, as the swizzle's 8-row period needs), then the bias channels as above
// (256-byte aligned for the 32-byte swizzle). The entry point aligns the whole to 1024 bytes at run time.
struct FaSmemWg {
    unsigned short ks[FA_STAGES][FA_BLOCK_N * HEAD_DIM];
    unsigned short vs[FA_STAGES][FA_BLOCK_N * HEAD_DIM];
    union {
        float4 xs[FA_STAGES][FA_BLOCK_N];
        unsigned short xb[FA_STAGES][FA_BLOCK_N * FA_XB_HALVES];
    };
};
// Per-block choice of the bias path and its scales, reduced over the block (see flash_entry).
struct FaBlockBias {
    float ox, oy, oz;  // origin: the first real query residue of the block (0 if none)
    float u_scale;     // query channels: g 2^-t
    float v_scale;     // key channels: 2^t
    float w_scale;     // key w channel: -g/2 2^-a
    float pa;          // query constant channels: 2^a
    bool bias_mma;     // tensor-core path: whether the bias mma can change any logit (see flash_entry)
};

// WG: the products on wgmma (sm_90a, HEAD_DIM = FA_BLOCK_N = 64, no cutoff), else on mma.sync.
template <bool BF16, int MODE, bool WG, bool LSE, class Smem>
__device__ __forceinline__ void flash_attention_mma(Smem& sm, const FaBlockBias& bb,
                                                    const unsigned short* __restrict__ q,
                                                    const unsigned short* __restrict__ k,
                                                    const unsigned short* __restrict__ v,
                                                    const float* __restrict__ coords,
                                                    const float* __restrict__ gamma,
                                                    const unsigned char* __restrict__ mask,
                                                    unsigned short* __restrict__ out, float* __restrict__ lse, int L,
                                                    int H, int xstride, int mstride, float scale, float cutoff2) {
    constexpr bool CUTOFF = MODE == FA_MODE_CUTOFF;
    constexpr bool MMAB = MODE == FA_MODE_MMA;  // the bias on the tensor cores
    static_assert(!WG || (!CUTOFF && HEAD_DIM == 64 && FA_BLOCK_N == 64 && FA_WARPS == 4),
                  "the wgmma path is one warpgroup, 128-byte rows and 64-key tiles, without a cutoff "
                  "(whose tile skipping is decided per warp)");
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
    const float* xb = coords + (i64)b * xstride;
    const unsigned char* mb = mask ? mask + (i64)b * mstride : nullptr;
    const float gl2 = gamma[h] * FA_LOG2E;
    const float sl2 = scale * FA_LOG2E;

    // This thread's query rows: fragment rows grp and grp + 8 of each of the warp's FA_MT slices. A
    // warp's slices are adjacent on mma.sync; on wgmma slice mt is rows 16 warp.. of the block's mt-th
    // 64 rows (one m64 instruction each).
    constexpr int WARP_ROWS = WG ? 16 : FA_ROWS_PER_WARP;
    constexpr int SLICE_ROWS = WG ? 16 * FA_WARPS : 16;
    const int wrow = blockIdx.x * FA_BLOCK_M + warp * WARP_ROWS;
    int row[FA_MT][2];
    bool rok[FA_MT][2];
#pragma unroll
    for (int mt = 0; mt < FA_MT; ++mt) {
        row[mt][0] = wrow + mt * SLICE_ROWS + grp;
        row[mt][1] = row[mt][0] + 8;
        rok[mt][0] = row[mt][0] < L;
        rok[mt][1] = row[mt][1] < L;
    }

    // Q fragments stay in registers for the whole key loop.
    u32 qf[FA_MT][HEAD_DIM / 16][4];
#pragma unroll
    for (int mt = 0; mt < FA_MT; ++mt) {
        const unsigned short* q0 = qb + (i64)row[mt][0] * rs + tig * 2;
        const unsigned short* q1 = qb + (i64)row[mt][1] * rs + tig * 2;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
            qf[mt][kk][0] = rok[mt][0] ? fa_ld32(q0 + kk * 16) : 0u;
            qf[mt][kk][1] = rok[mt][1] ? fa_ld32(q1 + kk * 16) : 0u;
            qf[mt][kk][2] = rok[mt][0] ? fa_ld32(q0 + kk * 16 + 8) : 0u;
            qf[mt][kk][3] = rok[mt][1] ? fa_ld32(q1 + kk * 16 + 8) : 0u;
        }
    }
    const float cx = bb.ox, cy = bb.oy, cz = bb.oz;  // origin of the expanded bias (0 with a cutoff)
    // Tensor-core bias: this thread's query channels as the A operand of the bias mma, per slice:
    // rows grp, grp + 8 (registers 0/2 and 1/3), channels 2 tig, 2 tig + 1 and 2 tig + 8, 2 tig + 9.
    u32 ab[FA_MT][4];
    if (MMAB) {
#pragma unroll
        for (int mt = 0; mt < FA_MT; ++mt) {
            float ch[2][4];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float hx = 0.f, hy = 0.f, hz = 0.f, lx = 0.f, ly = 0.f, lz = 0.f;  // rows past the end: 0
                if (rok[mt][hh]) {
                    const int r = row[mt][hh];
                    const float ux = bb.u_scale * (xb[3 * r] - cx);
                    const float uy = bb.u_scale * (xb[3 * r + 1] - cy);
                    const float uz = bb.u_scale * (xb[3 * r + 2] - cz);
                    hx = fa_f16_round(ux), hy = fa_f16_round(uy), hz = fa_f16_round(uz);
                    lx = ux - hx, ly = uy - hy, lz = uz - hz;
                }
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    ch[hh][e] = fa_query_channel(2 * tig + (e & 1) + (e >> 1) * 8, hx, hy, hz, lx, ly, lz, bb.pa);
            }
            ab[mt][0] = fa_pack<false>(ch[0][0], ch[0][1]);
            ab[mt][1] = fa_pack<false>(ch[1][0], ch[1][1]);
            ab[mt][2] = fa_pack<false>(ch[0][2], ch[0][3]);
            ab[mt][3] = fa_pack<false>(ch[1][2], ch[1][3]);
        }
    }
    // Query coordinates: raw (cutoff) or relative to the origin and pre-multiplied by 2 gamma log2e.
    float ax[FA_MT][2], ay[FA_MT][2], az[FA_MT][2];
    // Cutoff: bounding box of the warp's query rows, to skip key tiles that lie beyond the cutoff.
    float qlo_x = FA_INF, qlo_y = FA_INF, qlo_z = FA_INF;
    float qhi_x = FA_NEG_INF, qhi_y = FA_NEG_INF, qhi_z = FA_NEG_INF;
    {
        const float f = CUTOFF ? 1.f : 2.f * gl2;
#pragma unroll
        for (int mt = 0; mt < FA_MT; ++mt) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                ax[mt][hh] = ay[mt][hh] = az[mt][hh] = 0.f;
                if (rok[mt][hh]) {
                    const int r = row[mt][hh];
                    ax[mt][hh] = f * (xb[3 * r] - cx);
                    ay[mt][hh] = f * (xb[3 * r + 1] - cy);
                    az[mt][hh] = f * (xb[3 * r + 2] - cz);
                    if (CUTOFF) {  // fminf/fmaxf drop NaN (padding rows with no coordinates)
                        qlo_x = fminf(qlo_x, ax[mt][hh]);
                        qhi_x = fmaxf(qhi_x, ax[mt][hh]);
                        qlo_y = fminf(qlo_y, ay[mt][hh]);
                        qhi_y = fmaxf(qhi_y, ay[mt][hh]);
                        qlo_z = fminf(qlo_z, az[mt][hh]);
                        qhi_z = fmaxf(qhi_z, az[mt][hh]);
                    }
                }
            }
        }
        if (CUTOFF) {
#pragma unroll
            for (int sh = 16; sh >= 1; sh >>= 1) {
                qlo_x = fminf(qlo_x, __shfl_xor_sync(0xffffffffu, qlo_x, sh));
                qhi_x = fmaxf(qhi_x, __shfl_xor_sync(0xffffffffu, qhi_x, sh));
                qlo_y = fminf(qlo_y, __shfl_xor_sync(0xffffffffu, qlo_y, sh));
                qhi_y = fmaxf(qhi_y, __shfl_xor_sync(0xffffffffu, qhi_y, sh));
                qlo_z = fminf(qlo_z, __shfl_xor_sync(0xffffffffu, qlo_z, sh));
                qhi_z = fmaxf(qhi_z, __shfl_xor_sync(0xffffffffu, qhi_z, sh));
            }
        }
    }

    float o[FA_MT][HEAD_DIM / 8][4];
#pragma unroll
    for (int mt = 0; mt < FA_MT; ++mt)
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    // Reference maxima (log2 units), and the row sums of P as an mma accumulator: P times a B operand of
    // ones gives every column the row sum (c0 = c1: row grp, c2 = c3: row grp + 8), so the sums cost one
    // tensor-core instruction per 16 keys instead of one FADD per logit, and add up exactly the 16-bit
    // P that multiplies V.
    float m[FA_MT][2], ls[FA_MT][4];
#pragma unroll
    for (int mt = 0; mt < FA_MT; ++mt) {
        m[mt][0] = m[mt][1] = FA_NEG_INF;
        ls[mt][0] = ls[mt][1] = ls[mt][2] = ls[mt][3] = 0.f;
    }
    const u32 ones = BF16 ? 0x3F803F80u : 0x3C003C00u;  // (1, 1) in bfloat16 / float16

    const int ntiles = (L + FA_BLOCK_N - 1) / FA_BLOCK_N;

    // ---- tile loads. K and V travel by cp.async: thread tid copies 16-byte chunk lc of rows lr,
    // lr + RPP, ... The key coordinates (and mask) of a tile are read into registers one iteration
    // before they are written to shared memory, so that their global-load latency hides behind a tile
    // of compute instead of stalling the loop.
    constexpr int CPR = HEAD_DIM / 8;      // 16-byte chunks per row
    constexpr bool EVEN = FA_THREADS % CPR == 0;  // each thread copies one fixed chunk column
    constexpr int RPP = EVEN ? FA_THREADS / CPR : 1;  // rows per pass of the whole block
    constexpr int PASSES = (FA_BLOCK_N + RPP - 1) / RPP;
    const int lr = tid / CPR, lc = tid - (tid / CPR) * CPR;
    // Shared rows: padded (mma.sync) or 128-byte swizzled (wgmma; RPP is a multiple of 8, so a thread's
    // rows all have the swizzle phase of lr).
    constexpr u32 ROW_BYTES = WG ? HEAD_DIM * 2 : FA_LDS * 2;
    constexpr u32 STAGE_BYTES = FA_BLOCK_N * ROW_BYTES;
    static_assert(!WG || (EVEN && RPP % 8 == 0), "the wgmma path's loads keep one swizzle phase per thread");
    const u32 lchunk = WG ? (u32)(lc ^ (lr & 7)) : (u32)lc;
    const u32 ks0 = fa_smem_addr(&sm.ks[0][0]) + (u32)lr * ROW_BYTES + lchunk * 16u;
    const u32 vs0 = fa_smem_addr(&sm.vs[0][0]) + (u32)lr * ROW_BYTES + lchunk * 16u;
    const unsigned short* kg0 = kb + (i64)lr * rs + lc * 8;
    const unsigned short* vg0 = vb + (i64)lr * rs + lc * 8;

    auto load_kv = [&](int t, int st) {
        const int n0 = t * FA_BLOCK_N;
        if (EVEN) {
            const i64 off0 = (i64)n0 * rs;
#pragma unroll
            for (int p = 0; p < PASSES; ++p) {
                const int r = lr + p * RPP;
                if (RPP * (p + 1) > FA_BLOCK_N && r >= FA_BLOCK_N) break;  // only when RPP does not divide BN
                const bool ok = n0 + r < L;
                // Rows past the end are zero-filled (source size 0) from an address that is still valid.
                const i64 off = off0 + (i64)(p * RPP) * rs;
                const u32 so = (u32)(st * STAGE_BYTES + p * RPP * ROW_BYTES);
                fa_cp_async16(ks0 + so, ok ? kg0 + off : kb + lc * 8, ok ? 16 : 0);
                fa_cp_async16(vs0 + so, ok ? vg0 + off : vb + lc * 8, ok ? 16 : 0);
            }
        } else {  // head dimensions such as 48 or 80: chunk c of the tile is row c / CPR, column c % CPR
            for (int c = tid; c < FA_BLOCK_N * CPR; c += FA_THREADS) {
                const int r = c / CPR, cc = c - r * CPR;
                const bool ok = n0 + r < L;
                const i64 off = ok ? (i64)(n0 + r) * rs + cc * 8 : cc * 8;
                const u32 so = (u32)(st * FA_TILE_BYTES + (r * FA_LDS + cc * 8) * 2);
                fa_cp_async16(fa_smem_addr(&sm.ks[0][0]) + so, kb + off, ok ? 16 : 0);
                fa_cp_async16(fa_smem_addr(&sm.vs[0][0]) + so, vb + off, ok ? 16 : 0);
            }
        }
        fa_cp_async_commit();
    };
    constexpr int KPT = (FA_BLOCK_N + FA_THREADS - 1) / FA_THREADS;  // keys per thread
    float4 pf[KPT];  // prefetched (x, y, z, 1 = real key / 0 = masked or past the end)
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
            if (MMAB) {  // the key's 16 bias channels (table at the top); masked: 0 and w_hi = -inf
                uint4 c0 = make_uint4(0u, 0u, 0u, 0u), c1 = make_uint4(fa_pack<false>(0.f, FA_NEG_INF), 0u, 0u, 0u);
                if (pf[i].w != 0.f) {
                    const float dx = pf[i].x - cx, dy = pf[i].y - cy, dz = pf[i].z - cz;
                    const float vx = dx * bb.v_scale, vy = dy * bb.v_scale, vz = dz * bb.v_scale;
                    const float hx = fa_f16_round(vx), hy = fa_f16_round(vy), hz = fa_f16_round(vz);
                    const float w = bb.w_scale * fmaf(dx, dx, fmaf(dy, dy, dz * dz));
                    const float wh = fa_f16_round(w);
                    c0 = make_uint4(fa_pack<false>(hx, hy), fa_pack<false>(hz, vx - hx), fa_pack<false>(vy - hy, vz - hz),
                                    fa_pack<false>(hx, hy));
                    c1 = make_uint4(fa_pack<false>(hz, wh), fa_pack<false>(w - wh, 0.f), 0u, 0u);
                }
                const int sw = (r >> 2) & 1;  // swizzle: halves swapped on rows with bit 2 set
                uint4* dst = reinterpret_cast<uint4*>(&sm.xb[st][r * FA_XB_HALVES]);
                dst[sw] = c0;
                dst[sw ^ 1] = c1;
                continue;
            }
            float4 e = make_float4(0.f, 0.f, 0.f, FA_NEG_INF);
            if (pf[i].w != 0.f) {
                const float x = pf[i].x - cx, y = pf[i].y - cy, z = pf[i].z - cz;
                e = make_float4(x, y, z, CUTOFF ? 0.f : -gl2 * (x * x + y * y + z * z));
            }
            sm.xs[st][r] = e;
        }
    };

    // ldmatrix addresses of this lane (stage 0, first 16 x 16 block). K (non-transposed): lane l points
    // at row l & 7 of 8x8 matrix l >> 3 = (key half (l >> 4) & 1, feature half (l >> 3) & 1), which
    // gives b0, b1 of key tile 2 np and then of 2 np + 1. V (transposed): matrix l >> 3 = (key half
    // (l >> 3) & 1, feature half (l >> 4) & 1) gives b0, b1 of feature tile 2 fp, then of 2 fp + 1.
    const u32 kld = fa_smem_addr(&sm.ks[0][0]) +
                    (u32)((((lane >> 4) & 1) * 8 + (lane & 7)) * FA_LDS + ((lane >> 3) & 1) * 8) * 2u;
    const u32 vld = fa_smem_addr(&sm.vs[0][0]) +
                    (u32)((((lane >> 3) & 1) * 8 + (lane & 7)) * FA_LDS + ((lane >> 4) & 1) * 8) * 2u;
    // Bias channels (tensor-core path): as K, 16 channels a key, halves swizzled by bit 2 of the row.
    const u32 xbld = fa_smem_addr(&sm.xb[0][0]) +
                     (u32)((((lane >> 4) & 1) * 8 + (lane & 7)) * FA_XB_HALVES +
                           ((((lane >> 3) & 1) ^ ((lane >> 2) & 1)) * 8)) * 2u;
    const float tau = MMAB ? FA_TAU / sl2 : FA_TAU;  // the threshold in the units of the row maxima

    load_kv(0, 0);
    fetch_coords(0);
    store_coords(0);
    if (ntiles > 1) fetch_coords(1);

    for (int t = 0; t < ntiles; ++t) {
        const int st = (FA_STAGES == 2) ? (t & 1) : 0;
        if (FA_STAGES == 2) {
            fa_cp_async_wait_all();  // tile t (the only group in flight) has landed
            __syncthreads();         // ... for every thread; and every warp is done with tile t - 1
            if (t + 1 < ntiles) {    // refill the other stage, last read in tile t - 1
                load_kv(t + 1, st ^ 1);
                store_coords(st ^ 1);  // tile t + 1, fetched during tile t - 1
                if (t + 2 < ntiles) fetch_coords(t + 2);
            }
        } else {
            if (t > 0) {
                __syncthreads();  // every warp is done with tile t - 1 before its stage is refilled
                load_kv(t, 0);
                store_coords(0);  // tile t, fetched during tile t - 1
                if (t + 1 < ntiles) fetch_coords(t + 1);
            }
            fa_cp_async_wait_all();
            __syncthreads();
        }
        const float4* xst = sm.xs[st];

        if (CUTOFF) {
            // Skip the tile when the bounding box of its real keys lies beyond the cutoff of every
            // query row of the warp (a warp-uniform decision; a tile of masked keys only is skipped).
            float klo_x = FA_INF, klo_y = FA_INF, klo_z = FA_INF;
            float khi_x = FA_NEG_INF, khi_y = FA_NEG_INF, khi_z = FA_NEG_INF;
#pragma unroll
            for (int j = lane; j < FA_BLOCK_N; j += 32) {
                const float4 e = xst[j];
                if (e.w == FA_NEG_INF) continue;  // masked or past the end
                klo_x = fminf(klo_x, e.x), khi_x = fmaxf(khi_x, e.x);
                klo_y = fminf(klo_y, e.y), khi_y = fmaxf(khi_y, e.y);
                klo_z = fminf(klo_z, e.z), khi_z = fmaxf(khi_z, e.z);
            }
#pragma unroll
            for (int sh = 16; sh >= 1; sh >>= 1) {
                klo_x = fminf(klo_x, __shfl_xor_sync(0xffffffffu, klo_x, sh));
                khi_x = fmaxf(khi_x, __shfl_xor_sync(0xffffffffu, khi_x, sh));
                klo_y = fminf(klo_y, __shfl_xor_sync(0xffffffffu, klo_y, sh));
                khi_y = fmaxf(khi_y, __shfl_xor_sync(0xffffffffu, khi_y, sh));
                klo_z = fminf(klo_z, __shfl_xor_sync(0xffffffffu, klo_z, sh));
                khi_z = fmaxf(khi_z, __shfl_xor_sync(0xffffffffu, khi_z, sh));
            }
            const float gx = fmaxf(0.f, fmaxf(klo_x - qhi_x, qlo_x - khi_x));
            const float gy = fmaxf(0.f, fmaxf(klo_y - qhi_y, qlo_y - khi_y));
            const float gz = fmaxf(0.f, fmaxf(klo_z - qhi_z, qlo_z - khi_z));
            // The gap is a lower bound of every pair distance; the margin absorbs float rounding of the
            // per-pair squared distances compared with cutoff2 below. NaN (no real query row) skips.
            const float gap2 = gx * gx + gy * gy + gz * gz;
            if (!(gap2 <= cutoff2 * 1.0001f + 1e-4f)) continue;
        }

        // ---- S = Q K^T for the warp's FA_MT x 16 rows and FA_BLOCK_N keys
        float s[FA_MT][FA_BLOCK_N / 8][4];
        if (WG) {
            // The bias (f16 channels) opens the accumulator, else the first k-step does (accumulate = 0).
            // K-major operands in the 128-byte swizzle: k-step kk starts 32 bytes further along the rows.
            const bool bias = MMAB && bb.bias_mma;
            const u32 kbase = fa_smem_addr(&sm.ks[st][0]);
            const u32 xbase = fa_smem_addr(&sm.xb[st][0]);
#pragma unroll
            for (int mt = 0; mt < FA_MT; ++mt) fa_reg_fence<FA_BLOCK_N / 2>(&s[mt][0][0]);
            fa_wg_fence();
            // FA_WG_SPLIT: one commit group per slice, so that slice 0's softmax can start while slice 1's
            // S is still being computed (see the end of the tile loop).
#pragma unroll
            for (int mt = 0; mt < FA_MT; ++mt) {
                if (bias) fa_wgmma64<true, false>(&s[mt][0][0], ab[mt], fa_wg_desc(xbase, 16, 8 * 32, FA_SWIZZLE_32B), 0);
#pragma unroll
                for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
                    fa_wgmma64<!BF16, false>(&s[mt][0][0], qf[mt][kk],
                                             fa_wg_desc(kbase + 32 * kk, 16, 8 * 128, FA_SWIZZLE_128B), bias || kk > 0);
                if (FA_WG_SPLIT || mt == FA_MT - 1) fa_wg_commit();
            }
        } else {
#pragma unroll
        for (int mt = 0; mt < FA_MT; ++mt)
#pragma unroll
            for (int n = 0; n < FA_BLOCK_N / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
        if (MMAB && bb.bias_mma) {  // S = bias / scale first (float16 channels, float32 accumulator)
            const u32 xbst = xbld + (u32)(st * FA_XB_TILE_BYTES);
#pragma unroll
            for (int np = 0; np < FA_BLOCK_N / 16; ++np) {
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4(b00, b01, b10, b11, xbst + (u32)(np * 16 * FA_XB_HALVES * 2));
#pragma unroll
                for (int mt = 0; mt < FA_MT; ++mt) {
                    fa_mma<false>(s[mt][2 * np], ab[mt], b00, b01);
                    fa_mma<false>(s[mt][2 * np + 1], ab[mt], b10, b11);
                }
            }
        }
        const u32 kst = kld + (u32)(st * FA_TILE_BYTES);
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < FA_BLOCK_N / 16; ++np) {
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4(b00, b01, b10, b11, kst + (u32)((np * 16 * FA_LDS + kk * 16) * 2));
#pragma unroll
                for (int mt = 0; mt < FA_MT; ++mt) {
                    fa_mma<BF16>(s[mt][2 * np], qf[mt][kk], b00, b01);
                    fa_mma<BF16>(s[mt][2 * np + 1], qf[mt][kk], b10, b11);
                }
            }
        }
        }  // mma.sync

        // The online softmax of slices [M0, M1): S -> logits, row maxima, lazy rescaling of O, and
        // P = 2^(logit - m) in place of S. Called with constant bounds only: inlined, its loops unroll
        // and the register arrays stay registers (ptxas reports no stack frame).
        auto softmax = [&](const int M0, const int M1) {
            // ---- bias, mask, cutoff -> logits (log2 units; tensor-core path: S as it is, q.k + bias / scale);
            // tile row maxima
            float tm[FA_MT][2];
    #pragma unroll
            for (int mt = M0; mt < M1; ++mt) tm[mt][0] = tm[mt][1] = FA_NEG_INF;
            if (MMAB) {
    #pragma unroll
                for (int n = 0; n < FA_BLOCK_N / 8; ++n)
    #pragma unroll
                    for (int mt = M0; mt < M1; ++mt) {
                        tm[mt][0] = fmaxf(tm[mt][0], fmaxf(s[mt][n][0], s[mt][n][1]));
                        tm[mt][1] = fmaxf(tm[mt][1], fmaxf(s[mt][n][2], s[mt][n][3]));
                    }
            } else {
    #pragma unroll
                for (int n = 0; n < FA_BLOCK_N / 8; ++n) {
    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float4 xj = xst[n * 8 + tig * 2 + e];
    #pragma unroll
                        for (int mt = M0; mt < M1; ++mt) {
    #pragma unroll
                            for (int hh = 0; hh < 2; ++hh) {
                                float& sv = s[mt][n][2 * hh + e];
                                float tv;
                                if (CUTOFF) {
                                    const float dx = ax[mt][hh] - xj.x, dy = ay[mt][hh] - xj.y, dz = az[mt][hh] - xj.z;
                                    const float d2 = fmaf(dx, dx, fmaf(dy, dy, dz * dz));
                                    tv = fmaf(sv, sl2, fmaf(-gl2, d2, xj.w));
                                    if (d2 > cutoff2) tv = FA_NEG_INF;
                                } else {
                                    tv = fmaf(sv, sl2,
                                              fmaf(ax[mt][hh], xj.x, fmaf(ay[mt][hh], xj.y, fmaf(az[mt][hh], xj.z, xj.w))));
                                }
                                sv = tv;
                                tm[mt][hh] = fmaxf(tm[mt][hh], tv);
                            }
                        }
                    }
                }
            }
            // A row's values sit in the 4 threads of a quad.
            bool grow = false;
    #pragma unroll
            for (int mt = M0; mt < M1; ++mt) {
    #pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    float x = tm[mt][hh];
                    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
                    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
                    tm[mt][hh] = x;
                    grow |= x > m[mt][hh] + tau;  // -inf + tau = -inf: the first real logit moves m
                }
            }

            // ---- lazy rescale: only when some row's maximum grew by more than FA_TAU
            if (__any_sync(0xffffffffu, grow)) {
    #pragma unroll
                for (int mt = M0; mt < M1; ++mt) {
    #pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const bool up = tm[mt][hh] > m[mt][hh] + tau;
                        const float dm = m[mt][hh] - tm[mt][hh];
                        const float c = up ? fa_exp2(MMAB ? dm * sl2 : dm) : 1.f;  // 2^(-inf) = 0
                        m[mt][hh] = up ? tm[mt][hh] : m[mt][hh];
                        ls[mt][2 * hh] *= c;
                        ls[mt][2 * hh + 1] *= c;
    #pragma unroll
                        for (int n = 0; n < HEAD_DIM / 8; ++n) {
                            o[mt][n][2 * hh] *= c;
                            o[mt][n][2 * hh + 1] *= c;
                        }
                    }
                }
            }

            // ---- P = 2^(logit - m): at most 2^FA_TAU. A row with every key so far masked keeps m = -inf;
            // subtracting 0 instead keeps 2^x at 0 rather than NaN (-inf - -inf).
    #pragma unroll
            for (int mt = M0; mt < M1; ++mt) {
    #pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const float mu = m[mt][hh] == FA_NEG_INF ? 0.f : m[mt][hh];
                    if (MMAB) {  // 2^((S - m) scale log2e) as one FMA and the exponential
                        const float nm = -mu * sl2;
    #pragma unroll
                        for (int n = 0; n < FA_BLOCK_N / 8; ++n) {
                            s[mt][n][2 * hh] = fa_exp2(fmaf(s[mt][n][2 * hh], sl2, nm));
                            s[mt][n][2 * hh + 1] = fa_exp2(fmaf(s[mt][n][2 * hh + 1], sl2, nm));
                        }
                    } else {
    #pragma unroll
                        for (int n = 0; n < FA_BLOCK_N / 8; ++n) {
                            s[mt][n][2 * hh] = fa_exp2(s[mt][n][2 * hh] - mu);
                            s[mt][n][2 * hh + 1] = fa_exp2(s[mt][n][2 * hh + 1] - mu);
                        }
                    }
                }
            }

        };

        if (WG) {
            // Slices [M0, M1) at a time (all, or one with FA_WG_SPLIT): wait for their S, the softmax, then
            // their P V issued at once. Split, slice 0's softmax runs while slice 1's S is computed and
            // slice 0's P V while slice 1's softmax runs: the pending groups are in order S0, S1, P V0,
            // and each wait leaves at most one of the others in flight.
            // P of all 64 keys is kept until the end: the wgmma reads its A registers asynchronously.
            // V is the N-major (transposed) operand: 16 keys a k-step, 2048 bytes apart; its 8-key groups
            // 1024 bytes apart; one 64-column block (the lead offset is unused).
            u32 pw[FA_BLOCK_N / 16][FA_MT][4];
            const u32 vbase = fa_smem_addr(&sm.vs[st][0]);
            auto slices = [&](const int M0, const int M1) {  // (constant arguments only, as softmax)
                fa_wg_wait<(FA_WG_SPLIT && FA_MT == 2) ? 1 : 0>();
#pragma unroll
                for (int mt = M0; mt < M1; ++mt) fa_reg_fence<FA_BLOCK_N / 2>(&s[mt][0][0]);
                softmax(M0, M1);
#pragma unroll
                for (int mt = M0; mt < M1; ++mt) {
#pragma unroll
                    for (int kc = 0; kc < FA_BLOCK_N / 16; ++kc) {
                        pw[kc][mt][0] = fa_pack<BF16>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                        pw[kc][mt][1] = fa_pack<BF16>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                        pw[kc][mt][2] = fa_pack<BF16>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                        pw[kc][mt][3] = fa_pack<BF16>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                    }
                    fa_reg_fence<HEAD_DIM / 2>(&o[mt][0][0]);
                }
                fa_wg_fence();
#pragma unroll
                for (int kc = 0; kc < FA_BLOCK_N / 16; ++kc)
#pragma unroll
                    for (int mt = M0; mt < M1; ++mt)
                        fa_wgmma64<!BF16, true>(&o[mt][0][0], pw[kc][mt],
                                                fa_wg_desc(vbase + 16 * 128 * kc, 8 * 1024, 8 * 128, FA_SWIZZLE_128B), 1);
                fa_wg_commit();
            };
            if (FA_WG_SPLIT && FA_MT == 2) {
                slices(0, 1);
                slices(1, 2);
            } else {
                slices(0, FA_MT);
            }
            // The row sums (mma.sync on other registers) overlap the last P V.
#pragma unroll
            for (int kc = 0; kc < FA_BLOCK_N / 16; ++kc)
#pragma unroll
                for (int mt = 0; mt < FA_MT; ++mt) fa_mma<BF16>(ls[mt], pw[kc][mt], ones, ones);
            fa_wg_wait<0>();  // before the next tile's barrier lets this stage's V be refilled
#pragma unroll
            for (int mt = 0; mt < FA_MT; ++mt) fa_reg_fence<HEAD_DIM / 2>(&o[mt][0][0]);
            continue;
        }
        softmax(0, FA_MT);

        // ---- O += P V
        const u32 vst = vld + (u32)(st * FA_TILE_BYTES);
#pragma unroll
        for (int kc = 0; kc < FA_BLOCK_N / 16; ++kc) {
            u32 pa[FA_MT][4];
#pragma unroll
            for (int mt = 0; mt < FA_MT; ++mt) {
                pa[mt][0] = fa_pack<BF16>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                pa[mt][1] = fa_pack<BF16>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                pa[mt][2] = fa_pack<BF16>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                pa[mt][3] = fa_pack<BF16>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                fa_mma<BF16>(ls[mt], pa[mt], ones, ones);
            }
#pragma unroll
            for (int fp = 0; fp < HEAD_DIM / 16; ++fp) {
                u32 b00, b01, b10, b11;
                fa_ldmatrix_x4_trans(b00, b01, b10, b11, vst + (u32)((kc * 16 * FA_LDS + fp * 16) * 2));
#pragma unroll
                for (int mt = 0; mt < FA_MT; ++mt) {
                    fa_mma<BF16>(o[mt][2 * fp], pa[mt], b00, b01);
                    fa_mma<BF16>(o[mt][2 * fp + 1], pa[mt], b10, b11);
                }
            }
        }
    }

    // ---- normalise and store; a row whose keys are all masked has l = 0 and gets zeros
#pragma unroll
    for (int mt = 0; mt < FA_MT; ++mt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float x = ls[mt][2 * hh];  // the whole row's sum (the mma added over the quad)
            const float inv = x > 0.f ? 1.f / x : 0.f;
            if (LSE && tig == 0 && rok[mt][hh]) {
                // lse (natural log) = log of the row's sum of 2^logit: the sum is l 2^m (m in log2 units;
                // tensor-core path: in units of S, times sl2). Without a cutoff the logits here lack the
                // row constant -gamma |x_i - o|^2, added back. -inf for a row with no key.
                float v = FA_NEG_INF;
                if (x > 0.f) {
                    v = FA_LN2 * ((MMAB ? m[mt][hh] * sl2 : m[mt][hh]) + log2f(x));
                    if (!CUTOFF) {
                        const int r = row[mt][hh];
                        const float dx = xb[3 * r] - cx, dy = xb[3 * r + 1] - cy, dz = xb[3 * r + 2] - cz;
                        v -= gamma[h] * fmaf(dx, dx, fmaf(dy, dy, dz * dz));
                    }
                }
                lse[((i64)b * H + h) * L + row[mt][hh]] = v;
            }
            if (rok[mt][hh]) {
                unsigned short* orow = ob + (i64)row[mt][hh] * rs + tig * 2;
#pragma unroll
                for (int n = 0; n < HEAD_DIM / 8; ++n)
                    *reinterpret_cast<u32*>(orow + n * 8) =
                        fa_pack<BF16>(o[mt][n][2 * hh] * inv, o[mt][n][2 * hh + 1] * inv);
            }
        }
    }
}

// Per block: the bias path and its scales (see the top of the file), then the body. The origin is the
// first real query residue of the block: any origin gives the same distances, a near one keeps the
// expanded terms, and their rounding, small; padding residues may hold any coordinates, so they are
// the origin only in a block without real rows (its first row with finite coordinates). The tensor-core path also needs the largest squared distance from the origin of the
// block's query rows (finite ones, padding included) and of all real keys: one pass over the key
// coordinates (L2-resident, shared by every block) and a block reduction.
template <bool BF16, bool WG, bool LSE, class Smem>
__device__ __forceinline__ void flash_entry(Smem& sm, const unsigned short* q, const unsigned short* k,
                                            const unsigned short* v, const float* coords, const float* gamma,
                                            const unsigned char* mask, unsigned short* out, float* lse, int L,
                                            int H, int xstride, int mstride, float scale, float cutoff2) {
    FaBlockBias bb = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, false};
    if (!WG && cutoff2 >= 0.f) {  // (the wgmma entry points are not launched with a cutoff)
        flash_attention_mma<BF16, FA_MODE_CUTOFF, false, LSE>(sm, bb, q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride,
                                                  scale, cutoff2);
        return;
    }
    const float* xb = coords + (i64)blockIdx.z * xstride;
    const unsigned char* mb = mask ? mask + (i64)blockIdx.z * mstride : nullptr;
    const int first = blockIdx.x * FA_BLOCK_M;
    const int last = min(L, first + FA_BLOCK_M);
    int o = -1;  // the first real query row with finite coordinates, else the first finite one
    for (int i = first; i < last; ++i) {
        if (!isfinite(xb[3 * i] + xb[3 * i + 1] + xb[3 * i + 2])) continue;
        if (o < 0) o = i;
        if (mb == nullptr || mb[i]) {
            o = i;
            break;
        }
    }
    if (o >= 0) {
        bb.ox = xb[3 * o];
        bb.oy = xb[3 * o + 1];
        bb.oz = xb[3 * o + 2];
    }
    bool mma = false;
    if (FA_BIAS_MMA && scale > 0.f) {
        float rq = 0.f, rk = 0.f;  // fmaxf drops NaN (padding rows without coordinates)
        for (int i = first + (int)threadIdx.x; i < last; i += FA_THREADS) {
            const float dx = xb[3 * i] - bb.ox, dy = xb[3 * i + 1] - bb.oy, dz = xb[3 * i + 2] - bb.oz;
            rq = fmaxf(rq, fmaf(dx, dx, fmaf(dy, dy, dz * dz)));
        }
        // 8 keys a thread per step, their loads issued together: a dependent load a key would leave
        // every block waiting out L / FA_THREADS round trips to L2 (several microseconds at L = 4096).
        for (int j0 = threadIdx.x; j0 < L; j0 += 8 * FA_THREADS) {
            float d2[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int j = j0 + u * FA_THREADS;
                d2[u] = 0.f;
                if (j < L && (mb == nullptr || mb[j])) {
                    const float dx = xb[3 * j] - bb.ox, dy = xb[3 * j + 1] - bb.oy, dz = xb[3 * j + 2] - bb.oz;
                    d2[u] = fmaf(dx, dx, fmaf(dy, dy, dz * dz));
                }
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) rk = fmaxf(rk, d2[u]);
        }
#pragma unroll
        for (int sh = 16; sh >= 1; sh >>= 1) {
            rq = fmaxf(rq, __shfl_xor_sync(0xffffffffu, rq, sh));
            rk = fmaxf(rk, __shfl_xor_sync(0xffffffffu, rk, sh));
        }
        // The reduction borrows the bias area of shared memory, before the body's first tile load.
        float* red = reinterpret_cast<float*>(&sm.xs[0][0]);
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) {
            red[warp] = rq;
            red[FA_WARPS + warp] = rk;
        }
        __syncthreads();
        rq = rk = 0.f;
#pragma unroll
        for (int w = 0; w < FA_WARPS; ++w) rq = fmaxf(rq, red[w]), rk = fmaxf(rk, red[FA_WARPS + w]);
        __syncthreads();  // every thread has read it before the first tile's coordinates land there
        // The accumulator holds q.k + bias / scale: g = 2 gamma / scale multiplies (x_i - o) . (x_j - o).
        const float g = 2.f * gamma[blockIdx.y] / scale;
        const float ag = fabsf(g);
        // |bias| / scale < 2^26 keeps the query and key channels below 2^14 each (and w below 2^25).
        if (isfinite(ag * fmaxf(rq, rk)) && ag * fmaxf(rq, rk) < 67108864.f) {
            mma = true;
            const float gq = ag * sqrtf(rq), rkk = sqrtf(rk);
            // 2^t balances the query channels (<= gq 2^-t) against the key channels (<= rkk 2^t).
            const int tmax = rkk > 0.f ? 13 - ilogbf(rkk) : 100;
            const int tmin = gq > 0.f ? ilogbf(gq) - 13 : -100;
            const int t = min(100, max(-100, (tmin + tmax) >> 1));
            const float wmax = 0.5f * ag * rk;
            const int a = wmax > 0.f ? max(0, ilogbf(wmax) - 13) : 0;
            bb.u_scale = rkk > 0.f ? ldexpf(g, -t) : 0.f;
            bb.v_scale = ldexpf(1.f, t);
            bb.w_scale = ldexpf(-0.5f * g, -a);
            bb.pa = ldexpf(1.f, a);
            // With gamma = 0 the channels are zero but for the -inf of masked keys and of the keys past
            // the end in the last tile: without either, the bias mma is skipped (plain attention).
            bb.bias_mma = g != 0.f || mb != nullptr || L % FA_BLOCK_N != 0;
        }
    }
    if (mma)
        flash_attention_mma<BF16, FA_MODE_MMA, WG, LSE>(sm, bb, q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride,
                                               scale, cutoff2);
    else
        flash_attention_mma<BF16, FA_MODE_F32, WG, LSE>(sm, bb, q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride,
                                               scale, cutoff2);
}

// Entry points. Without FA_WRITE_LSE the flash_attention_[wg_]{bf16,f16} ones have bodies; with it the
// *_lse_* ones (which also write lse (B, H, L) float32, natural log, for the backward) have, and the others
// are empty. Every module declares both kinds, so that the loader's signature list is one.
extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, __nv_bfloat16* out, int L, int H, int xstride, int mstride, float scale,
    float cutoff2) {
#if !FA_WRITE_LSE
    __shared__ FaSmem sm;
    flash_entry<true, false, false>(sm, q, k, v, coords, gamma, mask, out, nullptr, L, H, xstride, mstride, scale,
                                    cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, __half* out, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if !FA_WRITE_LSE
    __shared__ FaSmem sm;
    flash_entry<false, false, false>(sm, q, k, v, coords, gamma, mask, out, nullptr, L, H, xstride, mstride, scale,
                                     cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_lse_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, __nv_bfloat16* out, float* lse, int L, int H, int xstride, int mstride, float scale,
    float cutoff2) {
#if FA_WRITE_LSE
    __shared__ FaSmem sm;
    flash_entry<true, false, true>(sm, q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride, scale, cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_lse_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, __half* out, float* lse, int L, int H, int xstride, int mstride, float scale,
    float cutoff2) {
#if FA_WRITE_LSE
    __shared__ FaSmem sm;
    flash_entry<false, false, true>(sm, q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride, scale, cutoff2);
#endif
}

// The wgmma entry points (HEAD_DIM = FA_BLOCK_N = 64, FA_WARPS = 4, no cutoff): compiled for sm_90a; for
// other targets they are empty, and the host launches them only on a compute capability 9.0 device.
#if FA_HAS_WGMMA
#define FA_WG_SMEM_BYTES (sizeof(FaSmemWg) + 1024)
__device__ __forceinline__ FaSmemWg& fa_wg_smem(unsigned char* raw) {  // 1024-byte aligned (the swizzle)
    return *reinterpret_cast<FaSmemWg*>(raw + ((1024u - (fa_smem_addr(raw) & 1023u)) & 1023u));
}
#endif

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_wg_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, __nv_bfloat16* out, int L, int H, int xstride, int mstride, float scale,
    float cutoff2) {
#if FA_HAS_WGMMA && !FA_WRITE_LSE
    __shared__ __align__(128) unsigned char raw[FA_WG_SMEM_BYTES];
    flash_entry<true, true, false>(fa_wg_smem(raw), q, k, v, coords, gamma, mask, out, nullptr, L, H, xstride, mstride,
                                   scale, cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_wg_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, __half* out, int L, int H, int xstride, int mstride, float scale, float cutoff2) {
#if FA_HAS_WGMMA && !FA_WRITE_LSE
    __shared__ __align__(128) unsigned char raw[FA_WG_SMEM_BYTES];
    flash_entry<false, true, false>(fa_wg_smem(raw), q, k, v, coords, gamma, mask, out, nullptr, L, H, xstride, mstride,
                                    scale, cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_wg_lse_bf16(
    const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* coords, const float* gamma,
    const unsigned char* mask, __nv_bfloat16* out, float* lse, int L, int H, int xstride, int mstride, float scale,
    float cutoff2) {
#if FA_HAS_WGMMA && FA_WRITE_LSE
    __shared__ __align__(128) unsigned char raw[FA_WG_SMEM_BYTES];
    flash_entry<true, true, true>(fa_wg_smem(raw), q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride,
                                  scale, cutoff2);
#endif
}

extern "C" __global__ __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) void flash_attention_wg_lse_f16(
    const __half* q, const __half* k, const __half* v, const float* coords, const float* gamma,
    const unsigned char* mask, __half* out, float* lse, int L, int H, int xstride, int mstride, float scale,
    float cutoff2) {
#if FA_HAS_WGMMA && FA_WRITE_LSE
    __shared__ __align__(128) unsigned char raw[FA_WG_SMEM_BYTES];
    flash_entry<false, true, true>(fa_wg_smem(raw), q, k, v, coords, gamma, mask, out, lse, L, H, xstride, mstride,
                                   scale, cutoff2);
#endif
}
