// Rounding to TF32 and the 3xTF32 split (kernels/common/tf32.h, Note [3xTF32]
// in kernels/gemm.h): exact values at and around ties, negative values, the
// carry into the exponent, overflow, subnormals, inf and NaN; random values
// against a rounding computed in double; and the split's exactness.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "kernels/common/tf32.h"

namespace bt::kernels {
namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
/// A TF32 value: its low 13 mantissa bits are zero.
bool is_tf32(float x) { return (bits(x) & 0x1fffu) == 0; }

/// x rounded to 11 significant bits, to nearest with ties away from zero,
/// computed in double from the definition (normal x only).
double reference_tf32(float x) {
  const double d = x;
  const double q = std::ldexp(1.0, std::ilogb(d) - 10);  // the last kept bit
  const double t = std::fabs(d) / q;
  const double r = std::floor(t) + (t - std::floor(t) >= 0.5 ? 1.0 : 0.0);
  return std::copysign(r * q, d);
}

TEST(Tf32, RoundsToNearestWithTiesAwayFromZero) {
  const float u = 0x1p-10f;  // the last stored bit of TF32 at 1
  EXPECT_EQ(round_to_tf32(1.0f), 1.0f);
  EXPECT_EQ(round_to_tf32(1.0f + u), 1.0f + u) << "a TF32 value stays";
  EXPECT_EQ(round_to_tf32(1.0f + u / 2), 1.0f + u) << "a tie with an even last bit goes up (away from zero)";
  EXPECT_EQ(round_to_tf32(1.0f + 3 * u / 2), 1.0f + 2 * u) << "a tie with an odd last bit goes up too";
  EXPECT_EQ(round_to_tf32(1.0f + u / 2 - 0x1p-23f), 1.0f) << "just below the tie";
  EXPECT_EQ(round_to_tf32(1.0f + u / 2 + 0x1p-23f), 1.0f + u) << "just above the tie";
  EXPECT_EQ(round_to_tf32(4099.0f), 4100.0f);  // 13 significant bits: 4099 = 4096 + 3
  EXPECT_EQ(round_to_tf32(1024.5f), 1025.0f);  // 12 bits, a tie
}

TEST(Tf32, NegativeValuesRoundTheirMagnitude) {
  const float u = 0x1p-10f;
  EXPECT_EQ(round_to_tf32(-1.0f - u / 2), -1.0f - u) << "a tie goes away from zero";
  EXPECT_EQ(round_to_tf32(-1.0f - u / 2 + 0x1p-23f), -1.0f);
  EXPECT_EQ(round_to_tf32(-4099.0f), -4100.0f);
  EXPECT_EQ(bits(round_to_tf32(-0.0f)), bits(-0.0f));
  EXPECT_EQ(bits(round_to_tf32(0.0f)), 0u);
}

TEST(Tf32, CarriesIntoTheExponentAndOverflowsToInfinity) {
  EXPECT_EQ(round_to_tf32(std::nextafter(2.0f, 0.0f)), 2.0f);
  const float max_tf32 = from_bits(0x7f7fe000u);  // (2 - 2^-10) 2^127
  EXPECT_EQ(round_to_tf32(max_tf32), max_tf32);
  EXPECT_EQ(round_to_tf32(from_bits(0x7f7fefffu)), max_tf32) << "below the midpoint to 2^128";
  EXPECT_EQ(round_to_tf32(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_tf32(-std::numeric_limits<float>::max()), -std::numeric_limits<float>::infinity());
}

TEST(Tf32, SubnormalsRoundLikeTheRest) {
  EXPECT_EQ(bits(round_to_tf32(from_bits(0x1u))), 0u) << "the smallest subnormal rounds to zero";
  EXPECT_EQ(bits(round_to_tf32(from_bits(0x1000u))), 0x2000u) << "a subnormal tie goes away from zero";
  EXPECT_EQ(bits(round_to_tf32(from_bits(0x807fffffu))), 0x80800000u) << "into the smallest normal";
}

TEST(Tf32, InfinityAndNanPassThrough) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_tf32(inf), inf);
  EXPECT_EQ(round_to_tf32(-inf), -inf);
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff801234u}) {
    const float r = round_to_tf32(from_bits(nan));
    EXPECT_TRUE(std::isnan(r)) << std::hex << nan << " -> " << bits(r);
    EXPECT_TRUE(is_tf32(r)) << std::hex << nan << " -> " << bits(r) << ": a tensor core would cut it";
    EXPECT_EQ(bits(r) >> 31, nan >> 31) << "sign kept";
  }
}

TEST(Tf32, RandomValuesMatchARoundingInDouble) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> any;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(any(gen));
    if (!std::isnormal(x) || std::fabs(x) > 0x1p127f) continue;
    const float r = round_to_tf32(x);
    ASSERT_EQ(static_cast<double>(r), reference_tf32(x)) << x << " (bits " << std::hex << bits(x) << ")";
    ASSERT_TRUE(is_tf32(r));
    ++checked;
  }
  EXPECT_GT(checked, 150000);
}

// x = big + small + rest: x - big is exact, both parts are TF32 values, and
// the rest is at most 2^-22 |x| (half the last bit of small, itself at most
// half the last bit of big).
TEST(Tf32, SplitKeepsTwentyTwoBits) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = normal(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 60) - 30);
    if (x == 0.0f) continue;
    const Tf32Split s = split_tf32(x);
    ASSERT_TRUE(is_tf32(s.big) && is_tf32(s.small)) << x;
    ASSERT_EQ(static_cast<double>(x - s.big), static_cast<double>(x) - s.big) << x << ": x - big is exact";
    const double rest = static_cast<double>(x) - s.big - s.small;
    ASSERT_LE(std::fabs(rest), 0x1p-22 * std::fabs(x)) << x;
    ASSERT_LE(std::fabs(s.small), 0x1p-11 * std::fabs(x)) << x;
  }
  EXPECT_EQ(split_tf32(4099.0f).small, -1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(split_tf32(inf).big, inf);
  EXPECT_EQ(split_tf32(inf).small, 0.0f) << "not inf - inf";
  EXPECT_EQ(split_tf32(std::numeric_limits<float>::max()).small, 0.0f) << "its big part overflowed";
  EXPECT_TRUE(std::isnan(split_tf32(std::numeric_limits<float>::quiet_NaN()).big));
}

}  // namespace
}  // namespace bt::kernels
