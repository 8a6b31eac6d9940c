// Global gradient norm against a float64 host computation; the clip factor.
#include <cmath>
#include <limits>

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

// clip_scale computes clip_coefficient's doubles from a sum of squares where
// the sum lives (Note [Step scalars]): {norm, factor}, rounded to float, the
// same values the host formula gives, for f32 and f64 sums, clipping on or off.
TEST(Clip, ScaleOnTheDeviceIsTheHostFormula) {
  std::vector<Device> devices = {Device::cpu()};
  if (cuda_available()) devices.push_back(Device::cuda(0));  // on the GPU machine
  for (const Device& d : devices) {
    for (const double sq : {0.0, 0.25, 1.0, 16.0, 12345.678}) {
      for (const double max_norm : {0.0, 1.0, 0.5}) {
        for (const DType dt : {DType::F32, DType::F64}) {
          const Tensor in = full({1}, sq, TensorOptions{dt, d});
          const std::vector<float> got = clip_scale(in, max_norm).to_vector<float>();
          const double norm = std::sqrt(dt == DType::F32 ? static_cast<double>(static_cast<float>(sq)) : sq);
          EXPECT_EQ(got[0], static_cast<float>(norm)) << d << " " << sq;
          EXPECT_EQ(got[1], static_cast<float>(clip_coefficient(norm, max_norm)))
              << d << " " << sq << " " << max_norm;
        }
      }
    }
  }
  EXPECT_THROW(clip_scale(zeros({2}), 1.0), Error);
}

// Note [Non-finite steps]: the factor is NaN -- so AdamW skips the update --
// when the norm is not finite (a NaN or an infinity in some gradient, or a
// sum of squares that overflowed), clipping on or off, or when the loss is
// not; a finite loss changes no bit. The norm itself is still reported.
TEST(Clip, ANonFiniteNormOrLossGivesANaNFactor) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<Device> devices = {Device::cpu()};
  if (cuda_available()) devices.push_back(Device::cuda(0));  // on the GPU machine
  for (const Device& d : devices) {
    const TensorOptions f64{DType::F64, d};
    for (const double max_norm : {0.0, 1.0}) {
      for (const DType dt : {DType::F32, DType::F64}) {
        for (const double sq : {nan, inf}) {
          const std::vector<float> got =
              clip_scale(full({1}, sq, TensorOptions{dt, d}), max_norm).to_vector<float>();
          EXPECT_FALSE(std::isfinite(got[0])) << d << " " << sq;
          EXPECT_TRUE(std::isnan(got[1])) << d << " " << sq << " " << max_norm;
        }
        const Tensor four = full({1}, 4.0, TensorOptions{dt, d});
        for (const double loss : {nan, inf, -inf}) {
          const std::vector<float> got = clip_scale(four, max_norm, full({1}, loss, f64)).to_vector<float>();
          EXPECT_EQ(got[0], 2.0f) << d << " loss " << loss;
          EXPECT_TRUE(std::isnan(got[1])) << d << " loss " << loss << " " << max_norm;
        }
        EXPECT_EQ(clip_scale(four, max_norm, full({1}, 3.5, f64)).to_vector<float>(),
                  clip_scale(four, max_norm).to_vector<float>())
            << d;
      }
    }
    EXPECT_THROW(clip_scale(full({1}, 4.0, f64), 1.0, full({1}, 1.0, TensorOptions{DType::F32, d})), Error);
  }
}

}  // namespace
}  // namespace bt
