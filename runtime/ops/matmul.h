// Matrix products through the linear-algebra layer (kernels/gemm.h):
// OpenBLAS on CPU, cuBLASLt on CUDA. Differentiable.
#pragma once

#include <vector>

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

/// x [..., in] through several weights w_i [n_i, in] (no bias) at once: one
/// GEMM against their row concatenation, whose result [..., sum n_i] the
/// outputs [..., n_i] view side by side (Note [One GEMM for several weights]).
/// Gives linear(x, w_i) for each i, up to the GEMM's summation order.
std::vector<Tensor> linear_split(const Tensor& x, const std::vector<Tensor>& ws);

}  // namespace bt
