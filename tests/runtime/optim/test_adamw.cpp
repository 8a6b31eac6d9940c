// AdamW: one step against the formula in double, and convergence on a quadratic.
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/bt.h"

namespace bt {
namespace {

TEST(AdamW, MatchesReferenceFormula) {
  Tensor p = from_vector<float>({0.5f, -1.0f, 2.0f}, {3}).requires_grad_();
  AdamWOptions o;
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  AdamW opt({p}, o);
  std::vector<double> pr = {0.5, -1.0, 2.0}, m(3, 0), v(3, 0);
  for (int step = 1; step <= 3; ++step) {
    opt.zero_grad();
    sum(mul(mul(p, p), 0.5)).backward();  // grad = p
    opt.step();
    for (int i = 0; i < 3; ++i) {
      const double g = pr[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.95 * v[i] + 0.05 * g * g;
      const double mh = m[i] / (1 - std::pow(0.9, step)), vh = v[i] / (1 - std::pow(0.95, step));
      pr[i] -= 0.1 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * pr[i]);
    }
  }
  const auto got = p.to_vector<float>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], pr[i], 1e-5) << i;
}

TEST(AdamW, MinimizesAQuadratic) {
  Generator g(3);
  Tensor target = randn({16}, {}, &g);
  Tensor p = zeros({16}).requires_grad_();
  AdamWOptions o;
  o.lr = 0.05;
  AdamW opt({p}, o);
  double first = 0, last = 0;
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    Tensor d = sub(p, target);
    Tensor loss = mean(mul(d, d));
    if (i == 0) first = loss.item<float>();
    last = loss.item<float>();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(last, first * 1e-3);
}

}  // namespace
}  // namespace bt
