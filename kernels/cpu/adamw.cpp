// CPU fused AdamW step (fp32 state; F32, BF16 or F64 gradients; optional
// F32 or BF16 copy of the updated params). Follows the formula in adamw.h
// operation for operation, in float. Element ranges run in parallel.
#include "kernels/adamw.h"

#include <cmath>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {

template <class G, class C>
void adamw_impl(const AdamWArgs& a, const G* grad, C* copy) {
  float* p = a.param;
  float* m = a.m;
  float* v = a.v;
  const float b1 = a.beta1, b2 = a.beta2, one_b1 = 1.0f - a.beta1, one_b2 = 1.0f - a.beta2;
  const float lr = a.hyper ? a.hyper[0] : a.lr, bias1 = a.hyper ? a.hyper[1] : a.bias1;
  const float bias2 = a.hyper ? a.hyper[2] : a.bias2, scale = a.scale ? *a.scale : a.grad_scale;
  if (!std::isfinite(scale)) return;  // a skipped step (adamw.h)
  parallel_for(0, a.n, int64_t{1} << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float g = static_cast<float>(detail::load(grad, i)) * scale;
      const float mi = b1 * m[i] + one_b1 * g;
      const float vi = b2 * v[i] + one_b2 * (g * g);
      m[i] = mi;
      v[i] = vi;
      const float pi = p[i] - lr * (mi / bias1 / (std::sqrt(vi / bias2) + a.eps) + a.weight_decay * p[i]);
      p[i] = pi;
      if constexpr (!std::is_void_v<C>) detail::store(copy, i, pi);
    }
  });
}

template <class G>
void with_copy(const AdamWArgs& a, const G* grad) {
  if (a.param_copy == nullptr) return adamw_impl<G, void>(a, grad, nullptr);
  switch (a.copy_dt) {
    case DType::F32:
      return adamw_impl(a, grad, static_cast<float*>(a.param_copy));
    case DType::BF16:
      return adamw_impl(a, grad, static_cast<bf16*>(a.param_copy));
    default:
      break;
  }
  BT_FAIL("adamw: unsupported param_copy dtype ", a.copy_dt, " (the CPU kernel supports f32 and bf16)");
}

}  // namespace

void adamw(const AdamWArgs& a) {
  detail::check_count("adamw", "n", a.n);
  BT_CHECK(a.n == 0 || (a.param && a.grad && a.m && a.v), "adamw: param, grad, m and v are required");
  detail::dispatch_float(a.grad_dt, "adamw", [&]<class G>(std::type_identity<G>) {
    with_copy(a, static_cast<const G*>(a.grad));
  });
}

}  // namespace bt::kernels::cpu
