// Trainer on CPU: the loss falls, runs are bitwise reproducible, gradient
// accumulation matches one big batch, validation is repeatable, a non-finite
// step is skipped or stops the run without updating, and bad configs fail
// with errors naming the key.
#include <cmath>

#include <gtest/gtest.h>

#include "kernels/cpu/parallel.h"
#include "runtime/bt.h"
#include "runtime/train/trainer.h"
#include "tests/support/error_message.h"
#include "tests/support/scoped_env.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"
#include "tests/support/trainer_runs.h"

namespace bt::train {
namespace {

using test::flat_params;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    train_glob_ = test::write_token_shards(dir_.path().string(), "train", 2, 3000, 64, 1);
    val_glob_ = test::write_token_shards(dir_.path().string(), "val", 1, 800, 64, 2);
  }
  TrainConfig config() const {
    TrainConfig c;
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.n_embd = 32;
    c.model.seq_len = 16;
    c.model.vocab_size = 64;
    c.data.train = train_glob_;
    c.data.val = val_glob_;
    c.train.device = "cpu";
    c.train.steps = 30;
    c.train.batch_size = 8;
    c.train.micro_batch = 8;
    c.train.lr = 3e-3;
    c.train.min_lr = 3e-4;
    c.train.warmup_steps = 3;
    c.train.eval_batches = 4;
    return c;
  }
  static std::vector<double> run(Trainer& t, int64_t steps) {
    std::vector<double> losses;
    for (int64_t i = 0; i < steps; ++i) losses.push_back(t.step().loss);
    return losses;
  }
  test::TempDir dir_{"bt_trainer"};
  std::string train_glob_, val_glob_;
};

TEST_F(TrainerTest, CompileWithoutACompilerSaysItIsUnavailable) {
  // This program installs no fusion backend: the runtime's no-op one.
  TrainConfig c = config();
  c.train.compile = "true";
  Trainer t(c);
  const std::string notice = t.take_notice();
  EXPECT_NE(notice.find("train.compile: off, the step runs eagerly: no compiler is available"),
            std::string::npos)
      << notice;
  const StepStats s = t.step();
  EXPECT_FALSE(s.compiled);
  EXPECT_TRUE(std::isfinite(s.loss));
}

TEST_F(TrainerTest, LossFallsAndStatsAreFilled) {
  Trainer t(config());
  const double val0 = t.evaluate();
  EXPECT_NEAR(val0, std::log(64.0), 0.3);
  StepStats first = t.step(), last;
  EXPECT_EQ(first.step, 1);
  EXPECT_EQ(first.tokens, 8 * 16);
  EXPECT_NEAR(first.lr, 1e-3, 1e-12);  // warmup: 1/3 of the peak
  EXPECT_GT(first.grad_norm, 0.0);
  EXPECT_GT(first.tokens_per_s, 0.0);
  EXPECT_GT(first.peak_mem_bytes, 0u);
  for (int i = 1; i < 30; ++i) last = t.step();
  EXPECT_EQ(last.step, 30);
  EXPECT_LT(last.loss, first.loss - 1.0) << "30 steps on a repetitive stream should learn it";
  EXPECT_LT(t.evaluate(), val0 - 1.0);
  EXPECT_EQ(t.evaluate(), t.evaluate()) << "validation must see the same batches every time";
}

// Note [Deterministic by construction]: two runs of one config give the same
// losses, gradient norms and weights, bit for bit, in fp32 and bf16, with
// accumulation and clipping on, whatever the kernels' thread count. 256 rows
// of width 128 per micro-batch, so the kernels that add per-chunk partial sums
// (LayerNorm's dw and db) cut them into several chunks.
TEST_F(TrainerTest, SameSeedIsBitwiseIdentical) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = config();
    c.model.n_embd = 128;
    c.model.seq_len = 64;
    c.data.shuffle = true;
    c.train.precision = precision;
    c.train.micro_batch = 4;  // 2 micro-batches per step
    c.train.grad_clip = 0.5;  // clipping is active
    std::vector<std::vector<double>> stats;
    std::vector<std::vector<float>> params;
    for (int threads : {3, 1}) {
      kernels::cpu::set_num_threads(threads);
      Trainer t(c);
      std::vector<double> s;
      for (int i = 0; i < 8; ++i) {
        const StepStats st = t.step();
        s.push_back(st.loss);
        s.push_back(st.grad_norm);
      }
      stats.push_back(s);
      params.push_back(flat_params(t));
    }
    kernels::cpu::set_num_threads(0);
    EXPECT_EQ(stats[0], stats[1]) << "losses and gradient norms";
    EXPECT_EQ(params[0], params[1]) << "final weights";
  }
  TrainConfig c = config();
  c.train.seed = 99;
  Trainer other(c);
  EXPECT_NE(run(other, 1)[0], Trainer(config()).step().loss);
}

