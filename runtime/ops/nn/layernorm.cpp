#include "runtime/ops/nn/layernorm.h"

#include <algorithm>
#include <array>

#include "kernels/layernorm.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/recompute.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/elementwise.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

/// Checks the activations and the parameters of `op` (the affine ones, and the
/// residual's bias yb of add_layer_norm); returns the kernels' dtypes
/// (parameters in x's dtype or f32 under bf16, gradients in f32 under bf16:
/// Note [Gradients in a wider dtype]).
kernels::LnTypes check_args(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                            const Tensor& yb = Tensor()) {
  detail::check_defined(op, x, "x");
  detail::check_dtype(op, x, "x", {DType::F32, DType::F64, DType::BF16});
  BT_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  BT_CHECK(eps > 0, op, ": eps must be > 0, got ", eps);
  const int64_t C = x.size(-1);
  const bool bf16 = x.dtype() == DType::BF16;
  const Tensor* first = nullptr;  // the first parameter given: the others must have its dtype
  for (const Tensor* p : {&w, &b, &yb}) {
    if (!p->defined()) continue;
    const char* name = p == &w ? "weight" : p == &b ? "bias" : "y_bias";
    detail::check_same_device(op, x, *p);
    BT_CHECK(p->dtype() == x.dtype() || (bf16 && p->dtype() == DType::F32), op, ": ", name, " is ",
             p->dtype(), " but x is ", x.dtype(), "; pass it in ", x.dtype(), bf16 ? " or f32" : "");
    BT_CHECK(p->dim() == 1 && p->size(0) == C, op, ": ", name, " has shape ", shape_str(p->shape()),
             " but x has ", C, " features (shape ", shape_str(x.shape()), ")");
    if (first == nullptr) first = p;
    BT_CHECK(p->dtype() == first->dtype(), op, ": ", first == &w ? "weight" : "bias", " is ", first->dtype(),
             " but ", name, " is ", p->dtype(), "; pass the parameters in one dtype");
  }
  const DType wdt = first ? first->dtype() : x.dtype();
  return {x.dtype(), wdt, bf16 ? DType::F32 : x.dtype()};
}

Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? t.contiguous() : Tensor(); }
const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

/// {dx, dw, db, dsum} of y = LN(x) for dy; dx gets dres added when it is
/// defined (Note [Residual into LayerNorm]). dw/db are undefined without w/b,
/// dsum (dx's column sums, Note [A bias into the residual add]) unless asked for.
std::array<Tensor, 4> backward(kernels::LnTypes types, const Tensor& x, const Tensor& w, bool has_b,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dy_in,
                               const Tensor& dres_in, bool want_dsum = false) {
  const int64_t C = x.size(-1), R = C ? x.numel() / C : 0;
  const Tensor dy = dy_in.contiguous(), dres = contiguous_or_none(dres_in);
  Tensor dx = empty(x.shape(), x.options());
  const TensorOptions go{types.g, x.device()};
  Tensor dw = w.defined() ? empty({C}, go) : Tensor();
  Tensor db = has_b ? empty({C}, go) : Tensor();
  Tensor dsum = want_dsum ? empty({C}, go) : Tensor();
  const void* wp = ptr_or_null(w);
  const void* rp = ptr_or_null(dres);
  void* dwp = dw.defined() ? dw.data_ptr() : nullptr;
  void* dbp = db.defined() ? db.data_ptr() : nullptr;
  void* dsp = dsum.defined() ? dsum.data_ptr() : nullptr;
  detail::on_device(
      x.device(),
      [&] {
        kernels::cpu::layernorm_backward(types, dy.data_ptr(), x.data_ptr(), wp, mean.data<float>(),
                                         rstd.data<float>(), dx.data_ptr(), dwp, dbp, R, C, rp, dsp);
      },
      BT_CUDA_LAMBDA(
          Tensor scratch =
              empty({static_cast<int64_t>(kernels::cuda::layernorm_backward_scratch_floats(R, C, want_dsum))},
                    TensorOptions{DType::F32, x.device()});
          kernels::cuda::layernorm_backward(types, dy.data_ptr(), x.data_ptr(), wp, mean.data<float>(),
                                            rstd.data<float>(), dx.data_ptr(), dwp, dbp, R, C,
                                            scratch.data<float>(), stream, rp, dsp)));
  return {dx, dw, db, dsum};
}

/// The forward's outputs: s (with a residual only), the LayerNorm and its statistics.
struct Forward {
  Tensor s, out, mean, rstd;
};

