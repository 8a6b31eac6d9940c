// train.compile on the CPU with the MLIR backend (Note [Lazy fusion]): the
// same per-step losses and gradient norms as eager training, every step's
// fusible regions computed as compiled groups, all of them compiled on the
// first step, a second run loading them all from the kernel cache, and
// BT_COMPILE=0 turning it off. (Without a compiler, the
// Trainer says train.compile is unavailable: tests/runtime/train/test_trainer.cpp.)
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/mlir_backend.h"
#include "kernels/common/error.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/compile/lazy.h"
#include "runtime/train/trainer.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"

namespace bt::train {
namespace {

class TrainerCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(compiler::install_fusion_backend());
    fusion::clear_kernel_cache();
    fusion::reset_lazy_stats();
    glob_ = test::write_token_shards(dir_.path().string(), "train", 2, 3000, 64, 1);
  }
  void TearDown() override { fusion::set_backend(nullptr); }
  TrainConfig config(bool compile) const {
    TrainConfig c;
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.n_embd = 32;
    c.model.seq_len = 16;
    c.model.vocab_size = 64;
    c.data.train = glob_;
    c.train.device = "cpu";
    c.train.steps = 20;
    c.train.batch_size = 8;
    c.train.micro_batch = 4;  // two micro-batches: accumulation runs too
    c.train.lr = 3e-3;
    c.train.warmup_steps = 3;
    c.train.compile = compile ? "true" : "false";
    return c;
  }
  test::TempDir dir_{"bt_trainer_compile"};
  std::string glob_;
};

TEST_F(TrainerCompile, GivesTheEagerLossesAndCompilesOnlyOnTheFirstStep) {
  Trainer eager(config(false)), compiled(config(true));
  EXPECT_NE(compiled.take_notice().find("train.compile: fusing"), std::string::npos);
  for (int i = 0; i < 20; ++i) {
    const StepStats a = eager.step(), b = compiled.step();
    SCOPED_TRACE(::testing::Message() << "step " << b.step);
    EXPECT_LE(std::abs(b.loss - a.loss), 1e-6 * std::abs(a.loss));
    EXPECT_LE(std::abs(b.grad_norm - a.grad_norm), 1e-6 * std::abs(a.grad_norm));
    EXPECT_FALSE(a.compiled);
    ASSERT_TRUE(b.compiled);
    EXPECT_GT(b.fused_groups, 0);
    EXPECT_EQ(b.recompiles, 0);
    if (i == 0) {
      EXPECT_GT(b.compile_s, 0.0);
    } else {
      EXPECT_EQ(b.compile_s, 0.0) << "every group was compiled on the first step";
    }
  }
  EXPECT_EQ(fusion::lazy_stats().eager_fallbacks, 0);
}

TEST_F(TrainerCompile, ThePrimitiveOpModelGivesItsEagerLossesAndFusesMore) {
  // Note [Primitive-op GPT]: LayerNorm, GELU and the bias and residual adds from
  // primitives, so most of the block is the compiler's.
  TrainConfig off = config(false), on = config(true), fused = config(true);
  off.model.fused_ops = on.model.fused_ops = false;
  Trainer eager(off), compiled(on), hand(fused);
  for (int i = 0; i < 20; ++i) {
    const StepStats a = eager.step(), b = compiled.step(), f = hand.step();
    SCOPED_TRACE(::testing::Message() << "step " << b.step);
    EXPECT_LE(std::abs(b.loss - a.loss), 1e-6 * std::abs(a.loss));
    EXPECT_LE(std::abs(b.grad_norm - a.grad_norm), 1e-6 * std::abs(a.grad_norm));
    EXPECT_EQ(b.recompiles, 0);
    EXPECT_GT(b.fused_groups, f.fused_groups) << "the primitive model leaves the compiler more regions";
  }
}

