// Distributed strategies on 1, 2 and 4 real MPI ranks, on a toy model whose
// gradients are known: loss_r = sum_i sum(w_i * x_{r,i}) gives grad w_i =
// x_{r,i}, so the averaged gradient is the mean of the ranks' inputs. Checks
// DDP's bucketed averaging (and that non-sync micro-steps do not talk), and
// that zero1/zero2 shard the optimizer state and take the same step as one
// process's AdamW.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/autograd/grad_mode.h"
#include "runtime/dist/ddp.h"
#include "runtime/dist/mpi_process_group.h"
#include "runtime/dist/strategy.h"
#include "runtime/dist/world.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {
namespace {

const std::vector<Shape> kShapes = {{5}, {3}, {2, 7}, {4, 4}, {1}};

std::vector<Tensor> make_params(uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> ps;
  for (const Shape& s : kShapes) ps.push_back(randn(s, {}, &gen).requires_grad_());
  return ps;
}

// Rank r's input for parameter i: a fixed random tensor times (r + 1).
std::vector<Tensor> inputs(int rank, uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> xs;
  for (const Shape& s : kShapes) xs.push_back(mul(randn(s, {}, &gen), static_cast<double>(rank + 1)));
  return xs;
}

void backward(const std::vector<Tensor>& ps, const std::vector<Tensor>& xs) {
  Tensor loss;
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor l = sum(mul(ps[i], xs[i]));
    loss = loss.defined() ? add(loss, l) : l;
  }
  loss.backward();
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

TEST_F(Strategies, ZeroShardsStateAndMatchesOneProcess) {
  for (const char* name : {"zero1", "zero2"}) {
    StrategyOptions o;
    o.adamw.lr = 0.1;
    o.adamw.beta2 = 0.95;
    std::vector<Tensor> ps = make_params(3), ref = make_params(3);
    std::vector<ParamSpec> specs, ref_specs;
    for (size_t i = 0; i < ps.size(); ++i) {
      const double wd = ps[i].dim() == 2 ? 0.1 : 0.0;
      specs.push_back({ps[i], wd});
      ref_specs.push_back({ref[i], wd});
    }
    o.name = name;
    auto zero = make_strategy(o, specs, pg_);
    o.name = "local";
    auto local = make_strategy(o, ref_specs, nullptr);

    // This rank's share of the 5 + 3 + 14 + 16 + 1 = 39 parameters: ceil(39 / N),
    // less on the last rank, which holds the padding.
    const int64_t total = 39, n = pg_->size(), s = (total + n - 1) / n;
    const int64_t mine = std::max<int64_t>(0, std::min(s, total - pg_->rank() * s));
    EXPECT_EQ(zero->optimizer_state_bytes(), static_cast<uint64_t>(8 * mine)) << name;
    EXPECT_EQ(local->optimizer_state_bytes(), static_cast<uint64_t>(8 * total));

    for (int step = 0; step < 3; ++step) {
      zero->zero_grad();
      zero->before_backward(true);
      backward(ps, inputs(pg_->rank(), 20 + step));
      zero->after_backward();
      // One process sees the averaged gradient directly.
      local->zero_grad();
      std::vector<Tensor> avg = inputs(0, 20 + step);
      for (Tensor& x : avg) x = mul(x, mean_factor(pg_->size()));
      backward(ref, avg);
      const double gz = zero->grad_norm(), gl = local->grad_norm();
      EXPECT_NEAR(gz, gl, 1e-5 * gl) << name << " step " << step;
      zero->step(0.1, 0.5);
      local->step(0.1, 0.5);
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::vector<float> a = ps[i].to_vector<float>(), b = ref[i].to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k)
        ASSERT_NEAR(a[k], b[k], 1e-5) << name << " param " << i << "[" << k << "]";
    }
    if (std::string(name) == "zero2") {
      EXPECT_EQ(zero->gradient_bytes(), static_cast<uint64_t>(4 * s))
          << "zero2 keeps only its gradient shard";
      EXPECT_FALSE(ps[0].grad().defined()) << "zero2 releases the full gradient after reducing it";
    }
  }
}

}  // namespace
}  // namespace bt::dist
