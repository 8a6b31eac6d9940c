// Fused LayerNorm over the last dimension, differentiable, and the residual
// add fused with it (Note [Residual into LayerNorm] in kernels/layernorm.h).
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim of x.
/// weight and bias ([C]) are optional; they have x's dtype, or f32 when x is
/// bf16 (f32 masters used as they are). Under bf16 x their gradients come in
/// f32 (Note [Gradients in a wider dtype]).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

/// The residual stream after an add, and its LayerNorm.
struct ResidualNorm {
  Tensor sum;  // x + y, in x's dtype and shape
  Tensor out;  // layer_norm(sum, weight, bias, eps), bit for bit
};

/// sum = x + y (+ y_bias) and out = layer_norm(sum, ...) in one pass (Note
/// [Residual into LayerNorm]). y has x's shape, or the shape of x's trailing
/// dims (it repeats over the leading ones: positions [T, C] under tokens [B,
/// T, C]). y_bias, optional, is a [C] bias of the sublayer that made y, in
/// the parameters' dtype (Note [A bias into the residual add] in
/// kernels/layernorm.h): its gradient comes from the LayerNorm's backward pass.
/// Under selective recompute out is rebuilt from sum in backward.
ResidualNorm add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                            double eps = 1e-5, const Tensor& y_bias = Tensor());

}  // namespace bt
