#include "runtime/optim/clip.h"

#include <cmath>

#include "kernels/sum_squares.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt {

Tensor grad_sum_squares(const std::vector<Tensor>& params, const Device& device) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(std::move(g));
  if (grads.empty()) return zeros({1}, TensorOptions{DType::F32, device});
  return sum_squares(grads);
}

double global_grad_norm(const std::vector<Tensor>& params) {
  if (params.empty()) return 0.0;
  return std::sqrt(static_cast<double>(grad_sum_squares(params, params[0].device()).item<float>()));
}

Tensor clip_scale(const Tensor& sumsq, double max_norm, const Tensor& loss) {
  BT_CHECK(sumsq.numel() == 1 && sumsq.is_contiguous() &&
               (sumsq.dtype() == DType::F32 || sumsq.dtype() == DType::F64),
           "clip_scale: the sum of squares must be one contiguous f32 or f64 value, got ", sumsq.dtype(), " ",
           shape_str(sumsq.shape()));
  BT_CHECK(!loss.defined() || (loss.numel() == 1 && loss.is_contiguous() && loss.dtype() == DType::F64 &&
                               loss.device() == sumsq.device()),
           "clip_scale: the loss must be one contiguous f64 value on ", sumsq.device(), ", got ",
           loss.dtype(), " ", shape_str(loss.shape()), " on ", loss.device());
  const double* l = loss.defined() ? loss.data<double>() : nullptr;
  Tensor out = empty({2}, TensorOptions{DType::F32, sumsq.device()});
  detail::on_device(
      sumsq.device(),
      [&] { kernels::cpu::clip_scale(sumsq.data_ptr(), sumsq.dtype(), max_norm, out.data<float>(), l); },
      BT_CUDA_LAMBDA(kernels::cuda::clip_scale(sumsq.data_ptr(), sumsq.dtype(), max_norm, out.data<float>(),
                                               l, stream)));
  return out;
}

}  // namespace bt
