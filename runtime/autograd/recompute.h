// Trading compute for activation memory: which activations the backward
// rebuilds instead of keeping (the `train.recompute` setting).
//
//   none       keep every tensor an op saves for backward
//   selective  ops whose output is cheap to rebuild from tensors autograd keeps
//              anyway (LayerNorm from its input, GELU from its pre-activation)
//              tag it with a recipe; a later op that saves it keeps the recipe
//              instead of the memory (Note [Selective recompute])
//   full       models also rerun each block's forward in backward, keeping
//              only the block's input (checkpoint(), runtime/autograd/checkpoint.h)
#pragma once

#include <functional>

#include "runtime/autograd/recompute_mode.h"
#include "runtime/tensor/tensor.h"

namespace bt {
namespace autograd {

/// The mode of this thread's forward passes (none unless a guard says).
Recompute recompute_mode();

/// Sets this thread's recompute mode for its scope (models hold one around
/// their forward).
class RecomputeGuard {
 public:
  explicit RecomputeGuard(Recompute r);
  ~RecomputeGuard();
  RecomputeGuard(const RecomputeGuard&) = delete;
  RecomputeGuard& operator=(const RecomputeGuard&) = delete;

 private:
  Recompute prev_;
};

/// A storage's recipe: rebuilds the tensor that fills it, bit for bit.
struct Recipe : RecomputeTag {
  std::function<Tensor()> make;
};

/// Under selective (or full) recompute, tags `out` -- which must alone fill
/// its storage -- as rebuilt by `make` (run with grad mode off; it must
/// reproduce `out` bitwise, so it reruns the kernel that made it on inputs
/// the op saved anyway). Does nothing under none or for a view.
void make_recomputable(const Tensor& out, std::function<Tensor()> make);

}  // namespace autograd
}  // namespace bt
