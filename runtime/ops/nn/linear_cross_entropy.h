// The LM head and its loss as one op: cross_entropy(linear(x, w)) in row
// chunks, so the logits never exist whole (Note [The LM head in row chunks]).
// Differentiable.
#pragma once

#include <cstdint>

#include "kernels/common/gemm_math.h"
#include "runtime/tensor/tensor.h"

namespace bt {

/// cross_entropy(linear(x, w), targets, vocab, grad_hint) for x [N, C], w
/// [Vp, C] and N i32 targets (-1 = ignore), the same checks and messages as
/// cross_entropy's; the logits are made `chunk_rows` rows at a time (0: the
/// default of lm_head_chunk_rows). When the loss will be backpropagated with
/// `grad_hint` (!= 0: the Trainer's 1 / grad_accum), the forward also makes
/// the gradients of x and w, chunk by chunk, and the backward only rescales
/// them if the incoming gradient differs from the hint. Otherwise (no
/// gradient needed, or no hint) only the loss is made in chunks, and a
/// gradient, if one is needed, goes through linear and cross_entropy.
/// With bf16 operands w's gradient comes back in f32, as linear's does.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, int64_t vocab = -1,
                            float grad_hint = 0.0f, int64_t chunk_rows = 0);

/// Rows per chunk for `vp` logits columns of `dt` when the GEMMs multiply as
/// `math`: as many as fit the budget of logits (2 GiB; 512 MiB under 3xTF32:
/// Note [Chunk budgets]; BT_HEAD_CHUNK_MIB, read once, replaces both), a
/// multiple of 64, at least 64. BT_HEAD_CHUNK_MIB=0 asks for no chunks: 0 is
/// returned, and a model then computes its logits whole (to measure what
/// chunks cost).
int64_t lm_head_chunk_rows(int64_t vp, DType dt, kernels::GemmMath math);

}  // namespace bt
