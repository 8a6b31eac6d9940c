// The job spec: one small YAML file that says what to run on a cluster (the
// training config, its overrides), on what (nodes, GPUs, the container image)
// and how to survive there (checkpoint folder, time limit, restart budget),
// plus the fields only one scheduler reads. `blutrain slurm` turns it into an
// sbatch script and `blutrain k8s` into Kubernetes manifests; both embed the
// resolved training config, so what runs is what was checked at render time.
// The keys are documented in docs/jobspec.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/train/config.h"

namespace bt::launcher {

struct SlurmSpec {
  std::string partition, account, qos;
  std::string launcher = "srun";  // srun (--mpi=MPI, containers through pyxis) | mpirun
  std::string mpi = "pmix";       // srun --mpi=...
  int64_t signal_s = 300;         // USR1 this many seconds before the time limit: checkpoint, then requeue
  int64_t cpus_per_task = 0;      // 0: leave it to the cluster's default
  std::vector<std::string> container_mounts;  // SRC:DST for pyxis (the checkpoint folder is added)
  std::string output = "%x-%j.out";           // stdout and stderr of the batch script
  std::string workdir;                        // --chdir (empty: the folder sbatch runs from)
  std::vector<std::string> sbatch;            // extra #SBATCH lines, as "--key=value"
};

struct K8sSpec {
  std::string namespace_ = "default";
  std::string storage_class;               // empty: the cluster's default StorageClass
  std::string pvc_size = "100Gi";          // the checkpoint volume
  std::string existing_claim;              // use this PVC instead of creating one
  std::string shm_size = "8Gi";            // /dev/shm (NCCL and the data loader)
  std::string cpu = "8", memory = "64Gi";  // requests (and memory limit) per pod
  std::string mount = "/ckpt";             // where the checkpoint volume is mounted
  int64_t port = 29500;                    // MASTER_PORT of the rendezvous
  std::string image_pull_policy = "IfNotPresent";
  std::string service_account;
  std::map<std::string, std::string> labels;
};

struct JobSpec {
  std::string path;   // the spec file
  std::string name;   // DNS-1123 label: [a-z0-9-], at most 40 characters
  std::string image;  // container image (empty: Slurm runs `executable` on the nodes directly)
  std::string executable = "blutrain";
  int64_t nodes = 1;
  int64_t gpus_per_node = 0;     // 0: a CPU job
  int64_t ranks_per_node = 0;    // 0: gpus_per_node, or 1 for a CPU job
  std::string config;            // training config file as given (empty: the embedded default)
  std::vector<std::string> set;  // overrides, "section.key=value"
  std::string checkpoint_dir;    // as the ranks see it (a shared folder, or under k8s.mount)
  int64_t checkpoint_every = 0;  // 0: the training config's checkpoint.every
  std::string time_limit;        // "[D-]HH:MM:SS" or minutes (empty: no limit)
  int64_t time_limit_s = 0;
  int64_t max_restarts = 3;
  std::map<std::string, std::string> env;  // added to (and overriding) the defaults
  SlurmSpec slurm;
  K8sSpec k8s;

  train::TrainConfig train;  // the resolved training config, with the job's own keys applied
  int64_t world() const { return nodes * ranks(); }
  int64_t ranks() const {
    return ranks_per_node > 0 ? ranks_per_node : (gpus_per_node > 0 ? gpus_per_node : 1);
  }
};

/// Reads and checks a job spec; errors name the file and the key. The
/// training config is loaded (relative paths from the spec's folder) and
/// validated for the job's world size, with checkpoint.dir, checkpoint.every
/// and train.resume=auto applied.
JobSpec load_job_spec(const std::string& path);

/// Environment every rank gets, defaults first, then the spec's `env`
/// (NCCL and HDF5 defaults: see docs/jobspec.md).
std::vector<std::pair<std::string, std::string>> job_env(const JobSpec& s);

/// Seconds of "[D-]HH:MM:SS", "HH:MM", or plain minutes; throws naming `what`.
int64_t parse_time_limit(const std::string& text, const std::string& what);

}  // namespace bt::launcher
