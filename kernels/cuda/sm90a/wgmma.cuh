// Hopper's warpgroup tensor-core instructions (sm_90a PTX: wgmma.mma_async
// and its fences), for the kernels in kernels/cuda/sm90a/, which are built
// for sm_90a only (kernels/CMakeLists.txt). Not a public header.
//
// A warpgroup is 4 consecutive warps (128 threads, starting at a warp index
// divisible by 4); one wgmma multiplies a 64-row A by a 16-deep B into a
// 64 x N fp32 accumulator spread over the warpgroup: warp w of the group
// holds rows 16 w .. 16 w + 15 in the mma.m16n8 C layout (for each 8-column
// tile i, registers 4 i .. 4 i + 3 = (row g, col 2 t), (g, 2 t + 1),
// (g + 8, 2 t), (g + 8, 2 t + 1)), and an A operand in registers is each
// warp's 16 rows in the mma.m16n8k16 A layout.
//
// Shared-memory operands are described by a 64-bit descriptor. All of ours
// are tiles of rows of 64 bf16 (128 bytes) in the 128-byte swizzle -- the
// 16-byte chunk c of row r stored at chunk c ^ (r % 8), on absolute
// addresses, so every tile starts on a 1024-byte boundary -- which is the
// layout Bf16Ops::swz<64> gives (kernels/cuda/attention/mma_ops.cuh):
//   K-major operand (A = Q, B = K: rows of the tile are M or N, the 64
//   elements of a row are K): 8-row groups 1024 bytes apart (the stride
//   byte offset); the k-step s of 16 starts 32 s bytes into the rows.
//   N-major B (V: rows are K, a row's 64 elements are N): the same
//   descriptor; 16 rows (two 8-row groups, 1024 bytes apart) per k-step.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda::detail {

/// The 128-byte swizzle repeats every 8 rows of 128 bytes: a swizzled tile
/// starts on a boundary of this many bytes.
constexpr int kSwizzleAlign = 1024;

/// The first kSwizzleAlign boundary at or after `raw` (dynamic shared memory
/// is only 16-byte aligned: kernels ask for kSwizzleAlign bytes more).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* raw) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + kSwizzleAlign - 1) &
                                          ~uintptr_t{kSwizzleAlign - 1});
}

/// Descriptor of a 128-byte-swizzled tile of 128-byte rows starting at `p`
/// (the tile's first row, or 32 s bytes into it for k-step s of a K-major operand).
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  const uint64_t addr = smem_u32(p);
  return ((addr & 0x3FFFF) >> 4)        // start address, 16-byte units
         | (uint64_t{1} << 16)          // leading byte offset: unused for one 128-byte atom of K or N
         | (uint64_t{1024 >> 4} << 32)  // stride byte offset: 8 rows of 128 bytes
         | (uint64_t{1} << 62);         // 128-byte swizzle
}

/// The descriptor of the operand `bytes` further on: the start address sits
/// in the low 14 bits in 16-byte units, and shared-memory addresses stay
/// below 2^18, so the sum never carries into the next field (one add instead
/// of building each k-step's descriptor from its pointer).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, int bytes) {
  return desc + static_cast<uint64_t>(bytes >> 4);
}

/// Orders this thread's register writes before the wgmmas that read them
/// (accumulators, A fragments).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Waits until at most N committed wgmma groups are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Makes this thread's shared-memory writes (st.shared, cp.async) visible to
/// the async proxy that wgmma reads through; a barrier must follow.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// Pins registers at this point of the program: the compiler may not move
/// their reads or writes across it. A wgmma's result registers are pinned
/// after its wait (else the compiler may read them before it, seeing no
/// dependence on the wait), and its operand registers before the fence that
/// precedes it.
template <int N>
__device__ __forceinline__ void pin_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <class T, int N, int M>
__device__ __forceinline__ void pin_regs(T (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i) pin_regs(r[i]);
}

/// d (64 x 64: this thread's 32 accumulators) += A B: A 64 x 16 and B 16 x 64 from
/// shared memory, both K-major (descriptors); d is overwritten instead when !accumulate.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate))
      : "memory");
}

/// d (64 x 128: this thread's 64 accumulators) += A B: A 64 x 16 and B 16 x 128 from
/// shared memory, both K-major (descriptors); d is overwritten instead when !accumulate.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate))
      : "memory");
}

/// d (64 x 64) += A B: A 64 x 16 from registers (each warp's 16 rows in the
/// mma.m16n8k16 A layout), B 16 x 64 from shared memory, N-major (transposed).
__device__ __forceinline__ void wgmma_m64n64k16_rs_nmajor_b(float (&d)[32], const uint32_t (&a)[4],
                                                            uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31}, {%32, %33, %34, %35}, "
      "%36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)
      : "memory");
}

/// acc (64 x N) = A B^T over a depth of 64: A's 64 rows and B's N rows are
/// 128-byte-swizzled tiles of rows of 64 bf16 in shared memory (K-major), 4
/// k-steps of 16. acc is overwritten. (S = Q K^T, dP = dO V^T, and their
/// transposes in the dK/dV pass.)
template <int N>
__device__ __forceinline__ void wgmma_abt_d64(float (&acc)[N / 2], const bf16_t* a, const bf16_t* b) {
  const uint64_t da0 = sw128_desc(a), db0 = sw128_desc(b);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint64_t da = desc_advance(da0, 32 * ks), db = desc_advance(db0, 32 * ks);
    if constexpr (N == 64) {
      wgmma_m64n64k16_ss(acc, da, db, ks > 0);
    } else {
      static_assert(N == 128, "N of 64 or 128");
      wgmma_m64n128k16_ss(acc, da, db, ks > 0);
    }
  }
}

/// acc (64 x 64) += A B over a depth of K: A (64 x K) from registers, the
/// k-step kk's fragment in a[kk] (an accumulator converted by acc_to_a), B
/// the K rows of a 128-byte-swizzled tile of rows of 64 bf16 (N-major).
/// (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.)
template <int K>
__device__ __forceinline__ void wgmma_ab_regs(float (&acc)[32], const uint32_t (&a)[K / 16][4],
                                              const bf16_t* b) {
  const uint64_t db0 = sw128_desc(b);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wgmma_m64n64k16_rs_nmajor_b(acc, a[kk], desc_advance(db0, 2048 * kk));
}

/// The A fragments of a product over the N columns of an accumulator (P,
/// P^T, dS, dS^T), converted to bf16 in the register-A layout.
template <int N>
__device__ __forceinline__ void acc_to_frags(uint32_t (&f)[N / 16][4], const float (&acc)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    Bf16Ops::A a;
    Bf16Ops::acc_to_a(a, acc[2 * kk], acc[2 * kk + 1]);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[kk][i] = a.r[i];
  }
}

/// An accumulator tile as [N / 8][4] (the mma.sync fragments per 8-column
/// tile, as flash_common.cuh takes it) seen as wgmma's flat N / 2 registers.
template <int N>
__device__ __forceinline__ float (&flat(float (&acc)[N / 8][4]))[N / 2] {
  return reinterpret_cast<float(&)[N / 2]>(acc);
}

}  // namespace bt::kernels::cuda::detail
