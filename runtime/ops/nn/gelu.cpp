#include "runtime/ops/nn/gelu.h"

#include "kernels/gelu.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/recompute.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {

Tensor gelu(const Tensor& x_in) {
  detail::check_defined("gelu", x_in, "x");
  detail::check_dtype("gelu", x_in, "x", {DType::F32, DType::F64, DType::BF16});
  Tensor x = x_in.contiguous();
  Tensor y = empty(x.shape(), x.options());
  detail::on_device(
      x.device(), [&] { kernels::cpu::gelu_forward(x.dtype(), x.data_ptr(), y.data_ptr(), x.numel()); },
      BT_CUDA_LAMBDA(kernels::cuda::gelu_forward(x.dtype(), x.data_ptr(), y.data_ptr(), x.numel(), stream)));
  if (autograd::any_requires_grad({&x_in})) {
    autograd::make_recomputable(y, [sx = SavedTensor(x, "gelu")] { return gelu(sx.unpack()); });
    autograd::record("GeluBackward", {&x_in}, y,
                     [sx = SavedTensor(x, "gelu")](autograd::Grads& g) -> autograd::Grads {
                       return {gelu_backward(sx.unpack(), g[0])};
                     });
  }
  return y;
}

Tensor gelu_backward(const Tensor& x_in, const Tensor& dy_in) {
  detail::check_same_device("gelu_backward", x_in, dy_in);
  detail::check_same_dtype("gelu_backward", x_in, dy_in);
  BT_CHECK(x_in.shape() == dy_in.shape(), "gelu_backward: x ", shape_str(x_in.shape()), " and dy ",
           shape_str(dy_in.shape()), " differ");
  Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  Tensor dx = empty(x.shape(), x.options());
  detail::on_device(
      x.device(),
      [&] { kernels::cpu::gelu_backward(x.dtype(), x.data_ptr(), dy.data_ptr(), dx.data_ptr(), x.numel()); },
      BT_CUDA_LAMBDA(kernels::cuda::gelu_backward(x.dtype(), x.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                                  x.numel(), stream)));
  return dx;
}

}  // namespace bt
