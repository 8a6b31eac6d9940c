// tanh-GELU forward and backward against double references and finite differences.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gelu.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

TEST(GeluCpu, Forward) {
  uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (int64_t n : {1, 3, 17, 33, 1000}) {
      Buf x = rand_buf(dt, n, seed++, 3.0), y(dt, n);
      cpu::gelu_forward(dt, x.data(), y.data(), n);
      std::vector<double> ref;
      for (double v : x.vals()) ref.push_back(gelu_ref(v));
      EXPECT_LT(rel_err(y.vals(), ref), tol(dt)) << name_of(dt) << " n=" << n;
    }
}

TEST(GeluCpu, KnownValues) {
  // gelu(0) = 0; large |x| -> x or 0; the tanh form at 1 is 0.8411919906.
  const std::vector<double> x = {0.0, 1.0, -1.0, 30.0, -30.0};
  std::vector<double> y(5);
  cpu::gelu_forward(DType::F64, x.data(), y.data(), 5);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.8411919906082768, 1e-14);
  EXPECT_NEAR(y[2], -0.15880800939172324, 1e-14);
  EXPECT_EQ(y[3], 30.0);
  EXPECT_NEAR(y[4], 0.0, 1e-300);
}

TEST(GeluCpu, Backward) {
  uint32_t seed = 100;
  for (DType dt : kFloatTypes)
    for (int64_t n : {1, 3, 17, 33, 1000}) {
      Buf x = rand_buf(dt, n, seed++, 3.0), dy = rand_buf(dt, n, seed++), dx(dt, n);
      cpu::gelu_backward(dt, x.data(), dy.data(), dx.data(), n);
      // Reference derivative by a high-order central difference of gelu_ref in
      // double (truncation error ~h^4, rounding ~1e-16/h).
      std::vector<double> ref;
      const std::vector<double> xv = x.vals(), gv = dy.vals();
      for (int64_t i = 0; i < n; ++i) {
        const double h = 1e-3, v = xv[i];
        const double d =
            (-gelu_ref(v + 2 * h) + 8 * gelu_ref(v + h) - 8 * gelu_ref(v - h) + gelu_ref(v - 2 * h)) /
            (12 * h);
        ref.push_back(gv[i] * d);
      }
      EXPECT_LT(rel_err(dx.vals(), ref), std::max(tol(dt), 1e-11)) << name_of(dt) << " n=" << n;
    }
}

TEST(GeluCpu, Errors) {
  std::vector<int32_t> buf(4);
  expect_error([&] { cpu::gelu_forward(DType::U8, buf.data(), buf.data(), 4); },
               "gelu_forward: unsupported dtype u8");
  expect_error([&] { cpu::gelu_backward(DType::F16, buf.data(), buf.data(), buf.data(), 4); },
               "gelu_backward");
}

}  // namespace
}  // namespace bt::test
