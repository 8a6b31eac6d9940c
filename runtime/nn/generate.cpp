#include "runtime/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/common/error.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/nn/kv_cache.h"
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
  KvCache cache(model.config(), 1);
  // The logits of the last position of ctx: the window's, or (the cache
  // holds all of ctx but its last token, and the window starts at 0) the
  // new token's through the cache.
  auto last_logits = [&]() {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ctx.size()), model.context());
    const auto ids = [&](int64_t k) {
      return from_vector<int32_t>(std::vector<int32_t>(ctx.end() - k, ctx.end()), {1, k}).to(model.device());
    };
    Tensor logits;
    if (!o.kv_cache || static_cast<int64_t>(ctx.size()) > model.context()) {
      logits = model.forward(ids(n));
    } else {
      if (cache.length() != static_cast<int64_t>(ctx.size()) - 1) cache.clear();
      logits = model.forward_cached(ids(static_cast<int64_t>(ctx.size()) - cache.length()), cache);
    }
    return logits.select(1, logits.size(1) - 1).to(DType::F32).to_vector<float>();
  };
  for (int64_t i = 0; i < o.tokens; ++i) {
    const std::vector<float> last = last_logits();
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
