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
/// cuda::gelu_backward_fused's contract on the CPU (F32 or BF16), as the
/// three kernels whose bits it gives: gelu_backward in place, gelu_forward,
/// reduce_dim's column sums into F32.
void gelu_backward_fused(DType dt, const void* pre, void* g, void* h, float* bias_grad, int64_t rows,
                         int64_t cols);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void gelu_forward(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream);
void gelu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n, cudaStream_t stream);
/// An MLP's GELU backward over row-major [rows, cols], F32 or BF16, in one
/// pass (Note [The MLP's GELU backward in one pass], kernels/cuda/gelu.cu):
/// g (dL/dh on entry) becomes dpre = g * gelu'(pre), with gelu_backward's
/// bits; h, if non-null, receives gelu(pre), gelu_forward's bits; bias_grad,
/// if non-null, receives dpre's column sums in F32, the bits of reduce_dim
/// (Sum into F32, with scratch) over dpre. scratch holds
/// gelu_backward_fused_scratch_floats(rows, cols) floats when bias_grad is set.
void gelu_backward_fused(DType dt, const void* pre, void* g, void* h, float* bias_grad, int64_t rows,
                         int64_t cols, float* scratch, cudaStream_t stream);
size_t gelu_backward_fused_scratch_floats(int64_t rows, int64_t cols);
}  // namespace cuda
#endif
}  // namespace bt::kernels
