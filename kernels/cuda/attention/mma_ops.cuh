// The operand types of the tensor-core attention kernels
// (kernels/cuda/attention/attention_mma.cu): how a [rows][D] tile sits in
// shared memory, and how its fragments are loaded, converted and multiplied.
// The kernels are written once over an Ops type:
//   Bf16Ops         BF16 tiles, mma.m16n8k16 (ldmatrix loads);
//   Tf32Ops<false>  F32 tiles, one TF32 product per term (mma.m16n8k8);
//   Tf32Ops<true>   F32 tiles, 3xTF32 (Note [3xTF32] in kernels/gemm.h).
// Each Ops gives, on 16-byte "chunks" of kChunk elements:
//   swz<D>(r, c)             element offset of chunk c of row r in a swizzled tile
//   A                        a 16-row x 16-k A fragment; load_a<D> reads one
//                            from a row-major [m][k] tile, acc_to_a builds one
//                            from two 16 x 8 accumulator tiles (P, dS)
//   B                        16-k B fragments of two 8-column tiles n0, n0 + 8:
//                            load_b_nmajor<D> from an [n][k] tile, load_b_kmajor<D>
//                            from a [k][n] tile
//   AOp prep(A)              an A fragment in the form the tensor cores take
//                            (TF32 parts), made once and used for many B
//   mma(d, AOp, B, half)     d += A B for the 8-column tile `half` of B
//   store2(p, x, y)          two adjacent elements from fp32 (the epilogues)
//   dot_chunk(acc, x, y)     acc += sum x[i] y[i] over one chunk (Di)
//
// Note [TF32 fragments by permuted k]
// A k-sum does not depend on the order of its terms, so the F32 kernels give
// the k index of an m16n8k8 fragment whatever meaning makes the loads cheap,
// as long as A and B agree. In a product over D (S = Q K^T, dP = dO V^T), k
// index t of k-step s of 16-wide chunk c is element 16 c + 4 t + 2 s, k index
// t + 4 is 16 c + 4 t + 2 s + 1: lane (g, t) reads 4 consecutive floats of its
// row (one 16-byte load) for both k-steps, of A and of B alike. In a product
// over keys or queries (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q), the
// A operand comes from an accumulator tile, where lane (g, t) holds columns
// 2 t and 2 t + 1; so k index t is column 2 t and t + 4 is 2 t + 1, and A is
// the accumulator's registers reordered (no shuffles), while B takes rows
// 2 t and 2 t + 1 of the [k][n] tile (two 4-byte loads per k-step).
//
// Swizzle of the F32 tiles: chunk c of row r sits at chunk c ^ f(r),
// f(r) = 2 ((r >> 1) & 3) ^ 4 (r & 1). The 16-byte loads above (8 lanes over
// rows r, r + 1 and 4 chunks) see f(r) and f(r + 1) differ in bit 2: 8 bank
// groups. The 4-byte [k][n] loads (rows 2 t or 2 t + 1, columns n0 + g: two
// chunks of each of 4 rows) see four values of f that differ in bits 1-2:
// 32 banks. So every fragment load is conflict-free. (D >= 32: 8 chunks a row.)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda::detail {

struct Bf16Ops {
  using E = bf16_t;
  static constexpr int kChunk = 8;
  struct A {
    uint32_t r[4];
  };
  struct B {
    uint32_t r[4];  // r[0], r[1]: columns n0..n0+7; r[2], r[3]: n0+8..n0+15
  };
  using AOp = A;

  /// The 16-byte chunk c of row r is stored at chunk c ^ (r & 7) (D >= 64) or
  /// c ^ ((r >> 1) & 3) (D = 32): the 8 row addresses of every ldmatrix hit 8
  /// different bank groups.
  template <int D>
  __device__ static __forceinline__ int swz(int r, int c) {
    if constexpr (D >= 64) {
      return r * D + ((c ^ (r & 7)) << 3);
    } else {
      static_assert(D == 32, "swizzle for D = 32, 64, 128");
      return r * D + ((c ^ ((r >> 1) & 3)) << 3);
    }
  }
  /// Rows r0..r0+15, k-step ks (16 wide), of a row-major [m][k] tile.
  template <int D>
  __device__ static __forceinline__ void load_a(A& a, const E* tile, int r0, int ks, int lane) {
    const int r = r0 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int c = ks * 2 + ((lane >> 4) & 1);
    ldmatrix_x4(a.r, smem_u32(tile + swz<D>(r, c)));
  }
  /// n-tiles n0 and n0 + 8 at k-step ks from an n-major [n][k] tile.
  template <int D>
  __device__ static __forceinline__ void load_b_nmajor(B& b, const E* tile, int n0, int ks, int lane) {
    const int r = n0 + (lane & 7) + ((lane >> 4) & 1) * 8;
    const int c = ks * 2 + ((lane >> 3) & 1);
    ldmatrix_x4(b.r, smem_u32(tile + swz<D>(r, c)));
  }
  /// n-tiles n0 and n0 + 8 for k rows k0..k0+15 from a k-major [k][n] tile (.trans).
  template <int D>
  __device__ static __forceinline__ void load_b_kmajor(B& b, const E* tile, int k0, int n0, int lane) {
    const int r = k0 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int c = (n0 >> 3) + ((lane >> 4) & 1);
    ldmatrix_x4_trans(b.r, smem_u32(tile + swz<D>(r, c)));
  }
  /// Accumulator tiles 2k and 2k + 1 are exactly the A fragment of k-step k.
  __device__ static __forceinline__ void acc_to_a(A& a, const float (&c0)[4], const float (&c1)[4]) {
    a.r[0] = pack_bf16(c0[0], c0[1]);
    a.r[1] = pack_bf16(c0[2], c0[3]);
    a.r[2] = pack_bf16(c1[0], c1[1]);
    a.r[3] = pack_bf16(c1[2], c1[3]);
  }
  __device__ static __forceinline__ const AOp& prep(const A& a) { return a; }
  template <int HALF>
  __device__ static __forceinline__ void mma(float (&d)[4], const AOp& a, const B& b) {
    mma_bf16_16816(d, a.r, b.r[2 * HALF], b.r[2 * HALF + 1]);
  }
  __device__ static __forceinline__ void store2(E* p, float x, float y) {
    *reinterpret_cast<uint32_t*>(p) = pack_bf16(x, y);
  }
  __device__ static __forceinline__ float dot_chunk(float acc, const E* x, const E* y) {
    const uint4 xv = *reinterpret_cast<const uint4*>(x);
    const uint4 yv = *reinterpret_cast<const uint4*>(y);
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
    const __nv_bfloat162* y2 = reinterpret_cast<const __nv_bfloat162*>(&yv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xf = __bfloat1622float2(x2[i]), yf = __bfloat1622float2(y2[i]);
      acc = fmaf(xf.x, yf.x, acc);
      acc = fmaf(xf.y, yf.y, acc);
    }
    return acc;
  }
};

