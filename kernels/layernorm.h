// Fused LayerNorm over the last dimension of a contiguous [rows, cols] buffer.
// x, y, w, b, dx, dw, db share `dt` (F32, F64 on CPU, BF16); mean and rstd are
// always float ([rows]); accumulation is in float (double for F64).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps);
/// Writes (does not accumulate) dx, dw and db. w/dw/b/db may be null (no affine).
void layernorm_backward(DType dt, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t stream);
/// Floats of scratch that layernorm_backward needs (for the dw/db partial sums).
size_t layernorm_backward_scratch_floats(int64_t rows, int64_t cols);
void layernorm_backward(DType dt, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                        float* scratch, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
