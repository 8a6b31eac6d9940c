// The Llama glue from primitive ops (runtime/nn/llama/layers.h): float64
// gradchecks as composed, and values against formulas written out here.
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/nn/llama/layers.h"
#include "tests/support/gradcheck.h"

namespace bt::nn {
namespace {

using V = std::vector<Tensor>;
using test::gradcheck;
using test::leaf;

TEST(LlamaLayers, RmsNormGradcheck) {
  EXPECT_TRUE(
      gradcheck([](const V& v) { return rms_norm(v[0], v[1], 1e-5); }, {leaf({2, 3, 8}, 1), leaf({8}, 2)}));
}

TEST(LlamaLayers, SwigluGradcheck) {
  EXPECT_TRUE(
      gradcheck([](const V& v) { return swiglu(v[0], v[1]); }, {leaf({3, 6}, 3, -3, 3), leaf({3, 6}, 4)}));
}

TEST(LlamaLayers, RopeGradcheck) {
  const RopeTables t = RopeTables::make(5, 8, 10000.0, Device::cpu()).slice(0, 5, DType::F64);
  EXPECT_TRUE(gradcheck([&](const V& v) { return rope(v[0], t); }, {leaf({2, 5, 3, 8}, 5)}));
  // Inside a composition (the rotation feeds a product, as q and k do).
  EXPECT_TRUE(gradcheck([&](const V& v) { return mul(rope(v[0], t), v[1]); },
                        {leaf({1, 5, 2, 8}, 6), leaf({1, 5, 2, 8}, 7)}));
}

TEST(LlamaLayers, RmsNormMatchesItsFormula) {
  const Tensor x = leaf({2, 4, 6}, 8).detach(), w = leaf({6}, 9).detach();
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> got = rms_norm(x, w, 1e-5).to_vector<double>();
  for (int r = 0; r < 8; ++r) {
    double ms = 0;
    for (int c = 0; c < 6; ++c) ms += xv[r * 6 + c] * xv[r * 6 + c] / 6;
    for (int c = 0; c < 6; ++c)
      EXPECT_NEAR(got[r * 6 + c], xv[r * 6 + c] / std::sqrt(ms + 1e-5) * wv[c], 1e-12) << r << "," << c;
  }
}

TEST(LlamaLayers, SwigluMatchesItsFormula) {
  const Tensor g = leaf({10}, 10, -6, 6).detach(), u = leaf({10}, 11).detach();
  const std::vector<double> gv = g.to_vector<double>(), uv = u.to_vector<double>();
  const std::vector<double> got = swiglu(g, u).to_vector<double>();
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(got[i], gv[i] / (1 + std::exp(-gv[i])) * uv[i], 1e-12) << i;
}

// Rotate-half (Hugging Face's Llama): dims i and i + D/2 form a pair rotated
// by t * theta^(-2i / D).
TEST(LlamaLayers, RopeRotatesHalvesByPosition) {
  const int64_t B = 2, T = 7, H = 3, D = 8, first = 4;
  const double theta = 500.0;
  const RopeTables all = RopeTables::make(first + T, D, theta, Device::cpu());
  const Tensor x = leaf({B, T, H, D}, 12).detach();
  const std::vector<double> xv = x.to_vector<double>();
  const std::vector<double> got = rope(x, all.slice(first, T, DType::F64)).to_vector<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double a = static_cast<double>(first + t) * std::pow(theta, -2.0 * i / D);
          const int64_t k = ((b * T + t) * H + h) * D;
          const double x0 = xv[k + i], x1 = xv[k + i + D / 2];
          // The tables are f32 (as Hugging Face's are): 1e-6 of an angle's sine.
          EXPECT_NEAR(got[k + i], x0 * std::cos(a) - x1 * std::sin(a), 2e-6);
          EXPECT_NEAR(got[k + i + D / 2], x1 * std::cos(a) + x0 * std::sin(a), 2e-6);
        }
}

TEST(LlamaLayers, RopeRefusesAnOddHeadDim) {
  EXPECT_THROW(RopeTables::make(4, 6 + 1, 10000.0, Device::cpu()), Error);
}

}  // namespace
}  // namespace bt::nn