/// F32 operands on the TF32 tensor cores: one product (X3 false) or 3xTF32.
/// Fragments hold raw fp32 values in the order of Note [TF32 fragments by
/// permuted k]; prep() and mma() round them to TF32 (and split them, X3).
template <bool X3>
struct Tf32Ops {
  using E = float;
  static constexpr int kChunk = 4;
  struct A {
    float r[8];  // k-step 0: a0..a3 in r[0..3]; k-step 1: r[4..7]
  };
  struct B {
    float r[8];  // columns n0..: k-step 0 (b0, b1) in r[0..1], k-step 1 r[2..3]; columns n0 + 8..: r[4..7]
  };
  struct AOp {
    uint32_t big[8];
    uint32_t small[X3 ? 8 : 1];
  };

  template <int D>
  __device__ static __forceinline__ int swz(int r, int c) {
    static_assert(D == 32 || D == 64 || D == 128, "F32 tiles for D = 32, 64, 128");
    return r * D + ((c ^ ((((r >> 1) & 3) << 1) ^ ((r & 1) << 2))) << 2);
  }
  template <int D>
  __device__ static __forceinline__ void load_a(A& a, const E* tile, int r0, int ks, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float4 x = *reinterpret_cast<const float4*>(tile + swz<D>(r0 + g, 4 * ks + t));
    const float4 y = *reinterpret_cast<const float4*>(tile + swz<D>(r0 + g + 8, 4 * ks + t));
    a = A{{x.x, y.x, x.y, y.y, x.z, y.z, x.w, y.w}};
  }
  template <int D>
  __device__ static __forceinline__ void load_b_nmajor(B& b, const E* tile, int n0, int ks, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 x = *reinterpret_cast<const float4*>(tile + swz<D>(n0 + 8 * h + g, 4 * ks + t));
      b.r[4 * h] = x.x, b.r[4 * h + 1] = x.y, b.r[4 * h + 2] = x.z, b.r[4 * h + 3] = x.w;
    }
  }
  template <int D>
  __device__ static __forceinline__ void load_b_kmajor(B& b, const E* tile, int k0, int n0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + 8 * h + g, c = n >> 2, e = n & 3;
#pragma unroll
      for (int i = 0; i < 4; ++i) b.r[4 * h + i] = tile[swz<D>(k0 + 8 * (i >> 1) + 2 * t + (i & 1), c) + e];
    }
  }
  __device__ static __forceinline__ void acc_to_a(A& a, const float (&c0)[4], const float (&c1)[4]) {
    a = A{{c0[0], c0[2], c0[1], c0[3], c1[0], c1[2], c1[1], c1[3]}};
  }
  __device__ static __forceinline__ AOp prep(const A& a) {
    AOp o;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      o.big[i] = tf32_bits(a.r[i]);
      if constexpr (X3) o.small[i] = tf32_bits(a.r[i] - __uint_as_float(o.big[i]));
    }
    return o;
  }
  template <int HALF>
  __device__ static __forceinline__ void mma(float (&d)[4], const AOp& a, const B& b) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float x0 = b.r[4 * HALF + 2 * s], x1 = b.r[4 * HALF + 2 * s + 1];
      const uint32_t b0 = tf32_bits(x0), b1 = tf32_bits(x1);
      if constexpr (X3) {  // the small products first, while the sum is small
        mma_tf32_1688(d, a.small + 4 * s, b0, b1);
        mma_tf32_1688(d, a.big + 4 * s, tf32_bits(x0 - __uint_as_float(b0)),
                      tf32_bits(x1 - __uint_as_float(b1)));
      }
      mma_tf32_1688(d, a.big + 4 * s, b0, b1);
    }
  }
  __device__ static __forceinline__ void store2(E* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  }
  __device__ static __forceinline__ float dot_chunk(float acc, const E* x, const E* y) {
    const float4 xv = *reinterpret_cast<const float4*>(x);
    const float4 yv = *reinterpret_cast<const float4*>(y);
    acc = fmaf(xv.x, yv.x, acc);
    acc = fmaf(xv.y, yv.y, acc);
    acc = fmaf(xv.z, yv.z, acc);
    return fmaf(xv.w, yv.w, acc);
  }
};

}  // namespace bt::kernels::cuda::detail
