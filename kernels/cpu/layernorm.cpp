// CPU LayerNorm over the last dimension (F32, F64, BF16; f32 parameters with
// BF16 activations), with the residual add of Note [Residual into LayerNorm].
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

/// Calls f(type_identity<T>, type_identity<W>, type_identity<G>) with the
/// storage types of the activations, the parameters and their gradients.
template <class F>
void dispatch_ln(LnTypes t, const char* kernel, F&& f) {
  check_ln_types(t, kernel);
  detail::dispatch_float(t.x, kernel, [&]<class T>(std::type_identity<T> tt) {
    if constexpr (std::is_same_v<T, bf16>) {
      auto with_w = [&]<class W>(std::type_identity<W> tw) {
        if (t.g == DType::F32)
          f(tt, tw, std::type_identity<float>{});
        else
          f(tt, tw, tt);
      };
      if (t.w == DType::F32)
        with_w(std::type_identity<float>{});
      else
        with_w(tt);
    } else {
      f(tt, tt, tt);
    }
  });
}

/// res null: y = LN(x). Else s = x + res (+ rb), rounded to T, and y = LN(s)
/// (Note [Residual into LayerNorm], Note [A bias into the residual add]).
template <class T, class W>
void forward_impl(const T* x, const T* res, int64_t res_rows, const W* rb, const W* w, const W* b, T* s, T* y,
                  float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  using A = acc_t<T>;
  parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      if (res) {
        T* sr = s + r * cols;
        const T* rr = res + (r % res_rows) * cols;
        if (rb)
          for (int64_t j = 0; j < cols; ++j) store(sr, j, load(xr, j) + (load(rr, j) + load(rb, j)));
        else
          for (int64_t j = 0; j < cols; ++j) store(sr, j, load(xr, j) + load(rr, j));
        xr = sr;
      }
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

/// dx row by row (plus dres when given); dw, db and dsum (the column sums of
/// dx as stored) as one partial sum per chunk of rows (summed over its rows in
/// order), then the partials added in chunk order: the same bits for any
/// thread count (Note [Deterministic CPU parallelism]).
template <class T, class W, class G>
void backward_impl(const T* dy, const T* x, const W* w, const float* mean, const float* rstd, const T* dres,
                   T* dx, G* dw, G* db, G* dsum, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  const int64_t grain = row_grain(cols), nchunks = num_chunks(0, rows, grain);
  const size_t C = static_cast<size_t>(cols);
  const auto partials = [&](const G* out) {
    return std::vector<A>(out ? C * static_cast<size_t>(nchunks) : 0);
  };
  std::vector<A> gw = partials(dw), gb = partials(db), gs = partials(dsum);
  parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    const size_t chunk = static_cast<size_t>(lo / grain);
    A* pw = dw ? gw.data() + chunk * C : nullptr;
    A* pb = db ? gb.data() + chunk * C : nullptr;
    A* ps = dsum ? gs.data() + chunk * C : nullptr;
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
        const T* dr = dres ? dres + r * cols : nullptr;
        for (int64_t j = 0; j < cols; ++j) {
          const A v = rs * (g[j] - c1 - xhat[j] * c2);
          store(dxr, j, dr ? v + load(dr, j) : v);
          if (ps) ps[j] += load(dxr, j);
        }
      }
    }
  });
  for (int64_t c = 1; c < nchunks; ++c)
    for (size_t j = 0; j < C; ++j) {
      if (dw) gw[j] += gw[static_cast<size_t>(c) * C + j];
      if (db) gb[j] += gb[static_cast<size_t>(c) * C + j];
      if (dsum) gs[j] += gs[static_cast<size_t>(c) * C + j];
    }
  for (int64_t j = 0; j < cols; ++j) {
    if (dw) store(dw, j, rows > 0 ? gw[j] : A(0));
    if (db) store(db, j, rows > 0 ? gb[j] : A(0));
    if (dsum) store(dsum, j, rows > 0 ? gs[j] : A(0));
  }
}

void check_shape(const char* kernel, int64_t rows, int64_t cols) {
  detail::check_count(kernel, "rows", rows);
  BT_CHECK(cols > 0, kernel, ": cols must be > 0, got ", cols);
}

}  // namespace

void layernorm_forward(LnTypes t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps) {
  check_shape("layernorm_forward", rows, cols);
  dispatch_ln(
      t, "layernorm_forward",
      [&]<class T, class W, class G>(std::type_identity<T>, std::type_identity<W>, std::type_identity<G>) {
        forward_impl<T, W>(static_cast<const T*>(x), nullptr, 1, nullptr, static_cast<const W*>(w),
                           static_cast<const W*>(b), nullptr, static_cast<T*>(y), mean, rstd, rows, cols,
                           eps);
      });
}

void add_layernorm_forward(LnTypes t, const void* x, const void* r, int64_t r_rows, const void* w,
                           const void* b, void* s, void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, float eps, const void* rb) {
  check_shape("add_layernorm_forward", rows, cols);
  BT_CHECK(r_rows > 0 && rows % r_rows == 0, "add_layernorm_forward: the residual's rows (", r_rows,
           ") must divide the rows (", rows, ")");
  BT_CHECK(rows == 0 || (x && r && s && y), "add_layernorm_forward: x, r, s and y must be non-null");
  dispatch_ln(
      t, "add_layernorm_forward",
      [&]<class T, class W, class G>(std::type_identity<T>, std::type_identity<W>, std::type_identity<G>) {
        forward_impl<T, W>(static_cast<const T*>(x), static_cast<const T*>(r), r_rows,
                           static_cast<const W*>(rb), static_cast<const W*>(w), static_cast<const W*>(b),
                           static_cast<T*>(s), static_cast<T*>(y), mean, rstd, rows, cols, eps);
      });
}

void layernorm_backward(LnTypes t, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                        const void* dres, void* dsum) {
  check_shape("layernorm_backward", rows, cols);
  BT_CHECK(rows == 0 || (mean != nullptr && rstd != nullptr),
           "layernorm_backward: mean and rstd from the forward are required");
  BT_CHECK(dsum == nullptr || dx != nullptr, "layernorm_backward: dsum sums dx, which must not be null");
  dispatch_ln(
      t, "layernorm_backward",
      [&]<class T, class W, class G>(std::type_identity<T>, std::type_identity<W>, std::type_identity<G>) {
        backward_impl<T, W, G>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const W*>(w),
                               mean, rstd, static_cast<const T*>(dres), static_cast<T*>(dx),
                               static_cast<G*>(dw), static_cast<G*>(db), static_cast<G*>(dsum), rows, cols);
      });
}

}  // namespace bt::kernels::cpu
