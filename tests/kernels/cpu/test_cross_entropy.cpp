// Fused softmax cross-entropy against a double reference.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cross_entropy.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::CrossEntropyArgs;
namespace cpu = kernels::cpu;

struct Shape {
  int64_t rows, vocab, ld;
};
const Shape kShapes[] = {{1, 1, 1}, {1, 17, 17}, {3, 33, 40}, {17, 3, 8}, {8, 1000, 1024}, {33, 50, 50}};

std::vector<int32_t> make_targets(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = static_cast<int32_t>(gen() % vocab);
  if (rows >= 3) t[1] = -1;  // an ignored row
  if (rows >= 5) t[4] = static_cast<int32_t>(vocab - 1);
  return t;
}

double ref_lse(const std::vector<double>& x, int64_t r, int64_t ld, int64_t vocab) {
  double mx = -INFINITY, z = 0;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, x[r * ld + j]);
  for (int64_t j = 0; j < vocab; ++j) z += std::exp(x[r * ld + j] - mx);
  return mx + std::log(z);
}

TEST(CrossEntropyCpu, ForwardAndBackward) {
  uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(bt::cat(dtype_name(dt), " rows=", s.rows, " vocab=", s.vocab, " ld=", s.ld));
      // Padding columns hold huge values: they must not take part.
      std::vector<double> xs = randn(s.rows * s.ld, seed++, 3.0);
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t j = s.vocab; j < s.ld; ++j) xs[r * s.ld + j] = 1e4;
      Buf logits(dt, xs);
      const std::vector<int32_t> tgt = make_targets(s.rows, s.vocab, seed++);
      CrossEntropyArgs a;
      a.dt = dt, a.logits = logits.data(), a.rows = s.rows, a.vocab = s.vocab, a.ld = s.ld,
      a.targets = tgt.data();
      std::vector<float> loss(s.rows, NAN), lse(s.rows, NAN);
      cpu::cross_entropy_forward(a, loss.data(), lse.data());

      const std::vector<double> x = logits.vals(), dl = randn(s.rows, seed++);
      std::vector<double> rloss, rlse, got_loss, got_lse;
      for (int64_t r = 0; r < s.rows; ++r) {
        const double l = ref_lse(x, r, s.ld, s.vocab);
        rlse.push_back(l), got_lse.push_back(lse[r]);
        rloss.push_back(tgt[r] < 0 ? 0.0 : l - x[r * s.ld + tgt[r]]);
        got_loss.push_back(loss[r]);
        if (tgt[r] < 0) {
          EXPECT_EQ(loss[r], 0.0f);
        }
      }
      // loss and lse are float outputs for every dtype.
      EXPECT_LT(rel_err(got_lse, rlse), 1e-6);
      EXPECT_LT(rel_err(got_loss, rloss), 1e-5);

      std::vector<float> dloss(dl.begin(), dl.end());
      Buf dlogits(dt, s.rows * s.ld);
      for (int64_t i = 0; i < dlogits.n; ++i) dlogits.set(i, 99.0);  // must be overwritten
      cpu::cross_entropy_backward(a, lse.data(), dloss.data(), dlogits.data());
      std::vector<double> ref(s.rows * s.ld, 0.0);
      for (int64_t r = 0; r < s.rows; ++r) {
        if (tgt[r] < 0) continue;
        const double l = ref_lse(x, r, s.ld, s.vocab);
        for (int64_t j = 0; j < s.vocab; ++j)
          ref[r * s.ld + j] = (std::exp(x[r * s.ld + j] - l) - (j == tgt[r] ? 1.0 : 0.0)) * dloss[r];
      }
      EXPECT_LT(rel_err(dlogits.vals(), ref), tol(dt));
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t j = 0; j < s.ld; ++j)
          if (tgt[r] < 0 || j >= s.vocab) {
            ASSERT_EQ(dlogits.get(r * s.ld + j), 0.0) << r << "," << j;
          }
    }
}

TEST(CrossEntropyCpu, StableForHugeLogits) {
  for (DType dt : kFloatTypes) {
    Buf logits(dt, std::vector<double>{1000, 1000, 0, -1000});
    const int32_t t = 2;
    CrossEntropyArgs a;
    a.dt = dt, a.logits = logits.data(), a.rows = 1, a.vocab = 4, a.ld = 4, a.targets = &t;
    float loss = 0, lse = 0;
    cpu::cross_entropy_forward(a, &loss, &lse);
    EXPECT_NEAR(lse, 1000 + std::log(2.0), 1e-3);
    EXPECT_NEAR(loss, 1000 + std::log(2.0), 1e-3);
  }
}

TEST(CrossEntropyCpu, Errors) {
  std::vector<float> logits(12, 0.0f), loss(3), lse(3), dl(3, 1.0f), dx(12);
  CrossEntropyArgs a;
  a.dt = DType::F32, a.logits = logits.data(), a.rows = 3, a.vocab = 4, a.ld = 4;
  std::vector<int32_t> t = {0, 4, 1};
  a.targets = t.data();
  EXPECT_THROW(cpu::cross_entropy_forward(a, loss.data(), lse.data()), Error);
  expect_error([&] { cpu::cross_entropy_forward(a, loss.data(), lse.data()); }, "target 4 at row 1");
  t[1] = -2;
  expect_error([&] { cpu::cross_entropy_forward(a, loss.data(), lse.data()); }, "outside [0, 4)");
  expect_error([&] { cpu::cross_entropy_backward(a, lse.data(), dl.data(), dx.data()); }, "target -2");
  t[1] = 0;
  a.dt = DType::F16;
  expect_error([&] { cpu::cross_entropy_forward(a, loss.data(), lse.data()); },
               "cross_entropy_forward: unsupported dtype f16");
  a.dt = DType::F32;
  a.ld = 3;
  expect_error([&] { cpu::cross_entropy_forward(a, loss.data(), lse.data()); }, "ld");
}

}  // namespace
}  // namespace bt::test
