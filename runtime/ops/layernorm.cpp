#include "runtime/ops/layernorm.h"

#include "kernels/layernorm.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/recompute.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {

Tensor layer_norm(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, double eps) {
  detail::check_defined("layer_norm", x_in, "x");
  detail::check_dtype("layer_norm", x_in, "x", {DType::F32, DType::F64, DType::BF16});
  BT_CHECK(x_in.dim() >= 1, "layer_norm: x must have at least one dimension");
  BT_CHECK(eps > 0, "layer_norm: eps must be > 0, got ", eps);
  const int64_t C = x_in.size(-1), R = C ? x_in.numel() / C : 0;
  for (const Tensor* p : {&w_in, &b_in}) {
    if (!p->defined()) continue;
    detail::check_same_device("layer_norm", x_in, *p);
    detail::check_same_dtype("layer_norm", x_in, *p);
    BT_CHECK(p->dim() == 1 && p->size(0) == C, "layer_norm: ", p == &w_in ? "weight" : "bias", " has shape ",
             shape_str(p->shape()), " but x has ", C, " features (shape ", shape_str(x_in.shape()), ")");
  }
  Tensor x = x_in.contiguous(), w = w_in.defined() ? w_in.contiguous() : Tensor(),
         b = b_in.defined() ? b_in.contiguous() : Tensor();
  Tensor y = empty(x.shape(), x.options());
  TensorOptions f32{DType::F32, x.device()};
  Tensor mean = empty({R}, f32), rstd = empty({R}, f32);
  const void* wp = w.defined() ? w.data_ptr() : nullptr;
  const void* bp = b.defined() ? b.data_ptr() : nullptr;
  const float e = static_cast<float>(eps);
  detail::on_device(
      x.device(),
      [&] {
        kernels::cpu::layernorm_forward(x.dtype(), x.data_ptr(), wp, bp, y.data_ptr(), mean.data<float>(),
                                        rstd.data<float>(), R, C, e);
      },
      BT_CUDA_LAMBDA(kernels::cuda::layernorm_forward(x.dtype(), x.data_ptr(), wp, bp, y.data_ptr(),
                                                      mean.data<float>(), rstd.data<float>(), R, C, e,
                                                      stream)));
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in})) {
    autograd::make_recomputable(y, [sx = SavedTensor(x, "layer_norm"), sw = SavedTensor(w, "layer_norm"),
                                    sb = SavedTensor(b, "layer_norm"),
                                    eps] { return layer_norm(sx.unpack(), sw.unpack(), sb.unpack(), eps); });
    autograd::record(
        "LayerNormBackward", {&x_in, &w_in, &b_in}, y,
        [sx = SavedTensor(x, "layer_norm"), sw = SavedTensor(w, "layer_norm"),
         sm = SavedTensor(mean, "layer_norm"), sr = SavedTensor(rstd, "layer_norm"), has_b = b.defined(), R,
         C](autograd::Grads& g) -> autograd::Grads {
          Tensor x = sx.unpack(), w = sw.unpack(), mean = sm.unpack(), rstd = sr.unpack();
          Tensor dy = g[0].contiguous();
          Tensor dx = empty(x.shape(), x.options());
          Tensor dw = w.defined() ? empty({C}, x.options()) : Tensor();
          Tensor db = has_b ? empty({C}, x.options()) : Tensor();
          const void* wp = w.defined() ? w.data_ptr() : nullptr;
          void* dwp = dw.defined() ? dw.data_ptr() : nullptr;
          void* dbp = db.defined() ? db.data_ptr() : nullptr;
          detail::on_device(
              x.device(),
              [&] {
                kernels::cpu::layernorm_backward(x.dtype(), dy.data_ptr(), x.data_ptr(), wp,
                                                 mean.data<float>(), rstd.data<float>(), dx.data_ptr(), dwp,
                                                 dbp, R, C);
              },
              BT_CUDA_LAMBDA(
                  Tensor scratch =
                      empty({static_cast<int64_t>(kernels::cuda::layernorm_backward_scratch_floats(R, C))},
                            TensorOptions{DType::F32, x.device()});
                  kernels::cuda::layernorm_backward(x.dtype(), dy.data_ptr(), x.data_ptr(), wp,
                                                    mean.data<float>(), rstd.data<float>(), dx.data_ptr(),
                                                    dwp, dbp, R, C, scratch.data<float>(), stream)));
          return {dx, dw, db};
        });
  }
  return y;
}

}  // namespace bt