TEST_F(TrainerCompile, SelectiveRecomputeRebuildsSavedValuesInsideBackwardGroups) {
  // Note [Saved values recomputed]: under train.recompute selective, the
  // primitive model's saved intermediates (LayerNorm's centered and normalized
  // values, GELU's formula) are rebuilt in backward instead of written by the
  // forward: the same losses bit for bit, fewer values written. In bf16 the
  // casts are recorded too (the parameters' and their gradients').
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    TrainConfig off = config(false), kept = config(true), rebuilt = config(true);
    for (TrainConfig* c : {&off, &kept, &rebuilt}) {
      c->model.fused_ops = false;
      c->train.precision = precision;
      c->train.recompute = "selective";
    }
    kept.train.recompute = "none";
    Trainer eager(off), with_memory(kept), with_recipes(rebuilt);
    int64_t written[2] = {0, 0};
    for (int i = 0; i < 6; ++i) {
      const StepStats a = eager.step();
      fusion::reset_lazy_stats();
      const StepStats b = with_memory.step();
      written[0] += fusion::lazy_stats().outputs_written;
      fusion::reset_lazy_stats();
      const StepStats c = with_recipes.step();
      written[1] += fusion::lazy_stats().outputs_written;
      EXPECT_EQ(fusion::lazy_stats().eager_fallbacks, 0);
      SCOPED_TRACE(::testing::Message() << "step " << c.step);
      EXPECT_EQ(c.loss, b.loss);
      EXPECT_EQ(c.grad_norm, b.grad_norm);
      EXPECT_LE(std::abs(c.loss - a.loss),
                (std::string(precision) == "fp32" ? 1e-6 : 1e-2) * std::abs(a.loss));
      EXPECT_EQ(c.recompiles, 0);
    }
    EXPECT_LT(written[1], written[0]) << "the recipes' values were written anyway";
  }
}

TEST_F(TrainerCompile, CheckReportsTheLargestDifference) {
  TrainConfig c = config(true);
  c.compile.check = true;
  Trainer t(c);
  (void)t.take_notice();
  t.step();
  const std::string n = t.take_notice();
  EXPECT_NE(n.find("compile.check:"), std::string::npos) << n;
  EXPECT_NE(n.find("largest relative difference so far"), std::string::npos) << n;
  EXPECT_LT(fusion::lazy_stats().check_max_rel_diff, 1e-6);
  t.step();
  EXPECT_EQ(t.take_notice().find("compile.check:"), std::string::npos) << "nothing new to check after step 1";
}

TEST_F(TrainerCompile, ASecondRunLoadsEveryKernelFromTheCache) {
  // Note [Kernel cache]: the same job twice into one cache folder; the second
  // run generates no code and gives the first run's losses bit for bit.
  const test::TempDir cache("bt_trainer_kernel_cache");
  TrainConfig c = config(true);
  c.train.steps = 3;
  std::vector<StepStats> runs[2];
  std::string notices[2];
  for (auto r = 0; r < 2; ++r) {
    ASSERT_TRUE(compiler::install_fusion_backend({"", cache.path().string()}));  // a fresh backend each run
    Trainer t(c);
    for (int i = 0; i < 3; ++i) {
      runs[r].push_back(t.step());
      notices[r] += t.take_notice() + "\n";
    }
  }
  const StepStats &cold = runs[0][0], &warm = runs[1][0];
  EXPECT_GT(cold.kernels_compiled, 0);
  EXPECT_EQ(cold.kernels_loaded, 0);
  EXPECT_EQ(warm.kernels_compiled, 0) << "the second run generated code";
  EXPECT_EQ(warm.kernels_loaded, cold.kernels_compiled);
  EXPECT_NE(notices[0].find("kernel cache in " + cache.path().string()), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find(cat("step 1: ", cold.kernels_compiled, " fusion kernel(s) ready in ")),
            std::string::npos)
      << notices[0];
  EXPECT_NE(notices[1].find(cat(": ", warm.kernels_loaded, " loaded from the kernel cache, 0 compiled")),
            std::string::npos)
      << notices[1];
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i + 1);
    EXPECT_EQ(runs[1][i].loss, runs[0][i].loss);
    EXPECT_EQ(runs[1][i].grad_norm, runs[0][i].grad_norm);
    if (i > 0) {
      EXPECT_EQ(runs[1][i].kernels_loaded + runs[1][i].kernels_compiled, 0);
    }
  }
}

TEST_F(TrainerCompile, BtCompileZeroTurnsItOff) {
  ::setenv("BT_COMPILE", "0", 1);
  Trainer t(config(true));
  ::unsetenv("BT_COMPILE");
  EXPECT_NE(t.take_notice().find("train.compile: off, the step runs eagerly: BT_COMPILE=0 is set"),
            std::string::npos);
  EXPECT_FALSE(t.step().compiled);
}

}  // namespace
}  // namespace bt::train
