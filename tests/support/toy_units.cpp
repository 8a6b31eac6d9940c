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
  auto term = [&](size_t i) { return sum(mul(src ? src->weight(params[i]) : params[i], xs[i])); };
  if (src) src->enter(0);
  Tensor h = term(0);
  for (int u : {1, 2}) {
    if (src) src->enter(u);
    for (size_t i = 0; i < params.size(); ++i)
      if (units[i] == u) h = add(h, term(i));
    if (src) h = src->leave(u, h);
  }
  h = add(h, term(4));
  if (src) h = src->leave(0, h);
  h.backward();
}

}  // namespace bt::test
