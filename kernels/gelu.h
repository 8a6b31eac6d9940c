// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Dtypes: F32, F64 on CPU; F32, BF16 on both (BF16 computes in float).
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
void gelu_forward(DType dt, const void* x, void* y, int64_t n);
/// dx = dy * gelu'(x)
void gelu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void gelu_forward(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream);
void gelu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
