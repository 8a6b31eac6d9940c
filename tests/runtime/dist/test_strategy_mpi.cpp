// Distributed strategies on 1, 2 and 4 real MPI ranks, on the toy model of
// tests/support/toy_units.h, whose loss is nonlinear in the weights and
// linear in the inputs (Note [Toy loss]): the gradient averaged over the
// ranks, rank r's inputs being (r + 1) * x, is one process's gradient at
// (N + 1) / 2 * x. Checks DDP's bucketed averaging (and that non-sync
// micro-steps do not talk), that zero1/zero2/zero3 shard what they promise
// and take the same steps as one process's AdamW with gradient accumulation,
// that this comparison catches a forward given wrong weights, and zero3's
// gathering and freeing of units.
#include <algorithm>
#include <cmath>
#include <functional>

#include <gtest/gtest.h>

#include "runtime/autograd/grad_mode.h"
#include "runtime/dist/ddp.h"
#include "runtime/dist/mpi_process_group.h"
#include "runtime/dist/strategy.h"
#include "runtime/dist/world.h"
#include "runtime/dist/zero3.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"
#include "tests/support/toy_units.h"

namespace bt::dist {
namespace {

std::vector<Tensor> make_params(uint64_t seed) { return test::toy_params(seed); }

// Rank r's inputs: fixed random tensors times (r + 1).
std::vector<Tensor> inputs(int rank, uint64_t seed) { return test::toy_inputs(rank + 1.0, seed); }

double mean_factor(int n) { return (n + 1) / 2.0; }  // mean over r of (r + 1)

// What one process sees in place of N ranks' inputs (Note [Toy loss]).
std::vector<Tensor> mean_inputs(int n, uint64_t seed) { return test::toy_inputs(mean_factor(n), seed); }

void backward(const std::vector<Tensor>& ps, const std::vector<Tensor>& xs, nn::WeightSource* src = nullptr) {
  test::toy_backward(ps, xs, src);
}

class Strategies : public ::testing::Test {
 protected:
  void SetUp() override {
    pg_ = cpu_group();
    pg_->set_timeout(std::chrono::milliseconds(60'000));
  }
  std::shared_ptr<ProcessGroup> pg_;
};

TEST_F(Strategies, DdpAveragesBucketsAndSkipsNonSyncSteps) {
  std::vector<Tensor> ps = make_params(1);
  // Tiny buckets (one float) so every parameter gets its own.
  DataParallel ddp(ps, pg_, 4.0 / (1 << 20));
  EXPECT_EQ(ddp.num_buckets(), static_cast<int64_t>(ps.size()));
  ddp.broadcast_parameters();

  auto* mpi = dynamic_cast<MpiProcessGroup*>(pg_.get());
  ASSERT_NE(mpi, nullptr);
  const int64_t before = mpi->arrivals()[pg_->rank()];
  ddp.set_sync(false);  // micro-step 1 of 2: local accumulation only
  backward(ps, inputs(pg_->rank(), 9));
  EXPECT_EQ(mpi->arrivals()[pg_->rank()], before) << "a non-sync backward must not communicate";
  ddp.set_sync(true);
  backward(ps, inputs(pg_->rank(), 9));
  ddp.finish();

  // One process accumulates the same two micro-steps from the mean input.
  const std::vector<Tensor> ref = make_params(1);
  for (int micro = 0; micro < 2; ++micro) backward(ref, mean_inputs(pg_->size(), 9));
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> g = ps[i].grad().to_vector<float>(), want = ref[i].grad().to_vector<float>();
    for (size_t k = 0; k < g.size(); ++k)
      ASSERT_NEAR(g[k], want[k], 1e-5 * (1 + std::fabs(want[k]))) << "param " << i;
  }
  ddp.zero_grad();
  EXPECT_EQ(ps[0].grad().to_vector<float>()[0], 0.0f);
}

// This rank's share of a flat layout of `total` floats: ceil(total / N), less
// on the ranks that hold the padding.
int64_t share(int64_t total, int rank, int n) {
  const int64_t s = (total + n - 1) / n;
  return std::max<int64_t>(0, std::min(s, total - rank * s));
}

// A strategy on this rank's toy parameters and, beside it, one process's
// AdamW ("local") on a copy of them.
struct AgainstOneProcess {
  std::vector<Tensor> ps = make_params(3), ref = make_params(3);
  std::unique_ptr<Strategy> s, local;

  AgainstOneProcess(const std::string& name, const std::shared_ptr<ProcessGroup>& pg) {
    const std::vector<int> units = test::toy_units();
    StrategyOptions o;
    o.adamw.lr = 0.1;
    o.adamw.beta2 = 0.95;
    std::vector<ParamSpec> specs, ref_specs;
    for (size_t i = 0; i < ps.size(); ++i) {
      const double wd = ps[i].dim() == 2 ? 0.1 : 0.0;
      specs.push_back({ps[i], wd, units[i]});
      ref_specs.push_back({ref[i], wd, units[i]});
    }
    o.name = name;
    s = make_strategy(o, specs, pg);
    o.name = "local";
    local = make_strategy(o, ref_specs, nullptr);
  }

