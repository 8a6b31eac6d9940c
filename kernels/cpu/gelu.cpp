// CPU tanh-approximation GELU, forward and backward (F32, F64, BF16).
#include "kernels/gelu.h"

#include "kernels/cpu/dispatch.h"

namespace bt::kernels::cpu {

void gelu_forward(DType dt, const void* x, void* y, int64_t n) {
  detail::check_count("gelu_forward", "n", n);
  detail::dispatch_float(dt, "gelu_forward", [&]<class T>(std::type_identity<T>) {
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    for (int64_t i = 0; i < n; ++i) detail::store(py, i, detail::gelu_tanh(detail::load(px, i)));
  });
}

void gelu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n) {
  detail::check_count("gelu_backward", "n", n);
  detail::dispatch_float(dt, "gelu_backward", [&]<class T>(std::type_identity<T>) {
    const T* px = static_cast<const T*>(x);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    for (int64_t i = 0; i < n; ++i)
      detail::store(pdx, i, detail::load(pdy, i) * detail::gelu_tanh_grad(detail::load(px, i)));
  });
}

}  // namespace bt::kernels::cpu
