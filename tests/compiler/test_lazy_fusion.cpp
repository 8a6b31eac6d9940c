// Lazy fusion (runtime/compile/lazy.h, Note [Lazy fusion]) with the MLIR
// backend installed: a program of primitive ops -- forward and backward --
// gives the eager results inside a LazyScope; intermediates never get memory;
// a second run finds its kernels in the cache; a write to an input after a
// pending read, views of pending values and groups that fail to compile keep
// the eager semantics; compile.check's difference is small; nothing is
// recorded outside a scope or for devices the backend does not compile for.
#include <cmath>
#include <optional>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "compiler/mlir_backend.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/compile/lazy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"
#include "tests/support/fusion_groups.h"

namespace bt {
namespace {

/// The MLIR backend installed for a test, the no-op one put back after it.
class WithCompiler : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(compiler::install_fusion_backend());
    fusion::clear_kernel_cache();
    fusion::reset_lazy_stats();
  }
  void TearDown() override { fusion::set_backend(nullptr); }
};

double rel_error(const Tensor& a, const Tensor& b) { return fusion::relative_difference(a, b); }

/// A block written from primitives: y = gelu(layer_norm(x) * w + b) @ m + x,
/// the LayerNorm from mean and variance, GELU from its tanh formula.
Tensor block(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& m) {
  const Tensor mu = mean(x, {-1}, true);
  const Tensor xc = sub(x, mu);
  const Tensor var = mean(mul(xc, xc), {-1}, true);
  const Tensor h = add(mul(div(xc, sqrt(add(var, 1e-5))), w), b);
  const Tensor g =
      mul(mul(h, 0.5), add(tanh(mul(add(h, mul(pow(h, 3.0), 0.044715)), 0.7978845608028654)), 1.0));
  return add(matmul(g, m), x);
}

struct Result {
  Tensor y, loss, gx, gw, gb, gm;
};

Result run_block(DType dt, uint32_t seed, bool lazy) {
  std::mt19937 gen(seed);
  const int64_t B = 6, C = 48;
  Tensor x = test::uniform_cpu({B, C}, dt, gen).requires_grad_(true);
  Tensor w = test::uniform_cpu({C}, dt, gen).requires_grad_(true);
  Tensor b = test::uniform_cpu({C}, dt, gen).requires_grad_(true);
  Tensor m = test::uniform_cpu({C, C}, dt, gen, -0.2f, 0.2f).requires_grad_(true);
  Result r;
  {
    std::optional<fusion::LazyScope> scope;
    if (lazy) scope.emplace();
    r.y = block(x, w, b, m);
    r.loss = mean(mul(r.y, r.y));
    r.loss.backward();
  }
  r.gx = x.grad(), r.gw = w.grad(), r.gb = b.grad(), r.gm = m.grad();
  return r;
}

TEST_F(WithCompiler, PrimitiveProgramForwardAndBackwardMatchEager) {
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::F32 ? 1e-6 : 1e-12;
    const Result eager = run_block(dt, 11, false);
    fusion::reset_lazy_stats();
    const Result lazy = run_block(dt, 11, true);
    const fusion::LazyStats st = fusion::lazy_stats();
    EXPECT_LT(rel_error(lazy.y, eager.y), tol);
    EXPECT_LT(rel_error(lazy.loss, eager.loss), tol);
    EXPECT_LT(rel_error(lazy.gx, eager.gx), tol);
    EXPECT_LT(rel_error(lazy.gw, eager.gw), tol);
    EXPECT_LT(rel_error(lazy.gb, eager.gb), tol);
    EXPECT_LT(rel_error(lazy.gm, eager.gm), tol);
    // The matmul is the one opaque op: the forward up to it is a group, the
    // rest of the forward with the backward up to the matmul's is another, and
    // the backward after it a third (x's two gradients summed inside it).
    EXPECT_EQ(st.groups_run, 3);
    EXPECT_GE(st.nodes_fused, 40);
    EXPECT_EQ(st.eager_fallbacks, 0);
    EXPECT_GT(st.kernels_compiled, 0);
  }
}

