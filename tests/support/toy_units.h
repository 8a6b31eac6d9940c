// A toy model for the strategy tests, with known gradients: loss = sum over i
// of sum(w_i * x_i), so grad w_i = x_i. Its five parameters fall into units
// the way a model's do (nn::WeightSource): unit 0 holds parameters 0 and 4
// and encloses the others (entered first, left last, as GPT's embeddings and
// head), unit 1 holds parameters 1 and 2, unit 2 parameter 3.
#pragma once

#include <vector>

#include "runtime/nn/weight_source.h"
#include "runtime/tensor/factory.h"

namespace bt::test {

/// 5 + 3 + 14 + 16 + 1 = 39 floats.
std::vector<Shape> toy_shapes();
/// The unit of each parameter: {0, 1, 1, 2, 0}.
std::vector<int> toy_units();
/// Parameters of toy_shapes(), N(0, 1) from `seed`, requiring grad (on `dev`).
std::vector<Tensor> toy_params(uint64_t seed, const Device& dev = Device::cpu());
/// Fixed N(0, 1) tensors from `seed`, times `scale`: the x_i of one rank.
std::vector<Tensor> toy_inputs(double scale, uint64_t seed, const Device& dev = Device::cpu());
/// Forward and backward of the toy loss; the weights come from `src` (unit
/// by unit) when it is not null.
void toy_backward(const std::vector<Tensor>& params, const std::vector<Tensor>& xs,
                  nn::WeightSource* src = nullptr);

}  // namespace bt::test
