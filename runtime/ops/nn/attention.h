// Causal scaled-dot-product self-attention, differentiable, memory-efficient
// (the [T, T] probabilities are never stored; see kernels/attention.h).
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// q: [B, H, T, D]; k, v: [B, Hkv, T, D] with Hkv dividing H (Hkv = H is
/// multi-head attention; fewer is grouped-query attention, Note [Grouped-query
/// attention] in kernels/attention.h). Any strides with unit stride on D, e.g.
/// slices of a fused projection. Returns contiguous [B, H, T, D]. scale
/// defaults to 1/sqrt(D).
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0);

/// Grouped-query attention in the layout a Llama-style block produces:
/// q [B, T, H, D], k and v [B, T, Hkv, D] with Hkv dividing H (e.g. RoPE's
/// outputs for q and k, and a slice of the fused projection, viewed
/// [B, T, Hkv, D], for v: any strides with unit stride on D). Returns
/// contiguous [B, T, H, D], so .view({B, T, H * D}) is the input of the output
/// projection; the gradients come back in the inputs' [B, T, heads, D] layout,
/// dk and dv summed over each K/V head's query heads. The kernels index the
/// shared K/V heads in place: no K/V copies, no permute copies.
Tensor grouped_query_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0);

/// GPT-style self-attention on a fused projection: qkv [B, T, 3C] holds q, k
/// and v side by side, each with n_head heads of C / n_head; returns [B, T, C]
/// with the heads merged. The kernels read the heads in place and write the
/// output and the qkv gradient directly in these layouts (no split, permute or
/// merge copies). Same result as causal_attention on the sliced heads.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, double scale = 0.0);

}  // namespace bt
