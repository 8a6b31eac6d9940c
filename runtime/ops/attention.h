// Causal scaled-dot-product self-attention, differentiable, memory-efficient
// (the [T, T] probabilities are never stored; see kernels/attention.h).
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// q, k, v: [B, H, T, D] (any strides with unit stride on D, e.g. slices of a
/// fused projection). Returns contiguous [B, H, T, D]. scale defaults to 1/sqrt(D).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0);

}  // namespace bt
