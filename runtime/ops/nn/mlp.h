// The transformer MLP, two linear layers around a GELU, as one
// differentiable op whose backward fuses the GELU's gradient: into a GEMM
// epilogue in f32, into one pass after a plain GEMM in bf16 (Note [Fused MLP
// backward] in runtime/ops/nn/mlp.cpp).
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// y = gelu(x @ fc_w^T + fc_b) @ out_w^T + out_b with x [..., in], fc_w
/// [hidden, in], fc_b [hidden], out_w [out, hidden], out_b [out] (the biases
/// optional): linear(linear(x, fc_w, fc_b, Activation::Gelu), out_w, out_b),
/// with the same values, the same recompute behaviour and the same gradient
/// dtypes (f32 weight and bias gradients for bf16 operands).
Tensor mlp(const Tensor& x, const Tensor& fc_w, const Tensor& fc_b, const Tensor& out_w, const Tensor& out_b);

}  // namespace bt
