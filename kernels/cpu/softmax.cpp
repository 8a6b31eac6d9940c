// CPU row-wise softmax / log-softmax over the last dimension (F32, F64, BF16).
// Rows run in parallel; each row's math is the serial one.
#include "kernels/softmax.h"

#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

/// Rows per chunk; a constant of the shape (Note [Deterministic CPU parallelism]).
int64_t row_grain(int64_t cols) { return grain_for(cols, int64_t{1} << 14); }

template <class T>
void forward_impl(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  if (cols == 0) return;
  parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    std::vector<A> e(static_cast<size_t>(cols));  // one row; y may alias x
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      A mx = load(xr, 0);
      for (int64_t j = 1; j < cols; ++j) mx = std::max(mx, load(xr, j));
      A sum = 0;
      if (log) {
        for (int64_t j = 0; j < cols; ++j) {
          e[j] = load(xr, j) - mx;
          sum += std::exp(e[j]);
        }
        const A lse = std::log(sum);
        for (int64_t j = 0; j < cols; ++j) store(yr, j, e[j] - lse);
      } else {
        for (int64_t j = 0; j < cols; ++j) {  // keep exp(x - max): one exp per element
          e[j] = std::exp(load(xr, j) - mx);
          sum += e[j];
        }
        for (int64_t j = 0; j < cols; ++j) store(yr, j, e[j] / sum);
      }
    }
  });
}

template <class T>
void backward_impl(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
  using A = acc_t<T>;
  parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* yr = y + r * cols;
      const T* dyr = dy + r * cols;
      T* dxr = dx + r * cols;
      A s = 0;
      if (log) {
        for (int64_t j = 0; j < cols; ++j) s += load(dyr, j);
        for (int64_t j = 0; j < cols; ++j) store(dxr, j, load(dyr, j) - std::exp(load(yr, j)) * s);
      } else {
        for (int64_t j = 0; j < cols; ++j) s += load(dyr, j) * load(yr, j);
        for (int64_t j = 0; j < cols; ++j) store(dxr, j, load(yr, j) * (load(dyr, j) - s));
      }
    }
  });
}

}  // namespace

void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log) {
  detail::check_count("softmax_forward", "rows", rows);
  detail::check_count("softmax_forward", "cols", cols);
  detail::dispatch_float(dt, "softmax_forward", [&]<class T>(std::type_identity<T>) {
    forward_impl(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log);
  });
}

void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols,
                      bool log) {
  detail::check_count("softmax_backward", "rows", rows);
  detail::check_count("softmax_backward", "cols", cols);
  detail::dispatch_float(dt, "softmax_backward", [&]<class T>(std::type_identity<T>) {
    backward_impl(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), rows, cols, log);
  });
}

}  // namespace bt::kernels::cpu
