// `blutrain train` started with torchrun-style variables (no MPI), as a
// Kubernetes Indexed Job starts it: the TCP rendezvous brings the ranks
// together, they train on CPU through the TCP process group and agree with the
// same job under mpirun, every way of getting the variables wrong ends each
// rank with a message that names the problem, a job without a token refuses
// to start, and strangers at a running job's store are refused while the job
// trains on unchanged (Note [Authenticated rendezvous]).
// Named *_mpi: one test compares with mpirun, so the file runs with the mpi
// tests, where LeakSanitizer is off for Open MPI's own one-time allocations.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "checkpoint/weights.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"
#include "tests/support/files.h"
#include "tests/support/free_port.h"
#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/stranger.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"
#include "tests/support/train_outputs.h"

namespace bt {
namespace {

using test::free_port;

const std::string kToken = "rendezvous-test-token-3f9c2a71";  // the jobs' BT_JOB_TOKEN

class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string glob = test::write_token_shards(dir_.path(), "tok", 1, 5000, 50257, 5);
    train_ = test::blutrain_exe() + " train --set 'data.train=" + glob +
             "' --set data.val= --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32"
             " --set model.seq_len=32 --set train.batch_size=4 --set train.micro_batch=2 --set train.steps=2"
             " --set train.device=cpu --set train.sample_tokens=0";
    port_ = std::to_string(free_port());
  }
  // Environment for one rank.
  std::string env(int rank, int world, const std::string& extra = "") const {
    return "RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
           " LOCAL_RANK=" + std::to_string(rank) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port_ +
           " BT_RENDEZVOUS_TIMEOUT_S=5 BT_JOB_TOKEN=" + kToken + " " + extra;
  }
  // Runs `cmd` once per environment, all at once; returns every rank's output,
  // each after "== rank i exited with S".
  test::CommandResult ranks(const std::vector<std::string>& envs, const std::string& cmd = "") {
    std::string script, collect;
    for (size_t i = 0; i < envs.size(); ++i) {
      const std::string out = dir_.file("r" + std::to_string(i) + ".out"), n = std::to_string(i);
      script +=
          "env " + envs[i] + " " + (cmd.empty() ? train_ : cmd) + " >" + out + " 2>&1 & p" + n + "=$!\n";
      collect += "wait $p" + n + "; echo \"== rank " + n + " exited with $?\"; cat " + out + "\n";
    }
    const std::string path = dir_.file("ranks.sh");
    std::ofstream(path) << script << collect;
    return test::run_command("bash " + path);
  }

  test::TempDir dir_{"bt_rendezvous"};
  std::string train_, port_;
};

// Each rank's progress lines ("step 3/6 | loss 10.7205 | lr 1.00e-03 | norm
// 1.287"), without the timings after them.
std::vector<std::string> step_lines(const std::string& log) {
  std::vector<std::string> v;
  std::istringstream in(test::read_file(log));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0) {
      const std::string head = line.substr(0, line.find(" tok/s"));
      v.push_back(head.substr(0, head.rfind(" | ")));
    }
  return v;
}

