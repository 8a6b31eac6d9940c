// Tensor-core building blocks (sm_80+ PTX, run as-is on sm_90): asynchronous
// global -> shared copies (cp.async), ldmatrix, the bf16 mma.sync m16n8k16
// and the tf32 mma.sync m16n8k8, both with fp32 accumulation. Not a public
// header: include it only from kernels/cuda/*.cu.
//
// Fragment layouts of mma.m16n8k16 (lane = 4 * g + t, g = lane / 4, t = lane % 4;
// each .b32 register holds two bf16, the lower column / k index in the low half):
//   A (16 x 16, row-major):  a0 = (row g,     k 2t..2t+1)   a1 = (row g + 8, k 2t..2t+1)
//                            a2 = (row g,     k 2t+8..+9)   a3 = (row g + 8, k 2t+8..+9)
//   B (16 x 8, "col"):       b0 = (k 2t..2t+1, col g)      b1 = (k 2t+8..+9, col g)
//   C (16 x 8, fp32):        c0, c1 = (row g, cols 2t, 2t+1)  c2, c3 = (row g + 8, cols 2t, 2t+1)
// mma.m16n8k8 with TF32 operands (one fp32 register per element): the same C,
//   A (16 x 8):  a0 = (row g, k t)  a1 = (row g + 8, k t)  a2 = (row g, k t + 4)  a3 = (row g + 8, k t + 4)
//   B (8 x 8):   b0 = (k t, col g)  b1 = (k t + 4, col g)
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, and
// register i of every lane receives matrix i as lane (g, t) -> row g, cols 2t, 2t+1
// (with .trans: rows 2t, 2t+1 of column g). So a row-major [m][k] tile gives A
// fragments, a row-major [n][k] tile (n-major) gives B fragments directly, and a
// row-major [k][n] tile gives B fragments through .trans.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace bt::kernels::cuda::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte asynchronous copy global -> shared. When !valid nothing is read and
/// the 16 destination bytes are zero-filled (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
/// 16-byte asynchronous copy global -> shared of its first `bytes` (0 to 16,
/// a multiple of 4); the rest of the 16 destination bytes is zero-filled. src
/// must be a valid 16-byte aligned address even when bytes == 0.
__device__ __forceinline__ void cp_async_bytes(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
/// 4-byte asynchronous copy global -> shared, zero-filled when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// d += a * b for one m16n8k16 tile (bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// d += a * b for one m16n8k8 tile (TF32 operands, fp32 accumulators).
__device__ __forceinline__ void mma_tf32_1688(float (&d)[4], const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// x rounded to TF32, to nearest with ties away from zero (cvt.rna: the
/// rounding of round_to_tf32 in kernels/common/tf32.h), as the bits of an fp32.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

/// Two floats rounded to bf16 (nearest even) in one register, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace bt::kernels::cuda::detail
