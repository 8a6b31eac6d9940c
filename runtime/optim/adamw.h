// AdamW with fp32 moments, one fused kernel launch per parameter.
#pragma once

#include <cstdint>
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
  void zero_grad();
  void set_lr(double lr) { opts_.lr = lr; }
  double lr() const { return opts_.lr; }
  int64_t steps() const { return steps_; }

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
