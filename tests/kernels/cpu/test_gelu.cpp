// tanh-GELU forward and backward against double references and finite differences.
#include <cmath>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gelu.h"
#include "kernels/reduce.h"
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

// gelu_backward_fused gives the bits of the three kernels it stands for.
TEST(GeluCpu, FusedBackwardIsTheThreeKernelsBitForBit) {
  uint32_t seed = 300;
  for (DType dt : {DType::F32, DType::BF16})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {300, 64}}) {
      const int64_t n = rows * cols;
      const Buf pre = rand_buf(dt, n, seed++, 3.0), dh = rand_buf(dt, n, seed++);
      Buf g = dh, h(dt, n), want_g = dh, want_h(dt, n);
      std::vector<float> bias(static_cast<size_t>(cols)), want_bias(static_cast<size_t>(cols));
      cpu::gelu_backward_fused(dt, pre.data(), g.data(), h.data(), bias.data(), rows, cols);
      cpu::gelu_backward(dt, pre.data(), want_g.data(), want_g.data(), n);
      cpu::gelu_forward(dt, pre.data(), want_h.data(), n);
      if (dt == DType::F32)
        kernels::cpu::reduce_dim(kernels::ReduceOp::Sum, dt, want_g.data(), want_bias.data(), 1, rows, cols,
                                 nullptr);
      else
        kernels::cpu::reduce_dim(kernels::ReduceOp::Sum, dt, DType::F32, want_g.data(), want_bias.data(), 1,
                                 rows, cols);
      EXPECT_EQ(g.bytes, want_g.bytes) << name_of(dt) << " dpre " << rows << "x" << cols;
      EXPECT_EQ(h.bytes, want_h.bytes) << name_of(dt) << " h";
      EXPECT_EQ(bias, want_bias) << name_of(dt) << " bias gradient";
      // Without h and the bias gradient it still writes dpre.
      Buf g2 = dh;
      cpu::gelu_backward_fused(dt, pre.data(), g2.data(), nullptr, nullptr, rows, cols);
      EXPECT_EQ(g2.bytes, want_g.bytes) << name_of(dt);
    }
  std::vector<double> buf(4);
  expect_error([&] { cpu::gelu_backward_fused(DType::F64, buf.data(), buf.data(), nullptr, nullptr, 2, 2); },
               "gelu_backward_fused: F32 or BF16");
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
