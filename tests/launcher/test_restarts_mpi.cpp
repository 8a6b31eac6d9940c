// `blutrain launch` supervising a job: --max-restarts starts it again from its
// latest checkpoint after a rank dies (and gives up, saying why, when the
// budget is spent); the hang watchdog reports what each rank was doing and
// stops a job that makes no progress; a stop request (SIGUSR1) to one rank
// makes every rank save a checkpoint and exit with status 75. Real mpirun,
// real ranks killed with SIGKILL; on CPU, or with BT_TEST_DEVICE=cuda on two
// GPUs over NCCL (scripts/gpu-ckpt).
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

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

class Supervised : public ::testing::Test {
 protected:
  void SetUp() override {
    test::allow_mpirun_as_root();
    glob_ = test::write_token_shards(dir_.path(), "tok", 2, 20'000, 1024, 7);
    train_ = " train --set 'data.train=" + glob_ +
             "' --set data.val= --set model.vocab_size=1024 --set model.n_layer=2 --set model.n_head=2"
             " --set model.n_embd=64 --set model.seq_len=64 --set train.steps=30 --set train.batch_size=8"
             " --set train.micro_batch=2"
             " --set train.sample_tokens=0 --set train.warmup_steps=5 --set train.lr=1e-3"
             " --set dist.strategy=zero1 --set train.device=" +
             test::test_device();
  }
  std::string file(const std::string& name) const { return dir_.file(name); }

  /// Starts `blutrain launch ARGS -- train ... EXTRA` in the background; output in launch.out.
  void start(const std::string& env, const std::string& args, const std::string& extra) {
    const std::string cmd = test::mpirun_prefix(1) + env + " " + test::blutrain_exe() +
                            " launch --nproc 2 --log-dir " + file("logs") + " " + args + " --" + train_ +
                            " " + extra + " >" + file("launch.out") + " 2>&1; echo $? >" + file("status");
    job_ = std::thread([cmd] { (void)std::system(cmd.c_str()); });
  }
  /// Waits for the job to end; its exit status.
  int finish() {
    job_.join();
    return std::stoi(test::read_file(file("status")));
  }
  void TearDown() override {
    if (job_.joinable()) {
      (void)std::system(("pkill -KILL -f " + glob_).c_str());
      job_.join();
    }
  }

  /// Sends `sig` to rank 1 once this attempt has reached the save of step 10,
  /// which pauses there (BT_CHECKPOINT_PAUSE) before its commit. The rank's
  /// heartbeat says what it is doing and under which pid; a pid already
  /// killed belongs to an earlier attempt.
  void signal_rank_1_in_step_10_save(int attempt, int sig = SIGKILL) {
    long pid = 0;
    for (int i = 0; i < 1200 && pid == 0; ++i) {  // up to 120 s
      std::this_thread::sleep_for(100ms);
      const std::string status = test::read_file(file("logs") + "/rank-1.status");
      std::smatch m;
      if (std::regex_search(status, m, std::regex("^(\\d+) \\S+ \\S+ after step 10: checkpoint")) &&
          std::stol(m[1]) != last_pid_)
        pid = std::stol(m[1]);
    }
    ASSERT_NE(pid, 0) << "attempt " << attempt << " never reached the save of step 10\n"
                      << test::read_file(file("launch.out"));
    ASSERT_EQ(::kill(static_cast<pid_t>(pid), sig), 0);
    last_pid_ = pid;
  }

  test::TempDir dir_{"bt_supervised"};
  std::string glob_, train_;
  std::thread job_;
  long last_pid_ = 0;
};

TEST_F(Supervised, ARankKilledOnceIsRestartedAndTheRunEndsWithTheUninterruptedWeights) {
  test::CommandResult r =
      test::run_command(test::mpirun_prefix(2) + test::blutrain_exe() + train_ + " --metrics " +
                        file("ref.jsonl") + " --save-weights " + file("ref.h5"));
  ASSERT_EQ(r.status, 0) << r.out;

  start("BT_CHECKPOINT_PAUSE=10:3", "--max-restarts 2",
        "--set checkpoint.dir=" + file("ck") + " --set checkpoint.every=5 --metrics " + file("job.jsonl") +
            " --save-weights " + file("job.h5"));
  signal_rank_1_in_step_10_save(1);
  const int status = finish();
  const std::string out = test::read_file(file("launch.out"));
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("blutrain launch: restart 1 of 2 after: rank 1 was killed by signal 9"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("restart 2 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from " + file("ck") + "/step_00000005"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(file("logs") + "/rank-1.log.1")) << "the failed attempt's log is kept";

  // Steps 6-10 ran twice (the step-10 save never committed); the second run's
  // losses, and the final weights, are those of the uninterrupted run.
  const std::vector<double> want = test::losses(file("ref.jsonl"));
  const std::map<int64_t, double> got = test::losses_by_step(file("job.jsonl"));
  ASSERT_EQ(want.size(), 30u);
  ASSERT_EQ(got.size(), 30u);
  for (int64_t step = 1; step <= 30; ++step) EXPECT_EQ(got.at(step), want[step - 1]) << "step " << step;
  const test::WeightDiff d =
      test::weight_diff(load_weights(file("job.h5")).tensors, load_weights(file("ref.h5")).tensors);
  EXPECT_TRUE(d.identical) << "the weights differ, worst in " << d.where << " (" << d.worst << ")";
}

TEST_F(Supervised, ARankKilledThreeTimesStopsAfterTwoRestarts) {
  start("BT_CHECKPOINT_PAUSE=10:3", "--max-restarts 2",
        "--set checkpoint.dir=" + file("ck") + " --set checkpoint.every=5");
  for (int attempt = 1; attempt <= 3; ++attempt) {
    signal_rank_1_in_step_10_save(attempt);
    if (HasFatalFailure()) return;
  }
  const int status = finish();
  const std::string out = test::read_file(file("launch.out"));
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("restart 1 of 2 after: rank 1 was killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("restart 2 of 2 after: rank 1 was killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("blutrain launch: giving up: the restart budget is spent (--max-restarts 2, 2 restarts "
                     "made); the last failure: rank 1 was killed by signal 9"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("restart 3"), std::string::npos) << out;
  EXPECT_EQ(test::read_file(file("ck") + "/latest"), "step_00000005\n");
}

// SIGUSR1 to rank 1 alone, during the save of step 10: after step 11 both
// ranks agree to stop, save step 11 and exit with status 75, which the
// launcher passes on without restarting; the job then resumes from step 11
// and ends with the weights of an uninterrupted run.
TEST_F(Supervised, AStopRequestToOneRankStopsEveryRankAfterACheckpoint) {
  test::CommandResult r = test::run_command(test::mpirun_prefix(2) + test::blutrain_exe() + train_ +
                                            " --save-weights " + file("ref.h5"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string ck = " --set checkpoint.dir=" + file("ck") + " --set checkpoint.every=5";
  start("BT_CHECKPOINT_PAUSE=10:3", "--max-restarts 2", ck);
  signal_rank_1_in_step_10_save(1, SIGUSR1);
  const int status = finish();
  const std::string out = test::read_file(file("launch.out"));
  ASSERT_EQ(status, 75) << out;
  EXPECT_NE(
      out.find("stopped after step 11 of 30: another rank's signal asked the job to stop; the checkpoint "
               "of step 11 is in " +
               file("ck")),
      std::string::npos)
      << "rank 0 never got the signal, yet stops with rank 1\n"
      << out;
  EXPECT_NE(test::read_file(file("logs") + "/rank-1.log").find("stopped after step 11 of 30: SIGUSR1 asked"),
            std::string::npos);
  EXPECT_NE(out.find("not restarting"), std::string::npos) << out;
  EXPECT_EQ(out.find("restart 1 of 2"), std::string::npos) << out;
  EXPECT_EQ(test::read_file(file("ck") + "/latest"), "step_00000011\n");

  r = test::run_command(test::mpirun_prefix(2) + test::blutrain_exe() + train_ + ck +
                        " --set train.resume=auto" + " --save-weights " + file("job.h5"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + file("ck") + "/step_00000011"), std::string::npos) << r.out;
  const test::WeightDiff d =
      test::weight_diff(load_weights(file("job.h5")).tensors, load_weights(file("ref.h5")).tensors);
  EXPECT_TRUE(d.identical) << "the weights differ, worst in " << d.where << " (" << d.worst << ")";
}

TEST_F(Supervised, TheHangWatchdogReportsEachRankAndStopsTheJob) {
  // Every rank sleeps 120 s in the save of step 10: nothing moves for longer
  // than --hang-timeout 2.
  const auto t0 = std::chrono::steady_clock::now();
  start("BT_CHECKPOINT_PAUSE=10:120", "--hang-timeout 2",
        "--set checkpoint.dir=" + file("ck") + " --set checkpoint.every=5");
  const int status = finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = test::read_file(file("launch.out"));
  EXPECT_NE(status, 0) << out;
  EXPECT_LT(secs, 100.0) << out;
  EXPECT_NE(out.find("blutrain launch: no rank made progress for "), std::string::npos) << out;
  for (const char* rank : {"rank 0 (pid ", "rank 1 (pid "}) {
    const size_t at = out.find(rank);
    ASSERT_NE(at, std::string::npos) << out;
    const std::string line = out.substr(at, out.find('\n', at) - at);
    EXPECT_NE(line.find("after step 10: checkpoint, for "), std::string::npos) << line;
    EXPECT_NE(line.find("process state S"), std::string::npos) << line;
  }
  EXPECT_NE(out.find("blutrain launch: the job hung (no progress for --hang-timeout seconds)"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace bt