TEST_F(TrainerTest, GradientAccumulationMatchesOneBatch) {
  TrainConfig c = config();
  c.data.shuffle = false;
  c.train.grad_clip = 0.5;  // clipping is active, so the norm must agree too
  Trainer whole(c);
  c.train.micro_batch = 2;  // 4 micro-batches per step
  Trainer split(c);
  EXPECT_EQ(split.grad_accum(), 4);
  for (int i = 0; i < 10; ++i) {
    const StepStats a = whole.step(), b = split.step();
    EXPECT_NEAR(b.loss, a.loss, 2e-6 * a.loss) << "step " << i + 1;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-4 * a.grad_norm) << "step " << i + 1;
  }
  const std::vector<float> pa = flat_params(whole), pb = flat_params(split);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) ASSERT_NEAR(pb[i], pa[i], 1e-4) << "parameter element " << i;
}

// fp32x3 (Note [3xTF32] in kernels/gemm.h: matmuls as error-compensated
// TF32, the CPU computing what the GPU does) tracks strict fp32 from the same
// weights and data, yet not to the bit (the precision took effect). Measured
// over these 12 steps: losses 6.6e-8 apart at most, gradient norms 5.8e-7
// (relative). The fidelity tolerance, 1e-5 on the losses, is not enough here
// to tell the compensation from plain TF32 products (2.6e-6 on the losses,
// 2.3e-4 on the norms at this size), so the bounds are 5e-7 on the losses and
// 1e-5 on the norms: both fail without the compensation.
TEST_F(TrainerTest, Fp32x3TracksStrictFp32) {
  TrainConfig c = config();
  c.data.shuffle = false;
  c.train.steps = 12;
  c.train.grad_clip = 0.5;  // clipping is active
  std::vector<StepStats> runs[2];
  for (int i = 0; i < 2; ++i) {
    c.train.precision = i == 0 ? "fp32" : "fp32x3";
    Trainer t(c);
    for (int64_t s = 0; s < c.train.steps; ++s) runs[i].push_back(t.step());
  }
  double loss = 0, norm = 0;
  bool same = true;
  for (size_t s = 0; s < runs[0].size(); ++s) {
    const StepStats &f = runs[0][s], &x = runs[1][s];
    loss = std::max(loss, std::fabs(x.loss - f.loss) / f.loss);
    norm = std::max(norm, std::fabs(x.grad_norm - f.grad_norm) / f.grad_norm);
    same = same && x.loss == f.loss && x.grad_norm == f.grad_norm;
  }
  std::printf("fp32x3 against fp32 over %zu steps: losses %.3e, gradient norms %.3e (relative)\n",
              runs[0].size(), loss, norm);
  EXPECT_FALSE(same) << "fp32x3 gave fp32's bits: train.precision=fp32x3 did not take effect";
  EXPECT_LT(loss, 5e-7) << "per-step losses";
  EXPECT_LT(norm, 1e-5) << "per-step gradient norms";
  EXPECT_LT(runs[1].back().loss, runs[1].front().loss - 0.5)
      << "the runs must learn for this to mean something";
}

std::string error_of(const TrainConfig& c) {
  return test::error_message([&] { Trainer t(c); });
}

// Note [Batch split]: a micro-batch that does not split the batch becomes the
// largest one that does, and the steps are those of the configured split.
TEST_F(TrainerTest, AMicroBatchThatDoesNotSplitTheBatchIsLowered) {
  TrainConfig c = config();
  c.data.shuffle = false;
  c.train.micro_batch = 4;  // 8 = 2 x 4
  Trainer fits(c);
  c.train.micro_batch = 3;  // 8 is no multiple of 3: 2 is the largest that splits it
  EXPECT_NE(c.batch_split_note().find("running micro-batches of 2"), std::string::npos)
      << c.batch_split_note();
  Trainer lowered(c);
  EXPECT_EQ(lowered.config().train.micro_batch, 2);
  EXPECT_EQ(lowered.grad_accum(), 4);
  for (int i = 0; i < 3; ++i) {
    const StepStats a = fits.step(), b = lowered.step();
    EXPECT_NEAR(b.loss, a.loss, 2e-6 * a.loss) << "step " << i + 1;
  }
}

// The Trainer checks every batch's ids on the host (Note [Whole-step CUDA
// graphs]: a replayed step cannot): shards holding ids beyond the model's
// vocabulary fail at the first step, naming the key and the id.
TEST_F(TrainerTest, TokenIdsOutsideTheVocabularyAreNamed) {
  TrainConfig c = config();
  c.data.train = test::write_token_shards(dir_.path().string(), "wide", 1, 3000, 200, 3);
  Trainer t(c);
  const std::string msg = test::error_message([&] { t.step(); });
  EXPECT_NE(msg.find("data.train: token id "), std::string::npos) << msg;
  EXPECT_NE(msg.find("is outside [0, model.vocab_size=64)"), std::string::npos) << msg;
}

