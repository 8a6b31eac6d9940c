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

/// A bias gradient: dy summed over every dim but the last, as autograd
/// records a broadcast add's backward (one dim at a time from the last but one, keepdim).
fusion::Group bias_grad_group(DType dt, const Shape& shape);

/// A gradient's squared norm (row sums, then their sum) beside a 0-d running
/// total, as gradient clipping records them. Inputs: the two totals, then x.
/// Outputs the norm, then the total.
fusion::Group square_norm_group(int64_t rows, int64_t cols);

/// LayerNorm's backward from primitives, inputs dy, w [last dim], xhat and
/// std (one per row): the bias and weight gradients (column sums), dy * w /
/// std (elementwise), and a row sum divided by a row value.
fusion::Group layer_norm_backward_group(DType dt, const Shape& shape);

/// A row reduction broadcast back (a mean's backward, `mul %s, c : [rows, cols]`
/// over the row's sum) added to x, then that sum's column sums, as autograd
/// records a LayerNorm input's and bias's gradients. Outputs the full value, then its column sums.
fusion::Group row_then_column_group(DType dt, const Shape& shape);

/// The tanh-GELU's backward as autograd records it for gelu(h) (h [rows,
/// cols], inputs h then dg): dh = dg * gelu'(h), then dh's column sums (the
/// bias gradient of the GEMM that made h). Outputs dh, then the sums.
fusion::Group gelu_backward_group(DType dt, int64_t rows, int64_t cols);

/// A CPU tensor of `dt` drawn uniformly from [lo, hi) (in f32, then converted).
Tensor uniform_cpu(const Shape& s, DType dt, std::mt19937& gen, float lo = -2.0f, float hi = 2.0f);

}  // namespace bt::test
