#include "runtime/optim/clip.h"

#include <cmath>

#include "runtime/autograd/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"

namespace bt {

double global_grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard ng;
  Tensor total;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.dtype() != DType::F32) g = g.to(DType::F32);
    Tensor sq = sum(mul(g, g));
    total = total.defined() ? add(total, sq) : sq;
  }
  return total.defined() ? std::sqrt(static_cast<double>(total.item<float>())) : 0.0;
}

}  // namespace bt
