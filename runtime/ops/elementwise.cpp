#include "runtime/ops/elementwise.h"

#include "kernels/elementwise.h"
#include "runtime/autograd/function.h"
#include "runtime/compile/lazy.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

using autograd::Grads;
using kernels::BinaryOp;
using kernels::UnaryOp;

constexpr std::initializer_list<DType> kFloat = {DType::F32, DType::F64, DType::BF16};

fusion::Op fusion_op(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return fusion::Op::Add;
    case BinaryOp::Sub:
      return fusion::Op::Sub;
    case BinaryOp::Mul:
      return fusion::Op::Mul;
    case BinaryOp::Div:
      return fusion::Op::Div;
    case BinaryOp::Pow:
      break;
  }
  return fusion::Op::Pow;
}

/// The fusion op of a unary op without a scalar.
fusion::Op fusion_op(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return fusion::Op::Neg;
    case UnaryOp::Exp:
      return fusion::Op::Exp;
    case UnaryOp::Log:
      return fusion::Op::Log;
    case UnaryOp::Tanh:
      return fusion::Op::Tanh;
    case UnaryOp::Sqrt:
      return fusion::Op::Sqrt;
    default:
      BT_FAIL("fusion_op: unary op ", static_cast<int>(op), " takes a scalar");
  }
}

Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  detail::check_defined(name, a, "a");
  detail::check_defined(name, b, "b");
  detail::check_same_device(name, a, b);
  detail::check_same_dtype(name, a, b);
  detail::check_dtype(name, a, "a", kFloat);
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), name);
  if (fusion::lazy_recording(a.device()) && shape_numel(out_shape) > 0)  // Note [Lazy fusion]
    return fusion::lazy_binary(fusion_op(op), a, b);
  Tensor y = empty(out_shape, a.options());
  const auto la = detail::broadcast_layout(a, out_shape), lb = detail::broadcast_layout(b, out_shape);
  detail::on_device(
      a.device(),
      [&] { kernels::cpu::binary(op, a.dtype(), a.data_ptr(), la, b.data_ptr(), lb, y.data_ptr()); },
      BT_CUDA_LAMBDA(
          kernels::cuda::binary(op, a.dtype(), a.data_ptr(), la, b.data_ptr(), lb, y.data_ptr(), stream)));
  return y;
}

Tensor unary_raw(UnaryOp op, const Tensor& a, double scalar, const char* name) {
  detail::check_defined(name, a, "input");
  detail::check_dtype(name, a, "input", kFloat);
  if (fusion::lazy_recording(a.device()) && a.numel() > 0) {  // Note [Lazy fusion]
    switch (op) {
      case UnaryOp::AddScalar:
        return fusion::lazy_scalar(fusion::Op::Add, a, scalar);
      case UnaryOp::MulScalar:
        return fusion::lazy_scalar(fusion::Op::Mul, a, scalar);
      case UnaryOp::PowScalar:
        return fusion::lazy_scalar(fusion::Op::Pow, a, scalar);
      default:
        return fusion::lazy_unary(fusion_op(op), a.contiguous());
    }
  }
  Tensor x = a.contiguous();
  Tensor y = empty(x.shape(), x.options());
  detail::on_device(
      x.device(), [&] { kernels::cpu::unary(op, x.dtype(), x.data_ptr(), y.data_ptr(), x.numel(), scalar); },
      BT_CUDA_LAMBDA(
          kernels::cuda::unary(op, x.dtype(), x.data_ptr(), y.data_ptr(), x.numel(), scalar, stream)));
  return y;
}

}  // namespace

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int lead = g.dim() - static_cast<int>(shape.size());
  BT_ASSERT(lead >= 0);
  std::vector<int64_t> dims;
  for (int i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(i);
  return sum(g, dims, /*keepdim=*/true).reshape(shape);
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Add, a, b, "add");
  if (autograd::any_requires_grad({&a, &b}))
    autograd::record("AddBackward", {&a, &b}, y, [sa = a.shape(), sb = b.shape()](Grads& g) -> Grads {
      return {sum_to(g[0], sa), sum_to(g[0], sb)};
    });
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Sub, a, b, "sub");
  if (autograd::any_requires_grad({&a, &b}))
    autograd::record("SubBackward", {&a, &b}, y, [sa = a.shape(), sb = b.shape()](Grads& g) -> Grads {
      return {sum_to(g[0], sa), sum_to(neg(g[0]), sb)};
    });
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Mul, a, b, "mul");
  if (autograd::any_requires_grad({&a, &b}))
    autograd::record("MulBackward", {&a, &b}, y,
                     [sa = SavedTensor(a, "mul"), sb = SavedTensor(b, "mul"), ra = a.requires_grad(),
                      rb = b.requires_grad()](Grads& g) -> Grads {
                       Tensor a = sa.unpack(), b = sb.unpack();
                       return {ra ? sum_to(mul(g[0], b), a.shape()) : Tensor(),
                               rb ? sum_to(mul(g[0], a), b.shape()) : Tensor()};
                     });
  return y;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Div, a, b, "div");
  if (autograd::any_requires_grad({&a, &b}))
    autograd::record(
        "DivBackward", {&a, &b}, y,
        [sa = SavedTensor(a, "div"), sb = SavedTensor(b, "div"), rb = b.requires_grad()](Grads& g) -> Grads {
          Tensor a = sa.unpack(), b = sb.unpack();
          Tensor ga = sum_to(div(g[0], b), a.shape());
          Tensor gb = rb ? sum_to(neg(div(mul(g[0], a), mul(b, b))), b.shape()) : Tensor();
          return {ga, gb};
        });
  return y;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor y = binary_raw(BinaryOp::Pow, a, b, "pow");
  if (autograd::any_requires_grad({&a, &b}))
    autograd::record("PowBackward", {&a, &b}, y,
                     [sa = SavedTensor(a, "pow"), sb = SavedTensor(b, "pow"), sy = SavedTensor(y, "pow"),
                      rb = b.requires_grad()](Grads& g) -> Grads {
                       Tensor a = sa.unpack(), b = sb.unpack();
                       // d/da a^b = b a^(b-1); d/db a^b = a^b log a
                       Tensor ga = sum_to(mul(g[0], mul(b, pow(a, sub(b, ones_like(b))))), a.shape());
                       Tensor gb = rb ? sum_to(mul(g[0], mul(sy.unpack(), log(a))), b.shape()) : Tensor();
                       return {ga, gb};
                     });
  return y;
}

