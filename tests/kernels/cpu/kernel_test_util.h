// Helpers shared by the CPU kernel tests: typed buffers built from doubles,
// random data, and the relative-error metric with per-dtype tolerances.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/dtype.h"
#include "kernels/common/error.h"

namespace bt::test {

inline constexpr DType kFloatTypes[] = {DType::F32, DType::F64, DType::BF16};

/// A raw buffer of `dt` elements (F32, F64 or BF16), as a kernel sees it.
struct Buf {
  DType dt = DType::F32;
  int64_t n = 0;
  std::vector<unsigned char> bytes;

  Buf() = default;
  Buf(DType t, int64_t count) : dt(t), n(count), bytes(static_cast<size_t>(count) * dtype_size(t)) {}
  Buf(DType t, const std::vector<double>& v) : Buf(t, static_cast<int64_t>(v.size())) {
    for (int64_t i = 0; i < n; ++i) set(i, v[i]);
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }

  void set(int64_t i, double x) {
    unsigned char* p = bytes.data() + i * dtype_size(dt);
    if (dt == DType::F32) {
      const float f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
    } else if (dt == DType::F64) {
      std::memcpy(p, &x, 8);
    } else if (dt == DType::BF16) {
      const uint16_t h = float_to_bf16_bits(static_cast<float>(x));
      std::memcpy(p, &h, 2);
    } else {
      ADD_FAILURE() << "Buf: unsupported dtype";
    }
  }
  double get(int64_t i) const {
    const unsigned char* p = bytes.data() + i * dtype_size(dt);
    if (dt == DType::F32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    if (dt == DType::F64) {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return bf16_bits_to_float(h);
  }
  /// All elements as doubles (the exact stored values).
  std::vector<double> vals() const {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = get(i);
    return v;
  }
};

inline std::vector<double> randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline std::vector<double> randu(size_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// Random values quantized to dt: the returned Buf and its exact values agree.
inline Buf rand_buf(DType dt, size_t n, uint32_t seed, double scale = 1.0) {
  return Buf(dt, randn(n, seed, scale));
}

/// ||out - ref|| / ||ref|| (or ||out - ref|| when ref is all zeros).
inline double rel_err(const std::vector<double>& out, const std::vector<double>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (std::isnan(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// The acceptance bound for rel_err on each dtype.
inline double tol(DType dt) {
  switch (dt) {
    case DType::F64:
      return 1e-12;
    case DType::F32:
      return 1e-5;
    default:
      return 1e-2;
  }
}

/// Runs f and checks that it throws bt::Error whose message contains `needle`.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected bt::Error containing '" << needle << "'";
  } catch (const bt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

inline std::string name_of(DType dt) { return std::string(dtype_name(dt)); }

}  // namespace bt::test
