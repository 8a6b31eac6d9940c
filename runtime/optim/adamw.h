// AdamW with fp32 moments, one fused kernel launch per parameter.
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

  /// Updates every parameter that has a gradient. `grad_scale` multiplies the
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
  };
  std::vector<State> state_;
  AdamWOptions opts_;
  int64_t steps_ = 0;
};

}  // namespace bt
