#include "runtime/autograd/checkpoint.h"

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/recompute.h"

namespace bt::autograd {

// Note [Checkpointed regions]
// The forward of a region runs twice: once without a graph (its output goes
// on), once in backward with one (its activations feed the gradients). The
// gradients are those of the first run only if both runs produce the same
// bits, so nothing inside may depend on whether a graph is recorded: under
// full recompute ops choose their kernels by the mode, never by grad mode
// (Linear's GELU is its own kernel either way, runtime/ops/matmul.cpp),
// and a region draws no random numbers (GPT has no dropout; one with dropout
// must replay its generator state). The rerun uses the recompute mode the
// region was first run under, so selective tagging still trims the rerun's
// own saved tensors while its backward runs.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!GradMode::enabled()) return fn(x);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  record("CheckpointBackward", {&x}, y,
         [sx = SavedTensor(x, "checkpoint"), fn, mode = recompute_mode(),
          needs_dx = x.requires_grad()](Grads& g) -> Grads {
           Tensor xr = sx.unpack().detach();
           if (needs_dx) xr.requires_grad_();
           Tensor yr;
           {
             GradModeGuard grad_on(true);
             RecomputeGuard same_mode(mode);
             yr = fn(xr);
           }
           if (!yr.requires_grad()) return {Tensor()};
           run_backward({yr}, {g[0]}, false);
           return {needs_dx ? xr.grad() : Tensor()};
         });
  return y;
}

}  // namespace bt::autograd
