// Global gradient norm against a float64 host computation; the clip factor.
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/optim/clip.h"

namespace bt {
namespace {

TEST(Clip, GlobalNormMatchesFloat64) {
  Generator g(3);
  std::vector<Tensor> params = {randn({7, 5}, {}, &g).requires_grad_(), randn({300}, {}, &g).requires_grad_(),
                                randn({2}, {}, &g).requires_grad_()};  // the last gets no gradient
  mul(sum(mul(params[0], params[0])), 1.5).backward();                 // grad = 3 p
  sum(mul(params[1], 2.0)).backward();                                 // grad = 2
  double want = 0;
  for (float v : params[0].to_vector<float>()) want += 9.0 * v * v;
  want += 300 * 4.0;
  EXPECT_NEAR(global_grad_norm(params), std::sqrt(want), 1e-5 * std::sqrt(want));
  EXPECT_EQ(global_grad_norm({params[2]}), 0.0);
}

TEST(Clip, CoefficientScalesDownOnly) {
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 0.0), 1.0);  // clipping off
}

}  // namespace
}  // namespace bt
