#include "tests/support/toy_units.h"

#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"

namespace bt::test {

std::vector<Shape> toy_shapes() { return {{5}, {3}, {2, 7}, {4, 4}, {1}}; }

std::vector<int> toy_units() { return {0, 1, 1, 2, 0}; }

std::vector<Tensor> toy_params(uint64_t seed, const Device& dev) {
  Generator gen(seed);
  std::vector<Tensor> ps;
  for (const Shape& s : toy_shapes()) ps.push_back(randn(s, {}, &gen).to(dev).requires_grad_());
  return ps;
}

std::vector<Tensor> toy_inputs(double scale, uint64_t seed, const Device& dev) {
  Generator gen(seed);
  std::vector<Tensor> xs;
  for (const Shape& s : toy_shapes()) xs.push_back(mul(randn(s, {}, &gen), scale).to(dev));
  return xs;
}

void toy_backward(const std::vector<Tensor>& params, const std::vector<Tensor>& xs, nn::WeightSource* src) {
  const std::vector<int> units = toy_units();
  std::vector<Tensor> w(params.size());  // what the forward computes with
  auto fetch = [&](size_t i) { w[i] = src ? src->weight(params[i]) : params[i]; };
  auto t = [&](size_t i) { return sum(mul(xs[i], tanh(w[i]))); };
  auto plus = [](const Tensor& acc, const Tensor& v) { return acc.defined() ? add(acc, v) : v; };
  auto g = [&](int u) {  // 1 + the mean square of unit u's weights
    Tensor sq;
    int64_t n = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (units[i] != u) continue;
      sq = plus(sq, sum(mul(w[i], w[i])));
      n += w[i].numel();
    }
    return add(mul(sq, 1.0 / static_cast<double>(n)), 1.0);
  };
  if (src) src->enter(0);
  fetch(0);
  Tensor h = t(0);
  for (int u : {1, 2}) {
    if (src) src->enter(u);
    Tensor s;
    for (size_t i = 0; i < params.size(); ++i) {
      if (units[i] != u) continue;
      fetch(i);
      s = plus(s, t(i));
    }
    h = add(h, mul(s, g(u)));
    if (src) h = src->leave(u, {h})[0];
  }
  fetch(4);
  h = mul(add(h, t(4)), g(0));
  if (src) h = src->leave(0, {h})[0];
  h.backward();
}

}  // namespace bt::test
