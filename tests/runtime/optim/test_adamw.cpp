// AdamW: one step against the formula in double, convergence on a quadratic,
// and a non-finite gradient multiplier skipping the update.
#include <cmath>
#include <limits>

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

// Note [Non-finite steps]: a gradient multiplier that is NaN or infinite
// makes the kernels write nothing -- parameters, moments and the bf16 copy
// keep their bits, on the CPU and on the GPU, through the vector loop and the
// scalar tail (37 elements) -- and retract() counts the step back out, so the
// next advance() gives the scalars the skipped one had.
TEST(AdamW, ANonFiniteMultiplierSkipsTheUpdateAndRetractCountsItOut) {
  std::vector<Device> devices = {Device::cpu()};
  if (cuda_available()) devices.push_back(Device::cuda(0));  // on the GPU machine
  for (const Device& d : devices) {
    SCOPED_TRACE(d.str());
    Generator g(11);
    const TensorOptions o{DType::F32, d};
    Tensor a = randn({37}, o, &g).requires_grad_(), b = randn({8, 16}, o, &g).requires_grad_();
    AdamWOptions opts;
    opts.weight_decay = 0.1;
    AdamW opt({a, b}, opts);
    auto backward = [&] {
      opt.zero_grad();
      add(sum(mul(a, a)), sum(mul(b, 3.0))).backward();
    };
    backward();
    opt.step();  // m and v are not zero from here on
    backward();
    const std::vector<float> a0 = a.to_vector<float>(), b0 = b.to_vector<float>();
    const std::vector<float> ma = opt.moments(a).first.to_vector<float>(),
                             vb = opt.moments(b).second.to_vector<float>();
    const AdamW::StepScalars second = opt.advance(opt.lr());
    const Tensor hyper = from_vector<float>({second.lr, second.bias1, second.bias2}, {3}, o);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      opt.apply(hyper, full({1}, bad, o));
      EXPECT_EQ(a.to_vector<float>(), a0) << bad;
      EXPECT_EQ(b.to_vector<float>(), b0) << bad;
      EXPECT_EQ(opt.moments(a).first.to_vector<float>(), ma) << bad;
      EXPECT_EQ(opt.moments(b).second.to_vector<float>(), vb) << bad;
    }
    EXPECT_EQ(opt.steps(), 2);
    opt.retract();
    EXPECT_EQ(opt.steps(), 1);
    const AdamW::StepScalars again = opt.advance(opt.lr());
    EXPECT_EQ(again.bias1, second.bias1);
    EXPECT_EQ(again.bias2, second.bias2);
    opt.apply(hyper, full({1}, 1.0, o));  // a finite multiplier updates again
    EXPECT_NE(a.to_vector<float>(), a0);
    EXPECT_NE(opt.moments(b).second.to_vector<float>(), vb);
  }
  AdamW none(std::vector<Tensor>{}, AdamWOptions{});
  EXPECT_THROW(none.retract(), Error);
}

}  // namespace
}  // namespace bt
