// A toy model for the strategy tests: five parameters that fall into units
// the way a model's do (nn::WeightSource, Note [ZeRO-3 units]): unit 0 holds
// parameters 0 and 4 and encloses the others (entered first, left last, as
// GPT's embeddings and head), unit 1 holds parameters 1 and 2, unit 2
// parameter 3.
//
// Note [Toy loss]: with t_i = sum(x_i * tanh(w_i)) and, per unit u,
// g_u = 1 + mean of w^2 over u's elements,
//
//   loss = (t_0 + (t_1 + t_2) * g_1 + t_3 * g_2 + t_4) * g_0
//
// It is nonlinear in the weights, and each gradient element depends on its own
// weight's value and sign (through tanh and g) and on every other weight of
// its unit (through g_u and the unit's sum of t), and of unit 0 (through
// g_0): a wrong value in what a strategy's forward gathers -- a wrong shard,
// a stale value, another unit's data, a wrong offset -- changes the
// gradients and so the steps. (A loss linear in w, grad w_i = x_i, cannot
// see any of these.) It is linear in the inputs x, so the gradient averaged
// over ranks with inputs x_r is the gradient at the averaged inputs: one
// process reproduces N ranks from the mean of their inputs.
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
/// Forward and backward of the toy loss (Note [Toy loss]); the weights come
/// from `src` (unit by unit) when it is not null.
void toy_backward(const std::vector<Tensor>& params, const std::vector<Tensor>& xs,
                  nn::WeightSource* src = nullptr);

}  // namespace bt::test
