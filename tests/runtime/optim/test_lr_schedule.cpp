// CosineSchedule: warmup values, the cosine's endpoints and midpoint, and the floor after the end.
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/optim/lr_schedule.h"

namespace bt {
namespace {

TEST(CosineSchedule, WarmupThenCosineToTheFloor) {
  const CosineSchedule s{1e-3, 1e-4, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);  // (0+1)/10 of the peak
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);                          // p = 0
  EXPECT_NEAR(s.at(60), 1e-4 + 0.5 * (1e-3 - 1e-4), 1e-15);  // p = 1/2
  EXPECT_NEAR(s.at(110), 1e-4, 1e-15);                       // p = 1
  EXPECT_NEAR(s.at(500), 1e-4, 1e-15);                       // clamped past the end
  for (int64_t i = 10; i < 110; ++i) EXPECT_LE(s.at(i + 1), s.at(i)) << i;
}

TEST(CosineSchedule, NoWarmupStartsAtThePeak) {
  const CosineSchedule s{3e-4, 0.0, 0, 1};
  EXPECT_DOUBLE_EQ(s.at(0), 3e-4);
  EXPECT_NEAR(s.at(1), 0.0, 1e-18);
}

}  // namespace
}  // namespace bt
