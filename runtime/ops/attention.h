// Causal scaled-dot-product self-attention, differentiable, memory-efficient
// (the [T, T] probabilities are never stored; see kernels/attention.h).
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// q, k, v: [B, H, T, D] (any strides with unit stride on D, e.g. slices of a
/// fused projection). Returns contiguous [B, H, T, D]. scale defaults to 1/sqrt(D).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0);

/// GPT-style self-attention on a fused projection: qkv [B, T, 3C] holds q, k
/// and v side by side, each with n_head heads of C / n_head; returns [B, T, C]
/// with the heads merged. The kernels read the heads in place and write the
/// output and the qkv gradient directly in these layouts (no split, permute or
/// merge copies). Same result as causal_attention on the sliced heads.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, double scale = 0.0);

}  // namespace bt
