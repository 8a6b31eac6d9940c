// Autograd state attached to a TensorImpl, kept apart from the tensor core.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "runtime/autograd/node.h"

namespace bt {

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves only; see AccumulateGrad
  std::vector<std::function<void(const Tensor&)>> grad_ready_hooks;
};

namespace autograd {
/// The meta of t, created on first use.
AutogradMeta& meta(const Tensor& t);
/// The meta of t, or null.
AutogradMeta* meta_or_null(const Tensor& t);
/// The edge a gradient for `t` should flow along (invalid if t needs none).
Edge edge_of(const Tensor& t);
/// True when grad mode is on and any input requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
/// Connects `out` (output `output_nr` of `fn`) to the graph.
void set_history(const Tensor& out, const std::shared_ptr<Node>& fn, uint32_t output_nr = 0);
/// Note [Stealing the gradient]: `g` is the only handle of a contiguous
/// tensor of `shape` that alone fills its storage, outside any graph, so
/// its buffer may be kept or written in place.
bool sole_owner(const Tensor& g, const Shape& shape);

/// Makes a node of type N whose next edges are the inputs' edges, or returns
/// null when no gradient is needed (grad mode off or no input requires grad).
template <typename N, typename... Args>
std::shared_ptr<N> make_node(std::initializer_list<const Tensor*> inputs, Args&&... args) {
  if (!any_requires_grad(inputs)) return nullptr;
  auto n = std::make_shared<N>(std::forward<Args>(args)...);
  for (const Tensor* t : inputs) n->next_edges.push_back(t && t->defined() ? edge_of(*t) : Edge{});
  return n;
}
}  // namespace autograd
}  // namespace bt
