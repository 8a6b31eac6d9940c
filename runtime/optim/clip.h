// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ does it.
#pragma once

#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

/// The sum of the squares of all gradients of `params` together (parameters
/// without a gradient count as zero): F32 [1] on `device`, summed there by
/// sum_squares (runtime/ops/reduce.h). No host sync.
Tensor grad_sum_squares(const std::vector<Tensor>& params, const Device& device);

/// The L2 norm of all gradients of `params` together: grad_sum_squares and
/// one host sync.
double global_grad_norm(const std::vector<Tensor>& params);

/// {norm, clip factor} as F32 [2] on the device of `sumsq` (a global sum of
/// squares, F32 or F64 [1]): clip_coefficient's formula, in the same doubles,
/// computed on the device so an optimizer step reads no value back (Note [Step
/// scalars] in runtime/optim/adamw.h). The factor is NaN, so AdamW skips the
/// update, when the norm is not finite or `loss` (optional: F64 [1] on the
/// same device) is not (Note [Non-finite steps] in runtime/train/trainer.cpp).
Tensor clip_scale(const Tensor& sumsq, double max_norm, const Tensor& loss = Tensor());

/// The factor that scales gradients of norm `norm` down to `max_norm`:
/// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace bt