  // Three steps of two micro-steps each (only the second communicates); the
  // model takes its weights from `src` (null: the parameters). Returns the
  // largest relative difference of the two gradient norms.
  double step(int rank, int n, nn::WeightSource* src) {
    double gap = 0;
    for (int k = 0; k < 3; ++k) {
      s->zero_grad();
      local->zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        const uint64_t seed = 20 + 2 * k + micro;
        s->before_backward(micro == 1);
        backward(ps, inputs(rank, seed), src);
        backward(ref, mean_inputs(n, seed));
      }
      s->after_backward();
      const double gs = s->grad_norm(), gl = local->grad_norm();
      gap = std::max(gap, std::fabs(gs - gl) / gl);
      s->step(0.1, 0.5);
      local->step(0.1, 0.5);
    }
    return gap;
  }

  // The largest difference of the parameters (after gather_parameters()).
  double param_gap() const {
    double gap = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::vector<float> a = ps[i].to_vector<float>(), b = ref[i].to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k) gap = std::max(gap, static_cast<double>(std::fabs(a[k] - b[k])));
    }
    return gap;
  }
};

// A strategy takes one process's steps when both gaps stay within these.
constexpr double kGradNormGap = 1e-5, kParamGap = 1e-5;

TEST_F(Strategies, ZeroShardsStateAndMatchesOneProcess) {
  const int r = pg_->rank(), n = pg_->size();
  for (const char* name : {"zero1", "zero2", "zero3"}) {
    const bool z3 = std::string(name) == "zero3";
    AgainstOneProcess run(name, pg_);
    Strategy& zero = *run.s;
    nn::WeightSource* src = zero.weight_source();
    EXPECT_EQ(src != nullptr, z3) << name;

    // zero1/zero2: one flat layout of 39 floats; zero3: one per unit, of
    // 5 + 1, 3 + 14 and 16 floats (Note [ZeRO-3 units]).
    const std::vector<int64_t> layouts = z3 ? std::vector<int64_t>{6, 17, 16} : std::vector<int64_t>{39};
    int64_t mine = 0, shards = 0;
    for (int64_t p : layouts) {
      mine += share(p, r, n);
      shards += (p + n - 1) / n;
    }
    EXPECT_EQ(zero.optimizer_state_bytes(), static_cast<uint64_t>(8 * mine)) << name;
    EXPECT_EQ(run.local->optimizer_state_bytes(), 8u * 39u);
    EXPECT_EQ(zero.parameter_bytes(), static_cast<uint64_t>(4 * (z3 ? shards : shards * n))) << name;
    EXPECT_EQ(zero.gradient_bytes(),
              static_cast<uint64_t>(4 * (std::string(name) == "zero1" ? shards * n : shards)))
        << name;

    EXPECT_LE(run.step(r, n, src), kGradNormGap) << name << ": gradient norms";
    if (z3) {
      // Between steps a zero3 rank holds shards only: the parameters' own
      // memory is released until gather_parameters().
      const std::string msg = test::error_message([&] { (void)run.ps[2].to_vector<float>(); });
      EXPECT_NE(msg.find("gather_parameters"), std::string::npos) << msg;
      zero.gather_parameters();
    }
    EXPECT_LE(run.param_gap(), kParamGap) << name << ": parameters";
    if (std::string(name) != "zero1") {
      EXPECT_FALSE(run.ps[0].grad().defined()) << name << " releases the full gradient after reducing it";
    }
  }
}

// A WeightSource that passes everything to zero3's but hands the forward a
// wrong value for one parameter, as a broken gather would; the gradient
// still reaches the parameter (the value is w + (bad - w), bad - w constant).
class WrongWeight : public nn::WeightSource {
 public:
  using Corrupt = std::function<Tensor(const Tensor& w)>;  // the bad value, from the right one
  WrongWeight(nn::WeightSource& inner, Tensor target, Corrupt corrupt)
      : inner_(inner), target_(std::move(target)), corrupt_(std::move(corrupt)) {}
  void enter(int unit) override { inner_.enter(unit); }
  std::vector<Tensor> leave(int unit, const std::vector<Tensor>& outs) override {
    return inner_.leave(unit, outs);
  }
  Tensor weight(const Tensor& param) override {
    const Tensor w = inner_.weight(param);
    if (param.impl() != target_.impl()) return w;
    Tensor delta;
    {
      NoGradGuard ng;
      delta = sub(corrupt_(w.detach()), w.detach());
    }
    return add(w, delta);
  }

 private:
  nn::WeightSource& inner_;
  Tensor target_;
  Corrupt corrupt_;
};