// The Kubernetes Indexed Job rendezvous, run locally: N processes given only
// the variables the manifests set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT; no mpirun) train a small GPT on CPU, their CPU collectives
// going through the TCP process group, and they agree:
//   - among themselves, exactly: every rank prints the same losses and
//     gradient norms (all-reduced values) at every step. Only rank 0 writes
//     weights, but under zero2/zero3 those are gathered from every rank's
//     shard, each updated by its own rank, so they check every rank's state;
//   - with the same job under `mpirun -np N`: bit for bit (per-step loss and
//     gradient norm, final weights). The TCP group adds in rank order and
//     divides as the MPI group does; with two ranks a + b has one order, and
//     with three, Open MPI 4.1's nonblocking reductions add in rank order too
//     (measured). An MPI that added in another order would differ in the last
//     bits, and this would need a tolerance: Open MPI 4.1 with four ranks does
//     (measured: some steps' gradient norms differ in the last bits).
TEST_F(Rendezvous, IndexedJobRanksWithoutMpirunTrainOnCpuAndMatchMpirun) {
  test::allow_mpirun_as_root();
  const std::string glob = test::write_token_shards(dir_.path(), "job", 1, 20'000, 50257, 7);
  // 12 sequences per step: 3 micro-batches of 2 on each of 2 ranks, 2 on each of 3.
  const std::string job =
      test::blutrain_exe() + " train --set 'data.train=" + glob +
      "' --set data.val= --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set "
      "model.seq_len=32"
      " --set train.batch_size=12 --set train.micro_batch=2 --set train.steps=6 --set train.warmup_steps=2"
      " --set train.lr=1e-3 --set train.device=cpu --set train.sample_tokens=0"
      " --set dist.bucket_mb=0.5";
  const std::vector<std::pair<int, std::string>> jobs = {{2, "ddp"}, {2, "zero3"}, {3, "zero2"}};
  for (const auto& [np, strategy] : jobs) {
    const std::string tag = strategy + std::to_string(np), logs = dir_.file("logs_" + tag);
    const std::string args = " --set dist.strategy=" + strategy + " --metrics " + dir_.file(tag + ".jsonl") +
                             " --save-weights " + dir_.file(tag + ".h5");
    std::filesystem::create_directories(logs);
    std::vector<std::string> envs;
    for (int r = 0; r < np; ++r)
      envs.push_back(env(r, np, "BT_RANK_LOG_DIR=" + logs + " BT_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"));
    const test::CommandResult r = ranks(envs, job + args);
    for (int i = 0; i < np; ++i)
      ASSERT_NE(r.out.find("== rank " + std::to_string(i) + " exited with 0"), std::string::npos)
          << tag << "\n"
          << r.out;
    EXPECT_NE(r.out.find(std::to_string(np) + " ranks (env), dist.strategy " + strategy), std::string::npos)
        << r.out;

    const std::vector<std::string> lead = step_lines(logs + "/rank-0.log");
    ASSERT_EQ(lead.size(), 6u) << tag << ": " << test::read_file(logs + "/rank-0.log");
    for (int i = 1; i < np; ++i)
      EXPECT_EQ(step_lines(logs + "/rank-" + std::to_string(i) + ".log"), lead) << tag << ": rank " << i;

    const std::string mpi_args = " --set dist.strategy=" + strategy + " --metrics " +
                                 dir_.file(tag + "_mpi.jsonl") + " --save-weights " +
                                 dir_.file(tag + "_mpi.h5");
    const test::CommandResult m = test::run_command(test::mpirun_prefix(np) + job + mpi_args);
    ASSERT_EQ(m.status, 0) << tag << "\n" << m.out;
    const auto got = test::jsonl_rows(dir_.file(tag + ".jsonl")),
               want = test::jsonl_rows(dir_.file(tag + "_mpi.jsonl"));
    ASSERT_EQ(got.size(), want.size()) << tag;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].at("loss").get<double>(), want[i].at("loss").get<double>())
          << tag << " step " << i + 1;
      EXPECT_EQ(got[i].at("grad_norm").get<double>(), want[i].at("grad_norm").get<double>())
          << tag << " step " << i + 1;
    }
    EXPECT_LT(got.back().at("loss").get<double>(), got.front().at("loss").get<double>())
        << tag << ": it learns";
    const test::WeightDiff wd = test::weight_diff(load_weights(dir_.file(tag + ".h5")).tensors,
                                                  load_weights(dir_.file(tag + "_mpi.h5")).tensors);
    EXPECT_TRUE(wd.identical) << tag << ": weights differ from mpirun's by " << wd.all << " overall, "
                              << wd.worst << " in " << wd.where;
  }
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

