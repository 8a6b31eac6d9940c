// Fusion groups the compiler tests share (runtime/compile/fusion_group.h):
// the shapes of work the training step hands a fusion backend.
#pragma once

#include <cstdint>
#include <random>

#include "runtime/compile/fusion_group.h"
#include "runtime/tensor/tensor.h"

namespace bt::test {

/// gelu(x + b) with the tanh formula, x [rows, cols], b [cols] broadcast over the rows.
fusion::Group bias_gelu_group(DType dt, int64_t rows, int64_t cols);

/// LayerNorm forward from primitives over x [rows, cols] with weight and bias
/// [cols]: y, and the row mean and 1/std it saves.
fusion::Group layer_norm_group(DType dt, int64_t rows, int64_t cols);

/// A CPU tensor of `dt` drawn uniformly from [lo, hi) (in f32, then converted).
Tensor uniform_cpu(const Shape& s, DType dt, std::mt19937& gen, float lo = -2.0f, float hi = 2.0f);

}  // namespace bt::test
