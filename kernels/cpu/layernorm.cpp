// CPU LayerNorm over the last dimension (F32, F64, BF16).
//
// Note on F64: mean and rstd are float by contract. The F64 forward computes
// y from the double statistics and stores them rounded to float; the F64
// backward recomputes the mean in double from x (exact, so a large mean does not
// cost accuracy) but must take rstd from the float buffer (eps is not an
// argument), which limits F64 input gradients to ~1e-7 relative accuracy.
#include "kernels/layernorm.h"

#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

template <class T, class A = acc_t<T>>
A row_mean(const T* x, int64_t cols) {
  A s = 0;
  for (int64_t j = 0; j < cols; ++j) s += load(x, j);
  return s / static_cast<A>(cols);
}

/// Rows per chunk; a constant of the shape (Note [Deterministic CPU parallelism]).
int64_t row_grain(int64_t cols) { return grain_for(cols, int64_t{1} << 14); }

template <class T>
void forward_impl(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t rows,
                  int64_t cols, float eps) {
  using A = acc_t<T>;
  parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      const A mu = row_mean(xr, cols);
      A var = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const A d = load(xr, j) - mu;
        var += d * d;
      }
      var /= static_cast<A>(cols);
      const A rs = A(1) / std::sqrt(var + static_cast<A>(eps));
      for (int64_t j = 0; j < cols; ++j) {
        A v = (load(xr, j) - mu) * rs;
        if (w) v *= load(w, j);
        if (b) v += load(b, j);
        store(yr, j, v);
      }
      if (mean) mean[r] = static_cast<float>(mu);
      if (rstd) rstd[r] = static_cast<float>(rs);
    }
  });
}

/// dx row by row; dw and db as one partial sum per chunk of rows (summed over
/// its rows in order), then the partials added in chunk order: the same bits
/// for any thread count (Note [Deterministic CPU parallelism]).
template <class T>
void backward_impl(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, T* dw,
                   T* db, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  const int64_t grain = row_grain(cols), nchunks = num_chunks(0, rows, grain);
  const size_t C = static_cast<size_t>(cols);
  std::vector<A> gw(dw ? C * static_cast<size_t>(nchunks) : 0), gb(db ? C * static_cast<size_t>(nchunks) : 0);
  parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    const size_t chunk = static_cast<size_t>(lo / grain);
    A* pw = dw ? gw.data() + chunk * C : nullptr;
    A* pb = db ? gb.data() + chunk * C : nullptr;
    std::vector<A> xhat(C), g(C);
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      const T* dyr = dy + r * cols;
      const A mu = std::is_same_v<T, double> ? row_mean(xr, cols) : static_cast<A>(mean[r]);
      const A rs = static_cast<A>(rstd[r]);
      A c1 = 0, c2 = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const A d = load(dyr, j);
        xhat[j] = (load(xr, j) - mu) * rs;
        g[j] = w ? d * load(w, j) : d;
        c1 += g[j];
        c2 += g[j] * xhat[j];
        if (pw) pw[j] += d * xhat[j];
        if (pb) pb[j] += d;
      }
      c1 /= static_cast<A>(cols);
      c2 /= static_cast<A>(cols);
      if (dx) {
        T* dxr = dx + r * cols;
        for (int64_t j = 0; j < cols; ++j) store(dxr, j, rs * (g[j] - c1 - xhat[j] * c2));
      }
    }
  });
  for (int64_t c = 1; c < nchunks; ++c)
    for (size_t j = 0; j < C; ++j) {
      if (dw) gw[j] += gw[static_cast<size_t>(c) * C + j];
      if (db) gb[j] += gb[static_cast<size_t>(c) * C + j];
    }
  for (int64_t j = 0; j < cols; ++j) {
    if (dw) store(dw, j, rows > 0 ? gw[j] : A(0));
    if (db) store(db, j, rows > 0 ? gb[j] : A(0));
  }
}

}  // namespace

void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps) {
  detail::check_count("layernorm_forward", "rows", rows);
  BT_CHECK(cols > 0, "layernorm_forward: cols must be > 0, got ", cols);
  detail::dispatch_float(dt, "layernorm_forward", [&]<class T>(std::type_identity<T>) {
    forward_impl(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                 static_cast<T*>(y), mean, rstd, rows, cols, eps);
  });
}

void layernorm_backward(DType dt, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols) {
  detail::check_count("layernorm_backward", "rows", rows);
  BT_CHECK(cols > 0, "layernorm_backward: cols must be > 0, got ", cols);
  BT_CHECK(rows == 0 || (mean != nullptr && rstd != nullptr),
           "layernorm_backward: mean and rstd from the forward are required");
  detail::dispatch_float(dt, "layernorm_backward", [&]<class T>(std::type_identity<T>) {
    backward_impl(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), mean, rstd,
                  static_cast<T*>(dx), static_cast<T*>(dw), static_cast<T*>(db), rows, cols);
  });
}

}  // namespace bt::kernels::cpu
