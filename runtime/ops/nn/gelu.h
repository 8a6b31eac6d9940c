// GELU (tanh approximation), differentiable.
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

Tensor gelu(const Tensor& x);
/// dx = dy * gelu'(x), not recorded (used by backward formulas).
Tensor gelu_backward(const Tensor& x, const Tensor& dy);

}  // namespace bt