Tensor add(const Tensor& a, double s) {
  Tensor y = unary_raw(UnaryOp::AddScalar, a, s, "add");
  if (autograd::any_requires_grad({&a}))
    autograd::record("AddScalarBackward", {&a}, y, [](Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor mul(const Tensor& a, double s) {
  Tensor y = unary_raw(UnaryOp::MulScalar, a, s, "mul");
  if (autograd::any_requires_grad({&a}))
    autograd::record("MulScalarBackward", {&a}, y, [s](Grads& g) -> Grads { return {mul(g[0], s)}; });
  return y;
}

Tensor pow(const Tensor& a, double e) {
  Tensor y = unary_raw(UnaryOp::PowScalar, a, e, "pow");
  if (autograd::any_requires_grad({&a}))
    autograd::record("PowScalarBackward", {&a}, y, [sa = SavedTensor(a, "pow"), e](Grads& g) -> Grads {
      return {mul(g[0], mul(pow(sa.unpack(), e - 1.0), e))};
    });
  return y;
}

Tensor neg(const Tensor& a) {
  Tensor y = unary_raw(UnaryOp::Neg, a, 0, "neg");
  if (autograd::any_requires_grad({&a}))
    autograd::record("NegBackward", {&a}, y, [](Grads& g) -> Grads { return {neg(g[0])}; });
  return y;
}

Tensor exp(const Tensor& a) {
  Tensor y = unary_raw(UnaryOp::Exp, a, 0, "exp");
  if (autograd::any_requires_grad({&a}))
    autograd::record("ExpBackward", {&a}, y,
                     [sy = SavedTensor(y, "exp")](Grads& g) -> Grads { return {mul(g[0], sy.unpack())}; });
  return y;
}

Tensor log(const Tensor& a) {
  Tensor y = unary_raw(UnaryOp::Log, a, 0, "log");
  if (autograd::any_requires_grad({&a}))
    autograd::record("LogBackward", {&a}, y,
                     [sa = SavedTensor(a, "log")](Grads& g) -> Grads { return {div(g[0], sa.unpack())}; });
  return y;
}

Tensor tanh(const Tensor& a) {
  Tensor y = unary_raw(UnaryOp::Tanh, a, 0, "tanh");
  if (autograd::any_requires_grad({&a}))
    autograd::record("TanhBackward", {&a}, y, [sy = SavedTensor(y, "tanh")](Grads& g) -> Grads {
      Tensor t = sy.unpack();
      return {mul(g[0], add(neg(mul(t, t)), 1.0))};  // 1 - tanh^2
    });
  return y;
}

Tensor sqrt(const Tensor& a) {
  Tensor y = unary_raw(UnaryOp::Sqrt, a, 0, "sqrt");
  if (autograd::any_requires_grad({&a}))
    autograd::record("SqrtBackward", {&a}, y, [sy = SavedTensor(y, "sqrt")](Grads& g) -> Grads {
      return {div(g[0], mul(sy.unpack(), 2.0))};
    });
  return y;
}

}  // namespace bt
