// AdamW with fp32 moments: fused kernels, a few launches for all the parameters.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Note [Step scalars]
// A captured CUDA graph replays its kernels with the arguments they had at
// capture, so nothing that changes from step to step may be a kernel
// argument: not the learning rate (the schedule), not AdamW's bias
// corrections (the step count), not the clipping factor (the gradient norm).
// So a step has two halves. advance() is host work: it counts the step and
// computes lr, bias1 and bias2 (the same floats as ever). apply() is device
// work: the kernels read {lr, bias1, bias2} and the gradient multiplier from
// device memory. The Trainer writes advance()'s values to pinned staging
// memory that the step copies to the device (the graph replays that copy,
// reading the staging memory's contents of the moment), and clip_scale
// (runtime/optim/clip.h) computes the clipping factor on the device. Eager
// and replayed steps run the same kernels on the same values: the same bits,
// and the same bits as before the split.
class AdamW {
 public:
  /// A set of parameters sharing a weight decay (e.g. matrices vs. biases/norms).
  struct Group {
    std::vector<Tensor> params;
    double weight_decay = 0.0;
  };

  AdamW(std::vector<Group> groups, const AdamWOptions& opts);
  /// One group with opts.weight_decay.
  AdamW(std::vector<Tensor> params, const AdamWOptions& opts);

  /// One step's learning rate and bias corrections, as the kernels read them.
  struct StepScalars {
    float lr = 0, bias1 = 1, bias2 = 1;
  };
  /// The host half of a step (Note [Step scalars]): counts it and returns its
  /// scalars for learning rate `lr`.
  StepScalars advance(double lr);
  /// The device half: updates every parameter that has a gradient, reading
  /// {lr, bias1, bias2} from `hyper` (F32 [3]) and the gradients' multiplier
  /// from `scale` (F32 [1]), both on the parameters' device. Reads nothing
  /// back to the host. A multiplier that is not finite skips the update on
  /// the device: parameters and moments keep their bits (then call retract()).
  void apply(const Tensor& hyper, const Tensor& scale);
  /// Counts the last advance() back out: its update was skipped (a non-finite
  /// multiplier), so the next step reuses its bias corrections.
  void retract();
  /// advance(lr()) and apply() with those values. `grad_scale` multiplies the
  /// gradients first (gradient clipping / accumulation averaging).
  void step(double grad_scale = 1.0);
  /// Zeroes every gradient in place, or, with `set_to_none`, drops them: the
  /// next backward's first gradient then becomes .grad without a copy (Note
  /// [Stealing the gradient] in runtime/autograd/autograd.cpp) and no pass
  /// zeroes memory. Parameters that get no gradient are skipped by step().
  void zero_grad(bool set_to_none = false);
  void set_lr(double lr) { opts_.lr = lr; }
  double lr() const { return opts_.lr; }
  int64_t steps() const { return steps_; }
  /// Every update of `p` from now on also writes `copy` (BF16 or F32, of p's
  /// numel, contiguous, on p's device): the values of p rounded to copy's
  /// dtype, in the same pass (Note [Compute copies] in
  /// runtime/dist/compute_copies.h). An undefined `copy` stops that.
  void set_copy(const Tensor& p, const Tensor& copy);
  /// Continues the bias correction from `n` steps (a checkpoint's count).
  void set_steps(int64_t n) { steps_ = n; }
  /// The moments of parameter `p` (matched by identity: the same tensor
  /// handle's storage view the optimizer was built with). Throws bt::Error for
  /// a tensor this optimizer does not update.
  std::pair<Tensor, Tensor> moments(const Tensor& p) const;

 private:
  struct State {
    Tensor param, m, v;
    double weight_decay;
    Tensor copy;  // set_copy()
  };
  State& state_of(const Tensor& p, const char* what);
  const State& state_of(const Tensor& p, const char* what) const;
  std::vector<State> state_;
  AdamWOptions opts_;
  int64_t steps_ = 0;
};

}  // namespace bt
