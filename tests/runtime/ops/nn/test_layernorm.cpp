// LayerNorm ops: bf16 activations with f32 parameters compute the f32 op's
// values rounded once and give f32 parameter gradients; add_layer_norm is the
// add followed by the LayerNorm (Note [Residual into LayerNorm]), bit for bit
// in f32, and its output is rebuilt exactly under selective recompute.
#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"

namespace bt {
namespace {

using autograd::RecomputeGuard;

/// A CPU leaf of `dt` holding values that are exact in bf16 (so every dtype
/// sees the same numbers).
Tensor leaf(const Shape& s, uint64_t seed, DType dt, double mean = 0.0) {
  Generator g(seed);
  return normal(s, mean, 1.0, {}, &g).to(DType::BF16).to(dt).detach().requires_grad_();
}

std::vector<float> floats(const Tensor& t) { return t.to(DType::F32).to_vector<float>(); }

/// sum(out * r) with r exact in bf16, whatever out's dtype.
Tensor weighted(const Tensor& out, uint64_t seed) {
  Generator g(seed);
  const Tensor r = normal(out.shape(), 0.0, 1.0, {}, &g).to(DType::BF16).to(DType::F32);
  return sum(mul(out.to(DType::F32), r));
}

// Under bf16 the f32 masters go to the LayerNorm as they are: the output is
// the f32 op's on the same values (for add_layer_norm, the bf16 sum), rounded
// once, and the weight and bias gradients are the f32 op's bits, in f32 (made
// from bf16 dy, exact in f32).
TEST(LayerNorm, Bf16ActivationsTakeF32Parameters) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "add_layer_norm" : "layer_norm");
    std::vector<std::vector<float>> out, grads;
    for (DType dt : {DType::BF16, DType::F32}) {
      Tensor x = leaf({3, 5, 24}, 1, DType::BF16, 0.5), y = leaf({5, 24}, 2, DType::BF16);
      Tensor w = leaf({24}, 3, DType::F32, 1.0), b = leaf({24}, 4, DType::F32);
      Tensor o;
      if (dt == DType::F32) {  // the reference: f32 on the values the bf16 op normalizes
        const Tensor in = fused ? add(x, y).detach() : x.detach();
        o = layer_norm(in.to(DType::F32), w, b);
      } else {
        o = fused ? add_layer_norm(x, y, w, b).out : layer_norm(x, w, b);
      }
      ASSERT_EQ(o.dtype(), dt);
      weighted(o, 5).backward();
      EXPECT_EQ(w.grad().dtype(), DType::F32);
      EXPECT_EQ(b.grad().dtype(), DType::F32);
      out.push_back(floats(o.to(DType::BF16)));  // the f32 output rounded to bf16 once
      grads.push_back(floats(w.grad()));
      grads.push_back(floats(b.grad()));
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(grads[0], grads[2]) << "weight gradient";
    EXPECT_EQ(grads[1], grads[3]) << "bias gradient";
  }
}

/// Loss and gradients of sum(s * r1) + sum(out * r2) over x, y, w, b, with
/// the fused op or the add and the LayerNorm apart.
std::vector<std::vector<float>> residual_grads(DType dt, bool fused, const Shape& yshape) {
  Tensor x = leaf({2, 5, 16}, 11, dt, 0.3), y = leaf(yshape, 12, dt), w = leaf({16}, 13, dt, 1.0),
         b = leaf({16}, 14, dt);
  Tensor s, o;
  if (fused) {
    auto r = add_layer_norm(x, y, w, b);
    s = r.sum, o = r.out;
  } else {
    s = add(x, y);
    o = layer_norm(s, w, b);
  }
  Tensor loss = add(weighted(s, 15), weighted(o, 16));
  loss.backward();
  return {floats(s), floats(o), floats(x.grad()), floats(y.grad()), floats(w.grad()), floats(b.grad())};
}

