// mma_ptx.cuh: inline-PTX helpers of the tensor-core kernels (sm_80 or newer): shared-memory addresses,
// cp.async, ldmatrix, mma.sync m16n8k16 with float32 accumulation, packing and conversions of 16-bit
// values held as raw bits, exp2. No CUDA headers: NVRTC from the PyPI wheels ships none (no mma.h, no
// cuda_fp16.h), so everything is inline asm. Inlined as text by the loader (#include "mma_ptx.cuh").

typedef unsigned int u32;

__device__ __forceinline__ u32 fa_smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 writes zeros (rows past the end of the sequence).
__device__ __forceinline__ void fa_cp_async16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void fa_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void fa_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void fa_ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void fa_ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// D += A B for one m16n8k16 tile: A 16x16 row-major (4 regs), B 16x8 column-major (2 regs), D f32.
// Not volatile: the instruction has no side effects, so the compiler may schedule it freely.
template <bool BF16>
__device__ __forceinline__ void fa_mma(float* d, const u32* a, u32 b0, u32 b1) {
    if (BF16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
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

// x rounded to float16 (nearest even) and back: the hi part of a hi + lo split (lo = x - hi is exact).
__device__ __forceinline__ float fa_f16_round(float x) {
    unsigned short h;
    float y;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(y) : "h"(h));
    return y;
}
