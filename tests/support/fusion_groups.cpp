#include "tests/support/fusion_groups.h"

#include "runtime/tensor/factory.h"

namespace bt::test {

using fusion::Op;

fusion::Group bias_gelu_group(DType dt, int64_t rows, int64_t cols) {
  fusion::Group g;
  g.name = "bias_gelu";
  const int x = g.input(dt, {rows, cols}), b = g.input(dt, {cols});
  const int s = g.binary(Op::Add, x, b);
  const int cube = g.binary(Op::Mul, g.binary(Op::Mul, s, s), s);
  const int inner = g.binary(Op::Mul, g.binary(Op::Add, s, g.binary(Op::Mul, g.scalar(0.044715, dt), cube)),
                             g.scalar(0.7978845608028654, dt));
  g.output(g.binary(Op::Mul, g.binary(Op::Mul, g.scalar(0.5, dt), s),
                    g.binary(Op::Add, g.scalar(1.0, dt), g.unary(Op::Tanh, inner))));
  return g;
}

fusion::Group layer_norm_group(DType dt, int64_t rows, int64_t cols) {
  fusion::Group g;
  g.name = "layer_norm";
  const int x = g.input(dt, {rows, cols}), w = g.input(dt, {cols}), b = g.input(dt, {cols});
  const int inv_n = g.scalar(1.0 / static_cast<double>(cols), dt);
  const int mean = g.binary(Op::Mul, g.reduce(Op::Sum, x, {1}, true), inv_n);
  const int xc = g.binary(Op::Sub, x, mean);
  const int var = g.binary(Op::Mul, g.reduce(Op::Sum, g.binary(Op::Mul, xc, xc), {1}, true), inv_n);
  const int rstd =
      g.binary(Op::Div, g.scalar(1.0, dt), g.unary(Op::Sqrt, g.binary(Op::Add, var, g.scalar(1e-5, dt))));
  g.output(g.binary(Op::Add, g.binary(Op::Mul, g.binary(Op::Mul, xc, rstd), w), b));
  g.output(mean);
  g.output(rstd);
  return g;
}

fusion::Group bias_grad_group(DType dt, const Shape& shape) {
  fusion::Group g;
  g.name = "bias_grad";
  int s = g.input(dt, shape);
  for (auto d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s = g.reduce(Op::Sum, s, {d}, true);
  g.output(s);
  return g;
}

fusion::Group square_norm_group(int64_t rows, int64_t cols) {
  fusion::Group g;
  g.name = "square_norm";
  const int a = g.input(DType::F32, {}), b = g.input(DType::F32, {});
  const int x = g.input(DType::F32, {rows, cols});
  g.output(g.reduce(Op::Sum, g.reduce(Op::Sum, g.binary(Op::Mul, x, x), {1}, true), {0}, true));
  g.output(g.binary(Op::Add, a, b));
  return g;
}

fusion::Group layer_norm_backward_group(DType dt, const Shape& shape) {
  fusion::Group g;
  g.name = "layer_norm_backward";
  const auto last = static_cast<int64_t>(shape.size()) - 1;
  Shape row = shape;
  row.back() = 1;
  const int dy = g.input(dt, shape), w = g.input(dt, {shape.back()}), xhat = g.input(dt, shape);
  const int sd = g.input(dt, row);
  const auto columns = [&](int v) {
    for (auto d = last - 1; d >= 0; --d) v = g.reduce(Op::Sum, v, {d}, true);
    return v;
  };
  g.output(columns(dy));
  g.output(columns(g.binary(Op::Mul, dy, xhat)));
  const int dxhat = g.binary(Op::Mul, dy, w);
  g.output(g.binary(Op::Div, dxhat, sd));
  const int s = g.reduce(Op::Sum, g.unary(Op::Neg, g.binary(Op::Div, g.binary(Op::Mul, dxhat, xhat), sd)),
                         {last}, true);
  g.output(g.binary(Op::Div, s, g.binary(Op::Mul, sd, g.scalar(2.0, dt))));
  return g;
}

fusion::Group row_then_column_group(DType dt, const Shape& shape) {
  fusion::Group g;
  g.name = "row_then_column";
  const auto last = static_cast<int64_t>(shape.size()) - 1;
  const int x = g.input(dt, shape);
  const int s = g.reduce(Op::Sum, g.unary(Op::Neg, x), {last}, true);
  const int y = g.binary(
      Op::Add, x, g.binary(Op::Mul, s, g.scalar(1.0 / static_cast<double>(shape.back()), DType::F32), shape));
  g.output(y);
  int c = y;
  for (auto d = last - 1; d >= 0; --d) c = g.reduce(Op::Sum, c, {d}, true);
  g.output(c);
  return g;
}

fusion::Group gelu_backward_group(DType dt, int64_t rows, int64_t cols) {
  fusion::Group g;
  g.name = "gelu_backward";
  const int h = g.input(dt, {rows, cols}), dg = g.input(dt, {rows, cols});
  const auto c = [&](double v) { return g.scalar(v, dt); };
  // gelu(h) = 0.5 h (1 + t), t = tanh(k (h + a h^3)); gelu' = 0.5 (1 + t) + 0.5 h (1 - t^2) k (1 + 3a h^2)
  const double k = 0.7978845608028654, a = 0.044715;
  const int h2 = g.binary(Op::Mul, h, h);
  const int t = g.unary(
      Op::Tanh,
      g.binary(Op::Mul, g.binary(Op::Add, h, g.binary(Op::Mul, c(a), g.binary(Op::Mul, h2, h))), c(k)));
  const int left = g.binary(Op::Mul, c(0.5), g.binary(Op::Add, c(1.0), t));
  const int dt_dh =
      g.binary(Op::Mul, g.binary(Op::Sub, c(1.0), g.binary(Op::Mul, t, t)),
               g.binary(Op::Mul, c(k), g.binary(Op::Add, c(1.0), g.binary(Op::Mul, c(3 * a), h2))));
  const int right = g.binary(Op::Mul, g.binary(Op::Mul, c(0.5), h), dt_dh);
  const int dh = g.binary(Op::Mul, dg, g.binary(Op::Add, left, right));
  g.output(dh);
  g.output(g.reduce(Op::Sum, dh, {0}, true));
  return g;
}

Tensor uniform_cpu(const Shape& s, DType dt, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t = empty(s, TensorOptions{DType::F32});
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(gen);
  return t.to(dt);
}

}  // namespace bt::test
