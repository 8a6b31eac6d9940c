// GPT-2: parameter layout and init statistics, the preset, bf16 casts, the
// fused residuals, the chunked head and the primitive-op model. What every
// family owes (causality, the padded vocabulary, recompute, errors) is in
// tests/runtime/nn/test_families.cpp.
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "runtime/autograd/meta.h"
#include "runtime/bt.h"
#include "runtime/nn/gpt2/gpt.h"
#include "runtime/nn/registry.h"

namespace bt::nn {
namespace {

ModelConfig small() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seq_len = 12;
  c.vocab_size = 50;  // padded to 128
  return c;
}

Tensor ids(const std::vector<int32_t>& v, int64_t B, int64_t T) { return from_vector<int32_t>(v, {B, T}); }

double stddev(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += static_cast<double>(x) * x;
  const double m = s / v.size();
  return std::sqrt(s2 / v.size() - m * m);
}

TEST(Gpt, ParameterNamesShapesAndCount) {
  const ModelConfig c = small();
  Gpt m(c, Device::cpu(), 1);
  const NamedTensors& p = m.named_parameters();
  ASSERT_EQ(p.size(), 2u + 12u * 2 + 2u);
  EXPECT_EQ(p[0].first, "wte");
  EXPECT_EQ(p[0].second.shape(), (Shape{128, 16}));
  EXPECT_EQ(p[1].first, "wpe");
  EXPECT_EQ(p[1].second.shape(), (Shape{12, 16}));
  EXPECT_EQ(p[4].first, "h.0.attn.c_attn.weight");
  EXPECT_EQ(p[4].second.shape(), (Shape{48, 16}));
  EXPECT_EQ(p[12].first, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(p[12].second.shape(), (Shape{16, 64}));
  EXPECT_EQ(p.back().first, "ln_f.bias");
  int64_t n = 0;
  for (const auto& [name, t] : p) {
    n += t.numel();
    EXPECT_TRUE(t.requires_grad()) << name;
    EXPECT_EQ(t.dtype(), DType::F32) << name;
  }
  EXPECT_EQ(n, c.num_params());
}

TEST(Gpt, Gpt2PresetHas124MParameters) {
  const ModelConfig c = model_preset("gpt2-124m");
  EXPECT_EQ(c.padded_vocab(), 50304);
  // 124,475,904 with the 50304-row padded embedding (124.44M with 50257 rows).
  EXPECT_EQ(c.num_params(), 124475904);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

TEST(Gpt, InitFollowsGpt2) {
  ModelConfig c = small();
  c.n_embd = 64;
  c.vocab_size = 1000;
  Gpt m(c, Device::cpu(), 7);
  for (const auto& [name, t] : m.named_parameters()) {
    if (name.find("bias") != std::string::npos) {
      EXPECT_EQ(stddev(t), 0.0) << name;
      EXPECT_EQ(t.to_vector<float>()[0], 0.0f) << name;
    } else if (name.find("ln_") != std::string::npos) {
      for (float v : t.to_vector<float>()) ASSERT_EQ(v, 1.0f) << name;
    } else {
      const double want = name.find("c_proj") != std::string::npos ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02;
      EXPECT_NEAR(stddev(t), want, want * 0.1) << name;
    }
  }
  Gpt same(c, Device::cpu(), 7), other(c, Device::cpu(), 8);
  EXPECT_EQ(m.named_parameters()[0].second.to_vector<float>(),
            same.named_parameters()[0].second.to_vector<float>());
  EXPECT_NE(m.named_parameters()[0].second.to_vector<float>(),
            other.named_parameters()[0].second.to_vector<float>());
}

/// True when the f32 value x is exactly a bf16 value (its low 16 bits are 0).
bool bf16_exact(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0xffffu) == 0;
}

// Under bf16 each master is cast to a bf16 compute copy; the linear layers'
// weight and bias gradients (the tied head's too) are made by the GEMM and the
// row sum in f32 and reach the f32 masters as they are (Note [Gradients in a
// wider dtype]); the LayerNorms take their f32 masters uncast and make their
// gradients in f32 (Note [f32 LayerNorm parameters]). Through a bf16 gradient
// every value would be a bf16 value; made in f32, few of the nonzero ones are.
TEST(Gpt, Bf16GradientsReachTheMastersInF32) {
  struct Restore {
    Precision p = precision();
    ~Restore() { set_precision(p); }
  } restore;
  set_precision(Precision::BF16);
  Gpt m(small(), Device::cpu(), 11);
  std::vector<int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = {2, 3, 4, 5, 6, 7, 8, 9};
  m.loss(ids(x, 2, 4), ids(y, 2, 4)).backward();
  int checked = 0;
  for (const auto& [name, t] : m.named_parameters()) {
    ASSERT_EQ(t.grad().dtype(), DType::F32) << name;
    // wpe's is f32, but it adds bf16 values summed over the batch by the
    // broadcast add's backward.
    const bool linear = name == "wte" || name.find(".c_") != std::string::npos;
    if (!linear && !m.keeps_f32(name)) continue;
    int64_t nonzero = 0, exact = 0;
    for (float v : t.grad().to_vector<float>())
      if (v != 0.0f) ++nonzero, exact += bf16_exact(v);
    ASSERT_GT(nonzero, 0) << name;
    // A weight gradient sums products; a bias gradient sums the 8 rows of
    // bf16 values here, which is exact in bf16 more often (up to 3 in 8 seen).
    const bool bias = name.size() > 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    EXPECT_LE(exact, bias ? nonzero / 2 : nonzero / 10)
        << name << ": " << exact << " of " << nonzero << " nonzero gradient values are bf16 values";
    ++checked;
  }
  EXPECT_EQ(checked, 1 + 12 * small().n_layer + 2);
}

/// The names of the nodes whose backward hands a gradient straight to the
/// leaf p, in the graph of `root`.
std::set<std::string> feeders(const Tensor& root, const Tensor& p) {
  const std::shared_ptr<Node> acc = autograd::edge_of(p).fn;
  std::set<std::string> names;
  std::set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack{root.grad_fn()};
  while (!stack.empty()) {
    std::shared_ptr<Node> n = stack.back();
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    for (const bt::Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      if (e.fn == acc) names.insert(n->name());
      stack.push_back(e.fn);
    }
  }
  return names;
}

// Under bf16 no cast runs for a LayerNorm parameter, nor for the attention
// projection's bias, which ln_2's residual add adds: their gradients go from
// the (fused residual) LayerNorm's backward to the masters (Note [f32
// LayerNorm parameters]), while a Linear's weight still goes through its bf16
// cast.
TEST(Gpt, Bf16LayerNormParametersAreNotCast) {
  struct Restore {
    Precision p = precision();
    ~Restore() { set_precision(p); }
  } restore;
  set_precision(Precision::BF16);
  for (Recompute mode : {Recompute::None, Recompute::Selective}) {
    Gpt m(small(), Device::cpu(), 11);
    m.set_recompute(mode);
    std::vector<int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8}, y = {2, 3, 4, 5, 6, 7, 8, 9};
    const Tensor loss = m.loss(ids(x, 2, 4), ids(y, 2, 4));
    int norms = 0;
    for (const auto& [name, t] : m.named_parameters()) {
      const std::set<std::string> f = feeders(loss, t);
      if (m.keeps_f32(name)) {
        ++norms;  // every LayerNorm adds a residual first, ln_1 of block 0 the positions
        EXPECT_EQ(f, std::set<std::string>{"AddLayerNormBackward"}) << name;
      } else if (name.find(".c_") != std::string::npos) {
        EXPECT_EQ(f, std::set<std::string>{"ToDTypeBackward"}) << name;
      }
    }
    EXPECT_EQ(norms, 5 * small().n_layer + 2)
        << "4 LayerNorm parameters and attn.c_proj.bias a block, and ln_f's";
  }
}

// The fused residual adds change no bit in f32: the same loss and gradients
// as the blocks written with add and layer_norm apart, from the same weights.
TEST(Gpt, FusedResidualsGiveTheUnfusedBits) {
  const ModelConfig c = small();
  Gpt m(c, Device::cpu(), 11);
  std::vector<int32_t> xv = {1, 2, 3, 4, 5, 6, 7, 8}, yv = {2, 3, 4, 5, 6, 7, 8, 9};
  const Tensor idx = ids(xv, 2, 4), tgt = ids(yv, 2, 4);
  const Tensor loss = m.loss(idx, tgt);
  loss.backward();
  std::vector<std::vector<float>> fused{loss.to_vector<float>()};
  for (const auto& [name, t] : m.named_parameters()) fused.push_back(t.grad().to_vector<float>());

  // The same model with fresh leaves holding the same values.
  std::map<std::string, Tensor> p;
  for (const auto& [name, t] : m.named_parameters()) p[name] = t.detach().clone().requires_grad_();
  Tensor x = add(embedding(p["wte"], idx), embedding(p["wpe"], arange(4, TensorOptions{DType::I32})));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto q = [&](const std::string& s) { return p["h." + std::to_string(l) + "." + s]; };
    Tensor qkv = linear(layer_norm(x, q("ln_1.weight"), q("ln_1.bias")), q("attn.c_attn.weight"),
                        q("attn.c_attn.bias"));
    x = add(x, linear(causal_self_attention(qkv, c.n_head), q("attn.c_proj.weight"), q("attn.c_proj.bias")));
    Tensor h = linear(layer_norm(x, q("ln_2.weight"), q("ln_2.bias")), q("mlp.c_fc.weight"),
                      q("mlp.c_fc.bias"), Activation::Gelu);
    x = add(x, linear(h, q("mlp.c_proj.weight"), q("mlp.c_proj.bias")));
  }
  Tensor logits = linear(layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]), p["wte"]);
  Tensor ref_loss = cross_entropy(logits.view({-1, logits.size(-1)}), tgt.reshape({-1}), c.vocab_size);
  ref_loss.backward();
  std::vector<std::vector<float>> apart{ref_loss.to_vector<float>()};
  for (const auto& [name, t] : m.named_parameters()) apart.push_back(p[name].grad().to_vector<float>());
  EXPECT_EQ(fused, apart);
}

