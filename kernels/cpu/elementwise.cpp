// CPU broadcasting binary ops and unary ops (F32, F64, BF16). Element ranges
// run in parallel; each element's math is the serial one.
#include "kernels/elementwise.h"

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

template <class A>
inline A apply(BinaryOp op, A x, A y) {
  switch (op) {
    case BinaryOp::Add:
      return x + y;
    case BinaryOp::Sub:
      return x - y;
    case BinaryOp::Mul:
      return x * y;
    case BinaryOp::Div:
      return x / y;
    case BinaryOp::Pow:
      return std::pow(x, y);
  }
  return x;
}

/// Elements per chunk: cheap ops take more of them than transcendental ones.
constexpr int64_t kCheapGrain = int64_t{1} << 15, kCostlyGrain = int64_t{1} << 12;

template <BinaryOp Op, class T>
void binary_impl(const T* a, const StridedLayout& la, const T* b, const StridedLayout& lb, T* out,
                 int64_t n) {
  using A = acc_t<T>;
  const bool contiguous = detail::is_contiguous(la) && detail::is_contiguous(lb);
  parallel_for(0, n, Op == BinaryOp::Pow ? kCostlyGrain : kCheapGrain, [&](int64_t lo, int64_t hi) {
    if (contiguous) {
      for (int64_t i = lo; i < hi; ++i) store(out, i, apply<A>(Op, load(a, i), load(b, i)));
      return;
    }
    detail::for_each_strided(la, lb, lo, hi, [&](int64_t i, int64_t oa, int64_t ob) {
      store(out, i, apply<A>(Op, load(a, oa), load(b, ob)));
    });
  });
}

template <UnaryOp Op, class T>
void unary_range(const T* a, T* out, int64_t lo, int64_t hi, double scalar) {
  using A = acc_t<T>;
  const A s = static_cast<A>(scalar);
  for (int64_t i = lo; i < hi; ++i) {
    const A x = load(a, i);
    A y;
    if constexpr (Op == UnaryOp::Neg)
      y = -x;
    else if constexpr (Op == UnaryOp::Exp)
      y = std::exp(x);
    else if constexpr (Op == UnaryOp::Log)
      y = std::log(x);
    else if constexpr (Op == UnaryOp::Tanh)
      y = std::tanh(x);
    else if constexpr (Op == UnaryOp::Sqrt)
      y = std::sqrt(x);
    else if constexpr (Op == UnaryOp::PowScalar)
      y = std::pow(x, s);
    else if constexpr (Op == UnaryOp::AddScalar)
      y = x + s;
    else
      y = x * s;  // MulScalar
    store(out, i, y);
  }
}

template <UnaryOp Op, class T>
void unary_impl(const T* a, T* out, int64_t n, double scalar) {
  constexpr bool cheap = Op == UnaryOp::Neg || Op == UnaryOp::AddScalar || Op == UnaryOp::MulScalar;
  parallel_for(0, n, cheap ? kCheapGrain : kCostlyGrain,
               [&](int64_t lo, int64_t hi) { unary_range<Op>(a, out, lo, hi, scalar); });
}

}  // namespace

void binary(BinaryOp op, DType dt, const void* a, const StridedLayout& la, const void* b,
            const StridedLayout& lb, void* out) {
  const int64_t n = detail::checked_numel("binary", la);
  detail::checked_numel("binary", lb);
  BT_CHECK(la.ndim == lb.ndim, "binary: operand layouts have ", la.ndim, " and ", lb.ndim,
           " dims; both must have the output's shape");
  for (int d = 0; d < la.ndim; ++d)
    BT_CHECK(la.shape[d] == lb.shape[d], "binary: operand shapes differ at dim ", d, " (", la.shape[d],
             " vs ", lb.shape[d], "); broadcast both to the output shape");
  detail::dispatch_float(dt, "binary", [&]<class T>(std::type_identity<T>) {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    switch (op) {
      case BinaryOp::Add:
        return binary_impl<BinaryOp::Add>(pa, la, pb, lb, po, n);
      case BinaryOp::Sub:
        return binary_impl<BinaryOp::Sub>(pa, la, pb, lb, po, n);
      case BinaryOp::Mul:
        return binary_impl<BinaryOp::Mul>(pa, la, pb, lb, po, n);
      case BinaryOp::Div:
        return binary_impl<BinaryOp::Div>(pa, la, pb, lb, po, n);
      case BinaryOp::Pow:
        return binary_impl<BinaryOp::Pow>(pa, la, pb, lb, po, n);
    }
    BT_FAIL("binary: unknown op ", static_cast<int>(op));
  });
}

void unary(UnaryOp op, DType dt, const void* a, void* out, int64_t n, double scalar) {
  detail::check_count("unary", "n", n);
  detail::dispatch_float(dt, "unary", [&]<class T>(std::type_identity<T>) {
    const T* pa = static_cast<const T*>(a);
    T* po = static_cast<T*>(out);
    switch (op) {
      case UnaryOp::Neg:
        return unary_impl<UnaryOp::Neg>(pa, po, n, scalar);
      case UnaryOp::Exp:
        return unary_impl<UnaryOp::Exp>(pa, po, n, scalar);
      case UnaryOp::Log:
        return unary_impl<UnaryOp::Log>(pa, po, n, scalar);
      case UnaryOp::Tanh:
        return unary_impl<UnaryOp::Tanh>(pa, po, n, scalar);
      case UnaryOp::Sqrt:
        return unary_impl<UnaryOp::Sqrt>(pa, po, n, scalar);
      case UnaryOp::PowScalar:
        return unary_impl<UnaryOp::PowScalar>(pa, po, n, scalar);
      case UnaryOp::AddScalar:
        return unary_impl<UnaryOp::AddScalar>(pa, po, n, scalar);
      case UnaryOp::MulScalar:
        return unary_impl<UnaryOp::MulScalar>(pa, po, n, scalar);
    }
    BT_FAIL("unary: unknown op ", static_cast<int>(op));
  });
}

}  // namespace bt::kernels::cpu
