// Reductions, differentiable.
#pragma once

#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

/// Sum of all elements (a 0-d tensor).
Tensor sum(const Tensor& x);
/// Sum over `dims` (negative dims count from the end).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// The same, accumulated and returned in `dtype`: x's, or f32 for a bf16 x
/// (one rounding, to f32: Note [Gradients in a wider dtype]); any other pair
/// is an error.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType dtype);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Maximum along `dim`; the gradient flows to the first maximal element.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Maximum of all elements.
Tensor max(const Tensor& x);

/// The sum of the squares of every element of every tensor in `xs`, as one
/// 0-d F32 tensor on their device; not differentiable. All on one device. On
/// CUDA one fused, deterministic pass over F32/BF16 data (kernels/sum_squares.h);
/// on CPU sum(mul(x, x)) per tensor (non-F32 cast to F32 first), added in order.
Tensor sum_squares(const std::vector<Tensor>& xs);

}  // namespace bt
