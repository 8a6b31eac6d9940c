// Activation checkpointing: a region of the forward whose activations are
// rebuilt in backward instead of kept (train.recompute = full).
#pragma once

#include <functional>

#include "runtime/tensor/tensor.h"

namespace bt::autograd {

/// Returns fn(x), computed without recording a graph, and records one node
/// that keeps only `x`. Its backward reruns fn(x) with recording on and
/// backpropagates the incoming gradient through that rerun: the parameters fn
/// reads get their gradients there (their .grad, their hooks), the node
/// returns x's. Only one region's activations are alive at a time in backward.
/// fn must compute the same bits both times (Note [Checkpointed regions]).
/// Without grad mode this is just fn(x).
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace bt::autograd
