// The GEMM calls the linear-algebra ops share (matmul.cpp, mlp.cpp): raw
// products through kernels/gemm.h on the precision policy's GemmMath, never
// recorded by autograd.
#pragma once

#include <optional>
#include <utility>

#include "kernels/gemm.h"
#include "runtime/ops/matmul.h"
#include "runtime/tensor/tensor.h"

namespace bt::detail {

/// Runs `g` on `d` (nothing when m or n is 0), its math set by precision().
void run_gemm(kernels::GemmArgs& g, const Device& d);

/// matmul()'s product. `out`: C's dtype when not a's (f32 for bf16 operands,
/// kernels/gemm.h c_dtype). `bias_grad` (2-D a and b only): receives the sums
/// of a's rows, from the same GEMM (Note [Fused bias gradient] in kernels/gemm.h).
Tensor matmul_raw(const Tensor& a, const Tensor& b, std::optional<DType> out = std::nullopt,
                  Tensor* bias_grad = nullptr);

/// dW = dY^T X and, with `bias`, db = the column sums of dY, both in `dt`,
/// from one GEMM when dY is a plain [rows, out] matrix (Note [Fused bias
/// gradient]); dY [rows, out], X [rows, in].
std::pair<Tensor, Tensor> weight_and_bias_grad(const Tensor& gy, const Tensor& x, DType dt, bool bias);

/// y = act(x @ w^T + bias) for contiguous x [rows, in], w [out, in] and bias
/// [out] (or undefined), the bias and GELU as GEMM epilogues; with Gelu and
/// `pre`, *pre receives the pre-activation.
Tensor linear_raw(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                  Tensor* pre = nullptr);

}  // namespace bt::detail
