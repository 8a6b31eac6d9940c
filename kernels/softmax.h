// Row-wise softmax and log-softmax over the last dimension of a contiguous
// [rows, cols] buffer. Dtypes: F32, F64 (CPU only), BF16.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log);
/// softmax:     dx = y * (dy - sum(dy * y))
/// log_softmax: dx = dy - exp(y) * sum(dy)
void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                      bool log);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log,
                     cudaStream_t stream);
void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log,
                      cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
