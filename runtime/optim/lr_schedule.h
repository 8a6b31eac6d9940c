// Learning-rate schedule: linear warmup, then cosine decay to a floor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace bt {

struct CosineSchedule {
  double peak = 6e-4;
  double floor = 6e-5;
  int64_t warmup = 0;
  int64_t total = 1;

  /// The learning rate of 0-based optimizer step `s`: peak * (s+1) / warmup
  /// while s < warmup, then floor + (peak - floor) (1 + cos(pi p)) / 2 with
  /// p = (s - warmup) / max(1, total - warmup), clamped to [0, 1].
  double at(int64_t s) const {
    if (s < warmup) return peak * static_cast<double>(s + 1) / static_cast<double>(warmup);
    const double p = std::clamp(
        static_cast<double>(s - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup)), 0.0,
        1.0);
    return floor + 0.5 * (1.0 + std::cos(M_PI * p)) * (peak - floor);
  }
};

}  // namespace bt
