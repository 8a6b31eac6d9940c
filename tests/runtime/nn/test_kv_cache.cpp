// Generation with a KV cache, for every family: the cached forward gives the
// full forward's logits, and sampling gives the same tokens as full
// recomputation, past the context too.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/nn/generate.h"
#include "runtime/nn/kv_cache.h"
#include "runtime/nn/registry.h"
#include "tests/support/error_message.h"

namespace bt::nn {
namespace {

class KvCacheTest : public ::testing::TestWithParam<std::string> {
 protected:
  ModelConfig config() const {
    ModelConfig c = model_preset(GetParam() == "gpt2" ? "tiny" : "llama-tiny");
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 4;
    if (c.arch == "llama") c.n_kv_head = 2, c.ffn_hidden = 48;
    c.seq_len = 16;
    c.vocab_size = 97;
    return c;
  }
};

Tensor ids(const std::vector<int32_t>& v) {
  return from_vector<int32_t>(v, {1, static_cast<int64_t>(v.size())});
}

double max_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(x[i] - y[i])));
  return d;
}

TEST_P(KvCacheTest, CachedLogitsAreTheFullForwardsLogits) {
  const auto m = make_model(config(), Device::cpu(), 3);
  std::vector<int32_t> seq;
  for (int i = 0; i < 16; ++i) seq.push_back((i * 29 + 5) % 97);
  NoGradGuard ng;
  const Tensor full = m->forward(ids(seq));  // [1, 16, Vp]
  KvCache cache(m->config(), 1);
  // A prompt of 5, then 2 positions at once (the masked path), then one at a time.
  int64_t at = 0;
  for (int64_t n : {5, 2, 1, 1, 3, 1, 1, 1, 1}) {
    const Tensor got = m->forward_cached(ids({seq.begin() + at, seq.begin() + at + n}), cache);
    EXPECT_LT(max_diff(got, full.narrow(1, at, n).contiguous()), 1e-5) << "positions " << at << "+" << n;
    at += n;
    EXPECT_EQ(cache.length(), at);
  }
  EXPECT_EQ(at, 16);
  EXPECT_NE(test::error_message([&] { m->forward_cached(ids({1}), cache); }).find("model.seq_len=16"),
            std::string::npos)
      << "a full cache is a clear error";
}

TEST_P(KvCacheTest, SamplingGivesFullRecomputationsTokens) {
  const auto m = make_model(config(), Device::cpu(), 4);
  SampleOptions o;
  o.tokens = 30;  // past the context of 16: the window slides
  o.temperature = 1.0;
  o.top_k = 0;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  const std::vector<int32_t> cached = generate(*m, prompt, o);
  o.kv_cache = false;
  EXPECT_EQ(cached, generate(*m, prompt, o));
  ASSERT_EQ(cached.size(), 30u);
}

INSTANTIATE_TEST_SUITE_P(Families, KvCacheTest, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace bt::nn
