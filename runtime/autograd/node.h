// A node of the backward graph: the backward function of one forward op.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

class Node;

/// Where a gradient flows: input `input_nr` of node `fn`. An edge with no fn
/// leads to a tensor that does not require grad.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  /// Gradients w.r.t. this node's forward outputs -> gradients w.r.t. its
  /// forward inputs, in next_edges order. An undefined Tensor means zero. A
  /// returned gradient may be in a wider floating dtype than its input
  /// (Note [Gradients in a wider dtype], engine.cpp).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  /// Drops saved tensors once backward no longer needs them.
  virtual void release_saved() {}
  /// Sinks (AccumulateGrad) outlive one graph: they are never marked released.
  virtual bool persistent() const { return false; }

  std::vector<Edge> next_edges;
  uint32_t num_outputs = 1;
  /// The dtype of each forward output (set_history fills it): apply() gets
  /// its gradients in these dtypes, unless any_grad_dtype.
  std::vector<DType> output_dtypes;
  /// apply() takes gradients in whatever floating dtype they arrive (casts
  /// and sinks, which convert them once themselves).
  bool any_grad_dtype = false;
  /// Creation order; the engine runs later nodes first.
  uint64_t sequence_nr = 0;
  bool released = false;
};

/// The sink node of a leaf tensor: adds incoming gradient into leaf.grad and
/// then runs the leaf's grad-ready hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) { any_grad_dtype = true; }
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  bool persistent() const override { return true; }
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

}  // namespace bt
