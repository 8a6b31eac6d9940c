// `blutrain launch` over real mpirun: rank 0's output on the terminal and a
// log file per rank; a rank killed with SIGKILL mid-run ends the job within
// 60 s with a message naming it; bad arguments name the problem.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"

namespace bt {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using Result = test::CommandResult;
Result run(const std::string& cmd) { return test::run_command(cmd); }

class Launch : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("BT_NUM_THREADS", "1", 1);  // the ranks share two cores
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    glob_ = test::write_token_shards(dir_.path(), "tok", 1, 20'000, 50257, 3);
    train_ = " train --set 'data.train=" + glob_ +
             "' --set data.val= --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32"
             " --set model.seq_len=32 --set train.batch_size=4 --set train.micro_batch=2"
             " --set train.device=cpu --set train.sample_tokens=0";
    exe_ = test::blutrain_exe();
  }
  std::string logs() const { return dir_.file("logs"); }

  test::TempDir dir_{"bt_launch"};
  std::string glob_, train_, exe_;
};

TEST_F(Launch, ShowsRankZeroAndLogsEveryRank) {
  const Result r =
      run(exe_ + " launch --nproc 2 --log-dir " + logs() + " --" + train_ + " --set train.steps=3");
  ASSERT_EQ(r.status, 0) << r.out;
  // Rank 0 on the terminal, once; rank 1 only in its file.
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank 1: done"), std::string::npos) << r.out;
  const std::string l0 = test::read_file(logs() + "/rank-0.log"),
                    l1 = test::read_file(logs() + "/rank-1.log");
  EXPECT_NE(l0.find("rank 0 of 2, pid "), std::string::npos) << l0;
  EXPECT_NE(l0.find("done: 3 steps"), std::string::npos) << l0;
  EXPECT_NE(l1.find("rank 1 of 2, pid "), std::string::npos) << l1;
  EXPECT_NE(l1.find("rank 1: done, 3 steps"), std::string::npos) << l1;
}

TEST_F(Launch, AKilledRankEndsTheJobAndIsNamed) {
  // A long run in the background; kill rank 1 once it is training.
  const std::string out = dir_.file("launch.out");
  const std::string cmd = exe_ + " launch --nproc 2 --log-dir " + logs() + " --" + train_ +
                          " --set train.steps=1000000 >" + out + " 2>&1; echo $? >" + dir_.file("status");
  std::thread job([&] { (void)std::system(cmd.c_str()); });
  const std::string log1 = logs() + "/rank-1.log";
  long pid = 0;
  for (int i = 0; i < 600 && pid == 0; ++i) {  // up to 60 s for rank 1 to start stepping
    std::this_thread::sleep_for(100ms);
    const std::string l = test::read_file(log1);
    std::smatch m;
    if (l.find("step ") != std::string::npos && std::regex_search(l, m, std::regex("pid (\\d+)")))
      pid = std::stol(m[1]);
  }
  if (pid == 0) {
    (void)std::system(("pkill -KILL -f " + glob_).c_str());
    job.join();
    FAIL() << "rank 1 never started training: " << test::read_file(out) << test::read_file(log1);
  }
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
  job.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string text = test::read_file(out);
  EXPECT_LT(secs, 60.0) << text;
  EXPECT_NE(std::stoi(test::read_file(dir_.file("status"))), 0) << text;
  EXPECT_NE(text.find("blutrain launch: rank 1 was killed by signal 9"), std::string::npos) << text;
  std::printf("the launcher exited %.1f s after rank 1 was killed\n", secs);
}

TEST_F(Launch, BadArgumentsAreNamed) {
  Result r = run(exe_ + " launch --nproc 0 --" + train_);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--nproc must be >= 1"), std::string::npos) << r.out;
  r = run(exe_ + " launch --nproc 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("give the command to run after --"), std::string::npos) << r.out;
  r = run(exe_ + " launch --nproc 2 --hostfile " + dir_.file("nohosts") + " --" + train_);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("nohosts"), std::string::npos) << r.out;
  r = run(exe_ + " launch --nproc 2 --mpirun " + dir_.file("no-mpirun") + " --log-dir " + logs() + " --" +
          train_);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("cannot run"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace bt
