// Internal to the CPU kernels: the dtype switch, the compute ("accumulation")
// type of each storage type, and load/store helpers.
//
//   storage  compute
//   float    float
//   double   double   (F64 paths never round through float)
//   bf16     float    (rounded once, on store)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "kernels/common/layout.h"

namespace bt::kernels::cpu::detail {

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
/// The type a kernel computes in for storage type T.
template <class T>
using acc_t = typename AccOf<T>::type;

template <class T>
inline acc_t<T> load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_bits_to_float(p[i].bits);
  else
    return p[i];
}

template <class T>
inline void store(T* p, int64_t i, acc_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>)
    p[i].bits = float_to_bf16_bits(v);
  else
    p[i] = v;
}

/// Calls f(std::type_identity<T>{}) with T = float, double or bf16 for dt;
/// any other dtype throws bt::Error naming the kernel.
template <class F>
decltype(auto) dispatch_float(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::F32:
      return f(std::type_identity<float>{});
    case DType::F64:
      return f(std::type_identity<double>{});
    case DType::BF16:
      return f(std::type_identity<bf16>{});
    default:
      break;
  }
  BT_FAIL(kernel, ": unsupported dtype ", dt, " (the CPU kernel supports f32, f64 and bf16)");
}

/// Checks an element count is non-negative, naming the kernel and argument.
inline void check_count(const char* kernel, const char* what, int64_t n) {
  BT_CHECK(n >= 0, kernel, ": ", what, " must be >= 0, got ", n);
}

/// Checks ndim and shape of a strided view and returns its element count.
inline int64_t checked_numel(const char* kernel, const StridedLayout& l) {
  BT_CHECK(l.ndim >= 0 && l.ndim <= kMaxDims, kernel, ": layout ndim ", l.ndim, " is outside [0, ", kMaxDims,
           "]");
  int64_t n = 1;
  for (int d = 0; d < l.ndim; ++d) {
    BT_CHECK(l.shape[d] >= 0, kernel, ": layout shape[", d, "] = ", l.shape[d], " is negative");
    n *= l.shape[d];
  }
  return n;
}

/// True when the view is the row-major contiguous buffer of its shape.
inline bool is_contiguous(const StridedLayout& l) {
  int64_t expect = 1;
  for (int d = l.ndim - 1; d >= 0; --d) {
    if (l.shape[d] != 1 && l.strides[d] != expect) return false;
    expect *= l.shape[d];
  }
  return true;
}

/// Visits the elements [lo, hi) of a's shape in row-major order, calling
/// f(i, off_a, off_b) with the element offsets of element i in the views a and
/// b (b must have a's shape). The innermost dimension runs as a plain loop.
template <class F>
void for_each_strided(const StridedLayout& a, const StridedLayout& b, int64_t lo, int64_t hi, F&& f) {
  if (hi <= lo) return;
  const int nd = a.ndim;
  if (nd == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  const int64_t inner = a.shape[nd - 1], sa = a.strides[nd - 1], sb = b.strides[nd - 1];
  int64_t idx[kMaxDims] = {};
  int64_t off_a = 0, off_b = 0;
  int64_t rest = lo / inner;  // the outer index of element lo, as an odometer
  for (int d = nd - 2; d >= 0; --d) {
    idx[d] = rest % a.shape[d];
    rest /= a.shape[d];
    off_a += idx[d] * a.strides[d];
    off_b += idx[d] * b.strides[d];
  }
  int64_t j0 = lo % inner;
  for (int64_t base = lo - j0; base < hi; base += inner, j0 = 0) {
    const int64_t j1 = std::min(inner, hi - base);
    for (int64_t j = j0; j < j1; ++j) f(base + j, off_a + j * sa, off_b + j * sb);
    for (int d = nd - 2; d >= 0; --d) {  // odometer over the outer dimensions
      off_a += a.strides[d];
      off_b += b.strides[d];
      if (++idx[d] < a.shape[d]) break;
      off_a -= a.strides[d] * a.shape[d];
      off_b -= b.strides[d] * b.shape[d];
      idx[d] = 0;
    }
  }
}

/// All numel elements of a's shape; see the range form above.
template <class F>
void for_each_strided(const StridedLayout& a, const StridedLayout& b, int64_t numel, F&& f) {
  for_each_strided(a, b, int64_t{0}, numel, std::forward<F>(f));
}

/// True when no two elements of the view share an offset (sufficient test:
/// sorted by stride, each dimension steps over everything the smaller ones span).
inline bool is_non_overlapping(const StridedLayout& l) {
  int64_t st[kMaxDims], sh[kMaxDims];
  int n = 0;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.shape[d] == 0) return true;  // no elements
    if (l.shape[d] == 1) continue;
    if (l.strides[d] <= 0) return false;
    st[n] = l.strides[d], sh[n] = l.shape[d], ++n;
  }
  for (int i = 1; i < n; ++i)  // insertion sort by stride
    for (int k = i; k > 0 && st[k] < st[k - 1]; --k) std::swap(st[k], st[k - 1]), std::swap(sh[k], sh[k - 1]);
  int64_t span = 0;  // largest offset reachable with the dimensions seen so far
  for (int i = 0; i < n; ++i) {
    if (st[i] <= span) return false;
    span += (sh[i] - 1) * st[i];
  }
  return true;
}

// GELU, tanh approximation, in the compute type A (float or double).
template <class A>
inline A gelu_tanh(A x) {
  const A k = static_cast<A>(0.79788456080286535588);  // sqrt(2 / pi)
  const A c = static_cast<A>(0.044715);
  const A u = k * (x + c * x * x * x);
  return static_cast<A>(0.5) * x * (static_cast<A>(1) + std::tanh(u));
}

/// d gelu_tanh(x) / dx.
template <class A>
inline A gelu_tanh_grad(A x) {
  const A k = static_cast<A>(0.79788456080286535588);
  const A c = static_cast<A>(0.044715);
  const A t = std::tanh(k * (x + c * x * x * x));
  const A du = k * (static_cast<A>(1) + static_cast<A>(3) * c * x * x);
  return static_cast<A>(0.5) * (static_cast<A>(1) + t) +
         static_cast<A>(0.5) * x * (static_cast<A>(1) - t * t) * du;
}

}  // namespace bt::kernels::cpu::detail
