// The Llama family: parameters and units, presets and config errors, init,
// positions and bf16. What every family owes (causality, the padded
// vocabulary, recompute, errors) is in tests/runtime/nn/test_families.cpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/core/precision.h"
#include "runtime/nn/llama/llama.h"
#include "tests/support/error_message.h"

namespace bt::nn {
namespace {

ModelConfig small() {
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.seq_len = 12;
  c.vocab_size = 50;  // padded to 128
  return c;
}

Tensor ids(const std::vector<int32_t>& v, int64_t B, int64_t T) { return from_vector<int32_t>(v, {B, T}); }

TEST(Llama, ParameterNamesShapesUnitsAndCount) {
  const ModelConfig c = small();
  Llama m(c, Device::cpu(), 1);
  const NamedTensors& p = m.named_parameters();
  ASSERT_EQ(p.size(), 1u + 9u * 2 + 2u);
  std::map<std::string, Shape> want = {{"tok_embeddings.weight", {128, 16}},
                                       {"layers.0.attention_norm.weight", {16}},
                                       {"layers.0.attention.wq.weight", {16, 16}},
                                       {"layers.0.attention.wk.weight", {8, 16}},
                                       {"layers.0.attention.wv.weight", {8, 16}},
                                       {"layers.0.attention.wo.weight", {16, 16}},
                                       {"layers.1.ffn_norm.weight", {16}},
                                       {"layers.1.feed_forward.w1.weight", {24, 16}},
                                       {"layers.1.feed_forward.w3.weight", {24, 16}},
                                       {"layers.1.feed_forward.w2.weight", {16, 24}},
                                       {"norm.weight", {16}},
                                       {"output.weight", {128, 16}}};
  int64_t n = 0;
  const std::vector<int>& units = m.param_units();
  ASSERT_EQ(units.size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const auto& [name, t] = p[i];
    n += t.numel();
    if (want.count(name)) EXPECT_EQ(t.shape(), want[name]) << name;
    const int unit = name.rfind("layers.", 0) == 0 ? 1 + std::stoi(name.substr(7)) : 0;
    EXPECT_EQ(units[i], unit) << name;
    EXPECT_EQ(m.decays(name), t.dim() == 2) << name;
    EXPECT_FALSE(m.keeps_f32(name)) << name << ": RMSNorm's weight is cast like the rest";
  }
  EXPECT_EQ(p.front().first, "tok_embeddings.weight");
  EXPECT_EQ(p.back().first, "output.weight");
  EXPECT_EQ(n, c.num_params());
  EXPECT_EQ(m.shape_attrs().at("n_kv_head"), 2);
  EXPECT_EQ(m.shape_attrs().at("ffn_hidden"), 24);
}

TEST(Llama, TiedEmbeddingsHaveNoOutputWeight) {
  ModelConfig c = small();
  c.tie_embeddings = true;
  Llama m(c, Device::cpu(), 1);
  EXPECT_EQ(m.named_parameters().back().first, "norm.weight");
  int64_t n = 0;
  for (const auto& [name, t] : m.named_parameters()) n += t.numel();
  EXPECT_EQ(n, c.num_params());
}

TEST(Llama, Llama150mIsTheIssuesModel) {
  const ModelConfig c = model_preset("llama-150m");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_embd, 768);
  EXPECT_EQ(c.n_head, 12);
  EXPECT_EQ(c.kv_heads(), 4);
  EXPECT_EQ(c.ffn_hidden, 2048);
  EXPECT_EQ(c.seq_len, 1024);
  EXPECT_EQ(c.padded_vocab(), 50304);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000.0);
  // 2 x 50304 x 768 embeddings + 12 x 6,292,992 per block + 768.
  EXPECT_EQ(c.num_params(), 152783616);
  ModelConfig d = c;
  d.ffn_hidden = 0;  // the default width: 8 x 768 / 3 = 2048
  EXPECT_EQ(d.num_params(), c.num_params());
}

TEST(Llama, InvalidCombinationsNameTheKeys) {
  ModelConfig c = small();
  c.n_kv_head = 3;
  EXPECT_NE(
      test::error_message([&] { c.validate(); }).find("model.n_kv_head (3) must divide model.n_head (4)"),
      std::string::npos);
  c = small();
  c.n_head = 16;  // head dim 1
  c.n_kv_head = 4;
  EXPECT_NE(test::error_message([&] { c.validate(); }).find("model.n_embd / model.n_head = 16 / 16 = 1"),
            std::string::npos);
  c = small();
  c.arch = "mamba";
  EXPECT_NE(test::error_message([&] { c.validate(); }).find("choose one of: gpt2, llama"), std::string::npos);
  ModelConfig g = model_preset("tiny");
  g.n_kv_head = 2;
  EXPECT_NE(
      test::error_message([&] { g.validate(); }).find("model.n_kv_head (2) applies to model.arch=llama"),
      std::string::npos);
  g = model_preset("tiny");
  g.tie_embeddings = false;
  EXPECT_NE(test::error_message([&] { g.validate(); }).find("model.tie_embeddings=false"), std::string::npos);
}

TEST(Llama, InitIsNormalWithUnitNorms) {
  ModelConfig c = small();
  c.n_embd = 64;
  c.ffn_hidden = 128;
  Llama m(c, Device::cpu(), 2);
  for (const auto& [name, t] : m.named_parameters()) {
    const std::vector<float> v = t.to_vector<float>();
    if (t.dim() == 1) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << name;
      continue;
    }
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += static_cast<double>(x) * x;
    const double mean = s / v.size(), sd = std::sqrt(s2 / v.size() - mean * mean);
    EXPECT_NEAR(sd, 0.02, 0.002) << name;
    EXPECT_NEAR(mean, 0.0, 0.002) << name;
  }
}

// Without positions, attention is blind to the order of the keys: the last
// token's logits after (3, 5, 9) and (5, 3, 9) would be equal. RoPE makes them differ.
TEST(Llama, TheOrderOfEarlierTokensMatters) {
  Llama m(small(), Device::cpu(), 6);
  const Tensor l1 = m.forward(ids({3, 5, 9}, 1, 3)), l2 = m.forward(ids({5, 3, 9}, 1, 3));
  const std::vector<float> a = l1.select(1, 2).to_vector<float>(), b = l2.select(1, 2).to_vector<float>();
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  EXPECT_GT(d, 1e-4);
}

// Under bf16 the loss and gradients stay close to f32's (every op computes
// in f32 and rounds once; RMSNorm's statistic and silu in f32).
TEST(Llama, Bf16IsCloseToF32) {
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = {2, 3, 4, 5, 6, 7, 8, 9};
  struct Restore {
    Precision p = precision();
    ~Restore() { set_precision(p); }
  } restore;
  float loss[2];
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    set_precision(bf16 ? Precision::BF16 : Precision::FP32);
    Llama m(small(), Device::cpu(), 13);
    const Tensor l = m.loss(ids(x, 2, 4), ids(y, 2, 4));
    l.backward();
    loss[bf16] = l.item<float>();
    for (const auto& [name, t] : m.named_parameters()) EXPECT_EQ(t.grad().dtype(), DType::F32) << name;
  }
  EXPECT_NEAR(loss[1], loss[0], 0.01 * loss[0]);
}

}  // namespace
}  // namespace bt::nn
