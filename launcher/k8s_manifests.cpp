#include "launcher/k8s_manifests.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>

#include <yaml-cpp/yaml.h>

#include "kernels/common/error.h"
#include "launcher/config.h"
#include "launcher/k8s_yaml.h"
#include "launcher/stop_request.h"
#include "runtime/dist/auth.h"

namespace bt::launcher {
namespace {

// Note [K8s restarts]: a training job is a gang. Its ranks rendezvous once
// (rank 0 serves the TcpStore at MASTER_ADDR, runtime/dist/world.cpp) and a
// lone replacement pod cannot join a gang that is still running: it claims a
// RANK the old rank 0 already holds and fails. So no design here restarts one
// rank on its own.
//
// Indexed Job (restartPolicy Never, which podFailurePolicy requires):
//   - exit 75 (kExitStopped: after a SIGTERM, from an eviction, a preemption
//     or the Job's deletion, every rank agreed to stop, saved a checkpoint and
//     exited; Note [Stop requests]) and the DisruptionTarget condition
//     (preemption, eviction, node drain) are Ignore rules: pods replaced without
//     spending the restart budget, and since every rank stopped together the
//     replacements form a new gang and resume from `latest`.
//   - any other exit status of the trainer is a FailJob rule: the Job fails at
//     once and Kubernetes stops every pod (SIGTERM, then terminationGracePeriod
//     to save a checkpoint). Replacing only the failed pod would crash-loop
//     against the old gang's rendezvous, spend the budget and its exponential
//     back-off (up to 6 minutes a pod) and keep the other GPUs idle while the
//     survivors wait out their collective timeout. To resume after a crash,
//     re-create the Job (k8s/README.md); the ranks start from `latest`.
//   - backoffLimit = max_restarts: the budget of pod failures no rule decides
//     (a pod lost before its container ran, say).
// batch/v1 has no "restart every pod" action; a JobSet (failurePolicy.
// maxRestarts) or the MPIJob below is what restarts the gang automatically.
//
// MPIJob: the ranks are children of mpirun in the launcher pod, and mpirun
// stops every rank when one fails. The launcher (restartPolicy OnFailure) then
// exits non-zero and its container restarts, starting all ranks again from
// `latest`: runPolicy.backoffLimit = max_restarts counts exactly these gang
// restarts. The workers only run sshd (restartPolicy OnFailure restarts it).
// Kubernetes' SIGTERM reaches sshd and mpirun, not the ranks, so on a
// deletion or eviction the job resumes from its last periodic checkpoint.

constexpr const char* kConfigDir = "/etc/blutrain";  // the ConfigMap's mount
constexpr const char* kConfigKey = "config.yaml";
constexpr const char* kTokenKey = "token";        // the job token's key in its Secret
constexpr int64_t kUid = 1000;                    // the image's user `bt` (Dockerfile)
constexpr int64_t kGraceS = 300;                  // SIGTERM to SIGKILL: time to save a checkpoint
constexpr int64_t kSshPort = 2222;                // the workers' sshd runs unprivileged, so not 22
constexpr const char* kSshDir = "/home/bt/.ssh";  // where mpi-operator mounts the job's key
constexpr const char* kCompletionIndex = "metadata.annotations['batch.kubernetes.io/job-completion-index']";

// ---------------------------------------------------------------- checks

/// A Kubernetes quantity: 8, 0.5, 500m, 64Gi, 1e3.
void check_quantity(const JobSpec& s, const char* key, const std::string& v) {
  static const std::regex q(R"(^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$)");
  BT_CHECK(std::regex_match(v, q), "'k8s.", key, "' in job spec '", s.path,
           "' must be a Kubernetes quantity ",
           "like 8, 500m or 64Gi (binary suffixes end in i: Gi, not GB), got '", v, "'");
}

bool is_under(const std::string& path, const std::string& dir) {
  const std::string p = std::filesystem::path(path).lexically_normal().string();
  std::string d = std::filesystem::path(dir).lexically_normal().string();
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return p == d || (p.size() > d.size() && p.compare(0, d.size(), d) == 0 && p[d.size()] == '/');
}

// ---------------------------------------------------------------- pieces

const std::string kNameLabel = "app.kubernetes.io/name";
const std::string kInstanceLabel = "app.kubernetes.io/instance";
const std::string kComponentLabel = "app.kubernetes.io/component";

YAML::Node labels(const JobSpec& s) {
  YAML::Node l;
  for (const auto& [k, v] : s.k8s.labels) l[k] = v;
  l[kNameLabel] = "blutrain";
  l[kInstanceLabel] = s.name;
  return l;
}

YAML::Node object(const char* api_version, const char* kind, const JobSpec& s, const std::string& name) {
  YAML::Node o;
  o["apiVersion"] = api_version;
  o["kind"] = kind;
  o["metadata"]["name"] = name;
  o["metadata"]["namespace"] = s.k8s.namespace_;
  o["metadata"]["labels"] = labels(s);
  return o;
}

YAML::Node env_var(const std::string& name, const std::string& value) {
  YAML::Node e;
  e["name"] = name;
  e["value"] = value;
  return e;
}

/// Requests cpu and memory; memory and GPUs are also limits (a GPU request
/// must equal its limit, and a memory limit keeps one pod from starving its
/// node's others).
YAML::Node resources(const std::string& cpu, const std::string& memory, int64_t gpus) {
  YAML::Node r;
  r["requests"]["cpu"] = cpu;
  r["requests"]["memory"] = memory;
  r["limits"]["memory"] = memory;
  if (gpus > 0) {
    r["requests"]["nvidia.com/gpu"] = std::to_string(gpus);
    r["limits"]["nvidia.com/gpu"] = std::to_string(gpus);
  }
  return r;
}

YAML::Node volume_mount(const char* name, const std::string& path, bool read_only) {
  YAML::Node m;
  m["name"] = name;
  m["mountPath"] = path;
  if (read_only) m["readOnly"] = k8s_bool(true);
  return m;
}

/// The training config (read-only), the checkpoint volume and /dev/shm.
YAML::Node trainer_mounts(const JobSpec& s) {
  YAML::Node m;
  m.push_back(volume_mount("config", kConfigDir, true));
  m.push_back(volume_mount("checkpoints", s.k8s.mount, false));
  m.push_back(volume_mount("shm", "/dev/shm", false));
  return m;
}

YAML::Node trainer_volumes(const JobSpec& s) {
  YAML::Node config, ckpt, shm, v;
  config["name"] = "config";
  config["configMap"]["name"] = k8s_config_map_name(s);
  ckpt["name"] = "checkpoints";
  ckpt["persistentVolumeClaim"]["claimName"] = k8s_claim_name(s);
  // NCCL and the data loader's pinned buffers live in /dev/shm; a container's
  // own is 64 MiB.
  shm["name"] = "shm";
  shm["emptyDir"]["medium"] = "Memory";
  shm["emptyDir"]["sizeLimit"] = s.k8s.shm_size;
  v.push_back(config);
  v.push_back(ckpt);
  v.push_back(shm);
  return v;
}

YAML::Node container(const JobSpec& s, const char* name, const std::vector<std::string>& command) {
  YAML::Node c;
  c["name"] = name;
  c["image"] = s.image;
  c["imagePullPolicy"] = s.k8s.image_pull_policy;
  for (const std::string& a : command) c["command"].push_back(a);
  return c;
}

/// job_env(s), plus BT_NUM_THREADS = the CPUs each rank may use when
/// neither the spec nor job_env sets it: a pod's CPU request split over its
/// ranks (the runtime would otherwise start a thread per core of the node).
std::vector<std::pair<std::string, std::string>> rank_env_vars(const JobSpec& s, int64_t ranks_per_pod) {
  std::vector<std::pair<std::string, std::string>> env = job_env(s);
  const bool set =
      std::any_of(env.begin(), env.end(), [](const auto& e) { return e.first == "BT_NUM_THREADS"; });
  const std::string& cpu = s.k8s.cpu;
  if (!set && !cpu.empty() && cpu.size() <= 6 && std::all_of(cpu.begin(), cpu.end(), ::isdigit))
    env.emplace_back("BT_NUM_THREADS", std::to_string(std::max<int64_t>(1, std::stoll(cpu) / ranks_per_pod)));
  return env;
}

std::vector<std::string> train_command(const JobSpec& s) {
  return {s.executable, "train", "--config", std::string(kConfigDir) + "/" + kConfigKey};
}

/// A pod template: the job's labels plus `component`, the image's non-root
/// user (fsGroup makes the checkpoint volume writable to it), the service
/// account, and `containers`.
YAML::Node pod_template(const JobSpec& s, const char* component, const YAML::Node& containers) {
  YAML::Node t;
  t["metadata"]["labels"] = labels(s);
  t["metadata"]["labels"][kComponentLabel] = component;
  YAML::Node spec;
  if (!s.k8s.service_account.empty()) spec["serviceAccountName"] = s.k8s.service_account;
  spec["securityContext"]["runAsNonRoot"] = k8s_bool(true);
  spec["securityContext"]["runAsUser"] = k8s_int(kUid);
  spec["securityContext"]["runAsGroup"] = k8s_int(kUid);
  spec["securityContext"]["fsGroup"] = k8s_int(kUid);
  spec["containers"] = containers;
  t["spec"] = spec;
  return t;
}

// ---------------------------------------------------------------- objects

YAML::Node config_map(const JobSpec& s) {
  YAML::Node o = object("v1", "ConfigMap", s, k8s_config_map_name(s));
  o["data"][kConfigKey] = config_to_yaml(s.train);
  return o;
}

/// The job token of an Indexed Job's rendezvous (Note [Authenticated
/// rendezvous] in runtime/dist/auth.cpp): a new one at every render.
YAML::Node token_secret(const JobSpec& s) {
  YAML::Node o = object("v1", "Secret", s, k8s_token_secret_name(s));
  o["type"] = "Opaque";
  o["stringData"][kTokenKey] = dist::auth::new_token();
  return o;
}

YAML::Node checkpoint_claim(const JobSpec& s) {
  YAML::Node o = object("v1", "PersistentVolumeClaim", s, k8s_claim_name(s));
  o["spec"]["accessModes"].push_back("ReadWriteMany");  // every rank writes its own file
  if (!s.k8s.storage_class.empty()) o["spec"]["storageClassName"] = s.k8s.storage_class;
  o["spec"]["resources"]["requests"]["storage"] = s.k8s.pvc_size;
  return o;
}

/// Headless, so each rank pod gets a DNS name, NAME-INDEX.NAME; published
/// before the pods are ready, so rank 0's name resolves while it starts.
YAML::Node headless_service(const JobSpec& s) {
  YAML::Node o = object("v1", "Service", s, s.name);
  o["spec"]["clusterIP"] = "None";
  o["spec"]["publishNotReadyAddresses"] = k8s_bool(true);
  o["spec"]["selector"][kNameLabel] = "blutrain";
  o["spec"]["selector"][kInstanceLabel] = s.name;
  o["spec"]["selector"][kComponentLabel] = "rank";
  YAML::Node port;
  port["name"] = "rendezvous";
  port["port"] = k8s_int(s.k8s.port);
  port["targetPort"] = k8s_int(s.k8s.port);
  port["protocol"] = "TCP";
  o["spec"]["ports"].push_back(port);
  return o;
}

/// RANK is the pod's completion index; MASTER_ADDR is pod 0's name under the
/// headless Service, NAME-0.NAME, which the pod's DNS search path (first
/// entry NAMESPACE.svc.CLUSTER-DOMAIN) completes: right in any namespace the
/// objects land in and on any cluster domain.
YAML::Node rank_env(const JobSpec& s) {
  YAML::Node env, rank;
  rank["name"] = "RANK";
  rank["valueFrom"]["fieldRef"]["fieldPath"] = kCompletionIndex;
  env.push_back(rank);
  env.push_back(env_var("WORLD_SIZE", std::to_string(s.world())));
  env.push_back(env_var("LOCAL_RANK", "0"));  // one rank, and at most one GPU, per pod
  env.push_back(env_var("LOCAL_WORLD_SIZE", "1"));
  env.push_back(env_var("MASTER_ADDR", s.name + "-0." + s.name));
  env.push_back(env_var("MASTER_PORT", std::to_string(s.k8s.port)));
  YAML::Node token;  // Note [Authenticated rendezvous]: the job's Secret, never in the pod spec
  token["name"] = "BT_JOB_TOKEN";
  token["valueFrom"]["secretKeyRef"]["name"] = k8s_token_secret_name(s);
  token["valueFrom"]["secretKeyRef"]["key"] = kTokenKey;
  env.push_back(token);
  for (const auto& [k, v] : rank_env_vars(s, 1)) env.push_back(env_var(k, v));
  return env;
}

/// A podFailurePolicy rule on the trainer's exit status: `op` In or NotIn {75}.
YAML::Node exit_rule(const char* action, const char* op) {
  YAML::Node r;
  r["action"] = action;
  r["onExitCodes"]["containerName"] = "trainer";
  r["onExitCodes"]["operator"] = op;
  r["onExitCodes"]["values"].push_back(k8s_int(kExitStopped));
  return r;
}

/// Note [K8s restarts] says why these rules.
YAML::Node pod_failure_policy() {
  YAML::Node disrupted, cond, p;
  disrupted["action"] = "Ignore";
  cond["type"] = "DisruptionTarget";
  cond["status"] = "True";
  disrupted["onPodConditions"].push_back(cond);
  p["rules"].push_back(disrupted);
  p["rules"].push_back(exit_rule("Ignore", "In"));
  p["rules"].push_back(exit_rule("FailJob", "NotIn"));
  return p;
}

YAML::Node indexed_job(const JobSpec& s) {
  const int64_t gpus = s.gpus_per_node > 0 ? 1 : 0;
  YAML::Node c = container(s, "trainer", train_command(s));
  c["env"] = rank_env(s);
  YAML::Node port;
  port["name"] = "rendezvous";
  port["containerPort"] = k8s_int(s.k8s.port);
  c["ports"].push_back(port);
  c["resources"] = resources(s.k8s.cpu, s.k8s.memory, gpus);
  c["volumeMounts"] = trainer_mounts(s);
  YAML::Node containers;
  containers.push_back(c);

  YAML::Node o = object("batch/v1", "Job", s, s.name);
  YAML::Node spec;
  spec["completionMode"] = "Indexed";
  spec["completions"] = k8s_int(s.world());
  spec["parallelism"] = k8s_int(s.world());
  spec["backoffLimit"] = k8s_int(s.max_restarts);
  if (s.time_limit_s > 0) spec["activeDeadlineSeconds"] = k8s_int(s.time_limit_s);
  spec["podFailurePolicy"] = pod_failure_policy();
  YAML::Node t = pod_template(s, "rank", containers);
  t["spec"]["subdomain"] = s.name;  // the headless Service: NAME-INDEX.NAME resolves
  t["spec"]["restartPolicy"] = "Never";
  t["spec"]["terminationGracePeriodSeconds"] = k8s_int(kGraceS);
  t["spec"]["volumes"] = trainer_volumes(s);
  spec["template"] = t;
  o["spec"] = spec;
  return o;
}

/// mpirun on the launcher: one rank per slot of the operator's hostfile
/// (/etc/mpi/hostfile, slotsPerWorker slots per worker), over ssh to the
/// workers' unprivileged sshd, with the job's environment passed by -x.
std::vector<std::string> mpirun_command(const JobSpec& s) {
  std::vector<std::string> c = {"mpirun",
                                "-np",
                                std::to_string(s.world()),
                                "--bind-to",
                                "none",
                                "--mca",
                                "plm_rsh_args",
                                "-p " + std::to_string(kSshPort) + " -i " + kSshDir +
                                    "/id_rsa -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                    "-o LogLevel=ERROR -o ConnectionAttempts=10",
                                "-x",
                                "PATH",
                                "-x",
                                "LD_LIBRARY_PATH"};
  for (const auto& [k, v] : rank_env_vars(s, s.ranks())) {
    c.push_back("-x");
    c.push_back(k + "=" + v);
  }
  const std::vector<std::string> train = train_command(s);
  c.insert(c.end(), train.begin(), train.end());
  return c;
}

/// sshd as the image's user on kSshPort, with no config file but these
/// options: the operator's key (mounted at kSshDir) is both the host key and
/// the one authorized key.
std::vector<std::string> sshd_command() {
  const std::string dir = kSshDir;
  return {"/usr/sbin/sshd",
          "-D",
          "-e",
          "-f",
          "/dev/null",
          "-o",
          "Port=" + std::to_string(kSshPort),
          "-o",
          "PidFile=/tmp/sshd.pid",
          "-o",
          "HostKey=" + dir + "/id_rsa",
          "-o",
          "AuthorizedKeysFile=" + dir + "/authorized_keys",
          "-o",
          "StrictModes=no"};
}

/// One entry of mpiReplicaSpecs: ReplicaSpec{replicas, restartPolicy, template}.
YAML::Node replica_spec(int64_t replicas, const YAML::Node& pod) {
  YAML::Node r;
  r["replicas"] = k8s_int(replicas);
  r["restartPolicy"] = "OnFailure";
  r["template"] = pod;
  return r;
}

/// Field names from kubeflow/mpi-operator pkg/apis/kubeflow/v2beta1/types.go
/// (MPIJobSpec, RunPolicy, ReplicaSpec).
YAML::Node mpi_job(const JobSpec& s) {
  YAML::Node launcher = container(s, "launcher", mpirun_command(s));
  launcher["resources"] = resources("1", "2Gi", 0);  // mpirun only
  YAML::Node launchers;
  launchers.push_back(launcher);

  YAML::Node worker = container(s, "worker", sshd_command());
  YAML::Node ssh_port;
  ssh_port["name"] = "ssh";
  ssh_port["containerPort"] = k8s_int(kSshPort);
  worker["ports"].push_back(ssh_port);
  worker["resources"] = resources(s.k8s.cpu, s.k8s.memory, s.gpus_per_node);
  worker["volumeMounts"] = trainer_mounts(s);
  YAML::Node workers;
  workers.push_back(worker);
  YAML::Node worker_pod = pod_template(s, "worker", workers);
  worker_pod["spec"]["volumes"] = trainer_volumes(s);

  YAML::Node o = object("kubeflow.org/v2beta1", "MPIJob", s, s.name);
  YAML::Node spec;
  spec["slotsPerWorker"] = k8s_int(s.ranks());
  spec["runPolicy"]["cleanPodPolicy"] = "Running";
  spec["runPolicy"]["backoffLimit"] = k8s_int(s.max_restarts);
  if (s.time_limit_s > 0) spec["runPolicy"]["activeDeadlineSeconds"] = k8s_int(s.time_limit_s);
  spec["sshAuthMountPath"] = kSshDir;
  spec["launcherCreationPolicy"] = "WaitForWorkersReady";  // no ssh to a worker still pulling its image
  spec["mpiImplementation"] = "OpenMPI";
  spec["mpiReplicaSpecs"]["Launcher"] = replica_spec(1, pod_template(s, "launcher", launchers));
  spec["mpiReplicaSpecs"]["Worker"] = replica_spec(s.nodes, worker_pod);
  o["spec"] = spec;
  return o;
}

}  // namespace

K8sMode parse_k8s_mode(const std::string& text, const std::string& what) {
  if (text == "indexed") return K8sMode::indexed;
  if (text == "mpijob") return K8sMode::mpijob;
  BT_FAIL(what, " must be indexed (an Indexed Job, one pod per rank) or mpijob (a Kubeflow MPIJob), got '",
          text, "'");
}

std::string k8s_config_map_name(const JobSpec& s) {
  // Not NAME-config: mpi-operator creates that one (the hostfile) for an MPIJob.
  return s.name + "-train-config";
}

std::string k8s_token_secret_name(const JobSpec& s) { return s.name + "-token"; }

std::string k8s_claim_name(const JobSpec& s) {
  return s.k8s.existing_claim.empty() ? s.name + "-ckpt" : s.k8s.existing_claim;
}

void check_k8s_spec(const JobSpec& s, K8sMode mode) {
  const std::string in = "' in job spec '" + s.path + "'";
  BT_CHECK(!s.image.empty(), "'image", in,
           " must name the container image the pods run (built from the repository's Dockerfile)");
  BT_CHECK(is_under(s.checkpoint_dir, s.k8s.mount), "'checkpoint_dir", in, " (", s.checkpoint_dir,
           ") must be under 'k8s.mount' (", s.k8s.mount, "), where the checkpoint volume is mounted; use ",
           "checkpoint_dir: ", s.k8s.mount, "/", s.name, " or set k8s.mount");
  for (const char* reserved : {kConfigDir, "/dev/shm", kSshDir})
    BT_CHECK(!is_under(s.k8s.mount, reserved) && !is_under(reserved, s.k8s.mount), "'k8s.mount", in, " (",
             s.k8s.mount, ") must not overlap ", reserved, ", which the pods mount for themselves");
  static const std::regex dns_label("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$");
  BT_CHECK(std::regex_match(s.k8s.namespace_, dns_label), "'k8s.namespace", in,
           " must be a Kubernetes namespace name (a-z, 0-9 and '-'), got '", s.k8s.namespace_, "'");
  check_quantity(s, "pvc_size", s.k8s.pvc_size);
  check_quantity(s, "shm_size", s.k8s.shm_size);
  check_quantity(s, "cpu", s.k8s.cpu);
  check_quantity(s, "memory", s.k8s.memory);
  const std::string& pull = s.k8s.image_pull_policy;
  BT_CHECK(pull == "Always" || pull == "IfNotPresent" || pull == "Never", "'k8s.image_pull_policy", in,
           " must be Always, IfNotPresent or Never, got '", pull, "'");
  for (const std::string& k : {kNameLabel, kInstanceLabel, kComponentLabel})
    BT_CHECK(!s.k8s.labels.count(k), "'k8s.labels", in, " must not set ", k,
             ": blutrain sets it and the Service selects the pods by it");
  if (mode != K8sMode::indexed) return;
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    BT_CHECK(!s.env.count(v), "'env", in, " must not set ", v, ": every pod gets it from the Indexed Job");
}

std::string render_k8s(const JobSpec& s, K8sMode mode) {
  check_k8s_spec(s, mode);
  std::vector<YAML::Node> docs = {config_map(s)};
  if (s.k8s.existing_claim.empty()) docs.push_back(checkpoint_claim(s));
  if (mode == K8sMode::indexed) {
    docs.push_back(token_secret(s));
    docs.push_back(headless_service(s));
    docs.push_back(indexed_job(s));
  } else {
    docs.push_back(mpi_job(s));
  }
  YAML::Emitter out;
  for (const YAML::Node& d : docs) emit_k8s_document(out, d);
  return std::string(out.c_str()) + "\n";
}

}  // namespace bt::launcher