/// out = LN(x); with y defined, s = x + y (+ yb) and out = LN(s). All contiguous.
Forward forward(kernels::LnTypes types, const Tensor& x, const Tensor& y, const Tensor& w, const Tensor& b,
                double eps, const Tensor& yb = Tensor()) {
  const int64_t C = x.size(-1), R = C ? x.numel() / C : 0, RY = C && y.defined() ? y.numel() / C : 0;
  const TensorOptions f32{DType::F32, x.device()};
  Forward f{y.defined() ? empty(x.shape(), x.options()) : Tensor(), empty(x.shape(), x.options()),
            empty({R}, f32), empty({R}, f32)};
  const void* wp = ptr_or_null(w);
  const void* bp = ptr_or_null(b);
  const void* ybp = ptr_or_null(yb);
  const float e = static_cast<float>(eps);
  float* mp = f.mean.data<float>();
  float* rp = f.rstd.data<float>();
  detail::on_device(
      x.device(),
      [&] {
        if (y.defined())
          kernels::cpu::add_layernorm_forward(types, x.data_ptr(), y.data_ptr(), RY, wp, bp, f.s.data_ptr(),
                                              f.out.data_ptr(), mp, rp, R, C, e, ybp);
        else
          kernels::cpu::layernorm_forward(types, x.data_ptr(), wp, bp, f.out.data_ptr(), mp, rp, R, C, e);
      },
      BT_CUDA_LAMBDA(if (y.defined()) kernels::cuda::add_layernorm_forward(
                         types, x.data_ptr(), y.data_ptr(), RY, wp, bp, f.s.data_ptr(), f.out.data_ptr(), mp,
                         rp, R, C, e, stream, ybp);
                     else kernels::cuda::layernorm_forward(types, x.data_ptr(), wp, bp, f.out.data_ptr(), mp,
                                                           rp, R, C, e, stream)));
  return f;
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, double eps) {
  const kernels::LnTypes types = check_args("layer_norm", x_in, w_in, b_in, eps);
  Tensor x = x_in.contiguous(), w = contiguous_or_none(w_in), b = contiguous_or_none(b_in);
  auto [unused, y, mean, rstd] = forward(types, x, Tensor(), w, b, eps);
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in})) {
    autograd::make_recomputable(y, [sx = SavedTensor(x, "layer_norm"), sw = SavedTensor(w, "layer_norm"),
                                    sb = SavedTensor(b, "layer_norm"),
                                    eps] { return layer_norm(sx.unpack(), sw.unpack(), sb.unpack(), eps); });
    autograd::record("LayerNormBackward", {&x_in, &w_in, &b_in}, y,
                     [types, sx = SavedTensor(x, "layer_norm"), sw = SavedTensor(w, "layer_norm"),
                      sm = SavedTensor(mean, "layer_norm"), sr = SavedTensor(rstd, "layer_norm"),
                      has_b = b.defined()](autograd::Grads& g) -> autograd::Grads {
                       auto [dx, dw, db, unused] = backward(types, sx.unpack(), sw.unpack(), has_b,
                                                            sm.unpack(), sr.unpack(), g[0], Tensor());
                       return {dx, dw, db};
                     });
  }
  return y;
}

ResidualNorm add_layer_norm(const Tensor& x_in, const Tensor& y_in, const Tensor& w_in, const Tensor& b_in,
                            double eps, const Tensor& yb_in) {
  const kernels::LnTypes types = check_args("add_layer_norm", x_in, w_in, b_in, eps, yb_in);
  detail::check_defined("add_layer_norm", y_in, "y");
  detail::check_same_device("add_layer_norm", x_in, y_in);
  detail::check_same_dtype("add_layer_norm", x_in, y_in);
  const Shape& xs = x_in.shape();
  const Shape& ys = y_in.shape();
  BT_CHECK(
      y_in.dim() >= 1 && y_in.dim() <= x_in.dim() && std::equal(ys.begin(), ys.end(), xs.end() - y_in.dim()),
      "add_layer_norm: y has shape ", shape_str(ys), " but must have x's shape ", shape_str(xs),
      " or that of its trailing dimensions");
  Tensor x = x_in.contiguous(), y = y_in.contiguous(), w = contiguous_or_none(w_in),
         b = contiguous_or_none(b_in), yb = contiguous_or_none(yb_in);
  auto [s, out, mean, rstd] = forward(types, x, y, w, b, eps, yb);
  if (autograd::any_requires_grad({&x_in, &y_in, &w_in, &b_in, &yb_in})) {
    // out is layer_norm's bits on s (Note [Residual into LayerNorm]), so the
    // plain op rebuilds it.
    autograd::make_recomputable(out,
                                [ss = SavedTensor(s, "add_layer_norm"), sw = SavedTensor(w, "add_layer_norm"),
                                 sb = SavedTensor(b, "add_layer_norm"),
                                 eps] { return layer_norm(ss.unpack(), sw.unpack(), sb.unpack(), eps); });
    autograd::record("AddLayerNormBackward", {&x_in, &y_in, &w_in, &b_in, &yb_in}, {s, out},
                     [types, ss = SavedTensor(s, "add_layer_norm"), sw = SavedTensor(w, "add_layer_norm"),
                      sm = SavedTensor(mean, "add_layer_norm"), sr = SavedTensor(rstd, "add_layer_norm"),
                      has_b = b.defined(), has_yb = yb.defined(), ys](autograd::Grads& g) -> autograd::Grads {
                       // g[0] reaches s from the stream's next reader, g[1] from the LayerNorm's output.
                       Tensor ds = g[0], dw, db, dyb;
                       if (g[1].defined()) {
                         auto [dx, gw, gb, gs] = backward(types, ss.unpack(), sw.unpack(), has_b, sm.unpack(),
                                                          sr.unpack(), g[1], g[0], has_yb);
                         ds = dx, dw = gw, db = gb, dyb = gs;
                       } else if (has_yb && ds.defined()) {
                         // No LayerNorm gradient: the bias's is ds summed over the rows, in the gradients'
                         // dtype.
                         dyb = sum_to(ds.to(types.g), Shape{ds.size(-1)});
                       }
                       return {ds, sum_to(ds, ys), dw, db, dyb};
                     });
  }
  return {s, out};
}

}  // namespace bt
