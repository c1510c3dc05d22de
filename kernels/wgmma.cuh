// wgmma.cuh: Hopper warpgroup MMA (wgmma, sm_90a only) for the tensor-core kernels: shared-memory matrix
// descriptors, fences, commit / wait, and wgmma.mma_async m64n64k16 with float32 accumulation. Off
// sm_90a (no __CUDA_ARCH_FEAT_SM90_ALL) the same names are empty stubs, so that a body templated on
// "use wgmma" still compiles everywhere. Inlined as text by the loader (#include "wgmma.cuh").
#include "mma_ptx.cuh"

// The four warps of a block form one warpgroup. wgmma.m64n64k16 multiplies 64 query rows (16 a warp, A
// from registers in the mma.sync fragment layout) by a 16 x 64 operand that the tensor cores read from
// shared memory themselves, once for the whole warpgroup: mma.sync has every warp read its own copy of
// the K and V fragments through ldmatrix, and at d = 64 that shared-memory traffic, not the tensor
// cores, bounds FlashAttention-2-style kernels. The accumulator of one m64n64 is the warp's 16 x 64 in
// the layout of eight m16n8 tiles, so the softmax code is shared with the mma.sync path unchanged.
// Shared-memory operands are given by 64-bit descriptors: start address, leading / stride byte offsets
// (16-byte units) and the swizzle mode. K and V rows are 128 bytes (64 16-bit values) in the 128-byte
// swizzle (16-byte chunk c of row r stored at chunk c ^ (r & 7), 1024-byte aligned tiles); the bias
// channels are 32-byte rows in the 32-byte swizzle (chunk c of row r at c ^ ((r >> 2) & 1)), the
// layout the mma.sync path already uses for its ldmatrix.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_HAS_WGMMA 1
#else
#define FA_HAS_WGMMA 0
#endif
#define FA_SWIZZLE_128B 1ull
#define FA_SWIZZLE_32B 3ull

__device__ __forceinline__ unsigned long long fa_wg_desc(u32 addr, u32 lead_bytes, u32 stride_bytes,
                                                         unsigned long long swizzle) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)((lead_bytes >> 4) & 0x3FFFu) << 16) |
           ((unsigned long long)((stride_bytes >> 4) & 0x3FFFu) << 32) | (swizzle << 62);
}

// Keeps the compiler from moving reads or writes of an accumulator register across the asynchronous
// wgmma that owns it (the asm statements below name the registers, not the order of their uses).
template <int N>
__device__ __forceinline__ void fa_reg_fence(float* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

#if FA_HAS_WGMMA
__device__ __forceinline__ void fa_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fa_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>  // until at most N of this warp's committed groups are pending
__device__ __forceinline__ void fa_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

#define FA_WG_D32                                                                                                \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_WG_D32_OPERANDS                                                                                       \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),  \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),   \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),  \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FA_WG_MMA(TYPES, TRANS_B)                                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " FA_WG_D32                               \
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, " TRANS_B ";\n}\n"                                      \
                 : FA_WG_D32_OPERANDS                                                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate))

// d (the warp's 16 x 64 of the 64 x 64 accumulator) = A (registers) B (descriptor) + (accumulate ? d : 0).
// F16: float16 operands (else bfloat16); TRANS_B: B's rows are its N dimension (V: keys x features).
template <bool F16, bool TRANS_B>
__device__ __forceinline__ void fa_wgmma64(float* d, const u32* a, unsigned long long b_desc, int accumulate) {
    if (F16) {
        if (TRANS_B) FA_WG_MMA("f16.f16", "1");
        else FA_WG_MMA("f16.f16", "0");
    } else {
        if (TRANS_B) FA_WG_MMA("bf16.bf16", "1");
        else FA_WG_MMA("bf16.bf16", "0");
    }
}
#else
// Never called off sm_90a (the wgmma entry points are empty there): stubs keep the body compilable.
__device__ __forceinline__ void fa_wg_fence() {}
__device__ __forceinline__ void fa_wg_commit() {}
template <int N>
__device__ __forceinline__ void fa_wg_wait() {}
template <bool F16, bool TRANS_B>
__device__ __forceinline__ void fa_wgmma64(float*, const u32*, unsigned long long, int) {}
#endif
