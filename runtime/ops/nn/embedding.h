// Embedding lookup, differentiable w.r.t. the table.
#pragma once

#include "runtime/tensor/tensor.h"

namespace bt {

/// table [num, dim], indices i32 of any shape -> [*indices.shape, dim].
/// An index outside [0, num) is an error naming its position.
Tensor embedding(const Tensor& table, const Tensor& indices);

}  // namespace bt
