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

/// Whether the backward pass running on this thread keeps the saved tensors
/// for another pass (retain_graph). A node may write its gradient over a
/// saved buffer nobody else holds only when it does not.
bool retaining_graph();

}  // namespace bt::autograd
