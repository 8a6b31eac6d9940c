// The reverse-mode engine: runs the backward graph from some roots.
#pragma once

#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt::autograd {

/// Propagates `grads` (one per root; same shape) backwards from `roots`,
/// accumulating into the .grad of every reachable leaf that requires grad.
/// Nodes run in reverse creation order once all their inputs are in, so a
/// leaf's grad-ready hooks fire as soon as its gradient is final (the hook
/// order follows the reverse of the forward, which DDP bucketing relies on).
/// Without retain_graph, each node frees its saved tensors after it runs.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph);

/// Note [Adding into the gradient so far] (engine.cpp): called by a backward
/// function while it runs, the gradient that its input `input` has received
/// from the nodes that ran before it, when the function may add its own
/// gradient into that buffer in place and return the buffer as its gradient
/// (the engine then keeps the sum as it is). Undefined when there is none
/// yet, when anything else holds the buffer, or under lazy fusion.
Tensor gradient_so_far(size_t input);

/// Whether the backward pass running on this thread keeps the saved tensors
/// for another pass (retain_graph). A node may write its gradient over a
/// saved buffer nobody else holds only when it does not.
bool retaining_graph();

}  // namespace bt::autograd
