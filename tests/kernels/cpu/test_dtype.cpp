// Host bf16 / f16 conversions in kernels/common/dtype.h, against known bit
// patterns and an independent nearest-value search.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/dtype.h"

namespace bt {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Bf16, KnownRounding) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f808000)), 0x3f80);  // tie, even below: down
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f818000)), 0x3f82);  // tie, odd below: up
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f808001)), 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f807fff)), 0x3f80);  // just below the tie
  EXPECT_EQ(float_to_bf16_bits(from_bits(0xbf818000)), 0xbf82);  // sign symmetric
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00000001)), 0x0000);  // tiny subnormal -> 0
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00018000)), 0x0002);  // subnormal tie -> even
}

TEST(Bf16, InfNanOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16_bits(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-inf), 0xff80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x7f7f7fff)), 0x7f7f);              // largest finite stays
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu, 0x7f80ffffu}) {
    const uint16_t h = float_to_bf16_bits(from_bits(nan));
    EXPECT_EQ(h & 0x7f80, 0x7f80) << std::hex << nan;
    EXPECT_NE(h & 0x007f, 0) << "NaN " << std::hex << nan << " became inf";
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(h)));
  }
  EXPECT_TRUE(std::isinf(bf16_bits_to_float(0x7f80)));
}

TEST(Bf16, RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_bits_to_float(static_cast<uint16_t>(h));
    EXPECT_EQ(to_bits(f), h << 16);
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bf16_bits(f), h);
    }
  }
}

// Reference: of the two bf16 values bracketing f (truncation and next up in
// magnitude), take the nearer; on a tie the one with an even last bit.
uint16_t bf16_reference(float f) {
  const uint32_t u = to_bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = x - std::fabs(static_cast<double>(bf16_bits_to_float(lo)));
  const double dhi = std::fabs(static_cast<double>(bf16_bits_to_float(hi))) - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(Bf16, RandomAgainstReference) {
  std::mt19937 gen(123);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = gen();
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // skip inf/NaN; exponent 0xfe handled below
    if ((u & 0x7fffffffu) >= 0x7f7f8000u) continue;  // hi would be inf: covered by InfNanOverflow
    ASSERT_EQ(float_to_bf16_bits(from_bits(u)), bf16_reference(from_bits(u))) << std::hex << u;
  }
}

TEST(F16, KnownValues) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16_bits(0.5f), 0x3800);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7bff);  // below the overflow midpoint
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);  // tie with 65536 -> even -> inf
  EXPECT_EQ(float_to_f16_bits(1e10f), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  // 1 + 2^-11 is the tie between 1 and 1 + 2^-10: even (1.0). 1 + 3*2^-11 -> up.
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f16_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_bits_to_float(0xc000), -2.0f);
}

TEST(F16, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  EXPECT_EQ(float_to_f16_bits(tiny), 0x0001);
  EXPECT_EQ(float_to_f16_bits(-tiny), 0x8001);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);         // tie 0 / 1 -> 0
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25) * 1.5f), 0x0001);  // above the tie
  EXPECT_EQ(float_to_f16_bits(3 * std::ldexp(1.0f, -25)), 0x0002);     // tie 1 / 2 -> 2
  EXPECT_EQ(float_to_f16_bits(1023 * tiny), 0x03ff);                   // largest subnormal
  EXPECT_EQ(float_to_f16_bits(1023.5f * tiny), 0x0400);                // tie -> smallest normal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_f16_bits(1e-10f), 0x0000);
  EXPECT_EQ(f16_bits_to_float(0x0001), tiny);
  EXPECT_EQ(f16_bits_to_float(0x8001), -tiny);
  EXPECT_EQ(f16_bits_to_float(0x03ff), 1023 * tiny);
}

TEST(F16, InfNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_f16_bits(inf), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-inf), 0xfc00);
  EXPECT_TRUE(std::isinf(f16_bits_to_float(0x7c00)));
  EXPECT_LT(f16_bits_to_float(0xfc00), 0.0f);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00000u}) {
    const uint16_t h = float_to_f16_bits(from_bits(nan));
    EXPECT_EQ(h & 0x7c00, 0x7c00);
    EXPECT_NE(h & 0x03ff, 0);
  }
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7c01)));
}

TEST(F16, RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_f16_bits(f), h) << std::hex << h;
  }
}

// Reference: nearest of all finite non-negative f16 values by binary search,
// ties to the even pattern; beyond the overflow midpoint (65520) infinity.
TEST(F16, RandomAgainstReference) {
  std::vector<std::pair<double, uint16_t>> table;
  for (uint32_t h = 0; h < 0x7c00; ++h) table.emplace_back(f16_bits_to_float(static_cast<uint16_t>(h)), h);
  auto reference = [&](float f) -> uint16_t {
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double x = std::fabs(static_cast<double>(f));
    if (x >= 65520.0) return sign | 0x7c00;
    auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(x, uint16_t{0}));
    if (it == table.end()) return sign | 0x7bff;
    if (it->first == x || it == table.begin()) return sign | it->second;
    const auto below = *(it - 1);
    const double dlo = x - below.first, dhi = it->first - x;
    if (dlo < dhi) return sign | below.second;
    if (dhi < dlo) return sign | it->second;
    return sign | ((below.second & 1) ? it->second : below.second);
  };
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> expo(-27.0f, 17.0f);
  for (int i = 0; i < 300000; ++i) {
    // Log-uniform magnitudes over the f16 range (subnormal to overflow), random sign.
    float f = std::exp2(expo(gen));
    if (gen() & 1) f = -f;
    ASSERT_EQ(float_to_f16_bits(f), reference(f)) << f;
    // And exact midpoints between neighbours, which must tie to even.
    const uint16_t h = static_cast<uint16_t>(gen() % 0x7bff);
    const double mid = (static_cast<double>(f16_bits_to_float(h)) + f16_bits_to_float(h + 1)) / 2;
    ASSERT_EQ(float_to_f16_bits(static_cast<float>(mid)), reference(static_cast<float>(mid))) << mid;
  }
}

TEST(DType, SizesNamesParse) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_GT(dtype_size(t), 0u);
  }
  EXPECT_EQ(dtype_size(DType::BF16), sizeof(bf16));
  EXPECT_EQ(dtype_size(DType::F16), sizeof(f16));
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_TRUE(is_floating(DType::BF16));
  EXPECT_FALSE(is_floating(DType::I32));
}

}  // namespace
}  // namespace bt
