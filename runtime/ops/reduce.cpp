#include "runtime/ops/reduce.h"

#include <algorithm>
#include <optional>

#include "kernels/reduce.h"
#include "kernels/scatter.h"
#include "kernels/sum_squares.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/compile/lazy.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/elementwise.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

using autograd::Grads;
using kernels::ReduceOp;

struct Split {
  int64_t outer = 1, dim = 1, inner = 1;
};

Split split_at(const Shape& s, int d) {
  Split p;
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    if (i < d)
      p.outer *= s[i];
    else if (i == d)
      p.dim = s[i];
    else
      p.inner *= s[i];
  }
  return p;
}

/// Reduces one dim of x (keepdim shape) into dtype `out` (x's, or f32 for a
/// bf16 Sum/Mean). argmax (I64) is filled for Max when non-null.
Tensor reduce_one(ReduceOp op, const Tensor& x_in, int d, Tensor* argmax, DType out) {
  detail::check_dtype("reduce", x_in, "input", {DType::F32, DType::F64, DType::BF16});
  if (op == ReduceOp::Sum && !argmax && x_in.numel() > 0 && fusion::lazy_recording(x_in.device()))
    return fusion::lazy_sum(x_in.contiguous(), d, out);  // Note [Lazy fusion]
  Tensor x = x_in.contiguous();
  const Split p = split_at(x.shape(), d);
  BT_CHECK(op != ReduceOp::Max || p.dim > 0, "max: cannot reduce an empty dimension (size 0)");
  Shape out_shape = x.shape();
  out_shape[d] = 1;
  Tensor y = empty(out_shape, x.options().with_dtype(out));
  int64_t* am = nullptr;
  if (argmax) {
    *argmax = empty(out_shape, TensorOptions{DType::I64, x.device()});
    am = argmax->data<int64_t>();
  }
  detail::on_device(
      x.device(),
      [&] {
        if (out == x.dtype())
          kernels::cpu::reduce_dim(op, x.dtype(), x.data_ptr(), y.data_ptr(), p.outer, p.dim, p.inner, am);
        else
          kernels::cpu::reduce_dim(op, x.dtype(), out, x.data_ptr(), y.data_ptr(), p.outer, p.dim, p.inner);
      },
      BT_CUDA_LAMBDA({
        const size_t n = kernels::cuda::reduce_dim_scratch_floats(op, p.outer, p.dim, p.inner);
        Tensor scratch =
            n ? empty({static_cast<int64_t>(n)}, TensorOptions{DType::F32, x.device()}) : Tensor();
        float* s = n ? scratch.data<float>() : nullptr;
        if (out == x.dtype())
          kernels::cuda::reduce_dim(op, x.dtype(), x.data_ptr(), y.data_ptr(), p.outer, p.dim, p.inner, am, s,
                                    stream);
        else
          kernels::cuda::reduce_dim(op, x.dtype(), out, x.data_ptr(), y.data_ptr(), p.outer, p.dim, p.inner,
                                    s, stream);
      }));
  return y;
}

std::vector<int> normalize_dims(const std::vector<int64_t>& dims, int ndim, const char* op) {
  std::vector<int> out;
  for (int64_t d : dims) out.push_back(normalize_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  BT_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op, ": a dimension appears twice");
  return out;
}

Shape drop_dims(const Shape& s, const std::vector<int>& dims) {
  Shape out;
  for (int i = 0; i < static_cast<int>(s.size()); ++i)
    if (!std::binary_search(dims.begin(), dims.end(), i)) out.push_back(s[i]);
  return out;
}

Tensor sum_raw(const Tensor& x, const std::vector<int>& dims, bool keepdim, bool mean, DType out) {
  Tensor y = x;
  int64_t count = 1;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    count *= x.shape()[*it];
    y = reduce_one(ReduceOp::Sum, y, *it, nullptr, out);
  }
  if (dims.empty()) y = out == x.dtype() ? x.contiguous().clone() : x.to(out);
  if (mean) {
    NoGradGuard ng;
    y = mul(y, 1.0 / static_cast<double>(std::max<int64_t>(count, 1)));
  }
  return keepdim ? y : y.reshape(drop_dims(x.shape(), dims));
}

