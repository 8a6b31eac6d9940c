// Philox fills: known-answer Philox, determinism, offset semantics, dtype
// handling, and the statistics of the uniform and normal transforms.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/philox.h"
#include "kernels/random.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;
namespace philox = kernels::philox;

TEST(RandomCpu, PhiloxKnownAnswer) {
  // Random123 kat_vectors: philox4x32_10, counter 0, key 0.
  const philox::U32x4 r = philox::philox4x32_10(0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

std::vector<float> uniform(int64_t n, uint64_t seed, uint64_t offset, float lo = 0, float hi = 1) {
  std::vector<float> v(n);
  cpu::fill_uniform(DType::F32, v.data(), n, seed, offset, lo, hi);
  return v;
}
std::vector<float> normal(int64_t n, uint64_t seed, uint64_t offset, float mean = 0, float std = 1) {
  std::vector<float> v(n);
  cpu::fill_normal(DType::F32, v.data(), n, seed, offset, mean, std);
  return v;
}

TEST(RandomCpu, DeterministicAndSeedDependent) {
  EXPECT_EQ(uniform(1000, 42, 0), uniform(1000, 42, 0));
  EXPECT_EQ(normal(1000, 42, 7), normal(1000, 42, 7));
  EXPECT_NE(uniform(1000, 42, 0), uniform(1000, 43, 0));
  EXPECT_NE(normal(1000, 42, 0), normal(1000, (1ull << 32) | 42, 0));  // high key word matters
}

TEST(RandomCpu, OffsetShiftsTheStream) {
  for (int64_t n : {1, 3, 17, 33, 1000}) {
    const std::vector<float> u0 = uniform(n + 5, 9, 0), u5 = uniform(n, 9, 5);
    const std::vector<float> z0 = normal(n + 5, 9, 0), z5 = normal(n, 9, 5);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(u5[i], u0[i + 5]) << i;
      ASSERT_EQ(z5[i], z0[i + 5]) << i;
    }
  }
  // Counters above 2^32 use the high counter word.
  EXPECT_NE(uniform(4, 1, 1ull << 32), uniform(4, 1, 0));
}

TEST(RandomCpu, MatchesIndependentTransform) {
  // Element i uses Philox(counter = offset + i, key = seed); recompute the
  // transforms here with libm's log/cos in double: they agree to ~1 ulp of float.
  const uint64_t seed = 0x1234567890abcdefull, offset = 1000;
  const int64_t n = 4096;
  const std::vector<float> u = uniform(n, seed, offset, -2.0f, 3.0f), z = normal(n, seed, offset, 0.5f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    const philox::U32x4 r = philox::philox4x32_10(offset + i, seed);
    const double u01 = (r.v[0] >> 8) / 16777216.0;
    EXPECT_NEAR(u[i], -2.0 + 5.0 * u01, 1e-6) << i;
    const double u1 = ((r.v[0] >> 8) + 1u) / 16777216.0, u2 = (r.v[1] >> 8) / 16777216.0;
    const double zr = 0.5 + 2.0 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2);
    EXPECT_NEAR(z[i], zr, 1e-6 * std::max(1.0, std::fabs(zr))) << i;
  }
}

TEST(RandomCpu, DtypesStoreTheFloatValue) {
  const int64_t n = 257;
  const std::vector<float> u = uniform(n, 5, 11, -1, 1), z = normal(n, 5, 11);
  for (bool is_normal : {false, true}) {
    const std::vector<float>& f = is_normal ? z : u;
    std::vector<double> d(n);
    std::vector<uint16_t> b(n), h(n);
    if (is_normal) {
      cpu::fill_normal(DType::F64, d.data(), n, 5, 11, 0, 1);
      cpu::fill_normal(DType::BF16, b.data(), n, 5, 11, 0, 1);
      cpu::fill_normal(DType::F16, h.data(), n, 5, 11, 0, 1);
    } else {
      cpu::fill_uniform(DType::F64, d.data(), n, 5, 11, -1, 1);
      cpu::fill_uniform(DType::BF16, b.data(), n, 5, 11, -1, 1);
      cpu::fill_uniform(DType::F16, h.data(), n, 5, 11, -1, 1);
    }
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(d[i], static_cast<double>(f[i]));
      EXPECT_EQ(b[i], float_to_bf16_bits(f[i]));
      EXPECT_EQ(h[i], float_to_f16_bits(f[i]));
    }
  }
}

TEST(RandomCpu, UniformStatistics) {
  const int64_t n = 100000;
  const std::vector<float> u = uniform(n, 77, 0, -3.0f, 5.0f);
  double sum = 0, sq = 0;
  for (float x : u) {
    ASSERT_GE(x, -3.0f);
    ASSERT_LT(x, 5.0f);
    sum += x;
    sq += x * x;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.03);  // se = 8/sqrt(12 n) ~ 0.007
  EXPECT_NEAR(var, 64.0 / 12.0, 0.1);
}

TEST(RandomCpu, NormalStatistics) {
  const int64_t n = 100000;
  const std::vector<float> z = normal(n, 2024, 123);
  double sum = 0, sq = 0, m4 = 0;
  int64_t beyond2 = 0;
  for (float x : z) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += static_cast<double>(x) * x;
    m4 += std::pow(static_cast<double>(x), 4);
    beyond2 += std::fabs(x) > 2.0f;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.015);  // se ~ 0.003
  EXPECT_NEAR(sd, 1.0, 0.015);    // se ~ 0.0022
  EXPECT_NEAR(m4 / n, 3.0, 0.1);  // normal kurtosis
  EXPECT_NEAR(static_cast<double>(beyond2) / n, 0.0455, 0.004);
  const std::vector<float> s = normal(n, 2024, 123, 10.0f, 0.5f);
  double ss = 0;
  for (float x : s) ss += x;
  EXPECT_NEAR(ss / n, 10.0, 0.01);
}

TEST(RandomCpu, Errors) {
  std::vector<int32_t> buf(4);
  expect_error([&] { cpu::fill_uniform(DType::I32, buf.data(), 4, 1, 0, 0, 1); }, "fill_uniform");
  expect_error([&] { cpu::fill_normal(DType::Bool, buf.data(), 4, 1, 0, 0, 1); }, "unsupported dtype bool");
  EXPECT_THROW(cpu::fill_normal(DType::F32, buf.data(), -1, 1, 0, 0, 1), Error);
}

}  // namespace
}  // namespace bt::test
