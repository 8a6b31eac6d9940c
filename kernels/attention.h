// Causal scaled-dot-product self-attention, forward and backward, in the
// memory-efficient form: the [T, T] probability matrix is never stored. The
// forward saves the row log-sum-exp (lse) and the backward recomputes P.
//
//   S = scale * Q K^T (masked: key j > query i is -inf),  P = softmax(S),  O = P V
//
// Q, K, V, O and their gradients are [B, H, T, D] views given by element
// strides for b, h and t (the d stride is 1), so q/k/v can be slices of a
// fused [B, T, 3, H, D] projection without a copy. lse is contiguous [B, H, T]
// float. Dtypes: F32, F64 on CPU, BF16 (float accumulation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

struct AttnShape {
  int64_t B = 0, H = 0, T = 0, D = 0;
};
struct AttnStrides {
  int64_t b = 0, h = 0, t = 0;
};
/// Strides of a contiguous [B, H, T, D] buffer.
inline AttnStrides contiguous_bhtd(const AttnShape& s) { return {s.H * s.T * s.D, s.T * s.D, s.D}; }

struct AttnForward {
  DType dt = DType::F32;
  AttnShape shape;
  float scale = 1.0f;
  const void* q = nullptr;
  AttnStrides sq;
  const void* k = nullptr;
  AttnStrides sk;
  const void* v = nullptr;
  AttnStrides sv;
  void* o = nullptr;
  AttnStrides so;
  float* lse = nullptr;  // [B, H, T]
};

struct AttnBackward {
  DType dt = DType::F32;
  AttnShape shape;
  float scale = 1.0f;
  const void* q = nullptr;
  AttnStrides sq;
  const void* k = nullptr;
  AttnStrides sk;
  const void* v = nullptr;
  AttnStrides sv;
  const void* o = nullptr;
  AttnStrides so;
  const void* dout = nullptr;
  AttnStrides sdo;
  const float* lse = nullptr;
  void* dq = nullptr;
  AttnStrides sdq;  // written, not accumulated
  void* dk = nullptr;
  AttnStrides sdk;
  void* dv = nullptr;
  AttnStrides sdv;
};

/// The CUDA implementations of attention (kernels/cuda/attention.cu dispatches):
enum class AttnPath {
  TensorCore,  // BF16 on the tensor cores, mma.sync (kernels/cuda/attention_mma.cu)
  F32Tiled,    // F32, register-tiled strict fp32 (kernels/cuda/attention_f32.cu)
  Simt,        // the one-row-per-lane SIMT kernels: every call the other two do not take
};
/// "tensor-core", "f32-tiled" or "simt".
const char* name_of(AttnPath p);
inline std::ostream& operator<<(std::ostream& os, AttnPath p) { return os << name_of(p); }

namespace cuda {
/// The implementation cuda::attention_forward / attention_backward runs for `a`
/// (they switch on these). Host code on the call's description only -- dtype,
/// D, scale, pointers and strides -- compiled in every build, CUDA or not
/// (kernels/common/attention_path.cpp), so the choice is tested without a GPU.
AttnPath attention_forward_path(const AttnForward& a);
AttnPath attention_backward_path(const AttnBackward& a);
}  // namespace cuda

namespace cpu {
void attention_forward(const AttnForward& a);
void attention_backward(const AttnBackward& a);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void attention_forward(const AttnForward& a, cudaStream_t stream);
/// Floats of scratch that attention_backward needs.
size_t attention_backward_scratch_floats(const AttnShape& s);
void attention_backward(const AttnBackward& a, float* scratch, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