/// `out`: the dtype to sum in and return, x's or (Note [Gradients in a wider
/// dtype]) f32 for a bf16 x; the backward then returns an f32 gradient.
Tensor sum_impl(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim, bool mean,
                std::optional<DType> out = std::nullopt) {
  const char* op = mean ? "mean" : "sum";
  detail::check_defined(op, x, "input");
  const std::vector<int> dims = normalize_dims(dims_in, x.dim(), op);
  if (out) kernels::reduce_widens(ReduceOp::Sum, x.dtype(), *out, op);
  Tensor y;
  {
    NoGradGuard ng;
    y = sum_raw(x, dims, keepdim, mean, out.value_or(x.dtype()));
  }
  if (autograd::any_requires_grad({&x})) {
    int64_t count = 1;
    for (int d : dims) count *= x.shape()[d];
    Shape kept = x.shape();
    for (int d : dims) kept[d] = 1;
    autograd::record(
        mean ? "MeanBackward" : "SumBackward", {&x}, y,
        [kept, xs = x.shape(), scale = mean ? 1.0 / std::max<int64_t>(count, 1) : 1.0](Grads& g) -> Grads {
          // Under lazy fusion the expansion is the scale's broadcast: no view of a pending value, no copy.
          if (fusion::lazy_recording(g[0].device()) && shape_numel(xs) > 0)
            return {fusion::lazy_scalar_to(fusion::Op::Mul, g[0].reshape(kept), scale, xs)};
          Tensor gi = g[0].reshape(kept).expand(xs).contiguous();
          return {scale == 1.0 ? gi : mul(gi, scale)};
        });
  }
  return y;
}

std::vector<int64_t> all_dims(const Tensor& x) {
  std::vector<int64_t> d(x.dim());
  for (int i = 0; i < x.dim(); ++i) d[i] = i;
  return d;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, false);
}
Tensor sum(const Tensor& x) { return sum_impl(x, all_dims(x), false, false); }
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType dtype) {
  return sum_impl(x, dims, keepdim, false, dtype);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_impl(x, dims, keepdim, true);
}
Tensor mean(const Tensor& x) { return sum_impl(x, all_dims(x), false, true); }

Tensor max(const Tensor& x, int64_t dim_in, bool keepdim) {
  detail::check_defined("max", x, "input");
  const int d = normalize_dim(dim_in, x.dim(), "max");
  Tensor argmax;
  Tensor y = reduce_one(ReduceOp::Max, x, d, &argmax, x.dtype());
  Shape kept = y.shape();
  if (!keepdim) y = y.detach().reshape(drop_dims(x.shape(), {d}));
  if (autograd::any_requires_grad({&x}))
    autograd::record(
        "MaxBackward", {&x}, y,
        [kept, xs = x.shape(), d, argmax = SavedTensor(argmax, "max")](Grads& g) -> Grads {
          Tensor dy = g[0].reshape(kept).contiguous();
          Tensor am = argmax.unpack();
          Tensor dx = empty(xs, dy.options());
          const Split p = split_at(xs, d);
          detail::on_device(
              dx.device(),
              [&] {
                kernels::cpu::argmax_scatter(dx.dtype(), dy.data_ptr(), am.data<int64_t>(), dx.data_ptr(),
                                             p.outer, p.dim, p.inner);
              },
              BT_CUDA_LAMBDA(kernels::cuda::argmax_scatter(dx.dtype(), dy.data_ptr(), am.data<int64_t>(),
                                                           dx.data_ptr(), p.outer, p.dim, p.inner, stream)));
          return {dx};
        });
  return y;
}

Tensor max(const Tensor& x) { return max(x.reshape({x.numel()}), 0, false); }

Tensor sum_squares(const std::vector<Tensor>& xs) {
  BT_CHECK(!xs.empty(), "sum_squares: no tensors given");
  NoGradGuard ng;
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::check_defined("sum_squares", xs[i], "input");
    detail::check_same_device("sum_squares", xs[0], xs[i]);
    detail::check_dtype("sum_squares", xs[i], "input", {DType::F32, DType::F64, DType::BF16});
  }
  const Device dev = xs[0].device();
  if (!dev.is_cuda()) {
    Tensor total;
    for (const Tensor& x : xs) {
      const Tensor f = x.dtype() == DType::F32 ? x : x.to(DType::F32);
      const Tensor sq = sum(mul(f, f));
      total = total.defined() ? add(total, sq) : sq;
    }
    return total;
  }
  std::vector<Tensor> dense;  // keeps the contiguous copies (if any) alive until the kernel is queued
  std::vector<kernels::SquaresInput> in;
  for (const Tensor& x : xs) {
    dense.push_back(x.contiguous());
    in.push_back({dense.back().dtype(), dense.back().data_ptr(), dense.back().numel()});
  }
  Tensor out = empty({}, TensorOptions{DType::F32, dev});
  detail::on_device(
      dev, [] {}, BT_CUDA_LAMBDA({
        const int n = static_cast<int>(in.size());
        Tensor scratch =
            empty({static_cast<int64_t>(kernels::cuda::sum_squares_scratch_floats(in.data(), n))},
                  TensorOptions{DType::F32, dev});
        kernels::cuda::sum_squares(in.data(), n, out.data<float>(), scratch.data<float>(), stream);
      }));
  return out;
}

}  // namespace bt
