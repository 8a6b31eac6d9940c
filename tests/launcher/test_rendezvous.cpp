// `blutrain train` started with torchrun-style variables (no MPI): the TCP
// rendezvous brings the ranks together, and every way of getting the
// variables wrong ends each rank with a message that names the problem.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/free_port.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"

namespace bt {
namespace {

using test::free_port;

class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string glob = test::write_token_shards(dir_.path(), "tok", 1, 5000, 50257, 5);
    train_ = std::string(BT_BLUTRAIN_EXE) + " train --set 'data.train=" + glob +
             "' --set data.val= --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32"
             " --set model.seq_len=32 --set train.batch_size=4 --set train.micro_batch=2 --set train.steps=2"
             " --set train.device=cpu --set train.sample_tokens=0";
    port_ = std::to_string(free_port());
  }
  // Environment for one rank.
  std::string env(int rank, int world, const std::string& extra = "") const {
    return "RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
           " LOCAL_RANK=" + std::to_string(rank) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port_ +
           " BT_RENDEZVOUS_TIMEOUT_S=5 " + extra;
  }
  // Runs the ranks' commands at once; returns every rank's output, each after "== rank i".
  test::CommandResult ranks(const std::vector<std::string>& envs) {
    std::string script;
    for (size_t i = 0; i < envs.size(); ++i)
      script += "env " + envs[i] + " " + train_ + " >" + dir_.file("r" + std::to_string(i)) + " 2>&1 & ";
    script += "wait; for f in " + dir_.file("r") + "*; do echo \"== $f\"; cat $f; done\n";
    const std::string path = dir_.file("ranks.sh");
    std::ofstream(path) << script;
    return test::run_command("bash " + path);
  }

  test::TempDir dir_{"bt_rendezvous"};
  std::string train_, port_;
};

TEST_F(Rendezvous, RanksMeetThenCpuTrainingAsksForMpi) {
  const test::CommandResult r = ranks({env(0, 2), env(1, 2)});
  // The rendezvous works; CPU tensors then need MPI, and both ranks say so.
  size_t n = 0;
  for (size_t p = 0; (p = r.out.find("collectives on CPU tensors need MPI", p)) != std::string::npos; ++p)
    ++n;
  EXPECT_EQ(n, 2u) << r.out;
}

TEST_F(Rendezvous, WorldSizeMismatchStopsEveryRank) {
  const test::CommandResult r = ranks({env(0, 2), env(1, 3)});
  size_t n = 0;
  for (size_t p = 0;
       (p = r.out.find("world-size mismatch: rank 0 has WORLD_SIZE=2 but rank 1 has WORLD_SIZE=3", p)) !=
       std::string::npos;
       ++p)
    ++n;
  EXPECT_EQ(n, 2u) << r.out;
}

TEST_F(Rendezvous, ARankBeyondRankZerosWorldStops) {
  // Rank 0 and rank 1 agree on 2; a third process says 3 and takes RANK=2.
  const test::CommandResult r = ranks({env(0, 2), env(1, 2), env(2, 3)});
  EXPECT_NE(r.out.find("world-size mismatch: rank 0 has WORLD_SIZE=2 but rank 2 has WORLD_SIZE=3"),
            std::string::npos)
      << r.out;
}

TEST_F(Rendezvous, TwoProcessesWithOneRank) {
  const test::CommandResult r = ranks({env(0, 3), env(1, 3), env(1, 3)});
  EXPECT_NE(r.out.find("RANK=1 is used by two processes"), std::string::npos) << r.out;
}

TEST_F(Rendezvous, MissingVariablesAndTimeoutsAreNamed) {
  test::CommandResult r = test::run_command("env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 " + train_);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("MASTER_ADDR is not set"), std::string::npos) << r.out;
  r = test::run_command("env RANK=2 WORLD_SIZE=2 " + train_);
  EXPECT_NE(r.out.find("RANK=2 must be an integer in [0, 1]"), std::string::npos) << r.out;
  r = test::run_command("env " + env(1, 2, "BT_RENDEZVOUS_TIMEOUT_S=1") + " " + train_);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("rendezvous timeout: cannot reach 127.0.0.1:" + port_), std::string::npos) << r.out;
}

}  // namespace
}  // namespace bt
