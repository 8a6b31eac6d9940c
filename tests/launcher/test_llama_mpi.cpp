// A small Llama (GQA, SwiGLU, RMSNorm, RoPE, untied head) trained by `blutrain
// train` under real `mpirun` on CPU ranks: ddp and zero3 (one unit per block)
// on 2 and 4 ranks, zero1 on 2 and zero2 on 4 follow one process, and a
// checkpoint saved by 2 ranks with zero3 resumes on 1 with ddp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/weights.h"
#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"
#include "tests/support/train_outputs.h"

namespace bt {
namespace {

using Result = test::CommandResult;

class LlamaJob : public ::testing::Test {
 protected:
  void SetUp() override {
    test::allow_mpirun_as_root();
    glob_ = test::write_token_shards(dir_.path(), "tok", 2, 20'000, 1024, 7);
    // 2 blocks of width 64: 4 heads of 16 sharing 2 K/V heads, SwiGLU 128; 8
    // sequences of 64 per step in micro-batches of 2.
    base_ =
        test::blutrain_exe() + " train --set 'data.train=" + glob_ +
        "' --set data.val= --set model.arch=llama --set model.vocab_size=1024 --set model.n_layer=2"
        " --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=2 --set model.ffn_hidden=128"
        " --set model.seq_len=64 --set train.batch_size=8 --set train.micro_batch=2"
        " --set train.device=cpu --set train.sample_tokens=0 --set train.warmup_steps=5 --set train.lr=1e-3";
  }
  Result train(int np, const std::string& strategy, const std::string& extra) {
    return test::run_command((np > 1 ? test::mpirun_prefix(np) : std::string()) + base_ +
                             " --set dist.strategy=" + strategy + " " + extra);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }

  test::TempDir dir_{"bt_llama_job"};
  std::string glob_, base_;
};

double worst_relative(const std::vector<double>& a, const std::vector<double>& b, size_t from = 0) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::fabs(a[i] - b[from + i]) / std::fabs(b[from + i]));
  return w;
}

// Per-step losses and final weights within 1e-6 of one process; under zero3
// rank 0 holds 1/N of each unit (the embedding, head and final norm; each
// block), under zero1 and zero2 a shard of the whole flat state.
TEST_F(LlamaJob, EveryStrategyOnTwoOrFourRanksMatchesOneProcess) {
  Result one = train(
      1, "ddp", "--set train.steps=12 --metrics " + file("one.jsonl") + " --save-weights " + file("one.h5"));
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_NE(one.out.find("(llama: 2 layers, 4 heads (2 K/V), width 64, MLP 128"), std::string::npos)
      << one.out;
  const std::vector<double> ref = test::losses(file("one.jsonl"));
  ASSERT_EQ(ref.size(), 12u);
  EXPECT_LT(ref.back(), ref.front() - 0.5) << "the run must learn for the comparison to mean something";
  const WeightFile wref = load_weights(file("one.h5"));

  const int64_t C = 64, unit0 = 2 * 1024 * C + C, block = 2 * C + 2 * C * C + 2 * C * 32 + 3 * C * 128;
  const std::vector<nlohmann::json> rows = test::jsonl_rows(file("one.jsonl"));
  ASSERT_EQ(rows.front().at("optimizer_state_bytes").get<int64_t>(), 8 * (unit0 + 2 * block));
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const std::vector<std::pair<std::string, int>> runs = {{"ddp", 2},   {"ddp", 4},   {"zero1", 2},
                                                         {"zero2", 4}, {"zero3", 2}, {"zero3", 4}};
  for (const auto& [strategy, np] : runs) {
    const std::string tag = strategy + std::to_string(np);
    Result r = train(
        np, strategy,
        "--set train.steps=12 --metrics " + file(tag + ".jsonl") + " --save-weights " + file(tag + ".h5"));
    ASSERT_EQ(r.status, 0) << tag << "\n" << r.out;
    const std::vector<double> got = test::losses(file(tag + ".jsonl"));
    ASSERT_EQ(got.size(), ref.size()) << tag;
    const double worst = worst_relative(got, ref);
    EXPECT_LT(worst, 1e-6) << tag << ": per-step losses differ from one process";
    const test::WeightDiff wd = test::weight_diff(load_weights(file(tag + ".h5")).tensors, wref.tensors);
    EXPECT_LT(wd.all, 1e-6) << tag << ": final weights differ, most in " << wd.where;
    const int64_t state =
        test::jsonl_rows(file(tag + ".jsonl")).front().at("optimizer_state_bytes").get<int64_t>();
    if (strategy == "zero3") {
      EXPECT_EQ(state, 8 * (ceil_div(unit0, np) + 2 * ceil_div(block, np))) << tag;
    } else if (strategy != "ddp") {  // zero1, zero2: one padded shard of the flat state
      EXPECT_GE(state, 8 * (unit0 + 2 * block) / np) << tag;
      EXPECT_LT(state, 8 * (unit0 + 2 * block)) << tag;
    }
    std::printf("%s: losses within %.2e, weights %.2e (worst %s)\n", tag.c_str(), worst, wd.all,
                wd.where.c_str());
  }
}

TEST_F(LlamaJob, ACheckpointOfZero3OnTwoRanksResumesOnOneWithDdp) {
  Result r = train(1, "ddp", "--set train.steps=16 --metrics " + file("full.jsonl"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<double> full = test::losses(file("full.jsonl"));
  ASSERT_EQ(full.size(), 16u);
  const std::string ck = "--set train.steps=16 --set checkpoint.dir=" + file("ck");
  r = train(2, "zero3", ck + " --set train.stop_at_step=8");
  ASSERT_EQ(r.status, 0) << r.out;
  r = train(1, "ddp", ck + " --set train.resume=auto --metrics " + file("resumed.jsonl"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("by 2 rank(s) with strategy zero3"), std::string::npos) << r.out;
  const std::vector<double> got = test::losses(file("resumed.jsonl"));
  ASSERT_EQ(got.size(), 8u);
  const double worst = worst_relative(got, full, 8);
  EXPECT_LT(worst, 1e-6);
  std::printf("steps 9-16 after the resume within %.2e of the uninterrupted run\n", worst);
}

}  // namespace
}  // namespace bt
