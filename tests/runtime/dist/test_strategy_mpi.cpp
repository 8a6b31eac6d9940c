// Distributed strategies on 1, 2 and 4 real MPI ranks, on a toy model whose
// gradients are known (tests/support/toy_units.h): loss_r = sum_i sum(w_i *
// x_{r,i}) gives grad w_i = x_{r,i}, so the averaged gradient is the mean of
// the ranks' inputs. Checks DDP's bucketed averaging (and that non-sync
// micro-steps do not talk), that zero1/zero2/zero3 shard what they promise
// and take the same steps as one process's AdamW with gradient accumulation,
// and zero3's gathering and freeing of units.
#include <algorithm>
#include <cmath>

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

void backward(const std::vector<Tensor>& ps, const std::vector<Tensor>& xs, nn::WeightSource* src = nullptr) {
  test::toy_backward(ps, xs, src);
}

double mean_factor(int n) { return (n + 1) / 2.0; }  // mean over r of (r + 1)

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

  const std::vector<Tensor> unit = inputs(0, 9);
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> g = ps[i].grad().to_vector<float>(), u = unit[i].to_vector<float>();
    for (size_t k = 0; k < g.size(); ++k)
      ASSERT_NEAR(g[k], 2 * mean_factor(pg_->size()) * u[k], 1e-5 * (1 + std::fabs(u[k]))) << "param " << i;
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

TEST_F(Strategies, ZeroShardsStateAndMatchesOneProcess) {
  const int r = pg_->rank(), n = pg_->size();
  const std::vector<int> units = test::toy_units();
  for (const char* name : {"zero1", "zero2", "zero3"}) {
    const bool z3 = std::string(name) == "zero3";
    StrategyOptions o;
    o.adamw.lr = 0.1;
    o.adamw.beta2 = 0.95;
    std::vector<Tensor> ps = make_params(3), ref = make_params(3);
    std::vector<ParamSpec> specs, ref_specs;
    for (size_t i = 0; i < ps.size(); ++i) {
      const double wd = ps[i].dim() == 2 ? 0.1 : 0.0;
      specs.push_back({ps[i], wd, units[i]});
      ref_specs.push_back({ref[i], wd, units[i]});
    }
    o.name = name;
    auto zero = make_strategy(o, specs, pg_);
    o.name = "local";
    auto local = make_strategy(o, ref_specs, nullptr);
    nn::WeightSource* src = zero->weight_source();
    EXPECT_EQ(src != nullptr, z3) << name;

    // zero1/zero2: one flat layout of 39 floats; zero3: one per unit, of
    // 5 + 1, 3 + 14 and 16 floats (Note [ZeRO-3 units]).
    const std::vector<int64_t> layouts = z3 ? std::vector<int64_t>{6, 17, 16} : std::vector<int64_t>{39};
    int64_t mine = 0, shards = 0;
    for (int64_t p : layouts) {
      mine += share(p, r, n);
      shards += (p + n - 1) / n;
    }
    EXPECT_EQ(zero->optimizer_state_bytes(), static_cast<uint64_t>(8 * mine)) << name;
    EXPECT_EQ(local->optimizer_state_bytes(), 8u * 39u);
    EXPECT_EQ(zero->parameter_bytes(), static_cast<uint64_t>(4 * (z3 ? shards : shards * n))) << name;
    EXPECT_EQ(zero->gradient_bytes(),
              static_cast<uint64_t>(4 * (std::string(name) == "zero1" ? shards * n : shards)))
        << name;

    for (int step = 0; step < 3; ++step) {
      // Two micro-steps: only the second communicates gradients.
      zero->zero_grad();
      local->zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        const uint64_t seed = 20 + 2 * step + micro;
        zero->before_backward(micro == 1);
        backward(ps, inputs(r, seed), src);
        // One process sees the averaged gradient directly.
        std::vector<Tensor> avg = inputs(0, seed);
        for (Tensor& x : avg) x = mul(x, mean_factor(n));
        backward(ref, avg);
      }
      zero->after_backward();
      const double gz = zero->grad_norm(), gl = local->grad_norm();
      EXPECT_NEAR(gz, gl, 1e-5 * gl) << name << " step " << step;
      zero->step(0.1, 0.5);
      local->step(0.1, 0.5);
    }
    if (z3) {
      // Between steps a zero3 rank holds shards only: the parameters' own
      // memory is released until gather_parameters().
      const std::string msg = test::error_message([&] { (void)ps[2].to_vector<float>(); });
      EXPECT_NE(msg.find("gather_parameters"), std::string::npos) << msg;
      zero->gather_parameters();
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::vector<float> a = ps[i].to_vector<float>(), b = ref[i].to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k)
        ASSERT_NEAR(a[k], b[k], 1e-5) << name << " param " << i << "[" << k << "]";
    }
    if (std::string(name) != "zero1")
      EXPECT_FALSE(ps[0].grad().defined()) << name << " releases the full gradient after reducing it";
  }
}

// zero3 gathers a unit on enter (prefetching the next), frees it on leave and
// again after the unit's backward; unit 0 stays from its enter to the end of
// its backward. A weight used outside its unit's forward is an error.
TEST_F(Strategies, Zero3GathersUnitsJustInTime) {
  std::vector<Tensor> ps = make_params(5);
  std::vector<ParamSpec> specs;
  const std::vector<int> units = test::toy_units();
  for (size_t i = 0; i < ps.size(); ++i) specs.push_back({ps[i], 0.0, units[i]});
  Zero3Strategy z(AdamWOptions{}, specs, pg_);
  ASSERT_EQ(z.num_units(), 3);
  for (int u = 0; u < 3; ++u) EXPECT_FALSE(z.gathered(u)) << "unit " << u << " before any forward";
  const std::string msg = test::error_message([&] { (void)z.weight(ps[1]); });
  EXPECT_NE(msg.find("outside that unit's forward"), std::string::npos) << msg;

  const std::vector<Tensor> xs = inputs(pg_->rank(), 7);
  z.zero_grad();
  z.before_backward(true);
  z.enter(0);
  EXPECT_TRUE(z.gathered(0));
  Tensor h = sum(mul(z.weight(ps[0]), xs[0]));
  z.enter(1);
  h = add(h, add(sum(mul(z.weight(ps[1]), xs[1])), sum(mul(z.weight(ps[2]), xs[2]))));
  h = z.leave(1, h);
  EXPECT_FALSE(z.gathered(1)) << "unit 1 is freed when its forward ends";
  z.enter(2);
  h = z.leave(2, add(h, sum(mul(z.weight(ps[3]), xs[3]))));
  h = z.leave(0, add(h, sum(mul(z.weight(ps[4]), xs[4]))));
  EXPECT_TRUE(z.gathered(0)) << "unit 0 stays for backward";
  h.backward();
  for (int u = 0; u < 3; ++u) EXPECT_FALSE(z.gathered(u)) << "unit " << u << " after backward";
  z.after_backward();
  // The gradient shards hold the average over ranks of xs: (N + 1) / 2 * x(rank 0).
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
