// strided_copy / fill / arange on every dtype and every conversion pair.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/copy.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::StridedLayout;
namespace cpu = kernels::cpu;

// ---- the test's own encoder/decoder (exact for the values used) ----

void encode(DType dt, void* base, int64_t i, double v) {
  unsigned char* p = static_cast<unsigned char*>(base) + i * dtype_size(dt);
  auto put = [&](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (dt) {
    case DType::F32:
      return put(static_cast<float>(v));
    case DType::F64:
      return put(v);
    case DType::BF16:
      return put(float_to_bf16_bits(static_cast<float>(v)));
    case DType::F16:
      return put(float_to_f16_bits(static_cast<float>(v)));
    case DType::I32:
      return put(static_cast<int32_t>(v));
    case DType::I64:
      return put(static_cast<int64_t>(v));
    case DType::U16:
      return put(static_cast<uint16_t>(v));
    case DType::U8:
      return put(static_cast<uint8_t>(v));
    case DType::Bool:
      return put(static_cast<uint8_t>(v != 0));
  }
}

double decode(DType dt, const void* base, int64_t i) {
  const unsigned char* p = static_cast<const unsigned char*>(base) + i * dtype_size(dt);
  auto get = [&](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (dt) {
    case DType::F32:
      return get(float{});
    case DType::F64:
      return get(double{});
    case DType::BF16:
      return bf16_bits_to_float(get(uint16_t{}));
    case DType::F16:
      return f16_bits_to_float(get(uint16_t{}));
    case DType::I32:
      return get(int32_t{});
    case DType::I64:
      return static_cast<double>(get(int64_t{}));
    case DType::U16:
      return get(uint16_t{});
    case DType::U8:
      return get(uint8_t{});
    case DType::Bool:
      return get(uint8_t{});
  }
  return NAN;
}

bool is_int(DType dt) { return !is_floating(dt) && dt != DType::Bool; }

double int_min(DType dt) {
  switch (dt) {
    case DType::I32:
      return -2147483648.0;
    case DType::I64:
      return -9223372036854775808.0;
    default:
      return 0;
  }
}
double int_max(DType dt) {
  switch (dt) {
    case DType::I32:
      return 2147483647.0;
    case DType::I64:
      return 9223372036854775807.0;
    case DType::U16:
      return 65535;
    case DType::U8:
      return 255;
    default:
      return 1;
  }
}

/// v is exactly a value of dt.
bool representable(DType dt, double v) {
  switch (dt) {
    case DType::F64:
      return true;
    case DType::F32:
      return static_cast<double>(static_cast<float>(v)) == v;
    case DType::BF16:
      return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v))) == v;
    case DType::F16:
      return f16_bits_to_float(float_to_f16_bits(static_cast<float>(v))) == v;
    case DType::Bool:
      return v == 0 || v == 1;
    default:
      return v == std::trunc(v) && v >= int_min(dt) && v <= int_max(dt);
  }
}

StridedLayout contiguous1d(int64_t n) {
  StridedLayout l;
  l.ndim = 1;
  l.shape[0] = n;
  l.strides[0] = 1;
  return l;
}

