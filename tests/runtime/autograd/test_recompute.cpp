// Activation recompute: selective recipes free what they replace and rebuild
// it bit for bit (Note [Selective recompute]), checkpointed regions keep only
// their input and give the gradients of the first run (Note [Checkpointed
// regions]), and the cross-entropy gradient overwrites logits nobody else
// holds (Note [Gradient over the logits]).
#include <cmath>
#include <memory>

#include <gtest/gtest.h>

#include "runtime/bt.h"

namespace bt {
namespace {

using autograd::RecomputeGuard;

struct Mlp {
  Tensor ln_w, ln_b, w1, b1, w2, b2;
  explicit Mlp(DType dt, uint64_t seed = 3) {
    Generator g(seed);
    auto p = [&](const Shape& s, double std) {
      return normal(s, 0.0, std, TensorOptions{DType::F32}, &g).to(dt).detach().requires_grad_();
    };
    ln_w = p({8}, 0.5), ln_b = p({8}, 0.5), w1 = p({32, 8}, 0.3), b1 = p({32}, 0.3), w2 = p({8, 32}, 0.3),
    b2 = p({8}, 0.3);
  }
  std::vector<Tensor> params() const { return {ln_w, ln_b, w1, b1, w2, b2}; }
  /// A pre-LN MLP block with its residual: the shapes GPT's blocks save.
  Tensor operator()(const Tensor& x) const {
    Tensor h = linear(layer_norm(x, ln_w, ln_b), w1, b1, Activation::Gelu);
    return add(x, linear(h, w2, b2));
  }
};

/// Gradients of sum(mlp(x) * r) for x and every parameter, as raw floats.
std::vector<std::vector<float>> grads(DType dt, Recompute mode) {
  Mlp m(dt);
  Generator g(11);
  Tensor x = normal({4, 5, 8}, 0.0, 1.0, TensorOptions{DType::F32}, &g).to(dt).detach().requires_grad_();
  Tensor r = normal({4, 5, 8}, 0.0, 1.0, TensorOptions{DType::F32}, &g).to(dt);
  {
    RecomputeGuard guard(mode);
    Tensor y = mode == Recompute::Full ? autograd::checkpoint(m, x) : m(x);
    sum(mul(y, r).to(DType::F32)).backward();
  }
  std::vector<std::vector<float>> out{x.grad().to_vector<float>()};
  for (const Tensor& p : m.params()) out.push_back(p.grad().to_vector<float>());
  return out;
}

// On the CPU the GEMM's GELU epilogue and the GELU kernel compute the same
// float function, so in f32 every mode gives the same bits. In bf16 the
// epilogue rounds the pre-activation after GELU reads it, so only the two
// recompute modes (which both run GELU as its own kernel) agree bitwise, and
// no recompute is close.
TEST(Recompute, EveryModeGivesTheGradientsOfTheForward) {
  const auto none = grads(DType::F32, Recompute::None);
  EXPECT_EQ(grads(DType::F32, Recompute::Selective), none);
  EXPECT_EQ(grads(DType::F32, Recompute::Full), none);

  const auto sel = grads(DType::BF16, Recompute::Selective);
  EXPECT_EQ(grads(DType::BF16, Recompute::Full), sel);
  const auto plain = grads(DType::BF16, Recompute::None);
  ASSERT_EQ(plain.size(), sel.size());
  for (size_t i = 0; i < sel.size(); ++i)
    for (size_t j = 0; j < sel[i].size(); ++j)
      EXPECT_NEAR(sel[i][j], plain[i][j], 0.03 * (1 + std::fabs(plain[i][j]))) << i << "," << j;
}

// Which GELU a Linear runs: its own kernel when selective recompute records a
// graph and always under full (a checkpointed block runs with and without a
// graph and must agree), the GEMM's epilogue otherwise. The CPU's bf16
// epilogue applies GELU before rounding the pre-activation, the kernel after,
// so the two are told apart by their bits.
TEST(Recompute, GeluRunsAsItsOwnKernelOnlyWhereARecomputeNeedsIt) {
  Mlp m(DType::BF16);
  Generator g(5);
  Tensor x = normal({6, 8}, 0.0, 1.0, TensorOptions{DType::F32}, &g).to(DType::BF16);
  auto run = [&](Recompute mode, bool graph) {
    RecomputeGuard guard(mode);
    GradModeGuard grad(graph);
    return linear(x, m.w1, m.b1, Activation::Gelu).to_vector<float>();
  };
  std::vector<float> fused, own;
  {
    NoGradGuard no_grad;
    fused = linear(x, m.w1, m.b1, Activation::Gelu).to_vector<float>();
    own = gelu(linear(x, m.w1, m.b1)).to_vector<float>();
  }
  ASSERT_NE(fused, own) << "the case must tell the two apart";
  EXPECT_EQ(run(Recompute::None, true), fused);
  EXPECT_EQ(run(Recompute::Selective, false), fused) << "evaluation keeps the epilogue";
  EXPECT_EQ(run(Recompute::Selective, true), own);
  EXPECT_EQ(run(Recompute::Full, false), own);
  EXPECT_EQ(run(Recompute::Full, true), own);
}

// What selective saves: the LayerNorm output the Linear reads is freed once
// the forward drops it (the Linear keeps a recipe); without recompute the
// Linear keeps it alive until backward.
TEST(Recompute, SelectiveFreesTheLayerNormOutput) {
  Mlp m(DType::F32);
  Tensor x = randn({3, 8}).requires_grad_();
  for (Recompute mode : {Recompute::None, Recompute::Selective}) {
    RecomputeGuard guard(mode);
    Tensor y = layer_norm(x, m.ln_w, m.ln_b);
    const std::weak_ptr<Storage> kept = y.impl_ptr()->storage;
    Tensor z = linear(y, m.w1);
    y = Tensor();
    EXPECT_EQ(kept.expired(), mode == Recompute::Selective) << recompute_name(mode);
    sum(z).backward();
    EXPECT_TRUE(kept.expired()) << "backward frees what it saved";
  }
}

TEST(Recompute, NothingIsTaggedWithoutAGraphOrUnderNone) {
  Tensor x = randn({3, 8}), w = ones({8});
  {
    RecomputeGuard guard(Recompute::Selective);
    EXPECT_EQ(layer_norm(x, w, Tensor()).impl()->storage->recompute, nullptr) << "no graph recorded";
  }
  x.requires_grad_();
  EXPECT_EQ(gelu(x).impl()->storage->recompute, nullptr) << "recompute none";
  RecomputeGuard guard(Recompute::Selective);
  EXPECT_NE(gelu(x).impl()->storage->recompute, nullptr);
}

// An in-place write to a tensor kept as a recipe would make the rebuilt
// values differ from what the forward used: backward refuses, naming it.
TEST(Recompute, AWriteAfterTheSaveIsNamed) {
  Tensor x = randn({3, 8}).requires_grad_(), w = randn({4, 8});
  RecomputeGuard guard(Recompute::Selective);
  Tensor h = gelu(x);
  Tensor z = linear(h, w);
  h.detach().mul_(2.0);  // an alias outside the graph: the write autograd must see
  try {
    sum(z).backward();
    FAIL() << "backward used a recipe of a tensor written after it was saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place after it was saved"), std::string::npos)
        << e.what();
  }
}

