// The Llama family's glue, written from primitive ops (runtime/ops/
// elementwise.h, reduce.h) so that train.compile fuses it (docs/compiler.md):
// no hand-written kernel exists for any of these.
//
// Note [RoPE without a concatenation]
// Rotary embeddings in the rotate-half convention (Hugging Face's Llama):
// with x = [x0 | x1] split in halves of D / 2 and per position t and pair i
// the angle t * theta^(-2i / D),
//   out0 = x0 cos - x1 sin,   out1 = x1 cos + x0 sin.
// Written so, it needs a concatenation, which no fusion group has. Instead x
// is viewed [B, T, H, 2, D/2] (a view: D is contiguous) and
//   out = x * cos + x0 * sin_a + x1 * sin_b
// with x0, x1 its halves as [B, T, H, 1, D/2] views (broadcast over the
// pair dim), cos [T, 1, 1, D/2], sin_a = (0, sin) and sin_b = (-sin, 0) as
// [T, 1, 2, D/2]: five pointwise nodes over the output, one kernel. The
// rotation's gradient is the inverse rotation, the same formula with sin
// negated, so backward is one such kernel too; autograd through the views
// would instead have scattered each half's gradient into a zeroed buffer.
#pragma once

#include <cstdint>

#include "runtime/tensor/tensor.h"

namespace bt::nn {

/// x * rsqrt(mean(x^2 over the last dim) + eps) * w, the statistic in f32
/// (a bf16 x is widened, normalized, rounded back, then scaled by w, as
/// Hugging Face's LlamaRMSNorm does). w: [C] in x's dtype.
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);

/// silu(gate) * up, silu(g) = g / (1 + exp(-g)) computed in f32 (a bf16 gate
/// is widened and the result rounded back before the product).
///
/// Note [SwiGLU's backward]: written out, not derived op by op: with
/// s = sigmoid(g), d up = dy silu(g) and d gate = dy up s (1 + g (1 - s)),
/// from the saved gate and up alone (the GEMMs' outputs, kept anyway). The
/// derived backward saved the f32 denominator 1 + exp(-g) as well (twice
/// the bytes of a bf16 [B, T, F] activation) and read it back; this one is
/// one pointwise group over gate, up and dy under train.compile.
Tensor swiglu(const Tensor& gate, const Tensor& up);

/// The angle tables of RoPE for positions [0, positions) and head dim D
/// (even), f32 on `device` (Note [RoPE without a concatenation]).
struct RopeTables {
  Tensor cos, sin_a, sin_b;  // [T, 1, 1, D/2], [T, 1, 2, D/2], [T, 1, 2, D/2]
  Tensor inv_a, inv_b;       // -sin_a, -sin_b: the inverse rotation's (backward)

  static RopeTables make(int64_t positions, int64_t head_dim, double theta, const Device& device);
  /// Positions [first, first + n), in `dtype`.
  RopeTables slice(int64_t first, int64_t n, DType dtype) const;
};

/// x [B, T, H, D] (unit stride on D) rotated by `t` (positions of x's T,
/// x's dtype: RopeTables::slice). Returns contiguous [B, T, H, D]; differentiable in x.
Tensor rope(const Tensor& x, const RopeTables& t);

}  // namespace bt::nn
