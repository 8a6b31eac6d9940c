// What the two tiled causal-attention implementations share (the tensor-core
// bf16 one, attention_mma.cu, and the strict-fp32 one, attention_f32.cu): the
// kernel parameter blocks, filling them from AttnForward/AttnBackward, and the
// launch. (Which calls they take: kernels/common/attention_path.cpp.)
// Included by those two .cu files only.
#pragma once

#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace bt::kernels::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <class E>
struct AttnFwdParams {
  const E* q;
  const E* k;
  const E* v;
  E* o;
  float* lse;
  AttnStrides sq, sk, sv, so;
  int64_t B, H, T, tiles;  // tiles: set by the launcher (its block size)
  int64_t G;               // query heads per key/value head: h reads K/V head h / G
  float scale_log2;
};

template <class E>
struct AttnBwdParams {
  const E* q;
  const E* k;
  const E* v;
  const E* o;
  const E* dout;
  const float* lse;
  float* di;  // written by the dQ pass, read by the dK/dV pass
  E* dq;
  E* dk;
  E* dv;
  AttnStrides sq, sk, sv, so, sdo, sdq, sdk, sdv;
  int64_t B, H, T, tiles;
  int64_t Hkv, G;  // key/value heads; query heads per key/value head
  float scale, scale_log2;
};

template <class E>
inline AttnFwdParams<E> fwd_params(const AttnForward& a) {
  AttnFwdParams<E> p{};
  p.q = static_cast<const E*>(a.q);
  p.k = static_cast<const E*>(a.k);
  p.v = static_cast<const E*>(a.v);
  p.o = static_cast<E*>(a.o);
  p.lse = a.lse;
  p.sq = a.sq, p.sk = a.sk, p.sv = a.sv, p.so = a.so;
  p.B = a.shape.B, p.H = a.shape.H, p.T = a.shape.T;
  p.G = a.shape.group();
  p.scale_log2 = a.scale * kLog2e;
  return p;
}

template <class E>
inline AttnBwdParams<E> bwd_params(const AttnBackward& a, float* di) {
  AttnBwdParams<E> p{};
  p.q = static_cast<const E*>(a.q);
  p.k = static_cast<const E*>(a.k);
  p.v = static_cast<const E*>(a.v);
  p.o = static_cast<const E*>(a.o);
  p.dout = static_cast<const E*>(a.dout);
  p.lse = a.lse;
  p.di = di;
  p.dq = static_cast<E*>(a.dq);
  p.dk = static_cast<E*>(a.dk);
  p.dv = static_cast<E*>(a.dv);
  p.sq = a.sq, p.sk = a.sk, p.sv = a.sv, p.so = a.so, p.sdo = a.sdo, p.sdq = a.sdq, p.sdk = a.sdk,
  p.sdv = a.sdv;
  p.B = a.shape.B, p.H = a.shape.H, p.T = a.shape.T;
  p.Hkv = a.shape.kv_heads(), p.G = a.shape.group();
  p.scale = a.scale;
  p.scale_log2 = a.scale * kLog2e;
  return p;
}

/// One block per (b, head, tile) of `heads` heads (H query heads, or Hkv
/// key/value heads for the dK/dV pass).
inline unsigned blocks_for(const AttnShape& s, int64_t heads, int64_t tiles, const char* what) {
  const int64_t blocks = s.B * heads * tiles;
  BT_CHECK(blocks > 0 && blocks < INT_MAX, "cuda ", what, ": too many blocks (B*H = ", s.B * heads,
           ", tiles ", tiles, ")");
  return static_cast<unsigned>(blocks);
}

/// Launches `kernel(args...)`, opting in to more than 48 KiB of dynamic shared memory when asked.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, unsigned blocks, int threads, size_t smem, cudaStream_t stream,
            const Args&... args) {
  allow_smem(kernel, smem);
  kernel<<<blocks, threads, smem, stream>>>(args...);
  BT_KERNEL_CHECK();
}

}  // namespace bt::kernels::cuda::detail