TEST(CopyCpu, AllConversionPairsExactValues) {
  const std::vector<double> values = {0,     1,       -1,   2,   3,    -3.25, 0.5,   2.5,    -1.75,
                                      7,     100,     -100, 127, -128, 200,   255,   1000,   -2048,
                                      65504, 0.15625, 1e-3, 1e6, -1e9, 40000, 1e-30, 0x1p100};
  int checked = 0;
  for (DType s : kAllDTypes)
    for (DType d : kAllDTypes) {
      std::vector<double> src_vals, expect;
      for (double v : values) {
        if (!representable(s, v)) continue;
        double e;
        if (d == DType::Bool) {
          e = v != 0 ? 1 : 0;
        } else if (is_int(d)) {
          e = std::trunc(v);
          if (e < int_min(d) || e > int_max(d)) continue;  // wrap/saturate: tested separately
        } else {
          if (!representable(d, v)) continue;  // rounding: tested separately
          e = v;
        }
        src_vals.push_back(v);
        expect.push_back(e);
      }
      const int64_t n = static_cast<int64_t>(src_vals.size());
      ASSERT_GE(n, 2) << dtype_name(s) << "->" << dtype_name(d);
      std::vector<unsigned char> src(n * dtype_size(s)), dst(n * dtype_size(d), 0xAB),
          rev(n * dtype_size(d), 0xAB);
      for (int64_t i = 0; i < n; ++i) encode(s, src.data(), i, src_vals[i]);
      cpu::strided_copy(s, src.data(), contiguous1d(n), d, dst.data());
      // Reversed view: stride -1 from the last element (the strided path).
      StridedLayout r = contiguous1d(n);
      r.strides[0] = -1;
      cpu::strided_copy(s, src.data() + (n - 1) * dtype_size(s), r, d, rev.data());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(decode(d, dst.data(), i), expect[i])
            << dtype_name(s) << "->" << dtype_name(d) << " value " << src_vals[i];
        EXPECT_EQ(decode(d, rev.data(), i), expect[n - 1 - i])
            << dtype_name(s) << "->" << dtype_name(d) << " reversed, value " << src_vals[n - 1 - i];
      }
      ++checked;
    }
  EXPECT_EQ(checked, 81);
}

// Naive reference for a strided gather: nested index loops.
std::vector<double> gather_ref(const std::vector<double>& src, const StridedLayout& l, int64_t base) {
  int64_t n = 1;
  for (int d = 0; d < l.ndim; ++d) n *= l.shape[d];
  std::vector<double> out;
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rem = lin, off = base;
    for (int d = l.ndim - 1; d >= 0; --d) {
      off += (rem % l.shape[d]) * l.strides[d];
      rem /= l.shape[d];
    }
    out.push_back(src[off]);
  }
  return out;
}

TEST(CopyCpu, StridedViews) {
  struct Case {
    int ndim;
    std::vector<int64_t> shape, strides;
    int64_t base;  // element offset of the view's origin in the source buffer
  };
  const std::vector<Case> cases = {
      {0, {}, {}, 5},                                              // scalar
      {1, {17}, {1}, 0},                                           // contiguous
      {2, {3, 5}, {1, 3}, 0},                                      // transpose of [5, 3]
      {2, {4, 7}, {0, 1}, 2},                                      // broadcast rows
      {3, {2, 3, 4}, {12, 1, 3}, 0},                               // permuted
      {3, {3, 1, 5}, {-5, 99, 1}, 10},                             // negative stride, size-1 dim
      {2, {3, 4}, {8, 2}, 1},                                      // every other element
      {4, {2, 1, 3, 2}, {0, 7, 2, -1}, 1},                         // mixed
      {2, {0, 5}, {5, 1}, 0},                                      // empty
      {8, {1, 2, 1, 2, 1, 2, 1, 2}, {0, 8, 0, 4, 0, 2, 0, 1}, 0},  // kMaxDims
  };
  const std::vector<double> src = randn(64, 3);
  const std::pair<DType, DType> pairs[] = {{DType::F32, DType::F32},
                                           {DType::F32, DType::F64},
                                           {DType::F32, DType::BF16},
                                           {DType::BF16, DType::F32},
                                           {DType::F16, DType::F64}};
  for (const auto& c : cases)
    for (auto [s, d] : pairs) {
      StridedLayout l;
      l.ndim = c.ndim;
      for (int i = 0; i < c.ndim; ++i) l.shape[i] = c.shape[i], l.strides[i] = c.strides[i];
      std::vector<unsigned char> sb(src.size() * dtype_size(s));
      std::vector<double> exact(src.size());
      for (size_t i = 0; i < src.size(); ++i) {
        encode(s, sb.data(), static_cast<int64_t>(i), src[i]);
        exact[i] = decode(s, sb.data(), static_cast<int64_t>(i));
      }
      const std::vector<double> ref = gather_ref(exact, l, c.base);
      std::vector<unsigned char> db(std::max<size_t>(ref.size(), 1) * dtype_size(d));
      cpu::strided_copy(s, sb.data() + c.base * dtype_size(s), l, d, db.data());
      for (size_t i = 0; i < ref.size(); ++i) {
        // The destination rounds to nearest: compare with the test's own rounding.
        std::vector<unsigned char> one(dtype_size(d));
        encode(d, one.data(), 0, ref[i]);
        EXPECT_EQ(decode(d, db.data(), static_cast<int64_t>(i)), decode(d, one.data(), 0))
            << "ndim " << c.ndim << " " << dtype_name(s) << "->" << dtype_name(d) << " at " << i;
      }
    }
}

