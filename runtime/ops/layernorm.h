// Fused LayerNorm over the last dimension, differentiable.
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// y = (x - mean) / sqrt(var + eps) * weight + bias, over the last dim of x.
/// weight and bias ([C]) are optional.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace bt