// The comparison above fails when zero3's forward computes with a wrong
// weight (a linear toy model, grad w = x, would see none of these).
TEST_F(Strategies, TheComparisonCatchesAWrongGather) {
  const int r = pg_->rank(), n = pg_->size();
  const float other_unit = make_params(3)[3].to_vector<float>()[5];
  Tensor first;  // param 0 as the first forward saw it
  const struct {
    const char* what;
    size_t param;
    WrongWeight::Corrupt corrupt;
  } faults[] = {
      {"a permutation (a wrong layout)", 3, [](const Tensor& w) { return w.t().contiguous(); }},
      {"values one element off (a wrong offset)", 2,
       [](const Tensor& w) {
         const Tensor flat = w.reshape({-1});
         const int64_t m = flat.numel();
         Tensor out = empty({m});
         out.narrow(0, 0, m - 1).copy_(flat.narrow(0, 1, m - 1));
         out.narrow(0, m - 1, 1).copy_(flat.narrow(0, 0, 1));
         return out.view(w.shape());
       }},
      {"a part left out (one rank's shard missing)", 1,
       [](const Tensor& w) {
         Tensor out = w.clone();
         out.narrow(0, 1, 2).zero_();
         return out;
       }},
      {"values from before the last step (stale)", 0,
       [&first](const Tensor& w) {
         if (!first.defined()) first = w.clone();
         return first;
       }},
      {"another unit's data", 4, [&](const Tensor& w) { return full(w.shape(), other_unit); }},
  };
  for (const auto& f : faults) {
    AgainstOneProcess run("zero3", pg_);
    WrongWeight wrong(*run.s->weight_source(), run.ps[f.param], f.corrupt);
    const double grad_gap = run.step(r, n, &wrong);
    run.s->gather_parameters();
    const double param_gap = run.param_gap();
    EXPECT_GT(grad_gap, kGradNormGap) << f.what << ": the gradient norms agree";
    EXPECT_GT(param_gap, kParamGap) << f.what << ": the parameters agree";
  }
}

// zero3 gathers a unit on enter (prefetching the next), frees it on leave and
// again after the unit's backward; unit 0 stays from its enter to the end of
// its backward. A weight used outside its unit's forward is an error.
TEST_F(Strategies, Zero3GathersUnitsJustInTime) {
  std::vector<Tensor> ps = make_params(5);
  const std::vector<Tensor> init = make_params(5);
  std::vector<ParamSpec> specs;
  const std::vector<int> units = test::toy_units();
  for (size_t i = 0; i < ps.size(); ++i) specs.push_back({ps[i], 0.0, units[i]});
  Zero3Strategy z(AdamWOptions{}, specs, pg_);
  ASSERT_EQ(z.num_units(), 3);
  for (int u = 0; u < 3; ++u) EXPECT_FALSE(z.gathered(u)) << "unit " << u << " before any forward";
  const std::string msg = test::error_message([&] { (void)z.weight(ps[1]); });
  EXPECT_NE(msg.find("outside that unit's forward"), std::string::npos) << msg;

  // The weight of parameter i, checked against the parameter's values.
  auto weight = [&](size_t i) {
    Tensor w = z.weight(ps[i]);
    EXPECT_EQ(w.to_vector<float>(), init[i].to_vector<float>()) << "param " << i << " gathered wrong";
    return w;
  };
  const std::vector<Tensor> xs = inputs(pg_->rank(), 7);
  z.zero_grad();
  z.before_backward(true);
  z.enter(0);
  EXPECT_TRUE(z.gathered(0));
  Tensor h = sum(mul(weight(0), xs[0]));
  z.enter(1);
  h = add(h, add(sum(mul(weight(1), xs[1])), sum(mul(weight(2), xs[2]))));
  h = z.leave(1, {h})[0];
  EXPECT_FALSE(z.gathered(1)) << "unit 1 is freed when its forward ends";
  z.enter(2);
  h = z.leave(2, {add(h, sum(mul(weight(3), xs[3])))})[0];
  h = z.leave(0, {add(h, sum(mul(weight(4), xs[4])))})[0];
  EXPECT_TRUE(z.gathered(0)) << "unit 0 stays for backward";
  h.backward();
  for (int u = 0; u < 3; ++u) EXPECT_FALSE(z.gathered(u)) << "unit " << u << " after backward";
  z.after_backward();
  // This forward is linear in w: the gradient shards hold the average over
  // ranks of xs, (N + 1) / 2 * x(rank 0).
  const std::vector<Tensor> x0 = inputs(0, 7);
  z.step(0.0, 1.0);  // lr 0: parameters unchanged, the gradients stay readable below
  z.gather_parameters();
  const double want = mean_factor(pg_->size());
  double norm2 = 0;
  for (const Tensor& x : x0)
    for (float v : x.to_vector<float>()) norm2 += want * want * v * v;
  EXPECT_NEAR(z.grad_norm(), std::sqrt(norm2), 1e-5 * std::sqrt(norm2));
}

}  // namespace
}  // namespace bt::dist