// Note [Authenticated rendezvous]: a torchrun-style job without a job token
// refuses to start, on every rank, saying how to give it one; with
// dist.insecure: true it runs open.
TEST_F(Rendezvous, WithoutAJobTokenEveryRankRefusesToStartUnlessInsecure) {
  const std::vector<std::string> open = {env(0, 2, "BT_JOB_TOKEN="), env(1, 2, "BT_JOB_TOKEN=")};
  test::CommandResult r = ranks(open);
  size_t n = 0;
  for (size_t p = 0; (p = r.out.find("started with torchrun-style variables but without a job token", p)) !=
                     std::string::npos;
       ++p)
    ++n;
  EXPECT_EQ(n, 2u) << r.out;
  EXPECT_NE(r.out.find("Give every rank the same secret in BT_JOB_TOKEN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dist.insecure: true runs without one"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("exited with 0"), std::string::npos) << r.out;
  r = ranks(open, train_ + " --set dist.insecure=true");
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(r.out.find("== rank " + std::to_string(i) + " exited with 0"), std::string::npos) << r.out;
}

// A running job's store met by strangers: one with another token, one that
// sends garbage, one that replays a proof recorded from another handshake.
// Rank 0 refuses each and names it in its log (address, what it sent), and the
// job trains on to the same losses and gradient norms as an undisturbed run.
// Rank 1 starts 3 s late, so rank 0's store is up and waiting for it while the
// strangers call. (Rank 0's process-group port is open only while the ranks
// connect to it: TcpProcessGroup.StrangersAtRankZerosPortAreRefusedAndTheGroupForms.)
TEST_F(Rendezvous, StrangersAtTheStoreAreRefusedAndTheJobTrainsOnUnchanged) {
  const std::string job = train_ + " --set train.steps=4 --metrics ";
  const std::string slow = " BT_RENDEZVOUS_TIMEOUT_S=60";
  test::CommandResult calm = ranks({env(0, 2, slow), env(1, 2, slow)}, job + dir_.file("calm.jsonl"));
  ASSERT_NE(calm.out.find("== rank 1 exited with 0"), std::string::npos) << calm.out;

  port_ = std::to_string(free_port());
  const std::string out0 = dir_.file("s0.out"), out1 = dir_.file("s1.out"), script = dir_.file("stormy.sh");
  std::ofstream(script)
      << "env " << env(0, 2, slow) << " " << job << dir_.file("stormy.jsonl") << " >" << out0
      << " 2>&1 & p0=$!\nsleep 3\nenv " << env(1, 2, slow) << " " << job << "/dev/null >" << out1
      << " 2>&1 & p1=$!\nwait $p0; echo \"== rank 0 exited with $?\"\nwait $p1; echo \"== rank 1 "
      << "exited with $?\"\n";
  test::CommandResult stormy;
  std::thread run([&] { stormy = test::run_command("bash " + script); });
  const int port = std::stoi(port_);
  test::as_stranger(port, [](int fd) {
    std::string why;
    EXPECT_FALSE(dist::auth::join(fd, "another-token-of-this-length", std::chrono::seconds(5), &why));
  });
  test::as_stranger(port, [](int fd) {
    ASSERT_TRUE(dist::net::send_all(fd, "PING garbage\n", 13));
    ::shutdown(fd, SHUT_WR);
  });
  const std::string recorded = test::recorded_proof(kToken);
  test::as_stranger(port, [&](int fd) {
    char greeting[41];
    ASSERT_TRUE(dist::net::recv_all(fd, greeting, sizeof greeting));
    ASSERT_TRUE(dist::net::send_all(fd, recorded.data(), recorded.size()));
  });
  run.join();
  for (int i = 0; i < 2; ++i)
    ASSERT_NE(stormy.out.find("== rank " + std::to_string(i) + " exited with 0"), std::string::npos)
        << stormy.out << test::read_file(out0) << test::read_file(out1);
  const std::string log = test::read_file(out0);
  size_t refused = 0;
  for (size_t p = 0; (p = log.find("rendezvous: refused a connection to the store from 127.0.0.1:", p)) !=
                     std::string::npos;
       ++p)
    ++refused;
  EXPECT_EQ(refused, 3u) << log;
  EXPECT_NE(log.find("it sent 13 byte(s) and closed the connection: 'PING garbage\\x0a'"), std::string::npos)
      << log;
  EXPECT_NE(log.find("another token, or a replayed handshake"), std::string::npos) << log;
  const auto got = test::jsonl_rows(dir_.file("stormy.jsonl")),
             want = test::jsonl_rows(dir_.file("calm.jsonl"));
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].at("loss"), want[i].at("loss")) << "step " << i + 1;
    EXPECT_EQ(got[i].at("grad_norm"), want[i].at("grad_norm")) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace bt