TEST_F(WithCompiler, Bf16ScalarOpsComputeInF32AsTheKernelsDo) {
  // The kernels hold a bf16 op's scalar in f32 (0.7978845608 is not a bf16
  // value): the fused ops must too, and round once.
  std::mt19937 gen(12);
  const Tensor x = test::uniform_cpu({300}, DType::BF16, gen, 0.1f, 2.0f);
  const auto program = [&] { return add(pow(mul(x, 0.7978845608028654), 1.5), 0.1); };
  const Tensor eager = program();
  Tensor lazy;
  {
    fusion::LazyScope scope;
    lazy = program();
  }
  EXPECT_EQ(fusion::lazy_stats().nodes_fused, 3);
  EXPECT_EQ(rel_error(lazy, eager), 0.0);
}

TEST_F(WithCompiler, ASecondRunFindsItsKernelsInTheCache) {
  run_block(DType::F32, 3, true);
  const fusion::LazyStats first = fusion::lazy_stats();
  run_block(DType::F32, 4, true);  // other values, the same shapes
  const fusion::LazyStats second = fusion::lazy_stats();
  EXPECT_EQ(second.kernels_compiled, first.kernels_compiled) << "no group compiled twice";
  EXPECT_EQ(second.groups_run, 2 * first.groups_run);
}

TEST_F(WithCompiler, IntermediatesNeverGetMemory) {
  std::mt19937 gen(5);
  const Tensor x = test::uniform_cpu({1000}, DType::F32, gen);
  Tensor y;
  {
    fusion::LazyScope scope;
    y = x;
    for (int i = 0; i < 10; ++i) y = add(mul(y, 0.5), 0.25);  // 20 ops; only the last value is held
  }
  const fusion::LazyStats st = fusion::lazy_stats();
  EXPECT_EQ(st.groups_run, 1);
  EXPECT_EQ(st.nodes_fused, 20);
  EXPECT_EQ(st.outputs_written, 1);
  Tensor want = x;
  for (int i = 0; i < 10; ++i) want = add(mul(want, 0.5), 0.25);
  EXPECT_EQ(rel_error(y, want), 0.0);
}

TEST_F(WithCompiler, GradientsOfAValueUsedManyTimesAreSummedInsideOneGroup) {
  // GELU from its tanh formula reads x four times, so backward sums four
  // gradients of x. The sums are recorded like any add: the whole backward is
  // one group and no sum is computed eagerly before it.
  std::mt19937 gen(13);
  const Tensor x0 = test::uniform_cpu({40, 24}, DType::F32, gen);
  const Tensor c = test::uniform_cpu({40, 24}, DType::F32, gen);
  const auto run = [&](bool lazy) {
    Tensor x = x0.clone().requires_grad_(true);
    std::optional<fusion::LazyScope> scope;
    if (lazy) scope.emplace();
    const Tensor g =
        mul(mul(x, 0.5), add(tanh(mul(add(x, mul(pow(x, 3.0), 0.044715)), 0.7978845608028654)), 1.0));
    const Tensor loss = sum(mul(g, c));
    (void)loss.item<float>();  // the forward's group runs here
    fusion::reset_lazy_stats();
    loss.backward();
    return x.grad();
  };
  const Tensor eager = run(false);
  const Tensor lazy = run(true);
  const fusion::LazyStats st = fusion::lazy_stats();
  EXPECT_EQ(st.groups_run, 1) << "one backward group; an eager sum of two gradients would split it";
  EXPECT_EQ(st.outputs_written, 1) << "only x's gradient gets memory";
  EXPECT_EQ(st.eager_fallbacks, 0);
  EXPECT_LT(rel_error(lazy, eager), 1e-6);
}

