#include "launcher/jobspec.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include <yaml-cpp/yaml.h>

#include "kernels/common/error.h"
#include "launcher/config.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;

/// Reads one mapping of the spec, so that every key is checked against the
/// known ones and every error names the file and the key.
class Reader {
 public:
  Reader(const YAML::Node& node, std::string file, std::string prefix)
      : node_(node), file_(std::move(file)), prefix_(std::move(prefix)) {}

  void str(const char* key, std::string& dst) {
    if (const auto got = get(key)) {
      const YAML::Node& n = *got;
      BT_CHECK(n.IsScalar(), where(key), " must be a single value");
      dst = n.Scalar();
    }
  }
  void integer(const char* key, int64_t& dst, int64_t lo, int64_t hi) {
    if (const auto got = get(key)) {
      const YAML::Node& n = *got;
      int64_t v = 0;
      BT_CHECK(n.IsScalar() && YAML::convert<int64_t>::decode(n, v), where(key), " must be an integer, got '",
               YAML::Dump(n), "'");
      BT_CHECK(v >= lo && v <= hi, where(key), " must be in [", lo, ", ", hi, "], got ", v);
      dst = v;
    }
  }
  void list(const char* key, std::vector<std::string>& dst) {
    if (const auto got = get(key)) {
      const YAML::Node& n = *got;
      BT_CHECK(n.IsSequence(), where(key), " must be a list");
      dst.clear();
      for (const YAML::Node& e : n) {
        BT_CHECK(e.IsScalar(), where(key), " must be a list of single values");
        dst.push_back(e.Scalar());
      }
    }
  }
  void map(const char* key, std::map<std::string, std::string>& dst) {
    if (const auto got = get(key)) {
      const YAML::Node& n = *got;
      BT_CHECK(n.IsMap(), where(key), " must be a mapping of NAME: value");
      for (const auto& kv : n) {
        BT_CHECK(kv.second.IsScalar(), where((std::string(key) + "." + kv.first.Scalar()).c_str()),
                 " must be a single value");
        dst[kv.first.Scalar()] = kv.second.Scalar();
      }
    }
  }
  /// A nested section, read by `f`.
  void section(const char* key, const std::function<void(Reader&)>& f) {
    if (const auto got = get(key)) {
      const YAML::Node& n = *got;
      BT_CHECK(n.IsMap(), where(key), " must be a mapping");
      Reader r(n, file_, prefix_ + key + ".");
      f(r);
      r.done();
    }
  }
  /// Every key of the mapping must have been read.
  void done() const {
    for (const auto& kv : node_) {
      const std::string k = kv.first.Scalar();
      if (!seen_.count(k))
        BT_FAIL("unknown key '", prefix_, k, "' in job spec '", file_, "'; docs/jobspec.md lists the keys (",
                known(), ")");
    }
  }
  std::string where(const char* key) const { return "'" + prefix_ + key + "' in job spec '" + file_ + "'"; }

 private:
  /// The value of `key`, or nothing when it is absent or null.
  std::optional<YAML::Node> get(const char* key) {
    seen_.insert(key);
    order_.push_back(key);
    const YAML::Node n = node_[key];
    if (!n.IsDefined() || n.IsNull()) return std::nullopt;
    return n;
  }
  std::string known() const {
    std::string s;
    for (const std::string& k : order_) s += (s.empty() ? "" : ", ") + k;
    return s;
  }

  YAML::Node node_;
  std::string file_, prefix_;
  std::set<std::string> seen_;
  std::vector<std::string> order_;
};

void check_name(const std::string& name, const std::string& where) {
  const bool ok = !name.empty() && name.size() <= 40 && std::isalpha(static_cast<unsigned char>(name[0])) &&
                  name.back() != '-' && std::all_of(name.begin(), name.end(), [](char ch) {
                    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
                  });
  BT_CHECK(ok, where,
           " must be 1-40 characters of a-z, 0-9 and '-', starting with a letter and not ending in '-' ",
           "(it names the Slurm job and the Kubernetes objects), got '", name, "'");
}

