#include "tests/support/gradcheck.h"

#include <cmath>

#include <gtest/gtest.h>

namespace bt::test {

Tensor leaf(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  return uniform(shape, lo, hi, TensorOptions{DType::F64}, &g).requires_grad_(true);
}

double rel_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

bool gradcheck(const Fn& f, std::vector<Tensor> inputs, double eps, double atol, double rtol) {
  // Analytic: backward of sum(out * w) for a fixed random w.
  for (Tensor& t : inputs)
    if (t.requires_grad()) t.set_grad(Tensor());
  Tensor out = f(inputs);
  Generator gw(1234);
  const Tensor w = uniform(out.shape(), 0.5, 1.5, TensorOptions{out.dtype()}, &gw);
  sum(mul(out, w)).backward();

  auto loss = [&] {
    NoGradGuard ng;
    return sum(mul(f(inputs), w)).item<double>();
  };
  bool ok = true;
  int reported = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    EXPECT_EQ(x.dtype(), DType::F64) << "gradcheck inputs must be f64";
    Tensor g = x.grad();
    if (!g.defined()) {
      ADD_FAILURE() << "input " << i << " received no gradient";
      ok = false;
      continue;
    }
    const std::vector<double> analytic = g.to_vector<double>();
    double* p = x.data<double>();
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double orig = p[j];
      p[j] = orig + eps;
      const double lp = loss();
      p[j] = orig - eps;
      const double lm = loss();
      p[j] = orig;
      const double numeric = (lp - lm) / (2 * eps);
      if (!(std::abs(analytic[j] - numeric) <= atol + rtol * std::abs(numeric))) {
        ok = false;
        if (reported++ < 10)
          ADD_FAILURE() << "input " << i << " element " << j << ": analytic " << analytic[j] << " vs numeric "
                        << numeric;
      }
    }
  }
  return ok;
}

}  // namespace bt::test
