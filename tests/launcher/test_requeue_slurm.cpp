// The sbatch script of `blutrain slurm render` on a real Slurm cluster (the
// one-node cluster of scripts/slurm-local, started by scripts/test): a 2-rank
// CPU job is preempted mid-run with the signal Slurm sends ahead of a
// preemption or the time limit (USR1 to the batch script). The ranks save a
// checkpoint, the script requeues the job, and the job resumes and finishes
// with the losses and weights of an uninterrupted run, bit for bit. With the
// restart budget spent, the same signal ends the job with a clear message.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "checkpoint/weights.h"
#include "tests/support/fetched_data.h"
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
using test::run_command;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class SlurmJob : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* conf = std::getenv("SLURM_CONF");
    const bool cluster = conf && *conf && run_command("sinfo -h -o %t 2>&1").status == 0;
    if (!cluster) {
      if (test::required("BT_REQUIRE_SLURM"))
        FAIL() << "no Slurm cluster (SLURM_CONF=" << (conf ? conf : "unset")
               << "): scripts/test starts one with scripts/slurm-local";
      GTEST_SKIP() << "no Slurm cluster: start one with `scripts/slurm-local start` and export SLURM_CONF";
    }
    test::allow_mpirun_as_root();
    glob_ = test::write_token_shards(dir_.path(), "tok", 2, 20'000, 1024, 7);
    // A 1024-token vocabulary keeps the run short (under the sanitizers too).
    sets_ = {"data.train=" + glob_, "data.val=",           "model.vocab_size=1024", "model.n_layer=2",
             "model.n_head=2",      "model.n_embd=64",     "model.seq_len=64",      "train.steps=40",
             "train.batch_size=8",  "train.micro_batch=2", "train.sample_tokens=0", "train.warmup_steps=5",
             "train.lr=1e-3",       "dist.strategy=zero2"};
  }
  void TearDown() override {
    if (!job_.empty()) (void)run_command("scancel " + job_ + " 2>/dev/null");
  }

  std::string file(const std::string& name) const { return dir_.file(name); }

  /// Writes the job spec: 2 ranks on one node, checkpoints every 5 steps, and
  /// a pause of `pause_s` in the save of step 10 (after the files are written,
  /// before the commit) that gives the test a moment to preempt the job.
  std::string write_spec(int max_restarts, int pause_s) {
    std::ofstream f(file("job.yaml"));
    f << "name: bt-requeue\nexecutable: " << test::blutrain_exe() << "\nnodes: 1\nranks_per_node: 2\nset:\n";
    for (const std::string& s : sets_) f << "  - \"" << s << "\"\n";
    f << "  - train.metrics=" << file("job.jsonl") << "\n  - train.save_weights=" << file("job.h5") << "\n"
      << "checkpoint_dir: " << file("ck") << "\ncheckpoint_every: 5\nmax_restarts: " << max_restarts << "\n"
      << "env:\n  OMPI_ALLOW_RUN_AS_ROOT: \"1\"\n  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: \"1\"\n"
      << "  OPENBLAS_NUM_THREADS: \"1\"\n  BT_CHECKPOINT_PAUSE: \"10:" << pause_s << "\"\n"
      << "slurm:\n  cpus_per_task: 1\n  signal_s: 60\n  workdir: " << dir_.path().string()
      << "\n  output: " << file("job.out") << "\n";
    return file("job.yaml");
  }

  /// `blutrain slurm submit`; remembers the job id.
  void submit(const std::string& spec) {
    const test::CommandResult r =
        run_command(test::blutrain_exe() + " slurm submit " + spec + " --script " + file("job.sbatch"));
    ASSERT_EQ(r.status, 0) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex("submitted job (\\d+)"))) << r.out;
    job_ = m[1];
  }

  std::string field(const std::string& name) {
    const std::string out = run_command("scontrol show job " + job_).out;
    std::smatch m;
    return std::regex_search(out, m, std::regex(name + "=(\\S+)")) ? m[1].str() : "";
  }

  /// Waits (up to `limit`) until `done` holds; false on timeout.
  template <class F>
  bool wait_for(F done, std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  /// Sends USR1 to the batch script, as --signal=B:USR1@secs does, while the
  /// save of step 10 pauses between writing its files and the commit.
  void preempt_during_step_10_save() {
    const std::string marker = file("ck") + "/step_00000010.tmp/rank_00001.json";
    ASSERT_TRUE(wait_for([&] { return fs::exists(marker); }, 120s))
        << "the job never reached the save of step 10 (state " << field("JobState") << ")\n"
        << test::read_file(file("job.out"));
    const test::CommandResult r = run_command("scancel --signal=USR1 --batch " + job_);
    ASSERT_EQ(r.status, 0) << r.out;
  }

  std::string final_state() {
    std::string state;
    wait_for(
        [&] {
          state = field("JobState");
          return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT";
        },
        240s);
    return state;
  }

  test::TempDir dir_{"bt_slurm_job"};
  std::string glob_, job_;
  std::vector<std::string> sets_;
};

