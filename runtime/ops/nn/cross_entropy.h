// Softmax cross-entropy fused with the logits (kernels/cross_entropy.h),
// differentiable.
#pragma once

#include <cstdint>
#include <utility>

#include "runtime/tensor/tensor.h"

namespace bt {

/// Mean over rows of -log softmax(logits)[target]. logits: [N, Vp] (or
/// [..., Vp], flattened); targets: i32 with N elements, -1 = ignore.
/// `vocab` (default Vp) limits the softmax to the first `vocab` columns, so a
/// vocabulary padded to Vp columns trains as if it had `vocab`. Targets
/// outside [0, vocab) are an error that names the first bad position. The
/// targets may be on the host while the logits are on a GPU: they are checked
/// there without waiting for the device (Note [Targets on the host]).
///
/// With `grad_hint` != 0, logits that require grad and that the caller moved
/// in (no other handle on their storage) are consumed: the forward also
/// writes the loss's gradient for an incoming gradient of `grad_hint` over
/// them, in the same pass (Note [Gradient in the forward pass]).
Tensor cross_entropy(Tensor logits, const Tensor& targets, int64_t vocab = -1, float grad_hint = 0.0f);

namespace detail {
/// `op`'s targets checked on the host (each -1 or in [0, vocab); the first
/// bad one named): flattened, on `device` (copied asynchronously), and how
/// many are not -1. Note [Targets on the host].
std::pair<Tensor, int64_t> checked_targets(const char* op, const Tensor& targets, int64_t vocab,
                                           const Device& device);
}  // namespace detail

}  // namespace bt
