#include "runtime/optim/clip.h"

#include <cmath>

#include "runtime/ops/reduce.h"

namespace bt {

double global_grad_norm(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(std::move(g));
  if (grads.empty()) return 0.0;
  return std::sqrt(static_cast<double>(sum_squares(grads).item<float>()));
}

}  // namespace bt
