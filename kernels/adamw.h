// Fused AdamW step over a flat buffer: fp32 master params p and fp32 moments
// m, v; the gradient is F32 or BF16. Optionally also writes a low-precision
// copy of the updated params (the bf16 compute weights).
//
//   g  = grad * grad_scale
//   m  = beta1 m + (1 - beta1) g
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / bias1 / (sqrt(v / bias2) + eps) + weight_decay * p)
//
// bias1 = 1 - beta1^step and bias2 = 1 - beta2^step are passed in, so one
// launch can serve buffers that share a step count. lr, bias1, bias2 and
// grad_scale are either values here or, when `hyper` / `scale` are set, read
// by the kernel from memory on the kernel's device (host memory for the CPU
// kernel): a captured CUDA graph replays with the values of each step (Note
// [Step scalars] in runtime/optim/adamw.h). A grad_scale that is not finite
// (NaN or infinite) means the step's gradients are unusable: the kernel then
// writes nothing -- p, m, v and the copy keep their bits (Note [Non-finite
// steps] in runtime/train/trainer.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

struct AdamWArgs {
  float* param = nullptr;
  const void* grad = nullptr;
  DType grad_dt = DType::F32;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float bias1 = 1, bias2 = 1, grad_scale = 1;
  const float* hyper = nullptr;  // optional: {lr, bias1, bias2}, replacing the fields above
  const float* scale = nullptr;  // optional: grad_scale
  void* param_copy = nullptr;    // optional
  DType copy_dt = DType::BF16;
};

namespace cpu {
void adamw(const AdamWArgs& a);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void adamw(const AdamWArgs& a, cudaStream_t stream);
/// adamw() on every buffer of `list`, in a few launches (Note [One AdamW
/// launch] in kernels/cuda/adamw.cu): the same bits. A buffer's copy, when
/// it has one, is bf16 or f32.
void adamw_many(std::span<const AdamWArgs> list, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
