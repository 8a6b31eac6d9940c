// CPU fused softmax cross-entropy (F32, F64, BF16 logits).
// For F64 the backward recomputes each row's lse in double rather than using
// the float lse, so F64 gradients stay accurate to double precision.
//
// Rows run in parallel (each writes only its own outputs). F32 rows, the hot
// path of training, use the vectorized exp of Note [Portable vector exp]
// (kernels/cpu/exp_rows.h): one exp per element in the forward (max pass,
// then a 16-lane double sum of exp(x - max)) and one in the backward
// (exp(x - lse) * dloss, rounded once). BF16 and F64 rows use std::exp in the
// compute type.
#include "kernels/cross_entropy.h"

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/exp_rows.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

template <class T, class A = acc_t<T>>
A row_lse(const T* x, int64_t vocab) {
  A mx = load(x, 0);
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, load(x, j));
  A sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(load(x, j) - mx);
  return mx + std::log(sum);
}

void check_args(const char* kernel, const CrossEntropyArgs& a) {
  detail::check_count(kernel, "rows", a.rows);
  BT_CHECK(a.vocab > 0, kernel, ": vocab must be > 0, got ", a.vocab);
  BT_CHECK(a.ld >= a.vocab, kernel, ": ld=", a.ld, " is smaller than vocab=", a.vocab);
  BT_CHECK(a.rows == 0 || (a.logits != nullptr && a.targets != nullptr), kernel,
           ": logits and targets are required");
  for (int64_t r = 0; r < a.rows; ++r) {
    const int32_t t = a.targets[r];
    BT_CHECK(t == -1 || (t >= 0 && t < a.vocab), kernel, ": target ", t, " at row ", r, " is outside [0, ",
             a.vocab, ") (use -1 to ignore a row)");
  }
}

/// Rows per chunk: about 64K logits of work each.
int64_t row_grain(int64_t vocab) { return grain_for(vocab, int64_t{1} << 16); }

template <class T>
void forward_impl(const CrossEntropyArgs& a, float* loss, float* lse) {
  const T* x = static_cast<const T*>(a.logits);
  parallel_for(0, a.rows, row_grain(a.vocab), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * a.ld;
      const int32_t t = a.targets[r];
      if constexpr (std::is_same_v<T, float>) {
        const float mx = detail::row_max(xr, a.vocab);
        const double l = static_cast<double>(mx) + std::log(detail::row_sum_exp(xr, a.vocab, mx));
        if (loss) loss[r] = t < 0 ? 0.0f : static_cast<float>(l - static_cast<double>(xr[t]));
        if (lse) lse[r] = static_cast<float>(l);
      } else {
        const auto l = row_lse(xr, a.vocab);
        if (loss) loss[r] = t < 0 ? 0.0f : static_cast<float>(l - load(xr, t));
        if (lse) lse[r] = static_cast<float>(l);
      }
    }
  });
}

template <class T>
void backward_impl(const CrossEntropyArgs& a, const float* lse, const float* dloss, T* dx) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(a.logits);
  parallel_for(0, a.rows, row_grain(a.vocab), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * a.ld;
      T* dr = dx + r * a.ld;
      const int32_t t = a.targets[r];
      if (t < 0) {
        for (int64_t j = 0; j < a.ld; ++j) store(dr, j, A(0));
        continue;
      }
      if constexpr (std::is_same_v<T, float>) {
        const double l = lse[r], g = dloss[r];
        const double xt = xr[t];  // read first: dlogits may alias the logits
        detail::row_exp_scale(xr, a.vocab, l, g, dr);
        dr[t] = static_cast<float>((detail::exp_d(xt - l) - 1.0) * g);
      } else {
        const A l = std::is_same_v<T, double> ? row_lse(xr, a.vocab) : static_cast<A>(lse[r]);
        const A g = static_cast<A>(dloss[r]);
        for (int64_t j = 0; j < a.vocab; ++j) {
          const A p = std::exp(load(xr, j) - l);
          store(dr, j, (j == t ? p - A(1) : p) * g);
        }
      }
      for (int64_t j = a.vocab; j < a.ld; ++j) store(dr, j, A(0));
    }
  });
}

}  // namespace

void cross_entropy_forward(const CrossEntropyArgs& a, float* loss, float* lse) {
  check_args("cross_entropy_forward", a);
  detail::dispatch_float(a.dt, "cross_entropy_forward",
                         [&]<class T>(std::type_identity<T>) { forward_impl<T>(a, loss, lse); });
}

void cross_entropy_backward(const CrossEntropyArgs& a, const float* lse, const float* dloss, void* dlogits) {
  check_args("cross_entropy_backward", a);
  BT_CHECK(a.rows == 0 || (dloss != nullptr && dlogits != nullptr && (lse != nullptr || a.dt == DType::F64)),
           "cross_entropy_backward: lse, dloss and dlogits are required");
  detail::dispatch_float(a.dt, "cross_entropy_backward", [&]<class T>(std::type_identity<T>) {
    backward_impl<T>(a, lse, dloss, static_cast<T*>(dlogits));
  });
}

}  // namespace bt::kernels::cpu
