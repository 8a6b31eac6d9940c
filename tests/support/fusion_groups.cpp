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

Tensor uniform_cpu(const Shape& s, DType dt, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t = empty(s, TensorOptions{DType::F32});
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(gen);
  return t.to(dt);
}

}  // namespace bt::test
