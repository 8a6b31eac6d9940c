// Job specs (launcher/jobspec.h) and the sbatch script rendered from them
// (launcher/slurm_script.h): what the script asks Slurm for, what it runs,
// and every way a spec can be wrong, each named by its key. The script's
// behaviour on a real cluster is tested in test_requeue_slurm.cpp.
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "launcher/config.h"
#include "launcher/jobspec.h"
#include "launcher/slurm_script.h"
#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace bt::launcher {
namespace {

class SlurmScript : public ::testing::Test {
 protected:
  /// Writes `text` as a job spec; returns its path.
  std::string spec(const std::string& text, const std::string& name = "job.yaml") {
    std::ofstream(dir_.file(name)) << text;
    return dir_.file(name);
  }
  /// The message load_job_spec throws for `text` ("" when it loads).
  std::string error_of(const std::string& text) {
    try {
      load_job_spec(spec(text));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static constexpr const char* kGpuJob =
      "name: gpt2-124m\nimage: registry.example.com/blutrain:1.0\nnodes: 2\ngpus_per_node: 8\n"
      "config: gpt2.yaml\nset: [train.steps=1000]\ncheckpoint_dir: /lustre/ckpt/gpt2\ncheckpoint_every: 100\n"
      "time_limit: 1-12:00:00\nmax_restarts: 5\nenv: {NCCL_DEBUG: INFO, NCCL_IB_HCA: mlx5}\n"
      "slurm:\n  partition: gpu\n  account: ml\n  qos: high\n  cpus_per_task: 12\n"
      "  container_mounts: [/lustre/data:/data]\n  sbatch: [--exclusive]\n";

  void SetUp() override {
    std::ofstream(dir_.file("gpt2.yaml"))
        << "model:\n  preset: gpt2-124m\ndata:\n  train: /data/fineweb_train_*.bin\n"
           "train:\n  batch_size: 512\n  micro_batch: 16\n  precision: bf16\n"
           "dist:\n  strategy: zero2\n";
  }
  test::TempDir dir_{"bt_slurm_script"};
};

TEST_F(SlurmScript, AGpuJobAsksSlurmForWhatTheSpecSays) {
  const JobSpec s = load_job_spec(spec(kGpuJob));
  EXPECT_EQ(s.world(), 16);
  EXPECT_EQ(s.time_limit_s, 36 * 3600);
  const std::string text = render_sbatch(s);
  for (const char* line :
       {"#SBATCH --job-name=gpt2-124m\n", "#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=8\n",
        "#SBATCH --gpus-per-node=8\n", "#SBATCH --cpus-per-task=12\n", "#SBATCH --time=1-12:00:00\n",
        "#SBATCH --partition=gpu\n", "#SBATCH --account=ml\n", "#SBATCH --qos=high\n",
        "#SBATCH --exclusive\n", "#SBATCH --requeue\n", "#SBATCH --signal=B:USR1@300\n", "MAX_RESTARTS=5\n",
        "CKPT_DIR=/lustre/ckpt/gpt2\n",
        // HDF5's default stays; the spec's NCCL_DEBUG wins over the default WARN.
        "export HDF5_USE_FILE_LOCKING=FALSE\n", "export NCCL_DEBUG=INFO\n", "export NCCL_IB_HCA=mlx5\n",
        "srun --mpi=pmix --kill-on-bad-exit=1 --container-image=registry.example.com/blutrain:1.0 "
        "--container-mounts=/lustre/ckpt/gpt2:/lustre/ckpt/gpt2,/lustre/data:/data --no-container-mount-home "
        "blutrain train --config \"$CONFIG\" &\n",
        "if [[ \"$latest\" == step_00001000 ]]; then\n"})
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "\nin:\n" << text;
  EXPECT_EQ(text.find("export NCCL_DEBUG=WARN"), std::string::npos);
  EXPECT_EQ(text.find("{{"), std::string::npos) << "a placeholder was left:\n" << text;

  // bash accepts it.
  std::ofstream(dir_.file("job.sbatch")) << text;
  const test::CommandResult r = test::run_command("bash -n " + dir_.file("job.sbatch"));
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST_F(SlurmScript, TheEmbeddedConfigReadsBackToTheResolvedOne) {
  const JobSpec s = load_job_spec(spec(kGpuJob));
  EXPECT_EQ(s.train.train.steps, 1000);
  EXPECT_EQ(s.train.train.resume, "auto");
  EXPECT_EQ(s.train.checkpoint.dir, "/lustre/ckpt/gpt2");
  EXPECT_EQ(s.train.checkpoint.every, 100);
  const std::string text = render_sbatch(s);
  const size_t begin = text.find("<<'BT_CONFIG_EOF'\n") + 18, end = text.find("BT_CONFIG_EOF\n", begin);
  ASSERT_LT(begin, end);
  std::ofstream(dir_.file("embedded.yaml")) << text.substr(begin, end - begin);
  const train::TrainConfig back = load_train_config(dir_.file("embedded.yaml"), {}, 16);
  EXPECT_EQ(config_to_yaml(back), config_to_yaml(s.train));
  EXPECT_EQ(config_to_json(back, 16), config_to_json(s.train, 16));
}

// A Llama job: the model's family and its keys travel in the embedded config.
TEST_F(SlurmScript, ALlamaJobsConfigReadsBackWithItsFamily) {
  std::ofstream(dir_.file("llama.yaml"))
      << "model:\n  preset: llama-150m\n  n_kv_head: 2\n  rope_theta: 500000\n"
         "data:\n  train: /data/fineweb_train_*.bin\n"
         "train:\n  batch_size: 512\n  micro_batch: 16\n";
  std::string job = kGpuJob;
  job.replace(job.find("config: gpt2.yaml"), 17, "config: llama.yaml");
  const JobSpec s = load_job_spec(spec(job));
  EXPECT_EQ(s.train.model.arch, "llama");
  const std::string text = render_sbatch(s);
  const size_t begin = text.find("<<'BT_CONFIG_EOF'\n") + 18, end = text.find("BT_CONFIG_EOF\n", begin);
  ASSERT_LT(begin, end);
  std::ofstream(dir_.file("embedded.yaml")) << text.substr(begin, end - begin);
  const train::TrainConfig back = load_train_config(dir_.file("embedded.yaml"), {}, 16);
  EXPECT_EQ(back.model.arch, "llama");
  EXPECT_EQ(back.model.n_kv_head, 2);
  EXPECT_EQ(back.model.rope_theta, 500000.0);
  EXPECT_EQ(config_to_json(back, 16), config_to_json(s.train, 16));
}

TEST_F(SlurmScript, ACpuJobUnderMpirunPassesItsEnvironmentToEveryRank) {
  const JobSpec s = load_job_spec(
      spec("name: tiny\nnodes: 1\nranks_per_node: 2\nexecutable: /opt/bt/blutrain\ncheckpoint_dir: /tmp/ck\n"
           "set: [train.batch_size=8, train.micro_batch=4]\nenv: {OMPI_MCA_btl: 'self,vader'}\n"
           "slurm: {launcher: mpirun}\n"));
  EXPECT_EQ(s.train.train.device, "cpu") << "a job without GPUs must not pick one up by `auto`";
  const std::string text = render_sbatch(s);
  EXPECT_NE(text.find("mpirun -np \"$SLURM_NTASKS\" --bind-to none -x HDF5_USE_FILE_LOCKING -x NCCL_DEBUG -x "
                      "OMPI_MCA_btl -x BT_NUM_THREADS /opt/bt/blutrain train --config \"$CONFIG\" &\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("--gpus-per-node"), std::string::npos);
  EXPECT_EQ(text.find("--time="), std::string::npos);
  EXPECT_NE(text.find("export OMPI_MCA_btl=self,vader\n"), std::string::npos);
}

TEST_F(SlurmScript, ValuesAreQuotedForTheShell) {
  EXPECT_EQ(shell_quote("plain/path-1.0"), "plain/path-1.0");
  EXPECT_EQ(shell_quote("two words"), "'two words'");
  EXPECT_EQ(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
  EXPECT_EQ(shell_quote(""), "''");
}

TEST_F(SlurmScript, TimeLimitsInSlurmsFormats) {
  EXPECT_EQ(parse_time_limit("90", "t"), 90 * 60);
  EXPECT_EQ(parse_time_limit("10:30", "t"), 10 * 60 + 30);
  EXPECT_EQ(parse_time_limit("04:00:00", "t"), 4 * 3600);
  EXPECT_EQ(parse_time_limit("2-00", "t"), 2 * 86400);
  EXPECT_EQ(parse_time_limit("1-02:03:04", "t"), 86400 + 2 * 3600 + 3 * 60 + 4);
  // More days than fit (libFuzzer: 999999999999999 days overflowed int64;
  // 20 digits threw std::out_of_range) are refused like the others.
  for (const char* bad :
       {"", "abc", "1:2:3:4", "-5", "0", "1-", "12:xx", "999999999999999-1", "99999999999999999999-1"})
    EXPECT_THROW(parse_time_limit(bad, "t"), Error) << bad;
}

TEST_F(SlurmScript, EveryMistakeInASpecIsNamed) {
  const std::string ok = "name: j\nnodes: 1\ncheckpoint_dir: /ck\n";
  ASSERT_EQ(error_of(ok), "");
  struct Case {
    std::string text, want;
  };
  const Case cases[] = {
      {ok + "gpus: 8\n", "unknown key 'gpus' in job spec"},
      {ok + "slurm: {partiton: gpu}\n", "unknown key 'slurm.partiton'"},
      {"name: Big_Job\nnodes: 1\ncheckpoint_dir: /ck\n", "'name' in job spec"},
      {"name: j\nnodes: 1\ncheckpoint_dir: ck\n", "'checkpoint_dir' in job spec"},
      {"name: j\nnodes: 0\ncheckpoint_dir: /ck\n", "'nodes' in job spec"},
      {"name: j\nnodes: two\ncheckpoint_dir: /ck\n", "'nodes' in job spec '"},
      {ok + "time_limit: soon\n", "'time_limit' in job spec"},
      {ok + "time_limit: '10'\nslurm: {signal_s: 900}\n", "'slurm.signal_s' in job spec"},
      {ok + "image: x\nslurm: {launcher: mpirun}\n", "must be srun when the job runs in a container"},
      {ok + "slurm: {launcher: ssh}\n", "'slurm.launcher' in job spec"},
      {ok + "env: {BAD-NAME: 1}\n", "'BAD-NAME' is not a variable name"},
      {ok + "set: [train.batch_size=7, train.micro_batch=2]\nranks_per_node: 2\n",
       "its training config does not hold for 2 rank(s): train.batch_size (7) cannot be split over 2 ranks"},
      {ok + "config: missing.yaml\n", "missing.yaml' does not exist"},
      {ok + "gpus_per_node: 1\nset: [train.device=cpu]\n", "'gpus_per_node' in job spec"},
      {"- a list\n", "must be a YAML mapping"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(c.text);
    EXPECT_NE(e.find(c.want), std::string::npos) << "spec:\n" << c.text << "error: " << e;
    if (c.want.find("does not exist") == std::string::npos) {
      EXPECT_NE(e.find(dir_.file("job.yaml")), std::string::npos) << "the error names the file: " << e;
    }
  }
  try {
    load_job_spec(dir_.file("nope.yaml"));
    ADD_FAILURE() << "a missing spec loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.yaml' does not exist"), std::string::npos) << e.what();
  }
}

// Note [Batch split]: the job's rank count picks the micro-batch when the
// spec is rendered, and says so; a batch the ranks cannot share fails there.
TEST_F(SlurmScript, TheBatchSplitIsChosenAtRenderTime) {
  const std::string exe = test::blutrain_exe();
  const std::string fits = spec(
      "name: j\nnodes: 1\nranks_per_node: 4\ncheckpoint_dir: /ck\n"
      "set: [train.batch_size=8, train.micro_batch=8]\n");
  EXPECT_EQ(load_job_spec(fits).train.micro_batch_for(4), 2);
  test::CommandResult r = test::run_command(exe + " slurm render " + fits + " -o " + dir_.file("a.sbatch"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("note: train.micro_batch 8 does not split train.batch_size 8 over 4 ranks: running "
                       "micro-batches of 2"),
            std::string::npos)
      << r.out;
  const std::string no_split = spec(
      "name: j\nnodes: 1\nranks_per_node: 3\ncheckpoint_dir: /ck\nset: [train.batch_size=8]\n", "b.yaml");
  r = test::run_command(exe + " slurm render " + no_split);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("train.batch_size (8) cannot be split over 3 ranks"), std::string::npos) << r.out;
  r = test::run_command(exe + " k8s render " + no_split);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("train.batch_size (8) cannot be split over 3 ranks"), std::string::npos) << r.out;
}

TEST_F(SlurmScript, TheCommandRendersAndRefusesBadUsage) {
  const std::string exe = test::blutrain_exe();
  const std::string path = spec(kGpuJob);
  test::CommandResult r = test::run_command(exe + " slurm render " + path + " -o " + dir_.file("out.sbatch"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(test::read_file(dir_.file("out.sbatch")), render_sbatch(load_job_spec(path)));
  r = test::run_command(exe + " slurm launch " + path);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("usage: blutrain slurm render|submit JOBSPEC"), std::string::npos) << r.out;
  r = test::run_command(exe + " slurm submit " + path + " --script " + dir_.file("s.sbatch") +
                        " --sbatch /nonexistent/sbatch");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("sbatch refused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is Slurm installed here?"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace bt::launcher
