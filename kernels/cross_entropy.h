// Softmax cross-entropy fused with the logits: the forward computes each row's
// log-sum-exp and loss in one pass, the backward writes
//   dlogits = (softmax(logits) - onehot(target)) * dloss[row]
// straight from the logits, so probabilities are never materialized.
// dlogits may be the logits buffer itself (the gradient overwrites them).
//
// logits: [rows, ld] (dt = F32, F64 on CPU, BF16); only the first `vocab`
// columns take part (the rest is vocabulary padding, gradient 0).
// targets: int32 [rows]; target -1 is ignored (loss 0, gradient 0).
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

struct CrossEntropyArgs {
  DType dt = DType::F32;
  const void* logits = nullptr;
  int64_t rows = 0, vocab = 0, ld = 0;
  const int32_t* targets = nullptr;
};

namespace cpu {
/// loss[r] = lse[r] - logits[r, target[r]]; throws bt::Error on a target out of [0, vocab).
void cross_entropy_forward(const CrossEntropyArgs& a, float* loss, float* lse);
void cross_entropy_backward(const CrossEntropyArgs& a, const float* lse, const float* dloss, void* dlogits);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
/// Out-of-range targets produce NaN loss for that row (checked by the runtime).
void cross_entropy_forward(const CrossEntropyArgs& a, float* loss, float* lse, cudaStream_t stream);
void cross_entropy_backward(const CrossEntropyArgs& a, const float* lse, const float* dloss, void* dlogits,
                            cudaStream_t stream);
/// The forward, and in the same pass the backward for dloss[row] = dl (every
/// row): the bits of cross_entropy_forward then cross_entropy_backward, one
/// read of the logits fewer. dlogits may be the logits.
void cross_entropy_forward_backward(const CrossEntropyArgs& a, float* loss, float* lse, float dl,
                                    void* dlogits, cudaStream_t stream);
/// dlogits[0, n) *= g[0] / hint unless g[0] == hint, g read on the device.
void cross_entropy_rescale(DType dt, void* dlogits, int64_t n, const float* g, float hint,
                           cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