TEST(CopyCpu, RoundingToNarrowFloats) {
  auto cast1 = [](DType s, double v, DType d) {
    std::vector<unsigned char> a(8), b(8);
    encode(s, a.data(), 0, v);
    cpu::strided_copy(s, a.data(), contiguous1d(1), d, b.data());
    return decode(d, b.data(), 0);
  };
  // f32 -> bf16: nearest even on ties.
  EXPECT_EQ(cast1(DType::F32, 1.0 + std::ldexp(1.0, -8), DType::BF16), 1.0);
  EXPECT_EQ(cast1(DType::F32, 1.0 + 3 * std::ldexp(1.0, -8), DType::BF16), 1.0 + std::ldexp(1.0, -6));
  // f64 -> bf16 must not double-round through float: 1 + 2^-8 + 2^-30 is just
  // above the tie, so it rounds up (via float it would tie and round down).
  EXPECT_EQ(cast1(DType::F64, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), DType::BF16),
            1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(cast1(DType::F64, -(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)), DType::BF16),
            -(1.0 + std::ldexp(1.0, -7)));
  EXPECT_EQ(cast1(DType::F64, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), DType::F16),
            1.0 + std::ldexp(1.0, -10));
  EXPECT_EQ(cast1(DType::F64, 1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -30), DType::BF16), 1.0);
  // f64 beyond the float range -> inf in bf16 and f16.
  EXPECT_TRUE(std::isinf(cast1(DType::F64, 1e300, DType::BF16)));
  EXPECT_TRUE(std::isinf(cast1(DType::F64, -1e300, DType::F16)));
  EXPECT_EQ(cast1(DType::F64, 1e-300, DType::BF16), 0.0);
  EXPECT_TRUE(std::isnan(cast1(DType::F64, NAN, DType::BF16)));
  EXPECT_TRUE(std::isnan(cast1(DType::F32, NAN, DType::F16)));
  // i64 -> bf16 / f32, large values, correctly rounded from the integer.
  std::vector<unsigned char> a(8), b(8);
  const int64_t big = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;  // just above a bf16 tie
  std::memcpy(a.data(), &big, 8);
  cpu::strided_copy(DType::I64, a.data(), contiguous1d(1), DType::BF16, b.data());
  EXPECT_EQ(decode(DType::BF16, b.data(), 0), std::ldexp(1.0, 60) + std::ldexp(1.0, 53));
  const int64_t big2 = (int64_t{1} << 40) + (int64_t{1} << 16) + 1;  // above a float tie
  std::memcpy(a.data(), &big2, 8);
  cpu::strided_copy(DType::I64, a.data(), contiguous1d(1), DType::F32, b.data());
  EXPECT_EQ(decode(DType::F32, b.data(), 0), std::ldexp(1.0, 40) + std::ldexp(1.0, 17));
}

