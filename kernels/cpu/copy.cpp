// CPU copy / cast / fill / arange over every dtype.
//
// Conversion rules (shared by strided_copy, fill and arange):
//   * to a floating type: correctly rounded, round to nearest even, from the
//     exact source value (double -> bf16/f16 and int64 -> bf16/f16 go through
//     a round-to-odd float, so there is no double rounding);
//   * floating -> integer: truncate toward zero, saturate to the target range,
//     NaN -> 0 (what CUDA's conversions do);
//   * integer -> integer: two's-complement wrap (C++20 static_cast);
//   * to bool: x != 0 (NaN is true); from bool: 0 or 1.
// Element ranges run in parallel; each element's conversion is the serial one.
#include "kernels/copy.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <limits>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {

struct Bool {  // storage of DType::Bool; read as byte != 0 so any byte is valid
  uint8_t v;
};

template <class T>
constexpr bool kFloating = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> ||
                           std::is_same_v<T, f16>;

template <class F>
decltype(auto) dispatch_all(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::F32:
      return f(std::type_identity<float>{});
    case DType::F64:
      return f(std::type_identity<double>{});
    case DType::BF16:
      return f(std::type_identity<bf16>{});
    case DType::F16:
      return f(std::type_identity<f16>{});
    case DType::I32:
      return f(std::type_identity<int32_t>{});
    case DType::I64:
      return f(std::type_identity<int64_t>{});
    case DType::U16:
      return f(std::type_identity<uint16_t>{});
    case DType::U8:
      return f(std::type_identity<uint8_t>{});
    case DType::Bool:
      return f(std::type_identity<Bool>{});
  }
  BT_FAIL(kernel, ": unsupported dtype code ", static_cast<int>(dt));
}

/// The float nearest d toward zero, with its last bit set when inexact
/// ("round to odd"); rounding it again to a format of <= 22 bits of precision
/// gives the correctly rounded result of d.
float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::isinf(f)) {
    f = std::copysign(FLT_MAX, f);
  } else if (std::fabs(static_cast<double>(f)) > std::fabs(d)) {
    f = std::nextafter(f, 0.0f);
  }
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= 1u;
  std::memcpy(&f, &u, 4);
  return f;
}

float round_to_odd_float(int64_t x) {
  const uint64_t mag = x < 0 ? uint64_t{0} - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  int shift = 0;
  while ((mag >> shift) >= (uint64_t{1} << 24)) ++shift;
  uint64_t m = mag >> shift;
  if (shift > 0 && (mag & ((uint64_t{1} << shift) - 1)) != 0) m |= 1u;  // sticky
  const float f = std::ldexp(static_cast<float>(m), shift);             // exact
  return x < 0 ? -f : f;
}

template <class T>
double to_double(T s) {  // exact for every floating storage type
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return static_cast<double>(static_cast<float>(s));
  else
    return static_cast<double>(s);
}

template <class I>
I saturate_trunc(double d) {
  if (std::isnan(d)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max());
  if (d <= lo) return std::numeric_limits<I>::min();
  if (d >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(d);
}

template <class D>
D from_double(double d) {
  if constexpr (std::is_same_v<D, double>)
    return d;
  else if constexpr (std::is_same_v<D, float>)
    return static_cast<float>(d);
  else if constexpr (std::is_same_v<D, bf16> || std::is_same_v<D, f16>)
    return D(round_to_odd_float(d));
  else if constexpr (std::is_same_v<D, Bool>)
    return Bool{static_cast<uint8_t>(d != 0.0)};
  else
    return saturate_trunc<D>(d);
}

template <class D>
D from_int(int64_t x) {
  if constexpr (std::is_same_v<D, double>)
    return static_cast<double>(x);
  else if constexpr (std::is_same_v<D, float>)
    return static_cast<float>(x);
  else if constexpr (std::is_same_v<D, bf16> || std::is_same_v<D, f16>)
    return D(round_to_odd_float(x));
  else if constexpr (std::is_same_v<D, Bool>)
    return Bool{static_cast<uint8_t>(x != 0)};
  else
    return static_cast<D>(x);
}

template <class D, class S>
D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<S, float> && (std::is_same_v<D, bf16> || std::is_same_v<D, f16>)) {
    return D(s);  // single rounding from float
  } else if constexpr (std::is_same_v<S, Bool>) {
    return from_int<D>(s.v != 0 ? 1 : 0);
  } else if constexpr (kFloating<S>) {
    return from_double<D>(to_double(s));
  } else {
    return from_int<D>(static_cast<int64_t>(s));
  }
}

constexpr int64_t kGrain = int64_t{1} << 15;  // elements per chunk

template <class S, class D>
void strided_copy_impl(const S* src, const StridedLayout& l, int64_t n, D* dst) {
  const bool contiguous = detail::is_contiguous(l);
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (contiguous) {
      for (int64_t i = lo; i < hi; ++i) dst[i] = convert<D>(src[i]);
      return;
    }
    detail::for_each_strided(l, l, lo, hi,
                             [&](int64_t i, int64_t off, int64_t) { dst[i] = convert<D>(src[off]); });
  });
}

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  constexpr int64_t kBytes = int64_t{1} << 18;  // bytes per chunk
  parallel_for(0, static_cast<int64_t>(bytes), kBytes, [&](int64_t lo, int64_t hi) {
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo,
                static_cast<size_t>(hi - lo));
  });
}

}  // namespace

void strided_copy(DType src_dt, const void* src, const StridedLayout& layout, DType dst_dt, void* dst) {
  const int64_t n = detail::checked_numel("strided_copy", layout);
  if (n == 0) return;
  BT_CHECK(src != nullptr && dst != nullptr, "strided_copy: null buffer for ", n, " elements");
  if (src_dt == dst_dt && detail::is_contiguous(layout)) {
    parallel_memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_dt));
    return;
  }
  dispatch_all(src_dt, "strided_copy", [&]<class S>(std::type_identity<S>) {
    dispatch_all(dst_dt, "strided_copy", [&]<class D>(std::type_identity<D>) {
      strided_copy_impl(static_cast<const S*>(src), layout, n, static_cast<D*>(dst));
    });
  });
}

void fill(DType dt, void* dst, int64_t n, double value) {
  detail::check_count("fill", "n", n);
  dispatch_all(dt, "fill", [&]<class D>(std::type_identity<D>) {
    const D v = convert<D>(value);
    D* out = static_cast<D*>(dst);
    parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { std::fill(out + lo, out + hi, v); });
  });
}

void arange(DType dt, void* dst, int64_t n, double start, double step) {
  detail::check_count("arange", "n", n);
  dispatch_all(dt, "arange", [&]<class D>(std::type_identity<D>) {
    D* out = static_cast<D*>(dst);
    parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = convert<D>(start + static_cast<double>(i) * step);
    });
  });
}

}  // namespace bt::kernels::cpu
