// Fused AdamW step against a double evaluation of the formula in adamw.h.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/adamw.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::AdamWArgs;
namespace cpu = kernels::cpu;

TEST(AdamWCpu, StepsMatchReference) {
  uint32_t seed = 1;
  for (DType gdt : kFloatTypes)
    for (int64_t n : {1, 3, 17, 33, 1000})
      for (DType cdt : {DType::BF16, DType::F32}) {
        SCOPED_TRACE(bt::cat("grad ", dtype_name(gdt), " copy ", dtype_name(cdt), " n=", n));
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
        std::vector<float> p, m(n, 0.0f), v(n, 0.0f);
        for (double x : randn(n, seed++)) p.push_back(static_cast<float>(x));
        std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
        Buf copy(cdt, n);
        for (int step = 1; step <= 3; ++step) {
          Buf grad = rand_buf(gdt, n, seed++);
          const float bias1 = 1.0f - std::pow(b1, static_cast<float>(step));
          const float bias2 = 1.0f - std::pow(b2, static_cast<float>(step));
          AdamWArgs a;
          a.param = p.data(), a.grad = grad.data(), a.grad_dt = gdt, a.m = m.data(), a.v = v.data(), a.n = n;
          a.lr = lr, a.beta1 = b1, a.beta2 = b2, a.eps = eps, a.weight_decay = wd;
          a.bias1 = bias1, a.bias2 = bias2, a.grad_scale = gs;
          a.param_copy = copy.data(), a.copy_dt = cdt;
          cpu::adamw(a);
          const std::vector<double> g = grad.vals();
          for (int64_t i = 0; i < n; ++i) {
            const double gi = g[i] * gs;
            rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
            rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
            rp[i] -= lr * (rm[i] / bias1 / (std::sqrt(rv[i] / bias2) + eps) + wd * rp[i]);
          }
          EXPECT_LT(rel_err(std::vector<double>(m.begin(), m.end()), rm), 1e-5) << "step " << step;
          EXPECT_LT(rel_err(std::vector<double>(v.begin(), v.end()), rv), 1e-5) << "step " << step;
          EXPECT_LT(rel_err(std::vector<double>(p.begin(), p.end()), rp), 1e-6) << "step " << step;
          for (int64_t i = 0; i < n; ++i) {
            Buf one(cdt, 1);
            one.set(0, p[i]);
            ASSERT_EQ(copy.get(i), one.get(0)) << "param_copy is the rounded updated param";
          }
        }
      }
}

TEST(AdamWCpu, NoCopyAndFirstStepSize) {
  // Step 1 with bias correction moves each param by ~lr * sign(g) (eps, wd = 0).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f), g = {0.3f, -4.0f, 1e-3f};
  AdamWArgs a;
  a.param = p.data(), a.grad = g.data(), a.m = m.data(), a.v = v.data(), a.n = 3;
  a.lr = 0.1f, a.eps = 0.0f, a.bias1 = 1.0f - 0.9f, a.bias2 = 1.0f - 0.999f;
  cpu::adamw(a);
  EXPECT_NEAR(p[0], 0.9f, 1e-5);
  EXPECT_NEAR(p[1], -1.9f, 1e-5);
  EXPECT_NEAR(p[2], 0.4f, 1e-5);
}

TEST(AdamWCpu, Errors) {
  std::vector<float> p(4), m(4), v(4);
  std::vector<int32_t> g(4);
  AdamWArgs a;
  a.param = p.data(), a.grad = g.data(), a.m = m.data(), a.v = v.data(), a.n = 4;
  a.grad_dt = DType::I32;
  expect_error([&] { cpu::adamw(a); }, "adamw: unsupported dtype i32");
  a.grad_dt = DType::F32;
  a.param_copy = g.data();
  a.copy_dt = DType::I32;
  expect_error([&] { cpu::adamw(a); }, "param_copy dtype i32");
}

}  // namespace
}  // namespace bt::test