TEST(CopyCpu, FloatToIntTruncatesSaturatesAndZeroesNan) {
  const double inf = std::numeric_limits<double>::infinity();
  struct C {
    double v;
    DType d;
    double expect;
  };
  const C cases[] = {{2.9, DType::I32, 2},
                     {-2.9, DType::I32, -2},
                     {1e20, DType::I32, 2147483647.0},
                     {-1e20, DType::I32, -2147483648.0},
                     {NAN, DType::I32, 0},
                     {inf, DType::U8, 255},
                     {-5.5, DType::U8, 0},
                     {300, DType::U8, 255},
                     {-inf, DType::I64, -9223372036854775808.0},
                     {70000, DType::U16, 65535},
                     {-0.0, DType::U16, 0},
                     {NAN, DType::Bool, 1},
                     {-0.0, DType::Bool, 0},
                     {0.25, DType::Bool, 1}};
  for (const C& c : cases)
    for (DType s : {DType::F64, DType::F32}) {
      std::vector<unsigned char> a(8), b(8);
      encode(s, a.data(), 0, c.v);
      cpu::strided_copy(s, a.data(), contiguous1d(1), c.d, b.data());
      EXPECT_EQ(decode(c.d, b.data(), 0), c.expect) << c.v << " -> " << dtype_name(c.d);
    }
  // Integer -> narrower integer wraps (two's complement).
  const int64_t x = 300;
  std::vector<unsigned char> b(8);
  cpu::strided_copy(DType::I64, &x, contiguous1d(1), DType::U8, b.data());
  EXPECT_EQ(decode(DType::U8, b.data(), 0), 44);
  // A bool byte other than 0/1 still reads as true.
  const uint8_t two = 2;
  cpu::strided_copy(DType::Bool, &two, contiguous1d(1), DType::F32, b.data());
  EXPECT_EQ(decode(DType::F32, b.data(), 0), 1.0);
}

TEST(CopyCpu, FillAllDtypes) {
  for (DType dt : kAllDTypes)
    for (int64_t n : {0, 1, 3, 17}) {
      std::vector<unsigned char> buf(std::max<int64_t>(n, 1) * dtype_size(dt), 0xCD);
      const double v = dt == DType::Bool ? 1.0 : 3.0;
      cpu::fill(dt, buf.data(), n, v);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(decode(dt, buf.data(), i), v) << dtype_name(dt);
      if (n == 0) {
        EXPECT_EQ(buf[0], 0xCD);
      }
    }
  std::vector<unsigned char> buf(16);
  cpu::fill(DType::BF16, buf.data(), 2, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  EXPECT_EQ(decode(DType::BF16, buf.data(), 1), 1.0 + std::ldexp(1.0, -7));
  cpu::fill(DType::Bool, buf.data(), 3, -7.0);
  EXPECT_EQ(decode(DType::Bool, buf.data(), 2), 1.0);
  cpu::fill(DType::I32, buf.data(), 2, -7.9);
  EXPECT_EQ(decode(DType::I32, buf.data(), 1), -7.0);
}

TEST(CopyCpu, ArangeAllDtypes) {
  for (DType dt : kAllDTypes) {
    const int64_t n = dt == DType::Bool ? 2 : 33;
    const double start = dt == DType::Bool ? 0 : 2, step = dt == DType::Bool ? 1 : 3;
    std::vector<unsigned char> buf(n * dtype_size(dt));
    cpu::arange(dt, buf.data(), n, start, step);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(decode(dt, buf.data(), i), start + i * step) << dtype_name(dt);
  }
  std::vector<double> d(5);
  cpu::arange(DType::F64, d.data(), 5, 1.0, -0.25);
  EXPECT_EQ(d, (std::vector<double>{1.0, 0.75, 0.5, 0.25, 0.0}));
  std::vector<float> f(11);
  cpu::arange(DType::F32, f.data(), 11, 0.0, 0.1);
  for (int i = 0; i < 11; ++i) EXPECT_EQ(f[i], static_cast<float>(i * 0.1));
}

TEST(CopyCpu, Errors) {
  std::vector<unsigned char> buf(64);
  const DType bad = static_cast<DType>(99);
  expect_error([&] { cpu::fill(bad, buf.data(), 2, 1.0); }, "fill");
  expect_error([&] { cpu::arange(bad, buf.data(), 2, 0.0, 1.0); }, "arange");
  expect_error([&] { cpu::strided_copy(DType::F32, buf.data(), contiguous1d(2), bad, buf.data() + 32); },
               "strided_copy");
  expect_error([&] { cpu::fill(DType::F32, buf.data(), -1, 1.0); }, "n must be >= 0");
  StridedLayout l = contiguous1d(2);
  l.ndim = 9;
  EXPECT_THROW(cpu::strided_copy(DType::F32, buf.data(), l, DType::F32, buf.data() + 32), Error);
  l = contiguous1d(-3);
  expect_error([&] { cpu::strided_copy(DType::F32, buf.data(), l, DType::F32, buf.data() + 32); },
               "negative");
}

}  // namespace
}  // namespace bt::test
