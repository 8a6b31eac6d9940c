// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ does it.
#pragma once

#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

/// The L2 norm of all gradients of `params` together (parameters without a
/// gradient count as zero), summed on the device by sum_squares
/// (runtime/ops/reduce.h); one host sync.
double global_grad_norm(const std::vector<Tensor>& params);

/// The factor that scales gradients of norm `norm` down to `max_norm`:
/// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace bt
