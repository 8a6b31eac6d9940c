// The NCCL process group on real GPUs, one per rank (mpirun -np 2|4 on a
// machine with that many GPUs; skipped otherwise): collectives against values
// computed locally, in place and async, bf16 included; and ddp, zero1, zero2
// and zero3 on CUDA taking the steps one process takes, with gradient
// accumulation (the toy model of tests/support/toy_units.h).
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/core/device.h"
#include "runtime/dist/strategy.h"
#include "runtime/dist/world.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"
#include "tests/support/toy_units.h"

namespace bt::dist {
namespace {

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    const World& w = world();
    if (cuda_device_count() < w.local_size)
      GTEST_SKIP() << "needs one GPU per rank: " << w.local_size << " ranks on this host, "
                   << cuda_device_count() << " GPUs";
    dev_ = Device::cuda(w.local_rank);
    pg_ = device_group(dev_);
    pg_->set_timeout(std::chrono::milliseconds(120'000));
  }
  TensorOptions on(DType dt = DType::F32) const { return TensorOptions{}.with_dtype(dt).with_device(dev_); }
  int rank() const { return pg_->rank(); }
  int size() const { return pg_->size(); }

  Device dev_;
  std::shared_ptr<ProcessGroup> pg_;
};

std::vector<double> host(const Tensor& t) { return t.to(DType::F64).cpu().to_vector<double>(); }

TEST_F(Nccl, Collectives) {
  EXPECT_EQ(pg_->backend(), "nccl");
  const double rank_sum = size() * (size() + 1) / 2.0;
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor t = mul(ones({1000}, on(DType::F32)), rank() + 1.0).to(dt);
    pg_->all_reduce(t, ReduceOp::Sum);
    for (double x : host(t)) ASSERT_EQ(x, rank_sum) << dt;
    Tensor a = mul(ones({8}, on(DType::F32)), rank() + 1.0).to(dt);
    pg_->all_reduce(a, ReduceOp::Avg);
    for (double x : host(a)) ASSERT_NEAR(x, rank_sum / size(), 1e-2) << dt;
  }
  // reduce_scatter and all_gather in place, on one buffer.
  const int64_t n = 3;
  Tensor buf = mul(arange(n * size(), on()), rank() + 1.0);
  Tensor slot = buf.narrow(0, rank() * n, n);
  pg_->reduce_scatter(buf, slot, ReduceOp::Sum);
  std::vector<double> v = host(slot);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], rank_sum * (rank() * n + i));
  pg_->all_gather(slot, buf);
  v = host(buf);
  for (int64_t i = 0; i < n * size(); ++i) ASSERT_EQ(v[i], rank_sum * i);
  // broadcast from the last rank, async, then a barrier.
  Tensor b = full({5}, rank() == size() - 1 ? 7.0 : -1.0, on());
  auto w = pg_->broadcast_async(b, size() - 1);
  w->wait();
  for (double x : host(b)) ASSERT_EQ(x, 7.0);
  EXPECT_TRUE(w->done());
  pg_->barrier();
}

TEST_F(Nccl, StrategiesMatchOneProcessOnCuda) {
  const std::vector<int> units = test::toy_units();
  for (const char* name : {"ddp", "zero1", "zero2", "zero3"}) {
    std::vector<Tensor> ps = test::toy_params(3, dev_), ref = test::toy_params(3, dev_);
    std::vector<ParamSpec> specs, ref_specs;
    for (size_t i = 0; i < ps.size(); ++i) {
      specs.push_back({ps[i], ps[i].dim() == 2 ? 0.1 : 0.0, units[i]});
      ref_specs.push_back({ref[i], ref[i].dim() == 2 ? 0.1 : 0.0, units[i]});
    }
    StrategyOptions o;
    o.adamw.lr = 0.1;
    o.bucket_mb = 4.0 / (1 << 20);
    o.name = name;
    auto s = make_strategy(o, specs, pg_);
    o.name = "local";
    auto local = make_strategy(o, ref_specs, nullptr);
    for (int step = 0; step < 3; ++step) {
      s->zero_grad();
      local->zero_grad();
      for (int micro = 0; micro < 2; ++micro) {  // only the second micro-step communicates
        const uint64_t seed = 20 + 2 * step + micro;
        s->before_backward(micro == 1);
        test::toy_backward(ps, test::toy_inputs(rank() + 1.0, seed, dev_), s->weight_source());
        // One process, from the ranks' mean input (Note [Toy loss]).
        test::toy_backward(ref, test::toy_inputs((size() + 1) / 2.0, seed, dev_));
      }
      s->after_backward();
      const double gn = s->grad_norm(), gl = local->grad_norm();
      EXPECT_NEAR(gn, gl, 1e-5 * gl) << name;
      s->step(0.1, 0.5);
      local->step(0.1, 0.5);
    }
    s->gather_parameters();  // zero3 holds shards only until now
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::vector<double> a = host(ps[i]), b = host(ref[i]);
      for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], 1e-5) << name << " param " << i;
    }
  }
}

}  // namespace
}  // namespace bt::dist
