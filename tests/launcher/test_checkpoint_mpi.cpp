// Checkpoints of `blutrain train` under real `mpirun` (oversubscribed, CPU,
// deterministic): exact resume, resharding across world sizes and
// strategies, and the faults a long job meets -- a rank killed mid-save, a
// corrupt shard, a checkpoint of another model.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"
#include "tests/support/train_outputs.h"

namespace bt {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Result = test::CommandResult;
using test::losses;

/// cpu (CI), or BT_TEST_DEVICE=cuda on the GPU machine (scripts/gpu-ckpt): the
/// same jobs over NCCL, one GPU per rank (np 4 needs 4 GPUs).
std::string device() { return test::test_device(); }

/// The most ranks a job may have: 4, or BT_TEST_MAX_RANKS (a GPU machine
/// with fewer GPUs: NCCL takes one GPU per rank).
int max_ranks() {
  const char* v = std::getenv("BT_TEST_MAX_RANKS");
  return v && std::atoi(v) > 0 ? std::min(4, std::atoi(v)) : 4;
}

class CheckpointJob : public ::testing::Test {
 protected:
  void SetUp() override {
    test::allow_mpirun_as_root();
    glob_ = test::write_token_shards(dir_.path(), "tok", 2, 20'000, 1024, 7);
    // A 1024-token vocabulary keeps the runs quick (under the sanitizers too); 40
    // steps of 8 sequences in micro-batches of 2 (4 micro-steps on 1 rank, 2 on 2, 1 on 4).
    train_ = test::blutrain_exe() + " train --set 'data.train=" + glob_ +
             "' --set data.val= --set model.vocab_size=1024 --set model.n_layer=2 --set model.n_head=2 --set "
             "model.n_embd=64"
             " --set model.seq_len=64 --set train.steps=40 --set train.batch_size=8 --set train.micro_batch=2"
             " --set train.device=" +
             device() +
             " --set train.sample_tokens=0"
             " --set train.warmup_steps=5 --set train.lr=1e-3";
  }
  /// `blutrain train` on `np` ranks with `strategy` and extra --set options.
  Result train(int np, const std::string& strategy, const std::string& extra) {
    return test::run_command(test::mpirun_prefix(np) + train_ + " --set dist.strategy=" + strategy + " " +
                             extra);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }

  test::TempDir dir_{"bt_ckpt_job"};
  std::string glob_, train_;
};

// 40 steps straight, and 20 + 20 with a stop and a resume, both on 2 ranks
// with zero2: steps 21-40 and the final weights are bitwise identical. The
// first half writes its checkpoints asynchronously.
TEST_F(CheckpointJob, ResumeIsExact) {
  Result r = train(2, "zero2", "--metrics " + file("full.jsonl") + " --save-weights " + file("full.h5"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string ck = "--set checkpoint.dir=" + file("ck");
  // The first half saves asynchronously every 5 steps (the last one is flushed at the stop).
  r = train(
      2, "zero2",
      ck + " --set checkpoint.async=true --set checkpoint.every=5 --set train.stop_at_step=20 --metrics " +
          file("a.jsonl"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("stopped after step 20 of 40"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 5: checkpoint snapshot taken in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("saved checkpoint " + file("ck") + "/step_00000020 (asynchronous"), std::string::npos)
      << r.out;
  EXPECT_EQ(ckpt::list(file("ck")).size(), 3u) << "checkpoint.keep_last defaults to 3";
  r = train(2, "zero2",
            ck + " --set train.resume=auto --metrics " + file("b.jsonl") + " --save-weights " + file("b.h5"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + file("ck") +
                       "/step_00000020 (saved at step 20 by 2 rank(s) with "
                       "strategy zero2;"),
            std::string::npos)
      << r.out;
  const std::vector<double> full = losses(file("full.jsonl")), a = losses(file("a.jsonl")),
                            b = losses(file("b.jsonl"));
  ASSERT_EQ(full.size(), 40u);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(a[i], full[i]) << "step " << i + 1;
    EXPECT_EQ(b[i], full[20 + i]) << "step " << 21 + i << " after the resume";
  }
  const test::WeightDiff d =
      test::weight_diff(load_weights(file("b.h5")).tensors, load_weights(file("full.h5")).tensors);
  EXPECT_TRUE(d.identical) << "the weights differ, worst in " << d.where << " (" << d.worst << ")";
}

// Saved on 4 ranks with zero3, resumed on 2 with ddp and on 1; saved on 1,
// resumed on 4 with zero3 and zero1: the trajectory goes on within 1e-6.
// (With BT_TEST_MAX_RANKS=2, 2 ranks stand for 4.)
TEST_F(CheckpointJob, ReshardsAcrossWorldSizesAndStrategies) {
  Result r = train(1, "ddp", "--metrics " + file("full.jsonl"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<double> full = losses(file("full.jsonl"));
  ASSERT_EQ(full.size(), 40u);
  struct Case {
    int from_np;
    std::string from;
    int to_np;
    std::string to;
  };
  const int wide = max_ranks();
  for (const Case& c : std::vector<Case>{{wide, "zero3", std::min(2, wide), "ddp"},
                                         {wide, "zero3", 1, "ddp"},
                                         {1, "ddp", wide, "zero3"},
                                         {1, "ddp", wide, "zero1"}}) {
    const std::string tag = std::to_string(c.from_np) + c.from + "_" + std::to_string(c.to_np) + c.to;
    const std::string saved = file("ck_" + std::to_string(c.from_np) + c.from);
    if (!fs::exists(saved)) {
      r = train(c.from_np, c.from, "--set checkpoint.dir=" + saved + " --set train.stop_at_step=20");
      ASSERT_EQ(r.status, 0) << tag << "\n" << r.out;
    }
    const std::string ck = file("ck_" + tag);
    fs::create_directories(ck);
    fs::copy(saved + "/step_00000020", ck + "/step_00000020", fs::copy_options::recursive);
    r = train(c.to_np, c.to,
              "--set checkpoint.dir=" + ck + " --set train.resume=auto --metrics " + file(tag + ".jsonl"));
    ASSERT_EQ(r.status, 0) << tag << "\n" << r.out;
    EXPECT_NE(r.out.find("by " + std::to_string(c.from_np) + " rank(s) with strategy " +
                         (c.from_np == 1 ? std::string("local") : c.from)),
              std::string::npos)
        << r.out;
    const std::vector<double> got = losses(file(tag + ".jsonl"));
    ASSERT_EQ(got.size(), 20u) << tag;
    double worst = 0;
    for (size_t i = 0; i < 20; ++i) worst = std::max(worst, std::fabs(got[i] - full[20 + i]) / full[20 + i]);
    EXPECT_LT(worst, 1e-6) << tag;
    std::printf("%s: steps 21-40 within %.2e (relative) of the uninterrupted run\n", tag.c_str(), worst);
  }
}

// Rank 1 killed while the step-10 save is between writing its files and the
// commit: `latest` stays at step 5, the half-written save is ignored, and a
// restart resumes from step 5.
TEST_F(CheckpointJob, ARankKilledMidSaveLeavesThePreviousCheckpoint) {
  const std::string ck = file("ck"), logs = file("logs"), out = file("launch.out");
  const std::string cmd = "BT_CHECKPOINT_PAUSE=10:120 " + test::blutrain_exe() +
                          " launch --nproc 2 --log-dir " + logs + " --" +
                          train_.substr(train_.find(" train")) + " --set checkpoint.dir=" + ck +
                          " --set checkpoint.every=5 >" + out + " 2>&1; echo $? >" + file("status");
  std::thread job([&] { (void)std::system(("BT_NUM_THREADS=1 " + cmd).c_str()); });
  const std::string marker = ck + "/step_00000010.tmp/rank_00001.json";
  long pid = 0;
  for (int i = 0; i < 1200 && pid == 0; ++i) {  // up to 120 s
    std::this_thread::sleep_for(100ms);
    std::smatch m;
    const std::string l = test::read_file(logs + "/rank-1.log");
    if (fs::exists(marker) && std::regex_search(l, m, std::regex("pid (\\d+)"))) pid = std::stol(m[1]);
  }
  if (pid == 0) {
    (void)std::system(("pkill -KILL -f " + glob_).c_str());
    job.join();
    FAIL() << "the step-10 save never started: " << test::read_file(out);
  }
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
  job.join();
  EXPECT_NE(std::stoi(test::read_file(file("status"))), 0) << test::read_file(out);
  EXPECT_EQ(fs::path(ckpt::latest(ck)).filename(), "step_00000005");
  EXPECT_EQ(test::read_file(ck + "/latest"), "step_00000005\n");
  EXPECT_EQ(ckpt::list(ck).size(), 1u);

  const Result r =
      train(2, "ddp", "--set checkpoint.dir=" + ck + " --set train.resume=auto --set train.stop_at_step=12");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + ck + "/step_00000005"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(ck + "/step_00000010.tmp")) << "the next save removes the dead one's leftovers";
}

// A flipped byte in the newest checkpoint: `blutrain ckpt verify` names the
// file, and resume=auto says so and falls back to the one before.
TEST_F(CheckpointJob, ACorruptShardIsCaughtAndResumeFallsBack) {
  const std::string ck = file("ck");
  Result r = train(2, "zero1",
                   "--set checkpoint.dir=" + ck + " --set checkpoint.every=5 --set train.stop_at_step=10");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string exe = test::blutrain_exe();
  // The root stands for its latest checkpoint, and the commands say which.
  const std::string chosen =
      ck + " is a checkpoint root: using its latest checkpoint, " + ck + "/step_00000010 (step 10)";
  for (const char* verb : {"verify", "inspect", "export"}) {
    r = test::run_command(exe + " ckpt " + verb + " " + ck +
                          (verb == std::string("export") ? " " + file("w.h5") : ""));
    EXPECT_EQ(r.status, 0) << verb << ": " << r.out;
    EXPECT_NE(r.out.find(chosen), std::string::npos) << verb << ": " << r.out;
  }
  EXPECT_NE(r.out.find("(step 10)"), std::string::npos) << r.out;
  r = test::run_command(exe + " ckpt verify --all " + ck);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("2 checkpoint(s), 0 with problems"), std::string::npos) << r.out;

  const std::string bad = ck + "/step_00000010/rank_00001.h5";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff mid = f.tellg() / 2;
    char c = 0;
    f.seekg(mid);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(mid);
    f.write(&c, 1);
  }
  r = test::run_command(exe + " ckpt verify " + ck + "/step_00000010");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rank_00001.h5"), std::string::npos) << r.out;
  r = test::run_command(exe + " ckpt verify " + ck + "/step_00000005");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
  r = test::run_command(exe + " ckpt verify " + ck);  // the root: its latest is the damaged one
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(chosen), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank_00001.h5"), std::string::npos) << r.out;
  r = test::run_command(exe + " ckpt verify --all " + ck);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("2 checkpoint(s), 1 with problems"), std::string::npos) << r.out;

  r = train(2, "zero1",
            "--set checkpoint.dir=" + ck + " --set train.resume=auto --set train.stop_at_step=12");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint " + ck + "/step_00000010 is unusable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + ck + "/step_00000005"), std::string::npos) << r.out;

  // A damaged `latest` file fails verify of the root, naming it.
  std::ofstream(ck + "/latest", std::ios::trunc) << "step_0000\x01"
                                                    "012\n";
  r = test::run_command(exe + " ckpt verify " + ck);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(ck + "/latest' holds \"step_0000\\x01012\\x0a\", which is not a checkpoint name"),
            std::string::npos)
      << r.out;
}

TEST_F(CheckpointJob, ACheckpointOfAnotherModelIsRefusedByTensor) {
  const std::string ck = file("ck");
  Result r = train(1, "ddp", "--set checkpoint.dir=" + ck + " --set train.stop_at_step=2");
  ASSERT_EQ(r.status, 0) << r.out;
  r = train(
      2, "zero1",
      "--set checkpoint.dir=" + ck + " --set train.resume=auto --set model.n_embd=128 --set model.n_head=2");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("has shape [1024, 64] there but [1024, 128] in this model"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace bt