TEST_F(SlurmJob, PreemptedJobRequeuesResumesAndMatchesAnUninterruptedRun) {
  // The uninterrupted run: the same training config on 2 ranks, no checkpoints.
  std::string ref = test::mpirun_prefix(2) + test::blutrain_exe() + " train";
  for (const std::string& s : sets_) ref += " --set " + test::shell_quote(s);
  test::CommandResult r =
      run_command(ref + " --metrics " + file("ref.jsonl") + " --save-weights " + file("ref.h5"));
  ASSERT_EQ(r.status, 0) << r.out;

  submit(write_spec(/*max_restarts=*/2, /*pause_s=*/8));
  preempt_during_step_10_save();
  // The script requeues the job. Slurm holds a requeued job for about two
  // minutes (its BeginTime), so that what is left of the first run is gone
  // before the next starts: its slurmstepd, which outlives the batch script
  // by a few seconds, and the revocation of its credential, which slurmd
  // checks at one-second resolution (a new run allocated in the same second
  // is refused). Once no slurmstepd of the job is left, the test shortens
  // the hold to 5 seconds.
  ASSERT_TRUE(wait_for(
      [&] {
        return field("Restarts") == "1" && field("JobState") == "PENDING" && field("Reason") == "BeginTime" &&
               run_command("pgrep -f 'slurmstepd: \\[" + job_ + "\\.'").status != 0;
      },
      120s))
      << "the job was not requeued: state " << field("JobState") << ", restarts " << field("Restarts") << "\n"
      << test::read_file(file("job.out"));
  r = run_command("scontrol update JobId=" + job_ + " StartTime=now+5");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string state = final_state();
  const std::string out = test::read_file(file("job.out"));
  ASSERT_EQ(state, "COMPLETED") << out;
  EXPECT_EQ(field("Restarts"), "1");

  // What the job said: the stop, the requeue, the resume, the end.
  EXPECT_NE(out.find("USR1: asking the ranks to save a checkpoint and stop"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped after step 11 of 40: SIGUSR1 asked the job to stop"), std::string::npos) << out;
  EXPECT_NE(out.find("requeueing (restart 1 of 2), to resume from " + file("ck") + "/step_00000011"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("resumed from " + file("ck") + "/step_00000011"), std::string::npos) << out;
  EXPECT_NE(out.find("run 2 (restart 1 of 2): training finished"), std::string::npos) << out;
  EXPECT_EQ(trim(test::read_file(file("ck") + "/latest")), "step_00000040");

  // Bit for bit: every step's loss (the second run appended steps 12-40) and
  // the final weights.
  const std::vector<double> want = test::losses(file("ref.jsonl"));
  const std::map<int64_t, double> got = test::losses_by_step(file("job.jsonl"));
  ASSERT_EQ(want.size(), 40u);
  ASSERT_EQ(got.size(), 40u) << test::read_file(file("job.jsonl"));
  for (int64_t step = 1; step <= 40; ++step) EXPECT_EQ(got.at(step), want[step - 1]) << "step " << step;
  const test::WeightDiff d =
      test::weight_diff(load_weights(file("job.h5")).tensors, load_weights(file("ref.h5")).tensors);
  EXPECT_TRUE(d.identical) << "the weights differ, worst in " << d.where << " (" << d.worst << ")";
}

TEST_F(SlurmJob, ASpentRestartBudgetEndsTheJobWithAClearMessage) {
  submit(write_spec(/*max_restarts=*/0, /*pause_s=*/5));
  preempt_during_step_10_save();
  const std::string state = final_state();
  const std::string out = test::read_file(file("job.out"));
  EXPECT_EQ(state, "FAILED") << out;
  EXPECT_EQ(field("Restarts"), "0") << "the job must not have been requeued";
  EXPECT_NE(out.find("the restart budget is spent (0 restarts), so the job ends here. Resubmit it to go on "
                     "from " +
                     file("ck") + "/step_00000011"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace bt
