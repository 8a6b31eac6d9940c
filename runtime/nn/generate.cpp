#include "runtime/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/common/error.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"

namespace bt::nn {

std::vector<int32_t> generate(const Model& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& o) {
  BT_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  BT_CHECK(o.temperature > 0, "generate: temperature must be > 0, got ", o.temperature);
  NoGradGuard ng;
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> ctx = prompt, out;
  const int64_t vocab = model.vocab_size();
  std::vector<double> p(static_cast<size_t>(vocab));
  std::vector<int32_t> order(p.size());
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ctx.size()), model.context());
    const std::vector<int32_t> window(ctx.end() - n, ctx.end());
    Tensor logits = model.forward(from_vector<int32_t>(window, {1, n}).to(model.device()));
    const std::vector<float> last = logits.select(1, n - 1).to(DType::F32).to_vector<float>();
    const float mx = *std::max_element(last.begin(), last.begin() + vocab);
    for (size_t k = 0; k < p.size(); ++k) p[k] = std::exp((last[k] - mx) / o.temperature);
    if (o.top_k > 0 && o.top_k < vocab) {
      std::iota(order.begin(), order.end(), 0);
      std::nth_element(order.begin(), order.begin() + (o.top_k - 1), order.end(),
                       [&](int32_t a, int32_t b) { return p[a] > p[b]; });
      const double kth = p[order[o.top_k - 1]];
      for (double& q : p)
        if (q < kth) q = 0;
    }
    std::discrete_distribution<int32_t> pick(p.begin(), p.end());
    const int32_t next = pick(rng);
    ctx.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace bt::nn
