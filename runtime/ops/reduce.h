// Reductions, differentiable.
#pragma once

#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

/// Sum of all elements (a 0-d tensor).
Tensor sum(const Tensor& x);
/// Sum over `dims` (negative dims count from the end).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Maximum along `dim`; the gradient flows to the first maximal element.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Maximum of all elements.
Tensor max(const Tensor& x);

}  // namespace bt
