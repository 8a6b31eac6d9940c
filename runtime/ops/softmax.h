// softmax and log_softmax along one dimension, differentiable.
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

}  // namespace bt
