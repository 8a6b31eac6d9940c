// What every model family owes the Trainer (Note [The Model interface]),
// checked for each family in the registry: the parameter count, the loss at
// init, causality, the padded vocabulary, gradients for every parameter,
// recompute modes that change nothing, and clear errors for bad input.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/nn/registry.h"
#include "tests/support/error_message.h"

namespace bt::nn {
namespace {

Tensor ids(const std::vector<int32_t>& v, int64_t B, int64_t T) { return from_vector<int32_t>(v, {B, T}); }

class Family : public ::testing::TestWithParam<const nn::Family*> {
 protected:
  /// 2 blocks of width 16, context 12, 50 real tokens padded to 128.
  ModelConfig small() const {
    ModelConfig c = GetParam()->presets.front().second;
    c.n_layer = 2;
    c.n_embd = 16;
    c.n_head = c.arch == "llama" ? 4 : 2;
    if (c.arch == "llama") c.n_kv_head = 2, c.ffn_hidden = 24;
    c.seq_len = 12;
    c.vocab_size = 50;
    return c;
  }
  std::unique_ptr<Model> make(uint64_t seed, const ModelConfig& c) const {
    return make_model(c, Device::cpu(), seed);
  }
  std::unique_ptr<Model> make(uint64_t seed) const { return make(seed, small()); }
};

TEST_P(Family, ParametersCountAsTheConfigSaysAndAreF32Leaves) {
  const auto m = make(1);
  int64_t n = 0;
  for (const auto& [name, t] : m->named_parameters()) {
    n += t.numel();
    EXPECT_TRUE(t.requires_grad()) << name;
    EXPECT_EQ(t.dtype(), DType::F32) << name;
  }
  EXPECT_EQ(n, small().num_params());
  EXPECT_EQ(m->param_units().size(), m->named_parameters().size());
  EXPECT_EQ(m->arch(), GetParam()->arch);
}

TEST_P(Family, LossAtInitIsNearUniform) {
  ModelConfig c = small();
  c.vocab_size = 1000;
  const auto m = make(3, c);
  std::vector<int32_t> x(4 * 12), y(4 * 12);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<int32_t>(i * 37 % 1000), y[i] = static_cast<int32_t>(i * 91 % 1000);
  EXPECT_NEAR(m->loss(ids(x, 4, 12), ids(y, 4, 12)).item<float>(), std::log(1000.0), 0.1);
}

TEST_P(Family, LogitsAreCausal) {
  const auto m = make(5);
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = a;
  b[5] = 40;  // change position 5 only
  const Tensor la = m->forward(ids(a, 1, 8)), lb = m->forward(ids(b, 1, 8));
  for (int64_t t = 0; t < 8; ++t) {
    const std::vector<float> ra = la.select(1, t).to_vector<float>(), rb = lb.select(1, t).to_vector<float>();
    if (t < 5)
      EXPECT_EQ(ra, rb) << "position " << t << " saw a later token";
    else
      EXPECT_NE(ra, rb) << "position " << t << " ignored token 5";
  }
}

// Rows 50..127 of every [padded_vocab, C] matrix (embedding, head) are
// padding: they change no loss and get no gradient from it (Note [Padded
// vocabulary] in gpt2/gpt.h).
TEST_P(Family, PaddedVocabularyRowsDoNotChangeTheLoss) {
  const auto m = make(9);
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6}, y = {2, 3, 4, 5, 6, 7};
  const float before = m->loss(ids(x, 1, 6), ids(y, 1, 6)).item<float>();
  int padded = 0;
  {
    NoGradGuard ng;
    for (const auto& [name, t] : m->named_parameters())
      if (t.dim() == 2 && t.size(0) == 128) t.narrow(0, 50, 78).fill_(3.0), ++padded;
  }
  EXPECT_GE(padded, 1);
  const Tensor loss = m->loss(ids(x, 1, 6), ids(y, 1, 6));
  EXPECT_EQ(loss.item<float>(), before);
  loss.backward();
  for (const auto& [name, t] : m->named_parameters()) {
    if (t.dim() != 2 || t.size(0) != 128) continue;
    for (float v : t.grad().narrow(0, 50, 78).contiguous().to_vector<float>())
      ASSERT_EQ(v, 0.0f) << name << ": a padded row got a gradient from the loss";
  }
}

TEST_P(Family, EveryParameterGetsAFiniteNonzeroGradient) {
  const auto m = make(11);
  m->loss(ids({1, 2, 3, 4, 5, 6, 7, 8}, 2, 4), ids({2, 3, 4, 5, 6, 7, 8, 9}, 2, 4)).backward();
  for (const auto& [name, t] : m->named_parameters()) {
    ASSERT_TRUE(t.grad().defined()) << name;
    double s = 0;
    for (float v : t.grad().to_vector<float>()) s += std::fabs(v);
    EXPECT_GT(s, 0.0) << name;
    EXPECT_TRUE(std::isfinite(s)) << name;
  }
}

// train.recompute trades compute for memory, never the result: on the CPU in
// f32 the loss and every gradient are the same bits in all three modes.
TEST_P(Family, RecomputeModesGiveTheSameLossAndGradients) {
  std::vector<std::vector<float>> ref;
  for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    const auto m = make(11);
    m->set_recompute(mode);
    const Tensor loss = m->loss(ids({1, 2, 3, 4, 5, 6, 7, 8}, 2, 4), ids({2, 3, 4, 5, 6, 7, 8, 9}, 2, 4));
    loss.backward();
    std::vector<std::vector<float>> got{loss.to_vector<float>()};
    for (const auto& [name, t] : m->named_parameters()) got.push_back(t.grad().to_vector<float>());
    if (ref.empty())
      ref = got;
    else
      EXPECT_EQ(got, ref) << recompute_name(mode);
  }
}

TEST_P(Family, BadInputsAreClearErrors) {
  const auto m = make(1);
  EXPECT_NE(test::error_message([&] {
              m->forward(ids(std::vector<int32_t>(13, 1), 1, 13));
            }).find("model.seq_len=12"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              m->forward(from_vector<float>({1, 2}, {1, 2}));
            }).find("i32"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              m->loss(ids({1, 2}, 1, 2), ids({1}, 1, 1));
            }).find("targets"),
            std::string::npos);
  ModelConfig c = small();
  c.n_head = 3;
  EXPECT_NE(test::error_message([&] {
              c.validate();
            }).find("model.n_embd (16) must be divisible by model.n_head (3)"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Registry, Family, ::testing::ValuesIn(families()),
                         [](const auto& info) { return info.param->arch; });

}  // namespace
}  // namespace bt::nn
