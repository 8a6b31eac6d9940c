#include "launcher/slurm_script.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "kernels/common/error.h"
#include "launcher/config.h"

namespace bt::launcher {

extern const char* const kSbatchTemplate;  // slurm/blutrain.sbatch.in (generated source)

namespace {

void replace_all(std::string& text, const std::string& key, const std::string& value) {
  const std::string needle = "{{" + key + "}}";
  for (size_t p = 0; (p = text.find(needle, p)) != std::string::npos; p += value.size())
    text.replace(p, needle.size(), value);
}

std::string slurm_time(int64_t s) {
  return fmt::format("{}-{:02}:{:02}:{:02}", s / 86400, s % 86400 / 3600, s % 3600 / 60, s % 60);
}

std::string sbatch_lines(const JobSpec& s) {
  std::vector<std::string> o = {"--job-name=" + s.name, fmt::format("--nodes={}", s.nodes),
                                fmt::format("--ntasks-per-node={}", s.ranks())};
  if (s.gpus_per_node > 0) o.push_back(fmt::format("--gpus-per-node={}", s.gpus_per_node));
  if (s.slurm.cpus_per_task > 0) o.push_back(fmt::format("--cpus-per-task={}", s.slurm.cpus_per_task));
  if (s.time_limit_s > 0) o.push_back("--time=" + slurm_time(s.time_limit_s));
  if (!s.slurm.partition.empty()) o.push_back("--partition=" + s.slurm.partition);
  if (!s.slurm.account.empty()) o.push_back("--account=" + s.slurm.account);
  if (!s.slurm.qos.empty()) o.push_back("--qos=" + s.slurm.qos);
  o.push_back("--output=" + s.slurm.output);
  if (!s.slurm.workdir.empty()) o.push_back("--chdir=" + s.slurm.workdir);
  for (const std::string& x : s.slurm.sbatch) {
    BT_CHECK(x.rfind("--", 0) == 0 && x.find('\n') == std::string::npos, "slurm.sbatch entry '", x,
             "' in job spec '", s.path, "' must be one long option such as --mail-type=END");
    o.push_back(x);
  }
  std::string text;
  for (const std::string& line : o) text += "#SBATCH " + line + "\n";
  text.pop_back();
  return text;
}

std::string launch_line(const JobSpec& s) {
  const std::string train = shell_quote(s.executable) + " train --config \"$CONFIG\"";
  if (s.slurm.launcher == "mpirun") {
    // Open MPI reads the allocation from Slurm; -x passes the environment to
    // ranks on other nodes. mpirun forwards USR1 to the ranks.
    std::string line = "mpirun -np \"$SLURM_NTASKS\" --bind-to none";
    for (const auto& [k, v] : job_env(s)) line += " -x " + k;
    return line + " -x BT_NUM_THREADS " + train;
  }
  std::string line = "srun --mpi=" + shell_quote(s.slurm.mpi) + " --kill-on-bad-exit=1";
  if (!s.image.empty()) {
    std::string mounts = s.checkpoint_dir + ":" + s.checkpoint_dir;
    for (const std::string& m : s.slurm.container_mounts) mounts += "," + m;
    line += " --container-image=" + shell_quote(s.image) + " --container-mounts=" + shell_quote(mounts) +
            " --no-container-mount-home";
  }
  return line + " " + train;
}

}  // namespace

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string("@%+=:,./_-").find(c) != std::string::npos;
  });
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string render_sbatch(const JobSpec& s) {
  std::string env;
  for (const auto& [k, v] : job_env(s)) env += "export " + k + "=" + shell_quote(v) + "\n";
  env.pop_back();
  const std::string config = config_to_yaml(s.train);
  BT_CHECK(config.find("\nBT_CONFIG_EOF") == std::string::npos, "the training config of job spec '", s.path,
           "' contains the line BT_CONFIG_EOF, which ends the script's here-document");
  std::string text = kSbatchTemplate;
  replace_all(text, "NAME", s.name);
  replace_all(text, "SPEC", s.path);
  replace_all(text, "SBATCH", sbatch_lines(s));
  replace_all(text, "SIGNAL_S", std::to_string(s.slurm.signal_s));
  replace_all(text, "MAX_RESTARTS", std::to_string(s.max_restarts));
  replace_all(text, "CHECKPOINT_DIR", shell_quote(s.checkpoint_dir));
  replace_all(text, "WORLD", std::to_string(s.world()));
  const train::TrainOptions& t = s.train.train;
  const int64_t last = t.stop_at_step > 0 ? std::min(t.stop_at_step, t.steps) : t.steps;
  replace_all(text, "LAST_CHECKPOINT", fmt::format("step_{:08}", last));
  replace_all(text, "ENV", env);
  replace_all(text, "LAUNCH", launch_line(s));
  replace_all(text, "CONFIG", config);  // last: the config is data, never scanned for placeholders
  return text;
}

}  // namespace bt::launcher
