// CPU tanh-approximation GELU, forward and backward (F32, F64, BF16). Element
// ranges run in parallel; each element's math is the serial one.
#include "kernels/gelu.h"

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reduce.h"

namespace bt::kernels::cpu {
namespace {
constexpr int64_t kGrain = int64_t{1} << 12;  // elements per chunk (tanh is ~20 ns)
}  // namespace

void gelu_forward(DType dt, const void* x, void* y, int64_t n) {
  detail::check_count("gelu_forward", "n", n);
  detail::dispatch_float(dt, "gelu_forward", [&]<class T>(std::type_identity<T>) {
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) detail::store(py, i, detail::gelu_tanh(detail::load(px, i)));
    });
  });
}

void gelu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n) {
  detail::check_count("gelu_backward", "n", n);
  detail::dispatch_float(dt, "gelu_backward", [&]<class T>(std::type_identity<T>) {
    const T* px = static_cast<const T*>(x);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        detail::store(pdx, i, detail::load(pdy, i) * detail::gelu_tanh_grad(detail::load(px, i)));
    });
  });
}

void gelu_backward_fused(DType dt, const void* pre, void* g, void* h, float* bias_grad, int64_t rows,
                         int64_t cols) {
  BT_CHECK(dt == DType::F32 || dt == DType::BF16, "gelu_backward_fused: F32 or BF16, got ", dtype_name(dt));
  detail::check_count("gelu_backward_fused", "rows", rows);
  detail::check_count("gelu_backward_fused", "cols", cols);
  gelu_backward(dt, pre, g, g, rows * cols);
  if (h) gelu_forward(dt, pre, h, rows * cols);
  if (!bias_grad) return;
  if (dt == DType::F32)
    reduce_dim(ReduceOp::Sum, dt, g, bias_grad, 1, rows, cols, nullptr);
  else
    reduce_dim(ReduceOp::Sum, dt, DType::F32, g, bias_grad, 1, rows, cols);
}

}  // namespace bt::kernels::cpu