// In f32 the fused op gives the unfused bits: the same sum, the same
// LayerNorm, and ds = dres + LN'(dy) rounded once as the engine's add of the
// two gradients rounds it. In bf16 ds is rounded once instead of twice: close.
TEST(AddLayerNorm, IsTheAddThenTheLayerNorm) {
  for (const Shape& ys : {Shape{2, 5, 16}, Shape{5, 16}}) {
    SCOPED_TRACE(shape_str(ys));
    EXPECT_EQ(residual_grads(DType::F32, true, ys), residual_grads(DType::F32, false, ys));
    const auto fused = residual_grads(DType::BF16, true, ys), apart = residual_grads(DType::BF16, false, ys);
    EXPECT_EQ(fused[0], apart[0]) << "the sum";
    EXPECT_EQ(fused[1], apart[1]) << "the LayerNorm";
    for (size_t i = 2; i < fused.size(); ++i) {
      double num = 0, den = 0;
      for (size_t j = 0; j < fused[i].size(); ++j) {
        num += (fused[i][j] - apart[i][j]) * (fused[i][j] - apart[i][j]);
        den += apart[i][j] * apart[i][j];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-2) << "gradient " << i;
    }
  }
}

// Only one output used: the other's gradient never arrives (undefined).
TEST(AddLayerNorm, EitherOutputAlone) {
  Tensor x = leaf({4, 8}, 21, DType::F32), y = leaf({4, 8}, 22, DType::F32), w = leaf({8}, 23, DType::F32);
  weighted(add_layer_norm(x, y, w, Tensor()).sum, 24).backward();
  EXPECT_EQ(floats(x.grad()), floats(y.grad()));
  EXPECT_FALSE(w.grad().defined()) << "the LayerNorm got no gradient";
  Tensor x2 = leaf({4, 8}, 21, DType::F32), y2 = leaf({4, 8}, 22, DType::F32), w2 = leaf({8}, 23, DType::F32);
  weighted(add_layer_norm(x2, y2, w2, Tensor()).out, 25).backward();
  Tensor x3 = leaf({4, 8}, 21, DType::F32), w3 = leaf({8}, 23, DType::F32);
  weighted(layer_norm(add(x3, y2.detach()), w3, Tensor()), 25).backward();
  EXPECT_EQ(floats(x2.grad()), floats(x3.grad()));
  EXPECT_EQ(floats(w2.grad()), floats(w3.grad()));
}

// Under selective recompute the fused op's output is dropped when the forward
// is done with it (a Linear saving it keeps a recipe) and rebuilt from the
// saved sum by the plain LayerNorm: the same bits, so the same gradients.
TEST(AddLayerNorm, SelectiveRecomputeRebuildsTheOutput) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<std::vector<float>> ref;
    for (Recompute mode : {Recompute::None, Recompute::Selective}) {
      Tensor x = leaf({3, 16}, 31, dt, 0.2), y = leaf({3, 16}, 32, dt), w = leaf({16}, 33, DType::F32, 1.0),
             b = leaf({16}, 34, DType::F32), lw = leaf({8, 16}, 35, dt);
      Tensor loss;
      {
        RecomputeGuard guard(mode);
        auto r = add_layer_norm(x, y, w, b);
        EXPECT_EQ(r.out.impl()->storage->recompute != nullptr, mode == Recompute::Selective);
        const std::weak_ptr<Storage> kept = r.out.impl_ptr()->storage;
        Tensor z = linear(r.out, lw);
        r.out = Tensor();
        EXPECT_EQ(kept.expired(), mode == Recompute::Selective) << recompute_name(mode);
        loss = add(weighted(z, 36), weighted(r.sum, 37));
      }
      loss.backward();
      std::vector<std::vector<float>> got{floats(loss),     floats(x.grad()), floats(y.grad()),
                                          floats(w.grad()), floats(b.grad()), floats(lw.grad())};
      if (ref.empty())
        ref = got;
      else
        EXPECT_EQ(got, ref);
    }
  }
}

}  // namespace
}  // namespace bt
