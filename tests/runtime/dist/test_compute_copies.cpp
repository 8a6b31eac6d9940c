// ComputeCopies (Note [Compute copies]): the bf16 weights AdamW keeps, against
// the cast a forward would otherwise make -- the same bits served, the same
// gradients, the same steps -- and a write that bypasses AdamW seen at the
// next use. On the CPU, and on the GPU where there is one (AdamW's kernels
// write the copies there in one launch for many buffers).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/core/precision.h"
#include "runtime/dist/compute_copies.h"
#include "runtime/dist/strategy.h"

namespace bt::dist {
namespace {

std::vector<Device> devices() {
  std::vector<Device> d = {Device::cpu()};
  if (cuda_available()) d.push_back(Device::cuda(0));
  return d;
}

/// Sets the global precision for one test, and BT_COMPUTE_COPIES when `copies` is given.
struct Bf16Scope {
  explicit Bf16Scope(int copies = -1) {
    set_precision(Precision::BF16);
    if (copies >= 0) setenv("BT_COMPUTE_COPIES", copies ? "1" : "0", 1);
  }
  ~Bf16Scope() {
    set_precision(was);
    unsetenv("BT_COMPUTE_COPIES");
  }
  Precision was = precision();
};

/// The weights of a forward without compute copies: a recorded cast per use,
/// but for the parameters the model keeps in f32.
struct CastEachUse : nn::WeightSource {
  explicit CastEachUse(const std::vector<ParamSpec>& ps) {
    for (const ParamSpec& p : ps)
      if (p.keep_f32) keep.push_back(p.param.impl());
  }
  void enter(int) override {}
  Tensor weight(const Tensor& p) override {
    return std::find(keep.begin(), keep.end(), p.impl()) != keep.end() ? p : p.to(DType::BF16);
  }
  std::vector<Tensor> leave(int, const std::vector<Tensor>& outs) override { return outs; }
  std::vector<const void*> keep;
};

/// Three matrices (one of odd size: the kernels' scalar tails) and a vector
/// the model keeps in f32, on `d`.
std::vector<ParamSpec> specs(const Device& d, uint64_t seed) {
  Generator g(seed);
  std::vector<ParamSpec> ps;
  for (const Shape& s : {Shape{64, 48}, Shape{7, 13}, Shape{300, 80}, Shape{48}}) {
    ParamSpec p;
    p.param = randn(s, {}, &g).to(d).requires_grad_();
    p.name = "p" + std::to_string(ps.size());
    p.weight_decay = ps.size() % 2 ? 0.0 : 0.1;
    p.keep_f32 = s.size() == 1;
    ps.push_back(p);
  }
  return ps;
}

/// A loss that is nonlinear in every weight, computed from the weights `src` gives.
void backward(const std::vector<ParamSpec>& ps, nn::WeightSource& src, uint64_t seed) {
  Generator g(seed);
  Tensor loss;
  for (const ParamSpec& p : ps) {
    const Tensor w = src.weight(p.param).to(DType::F32);
    const Tensor x = randn(p.param.shape(), {}, &g).to(p.param.device());
    const Tensor t = sum(mul(tanh(w), x));
    loss = loss.defined() ? add(loss, mul(t, t)) : mul(t, t);
  }
  loss.backward();
}

TEST(ComputeCopies, ServeTheCastAndPassTheGradientToTheMaster) {
  Bf16Scope bf16;
  for (const Device& d : devices()) {
    SCOPED_TRACE(d.str());
    const std::vector<ParamSpec> ps = specs(d, 5);
    ComputeCopies copies(ps, DType::BF16);
    CastEachUse cast(ps);
    for (const ParamSpec& p : ps) {
      const Tensor w = copies.weight(p.param);
      if (p.keep_f32) {
        EXPECT_EQ(w.impl(), p.param.impl()) << p.name << ": a keep_f32 weight is the master itself";
        continue;
      }
      ASSERT_EQ(w.dtype(), DType::BF16) << p.name;
      EXPECT_EQ(w.shape(), p.param.shape()) << p.name;
      EXPECT_EQ(w.to(DType::F32).to_vector<float>(),
                p.param.to(DType::BF16).to(DType::F32).to_vector<float>())
          << p.name;
    }
    // The same gradients as through a cast at every use.
    backward(ps, copies, 9);
    std::vector<std::vector<float>> got;
    for (const ParamSpec& p : ps) {
      ASSERT_TRUE(p.param.grad().defined()) << p.name;
      EXPECT_EQ(p.param.grad().dtype(), DType::F32) << p.name;
      got.push_back(p.param.grad().to_vector<float>());
      p.param.zero_grad();
    }
    backward(ps, cast, 9);
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(ps[i].param.grad().to_vector<float>(), got[i]) << ps[i].name;
  }
}

TEST(ComputeCopies, AWriteThatBypassesAdamWIsSeenAtTheNextUse) {
  Bf16Scope bf16;
  for (const Device& d : devices()) {
    SCOPED_TRACE(d.str());
    const std::vector<ParamSpec> ps = specs(d, 6);
    ComputeCopies copies(ps, DType::BF16);
    Tensor p = ps[0].param;
    const Tensor first = copies.weight(p);
    const void* storage = first.data_ptr();
    {
      NoGradGuard ng;
      Tensor again = copies.weight(p);
      EXPECT_EQ(again.data_ptr(), storage) << "a current copy is served as it is";
      p.copy_(mul(p, -3.0));  // a checkpoint's load, a user's write: the version moves
    }
    const Tensor w = copies.weight(p);
    EXPECT_EQ(w.data_ptr(), storage) << "refreshed in place";
    EXPECT_EQ(w.to(DType::F32).to_vector<float>(), p.to(DType::BF16).to(DType::F32).to_vector<float>());
  }
}

// The local strategy under bf16 takes its forward's weights from the copies
// AdamW writes; with BT_COMPUTE_COPIES=0 it has no weight source and the
// forward casts. Five steps either way, from the same masters and inputs:
// the same masters, moments and copies, bit for bit.
TEST(ComputeCopies, StepsGiveTheBitsOfStepsThatCastEveryForward) {
  for (const Device& d : devices()) {
    SCOPED_TRACE(d.str());
    StrategyOptions o;
    o.adamw.lr = 0.05;
    std::vector<ParamSpec> with = specs(d, 7), without = specs(d, 7);
    std::unique_ptr<Strategy> a, b;
    {
      Bf16Scope on(1);
      a = make_strategy(o, with, nullptr);
    }
    {
      Bf16Scope off(0);
      b = make_strategy(o, without, nullptr);
    }
    {
      Bf16Scope fp32_is_untouched(1);
      set_precision(Precision::FP32);
      EXPECT_EQ(make_strategy(o, specs(d, 7), nullptr)->weight_source(), nullptr);
    }
    Bf16Scope bf16;
    ASSERT_NE(a->weight_source(), nullptr);
    ASSERT_EQ(b->weight_source(), nullptr);
    CastEachUse cast(without);
    for (int step = 0; step < 5; ++step) {
      a->zero_grad();
      b->zero_grad();
      backward(with, *a->weight_source(), 100 + step);
      backward(without, cast, 100 + step);
      a->step(o.adamw.lr, 1.0);
      b->step(o.adamw.lr, 1.0);
    }
    // Each copy AdamW wrote is served as it is (a cast would move its
    // version) and equals its master's cast.
    auto* copies = dynamic_cast<ComputeCopies*>(a->weight_source());
    ASSERT_NE(copies, nullptr);
    for (const auto& [master, copy] : copies->copies()) {
      const uint64_t v = copy.version();
      copies->weight(master);
      EXPECT_EQ(copy.version(), v) << "served without a cast";
    }
    // Their bytes: bf16 copies of the three matrices, none of the vector.
    EXPECT_EQ(a->compute_copy_bytes(), 2u * (64 * 48 + 7 * 13 + 300 * 80));
    EXPECT_EQ(b->compute_copy_bytes(), 0u) << "no copies, none counted";
    for (size_t i = 0; i < with.size(); ++i) {
      SCOPED_TRACE(with[i].name);
      EXPECT_EQ(with[i].param.to_vector<float>(), without[i].param.to_vector<float>());
      EXPECT_NE(with[i].param.to_vector<float>(), specs(d, 7)[i].param.to_vector<float>()) << "it trained";
      const Tensor served = a->weight_source()->weight(with[i].param);
      EXPECT_EQ(
          served.to(DType::F32).to_vector<float>(),
          with[i].param.to(with[i].keep_f32 ? DType::F32 : DType::BF16).to(DType::F32).to_vector<float>());
    }
  }
}

}  // namespace
}  // namespace bt::dist