/// ||a - b|| / ||b|| over two lists of values.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Note [The LM head in row chunks]: told the incoming gradient (as the
// Trainer tells it), the loss runs the head and the loss as one op that makes
// the gradients in its forward; loss and gradients are the plain ops' to
// rounding (one chunk here: the same GEMMs).
TEST(Gpt, TheLossWithAHintRunsTheHeadInChunks) {
  const ModelConfig c = small();
  std::vector<int32_t> xv = {1, 2, 3, 4, 5, 6, 7, 8}, yv = {2, 3, -1, 5, 6, 7, 8, 9};
  std::vector<std::vector<float>> got[2];
  for (int hinted = 0; hinted < 2; ++hinted) {
    Gpt m(c, Device::cpu(), 11);
    const Tensor loss = m.loss(ids(xv, 2, 4), ids(yv, 2, 4), hinted ? 0.5f : 0.0f);
    ASSERT_NE(loss.grad_fn(), nullptr);
    EXPECT_EQ(loss.grad_fn()->name(), hinted ? "LinearCrossEntropyBackward" : "CrossEntropyBackward");
    loss.backward(full({}, 0.5, TensorOptions{DType::F32}));
    got[hinted].push_back(loss.to_vector<float>());
    for (const auto& [name, t] : m.named_parameters()) got[hinted].push_back(t.grad().to_vector<float>());
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  for (size_t i = 0; i < got[0].size(); ++i) EXPECT_LT(rel_l2(got[1][i], got[0][i]), 1e-6) << i;
}

// Note [Primitive-op GPT]: the model written from primitive ops has the fused
// model's parameters and, to rounding, its loss and gradients (the fused
// LayerNorm and GELU kernels round in other places than their primitive forms).
TEST(Gpt, PrimitiveOpsGiveTheFusedModelsValues) {
  std::vector<int32_t> xv = {1, 2, 3, 4, 5, 6, 7, 8}, yv = {2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<std::vector<float>> got[2];
  std::vector<std::string> names;
  for (int fused = 0; fused < 2; ++fused) {
    ModelConfig c = small();
    c.fused_ops = fused == 1;
    Gpt m(c, Device::cpu(), 11);
    const Tensor loss = m.loss(ids(xv, 2, 4), ids(yv, 2, 4));
    loss.backward();
    got[fused].push_back(loss.to_vector<float>());
    names = {"loss"};
    for (const auto& [name, t] : m.named_parameters()) {
      got[fused].push_back(t.grad().to_vector<float>());
      names.push_back(name);
    }
  }
  ASSERT_EQ(got[0].size(), got[1].size()) << "the same parameters";
  EXPECT_LT(rel_l2(got[0][0], got[1][0]), 1e-6) << "loss";
  for (size_t i = 1; i < got[0].size(); ++i) EXPECT_LT(rel_l2(got[0][i], got[1][i]), 1e-4) << names[i];
}

}  // namespace
}  // namespace bt::nn
