#include "runtime/ops/softmax.h"

#include <algorithm>

#include "kernels/softmax.h"
#include "runtime/autograd/function.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

using autograd::Grads;

/// Row-wise kernel over the last dim of a contiguous tensor.
Tensor rows_forward(const Tensor& x, bool log) {
  Tensor y = empty(x.shape(), x.options());
  const int64_t cols = x.dim() ? x.size(-1) : 1, rows = cols ? x.numel() / cols : 0;
  detail::on_device(
      x.device(),
      [&] { kernels::cpu::softmax_forward(x.dtype(), x.data_ptr(), y.data_ptr(), rows, cols, log); },
      BT_CUDA_LAMBDA(
          kernels::cuda::softmax_forward(x.dtype(), x.data_ptr(), y.data_ptr(), rows, cols, log, stream)));
  return y;
}

Tensor rows_backward(const Tensor& y, const Tensor& dy_in, bool log) {
  Tensor dy = dy_in.contiguous();
  Tensor dx = empty(y.shape(), y.options());
  const int64_t cols = y.dim() ? y.size(-1) : 1, rows = cols ? y.numel() / cols : 0;
  detail::on_device(
      y.device(),
      [&] {
        kernels::cpu::softmax_backward(y.dtype(), y.data_ptr(), dy.data_ptr(), dx.data_ptr(), rows, cols,
                                       log);
      },
      BT_CUDA_LAMBDA(kernels::cuda::softmax_backward(y.dtype(), y.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                                     rows, cols, log, stream)));
  return dx;
}

Tensor softmax_impl(const Tensor& x, int64_t dim_in, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  detail::check_defined(name, x, "x");
  detail::check_dtype(name, x, "x", {DType::F32, DType::F64, DType::BF16});
  const int d = normalize_dim(dim_in, std::max(x.dim(), 1), name);  // a scalar: dim 0 or -1
  const bool last = x.dim() == 0 || d == x.dim() - 1;
  // Other dims: move `d` last, run row-wise, move it back (a view).
  Tensor xt = last ? x.detach().contiguous() : x.detach().transpose(d, -1).contiguous();
  Tensor yt = rows_forward(xt, log);
  Tensor y = last ? yt : yt.transpose(d, -1);
  if (autograd::any_requires_grad({&x}))
    autograd::record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {&x}, y,
                     [sy = SavedTensor(yt, name), d, last, log](Grads& g) -> Grads {
                       Tensor gt = last ? g[0] : g[0].transpose(d, -1);
                       Tensor dx = rows_backward(sy.unpack(), gt, log);
                       return {last ? dx : dx.transpose(d, -1)};
                     });
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

}  // namespace bt
