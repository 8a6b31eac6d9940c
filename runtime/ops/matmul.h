// Matrix products through the linear-algebra layer (kernels/gemm.h):
// OpenBLAS on CPU, cuBLASLt on CUDA. Differentiable.
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// a [..., M, K] @ b [K, N] or [..., K, N] (same batch dims) -> [..., M, N].
/// Transposed views are passed to the GEMM as transposes, without copies.
Tensor matmul(const Tensor& a, const Tensor& b);

enum class Activation { None, Gelu };

/// y = act(x @ w^T + bias) with x [..., in], w [out, in], bias [out] (optional).
/// The bias and GELU run as GEMM epilogues (cuBLASLt) on CUDA. With bf16
/// operands the gradients of w and bias come back in f32, that of x in bf16
/// (Note [Gradients in a wider dtype], runtime/autograd/engine.cpp).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(),
              Activation act = Activation::None);

}  // namespace bt