bool is_env_name(const std::string& s) {
  return !s.empty() && !std::isdigit(static_cast<unsigned char>(s[0])) &&
         std::all_of(s.begin(), s.end(),
                     [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
}

}  // namespace

int64_t parse_time_limit(const std::string& text, const std::string& what) {
  auto bad = [&]() -> int64_t {
    BT_FAIL(what, " must be a time limit like 04:00:00, 1-12:00:00 or 90 (minutes), got '", text, "'");
  };
  std::string rest = text;
  int64_t days = -1;
  if (const size_t dash = rest.find('-'); dash != std::string::npos) {
    const std::string d = rest.substr(0, dash);
    if (d.empty() || d.size() > 5 || !std::all_of(d.begin(), d.end(), ::isdigit)) return bad();
    days = std::stoll(d);
    rest = rest.substr(dash + 1);
  }
  std::vector<int64_t> parts;
  for (size_t start = 0;;) {
    const size_t colon = rest.find(':', start);
    const std::string p = rest.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (p.empty() || p.size() > 6 || !std::all_of(p.begin(), p.end(), ::isdigit)) return bad();
    parts.push_back(std::stoll(p));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() > 3) return bad();
  int64_t s = 0;
  if (days >= 0) {  // D-H, D-H:M, D-H:M:S
    s = days * 86400 + parts[0] * 3600 + (parts.size() > 1 ? parts[1] * 60 : 0) +
        (parts.size() > 2 ? parts[2] : 0);
  } else if (parts.size() == 1) {  // M
    s = parts[0] * 60;
  } else if (parts.size() == 2) {  // M:S
    s = parts[0] * 60 + parts[1];
  } else {  // H:M:S
    s = parts[0] * 3600 + parts[1] * 60 + parts[2];
  }
  if (s <= 0) return bad();
  return s;
}

JobSpec load_job_spec(const std::string& path) {
  BT_CHECK(fs::is_regular_file(path), "job spec '", path,
           "' does not exist; see docs/jobspec.md and the examples in slurm/ and k8s/");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    BT_FAIL("job spec '", path, "' is not valid YAML: ", e.what());
  }
  BT_CHECK(root.IsMap(), "job spec '", path, "' must be a YAML mapping (name:, nodes:, config:, ...)");
  JobSpec s;
  s.path = path;
  Reader r(root, path, "");
  r.str("name", s.name);
  r.str("image", s.image);
  r.str("executable", s.executable);
  r.integer("nodes", s.nodes, 1, 100000);
  r.integer("gpus_per_node", s.gpus_per_node, 0, 64);
  r.integer("ranks_per_node", s.ranks_per_node, 0, 1024);
  r.str("config", s.config);
  r.list("set", s.set);
  r.str("checkpoint_dir", s.checkpoint_dir);
  r.integer("checkpoint_every", s.checkpoint_every, 0, int64_t{1} << 40);
  r.str("time_limit", s.time_limit);
  r.integer("max_restarts", s.max_restarts, 0, 1000);
  r.map("env", s.env);
  r.section("slurm", [&](Reader& q) {
    q.str("partition", s.slurm.partition);
    q.str("account", s.slurm.account);
    q.str("qos", s.slurm.qos);
    q.str("launcher", s.slurm.launcher);
    q.str("mpi", s.slurm.mpi);
    q.integer("signal_s", s.slurm.signal_s, 10, 86400);
    q.integer("cpus_per_task", s.slurm.cpus_per_task, 0, 4096);
    q.list("container_mounts", s.slurm.container_mounts);
    q.str("output", s.slurm.output);
    q.str("workdir", s.slurm.workdir);
    q.list("sbatch", s.slurm.sbatch);
  });
  r.section("k8s", [&](Reader& q) {
    q.str("namespace", s.k8s.namespace_);
    q.str("storage_class", s.k8s.storage_class);
    q.str("pvc_size", s.k8s.pvc_size);
    q.str("existing_claim", s.k8s.existing_claim);
    q.str("shm_size", s.k8s.shm_size);
    q.str("cpu", s.k8s.cpu);
    q.str("memory", s.k8s.memory);
    q.str("mount", s.k8s.mount);
    q.integer("port", s.k8s.port, 1, 65535);
    q.str("image_pull_policy", s.k8s.image_pull_policy);
    q.str("service_account", s.k8s.service_account);
    q.map("labels", s.k8s.labels);
  });
  r.done();

  check_name(s.name, r.where("name"));
  BT_CHECK(!s.checkpoint_dir.empty() && s.checkpoint_dir[0] == '/', r.where("checkpoint_dir"),
           " must be an absolute path that every rank sees (a shared filesystem, or under k8s.mount), got '",
           s.checkpoint_dir, "'");
  BT_CHECK(s.slurm.launcher == "srun" || s.slurm.launcher == "mpirun", r.where("slurm.launcher"),
           " must be srun or mpirun, got '", s.slurm.launcher, "'");
  BT_CHECK(s.image.empty() || s.slurm.launcher == "srun", r.where("slurm.launcher"),
           " must be srun when the job runs in a container (pyxis starts containers through srun)");
  BT_CHECK(s.k8s.mount.size() > 1 && s.k8s.mount[0] == '/', r.where("k8s.mount"),
           " must be an absolute path, got '", s.k8s.mount, "'");
  for (const auto& [k, v] : s.env)
    BT_CHECK(is_env_name(k), r.where("env"), ": '", k, "' is not a variable name");
  if (!s.time_limit.empty()) s.time_limit_s = parse_time_limit(s.time_limit, r.where("time_limit"));
  if (s.time_limit_s > 0)
    BT_CHECK(s.slurm.signal_s < s.time_limit_s, r.where("slurm.signal_s"), " (", s.slurm.signal_s,
             " s) must be shorter than the time limit (", s.time_limit_s, " s)");

  // The training config: relative to the spec's folder; the job's own keys last.
  std::string cfg_path = s.config;
  if (!cfg_path.empty() && fs::path(cfg_path).is_relative())
    cfg_path = (fs::path(path).parent_path() / cfg_path).lexically_normal().string();
  std::vector<std::string> sets = s.set;
  sets.push_back("checkpoint.dir=" + s.checkpoint_dir);
  if (s.checkpoint_every > 0) sets.push_back("checkpoint.every=" + std::to_string(s.checkpoint_every));
  sets.push_back("train.resume=auto");
  try {
    s.train = load_train_config(cfg_path, sets, static_cast<int>(s.world()));
  } catch (const Error& e) {
    BT_FAIL("job spec '", path, "': its training config does not hold for ", s.world(),
            " rank(s): ", e.what());
  }
  if (s.gpus_per_node == 0) {
    BT_CHECK(s.train.train.device == "cpu" || s.train.train.device == "auto", r.where("gpus_per_node"),
             " is 0 (a CPU job) but the training config asks for train.device=", s.train.train.device);
    s.train.train.device = "cpu";  // "auto" would take a GPU the scheduler did not allocate
  } else {
    BT_CHECK(s.train.train.device != "cpu", r.where("gpus_per_node"), " is ", s.gpus_per_node,
             " but the training config sets train.device=cpu; drop one of them");
  }
  return s;
}

std::vector<std::pair<std::string, std::string>> job_env(const JobSpec& s) {
  std::vector<std::pair<std::string, std::string>> env = {
      // Checkpoints live on shared filesystems (NFS, Lustre) where HDF5's locks fail.
      {"HDF5_USE_FILE_LOCKING", "FALSE"},
      // NCCL prints its warnings (a failed transport, a timeout), not its chatter.
      {"NCCL_DEBUG", "WARN"},
  };
  for (const auto& kv : s.env) {  // (clang 14, which builds the fuzz targets, captures no structured binding)
    auto it = std::find_if(env.begin(), env.end(), [&](const auto& e) { return e.first == kv.first; });
    if (it != env.end())
      it->second = kv.second;
    else
      env.push_back(kv);
  }
  return env;
}

}  // namespace bt::launcher
