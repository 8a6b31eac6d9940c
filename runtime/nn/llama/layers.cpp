#include "runtime/nn/llama/layers.h"

#include <cmath>
#include <vector>

#include "kernels/common/error.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/saved.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt::nn {
namespace {

/// f32 for bf16 (the dtype the statistics and silu are computed in), else dt.
DType wide(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }

Tensor as(const Tensor& x, DType dt) { return x.dtype() == dt ? x : x.to(dt); }

/// out = x * cos + x0 * sin_a + x1 * sin_b on the [B, T, H, 2, D/2] view (no autograd).
Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin_a, const Tensor& sin_b) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const Tensor x5 = x.view({B, T, H, 2, D / 2});
  const Tensor r = add(add(mul(x5, cos), mul(x5.narrow(3, 0, 1), sin_a)), mul(x5.narrow(3, 1, 1), sin_b));
  return r.view({B, T, H, D});
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const Tensor xf = as(x, wide(x.dtype()));
  const Tensor ms = mean(mul(xf, xf), {-1}, true);
  return mul(as(div(xf, sqrt(add(ms, eps))), x.dtype()), w);
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor y;
  {
    NoGradGuard ng;
    const Tensor g = as(gate, wide(gate.dtype()));
    y = mul(as(div(g, add(exp(neg(g)), 1.0)), gate.dtype()), up);
  }
  if (autograd::any_requires_grad({&gate, &up})) {
    // Note [SwiGLU's backward]: from the saved gate and up alone.
    autograd::record("SwigluBackward", {&gate, &up}, y,
                     [sg = SavedTensor(gate, "swiglu"),
                      su = SavedTensor(up, "swiglu")](autograd::Grads& grads) -> autograd::Grads {
                       const Tensor gate = sg.unpack(), up = su.unpack(), dy = grads[0];
                       const DType dt = gate.dtype();
                       const Tensor g = as(gate, wide(dt));
                       const Tensor s = pow(add(exp(neg(g)), 1.0), -1.0);  // sigmoid(g)
                       const Tensor dup = mul(dy, as(mul(g, s), dt));
                       // d silu / dg = s (1 + g (1 - s))
                       const Tensor dsilu = mul(s, add(mul(g, add(neg(s), 1.0)), 1.0));
                       return {as(mul(as(mul(dy, up), wide(dt)), dsilu), dt), dup};
                     });
  }
  return y;
}

RopeTables RopeTables::make(int64_t positions, int64_t head_dim, double theta, const Device& device) {
  BT_CHECK(head_dim % 2 == 0 && head_dim > 0, "RoPE: the head dim must be even, got ", head_dim);
  const int64_t h = head_dim / 2;
  std::vector<float> c(static_cast<size_t>(positions * h)), sa(static_cast<size_t>(positions * 2 * h), 0.0f),
      sb(sa.size(), 0.0f);
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t i = 0; i < h; ++i) {
      // Hugging Face: inv_freq = 1 / theta^(2i / D) in f32, angle = t * inv_freq in f32.
      const float inv = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(2 * i) / head_dim));
      const float a = static_cast<float>(t) * inv;
      const size_t k = static_cast<size_t>(t * h + i), k2 = static_cast<size_t>(t * 2 * h + i);
      c[k] = std::cos(a);
      sa[k2 + static_cast<size_t>(h)] = std::sin(a);  // pair 1 gets + x0 sin
      sb[k2] = -std::sin(a);                          // pair 0 gets - x1 sin
    }
  auto table = [&](const std::vector<float>& v, int64_t pairs, float sign) {
    std::vector<float> s(v.size());
    for (size_t k = 0; k < v.size(); ++k) s[k] = sign * v[k];
    return from_vector<float>(s, {positions, 1, pairs, h}).to(device);
  };
  return {table(c, 1, 1), table(sa, 2, 1), table(sb, 2, 1), table(sa, 2, -1), table(sb, 2, -1)};
}

RopeTables RopeTables::slice(int64_t first, int64_t n, DType dtype) const {
  BT_CHECK(first >= 0 && first + n <= cos.size(0), "RoPE: positions [", first, ", ", first + n,
           ") are outside the tables' [0, ", cos.size(0), ")");
  auto part = [&](const Tensor& t) { return as(t.narrow(0, first, n), dtype); };
  return {part(cos), part(sin_a), part(sin_b), part(inv_a), part(inv_b)};
}

Tensor rope(const Tensor& x, const RopeTables& t) {
  BT_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && x.size(1) == t.cos.size(0), "rope: x must be [B, T, H, D] ",
           "with D even and T = the tables' ", t.cos.size(0), " positions, got ", shape_str(x.shape()));
  Tensor y;
  {
    NoGradGuard ng;
    y = rotate(x, t.cos, t.sin_a, t.sin_b);
  }
  if (autograd::any_requires_grad({&x})) {
    // The inverse rotation (Note [RoPE without a concatenation]); the tables are constants.
    const Tensor cos = t.cos, na = t.inv_a, nb = t.inv_b;
    autograd::record("RopeBackward", {&x}, y, [cos, na, nb](autograd::Grads& g) -> autograd::Grads {
      return {rotate(g[0].contiguous(), cos, na, nb)};
    });
  }
  return y;
}

}  // namespace bt::nn