TEST_F(WithCompiler, AWriteAfterAPendingReadSeesTheOldValues) {
  std::mt19937 gen(6);
  Tensor x = test::uniform_cpu({64}, DType::F32, gen);
  const Tensor before = x.clone();
  Tensor y;
  {
    fusion::LazyScope scope;
    y = add(x, 1.0);          // pending: reads x
    x.add_(ones({64}), 5.0);  // writes x: y is computed first
  }
  EXPECT_EQ(rel_error(y, add(before, 1.0)), 0.0);
  EXPECT_EQ(rel_error(x, add(before, 5.0)), 0.0);
}

TEST_F(WithCompiler, ReleasingMemoryAPendingValueReadsComputesItFirst) {
  // ZeRO-3 releases a unit's gathered weights when the unit's backward ends
  // (Note [Released storage]); pending work that reads them runs before.
  std::mt19937 gen(14);
  Tensor x = test::uniform_cpu({64}, DType::F32, gen);
  const Tensor want = add(mul(x, 2.0), 1.0);
  Tensor y;
  {
    fusion::LazyScope scope;
    y = add(mul(x, 2.0), 1.0);  // pending: reads x
    x.impl()->storage->release();
    EXPECT_EQ(fusion::lazy_stats().groups_run, 1) << "computed at the release";
  }
  EXPECT_EQ(rel_error(y, want), 0.0);
}

TEST_F(WithCompiler, ViewsOfPendingValues) {
  std::mt19937 gen(7);
  const Tensor x = test::uniform_cpu({8, 12}, DType::F32, gen);
  Tensor z;
  {
    fusion::LazyScope scope;
    const Tensor y = mul(x, 2.0);
    z = add(y.t(), 1.0);  // a transposed view of a pending value: computed first, then read strided
  }
  EXPECT_EQ(rel_error(z, add(mul(x, 2.0).t(), 1.0)), 0.0);
}

/// A backend that compiles nothing (its groups run through the eager ops).
class FailingBackend final : public fusion::Backend {
 public:
  std::string name() const override { return "failing"; }
  std::string unavailable(const Device&) const override { return ""; }
  std::shared_ptr<fusion::Kernel> compile(const fusion::Group& g, const Device&) override {
    BT_FAIL("this test backend compiles nothing (group '", g.name, "')");
  }
};

TEST_F(WithCompiler, GroupsThatFailToCompileRunEagerly) {
  fusion::set_backend(std::make_shared<FailingBackend>());
  fusion::clear_kernel_cache();
  const Result eager = run_block(DType::F32, 8, false);
  fusion::reset_lazy_stats();
  const Result lazy = run_block(DType::F32, 8, true);
  EXPECT_GT(fusion::lazy_stats().eager_fallbacks, 0);
  EXPECT_EQ(fusion::lazy_stats().eager_fallbacks, fusion::lazy_stats().groups_run);
  EXPECT_LT(rel_error(lazy.gx, eager.gx), 1e-6);
  EXPECT_LT(rel_error(lazy.gm, eager.gm), 1e-6);
}

TEST_F(WithCompiler, CheckModeComparesEachNewGroupWithEager) {
  fusion::LazyOptions opts;
  opts.check = true;
  std::mt19937 gen(9);
  const Tensor x = test::uniform_cpu({32, 96}, DType::F32, gen);
  {
    fusion::LazyScope scope(opts);
    const Tensor y = tanh(add(mul(x, x), x));
    (void)sum(y).item<float>();
  }
  const fusion::LazyStats st = fusion::lazy_stats();
  EXPECT_GT(st.kernels_compiled, 0);
  EXPECT_LT(st.check_max_rel_diff, 1e-6);
}

TEST_F(WithCompiler, NothingIsRecordedOutsideAScopeOrForOtherDevices) {
  EXPECT_FALSE(fusion::lazy_recording(Device::cpu()));
  {
    fusion::LazyScope scope;
    EXPECT_TRUE(fusion::lazy_recording(Device::cpu()));
    EXPECT_FALSE(fusion::lazy_recording(Device::cuda(0))) << "the backend compiles no CUDA yet";
  }
  const Tensor x = ones({4});
  (void)add(x, 1.0);
  EXPECT_EQ(fusion::lazy_stats().groups_run, 0);
}

}  // namespace
}  // namespace bt