// A write before the save: the recipe no longer describes the tensor, so the
// Linear keeps the memory, and the gradient is that of the written values.
TEST(Recompute, AWriteBeforeTheSaveKeepsTheMemory) {
  Tensor x = from_vector<float>({0.5f, -1.0f, 2.0f}, {1, 3}).requires_grad_();
  Tensor w = from_vector<float>({1, 1, 1}, {1, 3}).requires_grad_();
  RecomputeGuard guard(Recompute::Selective);
  Tensor h = gelu(x);
  h.detach().mul_(3.0);
  const std::vector<float> written = h.to_vector<float>();
  sum(linear(h, w)).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), written);
}

// A checkpointed region's intermediates are gone after the forward; its
// parameters still get their gradients, accumulated like any others.
TEST(Checkpoint, KeepsOnlyItsInputAndStillReachesParameters) {
  Mlp m(DType::F32);
  Tensor x = randn({2, 8}).requires_grad_();
  std::weak_ptr<Storage> inner;
  Tensor y = autograd::checkpoint(
      [&](const Tensor& in) {
        Tensor t = layer_norm(in, m.ln_w, m.ln_b);
        inner = t.impl_ptr()->storage;
        return linear(t, m.w1);
      },
      x);
  EXPECT_TRUE(inner.expired()) << "an activation of the region outlived its forward";
  EXPECT_TRUE(y.requires_grad());
  sum(y).backward();
  Tensor gw = m.w1.grad(), gx = x.grad();
  ASSERT_TRUE(gw.defined() && gx.defined() && m.ln_w.grad().defined());

  Mlp ref(DType::F32);
  Tensor xr = x.detach().requires_grad_();
  sum(linear(layer_norm(xr, ref.ln_w, ref.ln_b), ref.w1)).backward();
  EXPECT_EQ(gw.to_vector<float>(), ref.w1.grad().to_vector<float>());
  EXPECT_EQ(gx.to_vector<float>(), xr.grad().to_vector<float>());
}

TEST(Checkpoint, WithoutGradModeItIsTheFunction) {
  Tensor x = randn({2, 8}).requires_grad_();
  NoGradGuard no_grad;
  Tensor y = autograd::checkpoint([](const Tensor& in) { return mul(in, 2.0); }, x);
  EXPECT_FALSE(y.requires_grad());
}

/// logits = clone(leaf): CloneBackward hands the CE gradient to the leaf as
/// is, so the leaf's .grad shows which buffer the gradient was written in.
struct CeCase {
  Generator gen{5};
  Tensor leaf = randn({6, 10}, {}, &gen).requires_grad_();
  Tensor targets = from_vector<int32_t>({1, 2, 3, -1, 9, 0}, {6});
  Tensor logits = leaf.clone();
  void* logits_data = logits.data_ptr();
  Tensor loss = cross_entropy(logits, targets);
};

TEST(CrossEntropy, TheGradientOverwritesLogitsNobodyHolds) {
  CeCase c;
  c.logits = Tensor();
  c.loss.backward();
  EXPECT_EQ(c.leaf.grad().data_ptr(), c.logits_data);

  CeCase kept;  // the caller still holds the logits: they stay as they were
  const std::vector<float> before = kept.logits.to_vector<float>();
  kept.loss.backward();
  EXPECT_NE(kept.leaf.grad().data_ptr(), kept.logits_data);
  EXPECT_EQ(kept.logits.to_vector<float>(), before);
  EXPECT_EQ(kept.leaf.grad().to_vector<float>(), c.leaf.grad().to_vector<float>());
}

TEST(CrossEntropy, ARetainedGraphKeepsItsLogits) {
  CeCase c;
  c.logits = Tensor();
  c.loss.backward({}, /*retain_graph=*/true);
  const std::vector<float> first = c.leaf.grad().to_vector<float>();
  c.leaf.zero_grad();
  c.loss.backward();
  EXPECT_EQ(c.leaf.grad().to_vector<float>(), first);
}

}  // namespace
}  // namespace bt