TEST(BatchSplit, LargestMicroBatchThatSplitsTheBatchOverTheRanks) {
  TrainConfig c;
  c.train.batch_size = 8;
  c.train.micro_batch = 8;
  EXPECT_EQ(c.micro_batch_for(1), 8);
  EXPECT_EQ(c.batch_split_note(1), "");
  EXPECT_EQ(c.micro_batch_for(2), 4);
  EXPECT_EQ(c.grad_accum(2), 1);
  EXPECT_EQ(c.micro_batch_for(4), 2);
  EXPECT_EQ(c.micro_batch_for(8), 1);
  EXPECT_NE(c.batch_split_note(4).find("over 4 ranks: running micro-batches of 2"), std::string::npos)
      << c.batch_split_note(4);
  c.train.batch_size = 24;
  c.train.micro_batch = 5;
  EXPECT_EQ(c.micro_batch_for(1), 4);  // 24 = 6 x 4
  EXPECT_EQ(c.micro_batch_for(2), 4);  // 12 per rank = 3 x 4
  EXPECT_EQ(c.micro_batch_for(3), 4);  // 8 per rank = 2 x 4
  EXPECT_EQ(c.grad_accum(3), 2);
  EXPECT_EQ(c.micro_batch_for(6), 4);
  c.train.micro_batch = 16;
  EXPECT_EQ(c.micro_batch_for(2), 12);  // at most what each rank gets
  // No split: the ranks cannot share the batch evenly. Both numbers are named.
  c.train.batch_size = 8;
  std::string e = test::error_message([&] { c.micro_batch_for(3); });
  EXPECT_NE(e.find("train.batch_size (8) cannot be split over 3 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("set train.batch_size to 6 or 9"), std::string::npos) << e;
  c.train.batch_size = 2;
  e = test::error_message([&] { c.micro_batch_for(4); });
  EXPECT_NE(e.find("train.batch_size (2) cannot be split over 4 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("set train.batch_size to 4,"), std::string::npos) << e;
}

// Note [Recompute defaults]: auto is selective under bf16 only; a mode named
// in the config is taken as it is.
TEST(TrainConfigRecompute, AutoIsSelectiveUnderBf16Only) {
  TrainConfig c;
  EXPECT_EQ(c.train.recompute, "auto");
  for (const char* p : {"fp32", "tf32"}) {
    c.train.precision = p;
    EXPECT_EQ(c.recompute(), Recompute::None) << p;
  }
  c.train.precision = "bf16";
  EXPECT_EQ(c.recompute(), Recompute::Selective);
  c.train.recompute = "none";
  EXPECT_EQ(c.recompute(), Recompute::None);
  c.train.precision = "fp32";
  c.train.recompute = "full";
  EXPECT_EQ(c.recompute(), Recompute::Full);
}

TEST_F(TrainerTest, BadConfigsNameTheKey) {
  TrainConfig c = config();
  c.train.lr = -1;
  EXPECT_NE(error_of(c).find("train.lr must be > 0"), std::string::npos) << error_of(c);
  c = config();
  c.train.precision = "fp8";
  EXPECT_NE(error_of(c).find("train.precision"), std::string::npos) << error_of(c);
  c = config();
  c.train.recompute = "some";
  EXPECT_NE(
      error_of(c).find("train.recompute: unknown recompute mode 'some'; choose one of: none, selective, "
                       "full"),
      std::string::npos)
      << error_of(c);
  c = config();
  c.train.nonfinite = "ignore";
  EXPECT_NE(error_of(c).find("train.nonfinite must be stop or skip, got 'ignore'"), std::string::npos)
      << error_of(c);
  c = config();
  c.train.max_skipped_steps = 0;
  EXPECT_NE(error_of(c).find("train.max_skipped_steps must be > 0"), std::string::npos) << error_of(c);
  c = config();
  c.data.train = dir_.file("nothing_*.bin");
  EXPECT_NE(error_of(c).find("nothing_*.bin"), std::string::npos) << error_of(c);
  c = config();
  c.model.seq_len = 4000;  // one window needs more tokens than a shard holds
  EXPECT_NE(error_of(c).find("tokens"), std::string::npos) << error_of(c);
}

// Note [Non-finite steps]: under train.nonfinite=skip, a step whose gradient
// goes non-finite (one parameter's, made NaN through BT_FAULT_NONFINITE)
// updates nothing. The run ends with the losses and weights, bit for bit, of
// a run that consumed that batch and took no step on it: a Trainer restored
// past it, with the step count and the data position moved on by one step
// and AdamW's count not. fp32 and bf16, two micro-batches per step, clipping
// on; the hook multiplies by 1 in the other steps, which must change no bit.
TEST_F(TrainerTest, ASkippedStepLeavesTheWeightsOfARunThatNeverTookIt) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = config();
    c.train.precision = precision;
    c.train.micro_batch = 4;
    c.train.grad_clip = 0.5;
    c.train.nonfinite = "skip";
    const test::FaultRun a = test::run_with_fault(c, "3:h.1.mlp.c_fc.weight", 6);
    std::vector<double> after;
    for (int64_t i = 1; i <= 6; ++i) {
      const StepStats& s = a.steps[static_cast<size_t>(i - 1)];
      EXPECT_EQ(s.skipped, i == 3) << "step " << i;
      EXPECT_EQ(s.skipped_steps, i >= 3 ? 1 : 0) << "step " << i;
      if (i > 3) after.push_back(s.loss);
    }
    const StepStats& third = a.steps[2];
    EXPECT_NE(third.nonfinite.find("step 3: the gradient of h.1.mlp.c_fc.weight is not finite; loss "),
              std::string::npos)
        << third.nonfinite;
    EXPECT_FALSE(std::isfinite(third.grad_norm));
    EXPECT_TRUE(std::isfinite(third.loss)) << "the forward pass was fine";
    EXPECT_NE(a.notices[2].find("skipped step 3: the gradient of h.1.mlp.c_fc.weight"), std::string::npos)
        << a.notices[2];
    EXPECT_NE(a.notices[2].find("(1 in a row; train.max_skipped_steps=5)"), std::string::npos)
        << a.notices[2];
    EXPECT_EQ(a.optimizer_steps, 5) << "the skipped step is not one of AdamW's";
    const auto [losses, params] = test::run_past_step(c, 3, 6);
    EXPECT_EQ(losses, after);
    EXPECT_EQ(params, a.params);
  }
}

// train.nonfinite=stop (the default): the step that went non-finite throws,
// naming the step and the parameter, and it updated nothing.
TEST_F(TrainerTest, ANonFiniteStepStopsTheRunNamingTheParameterAndUpdatesNothing) {
  const test::ScopedEnv fault("BT_FAULT_NONFINITE", "2:h.0.attn.c_proj.weight");
  Trainer t(config());
  EXPECT_FALSE(t.step().skipped);
  const std::vector<float> after_one = flat_params(t);
  const std::string msg = test::error_message([&] { t.step(); });
  for (const char* part :
       {"training stopped at step 2: the gradient of h.0.attn.c_proj.weight is not finite; loss ",
        "The update was not applied: the weights are those after step 1", "train.nonfinite=skip"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << "\n" << msg;
  EXPECT_EQ(msg.find("later parameters"), std::string::npos) << "only that gradient was made NaN: " << msg;
  EXPECT_EQ(flat_params(t), after_one);
}

// More than train.max_skipped_steps skipped steps in a row end the run.
TEST_F(TrainerTest, MoreSkippedStepsInARowThanAllowedEndTheRun) {
  TrainConfig c = config();
  c.train.nonfinite = "skip";
  c.train.max_skipped_steps = 2;
  const test::ScopedEnv fault("BT_FAULT_NONFINITE", "2-4:wte");
  Trainer t(c);
  EXPECT_FALSE(t.step().skipped);
  EXPECT_TRUE(t.step().skipped);
  EXPECT_TRUE(t.step().skipped);
  const std::string msg = test::error_message([&] { t.step(); });
  EXPECT_NE(msg.find("training stopped: 3 steps in a row were skipped, more than train.max_skipped_steps=2; "
                     "the last, step 4: the gradient of wte is not finite"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("The weights are those after step 1"), std::string::npos) << msg;
}

TEST_F(TrainerTest, ABadFaultSpecIsNamed) {
  for (const auto& [spec, want] : std::vector<std::pair<std::string, std::string>>{
           {"x:wte", "expected STEPS:PARAM[:RANK]"},
           {"0:wte", "steps must be 1 <= N <= M"},
           {"5-3:wte", "steps must be 1 <= N <= M"},
           {"2:wte:1", "RANK must be a rank of this job, 0 to 0"},
           {"2:wte:x", "RANK must be a rank of this job"},
           {"2:h.9.nothing", "the model has no parameter 'h.9.nothing' (its first is 'wte')"}}) {
    const test::ScopedEnv fault("BT_FAULT_NONFINITE", spec);
    const std::string msg = test::error_message([&] { Trainer t(config()); });
    EXPECT_NE(msg.find(want), std::string::npos) << spec << ": " << msg;
    EXPECT_NE(msg.find("BT_FAULT_NONFINITE='" + spec + "'"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace bt::train
