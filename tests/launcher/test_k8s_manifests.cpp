// `blutrain k8s render`: the manifests of a job spec, read back with yaml-cpp
// (ranks and rendezvous, volumes, restart policy, labels, the embedded
// config, the MPIJob's v2beta1 fields), its errors, the committed k8s/ folder
// kept equal to what k8s/example-job.yaml renders, and every manifest
// validated against the Kubernetes API schemas by node
// (tests/launcher/k8s_validate/validate.mjs; skipped without node and npm
// unless BT_REQUIRE_DATA=1).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include "launcher/config.h"
#include "launcher/jobspec.h"
#include "launcher/k8s_manifests.h"
#include "tests/support/error_message.h"
#include "tests/support/fetched_data.h"
#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace bt::launcher {

int run_k8s(int argc, char** argv);  // launcher/k8s.cpp

namespace {

namespace fs = std::filesystem;

const std::string kSrc = test::source_dir();

/// A 2-node, 2-GPU job (4 ranks) on the embedded tiny config.
const char* kSpec = R"(name: tiny-k8s
image: registry.example/blutrain:1.0
nodes: 2
gpus_per_node: 2
set: [train.micro_batch=2]
checkpoint_dir: /ckpt/tiny
time_limit: "01:30:00"
max_restarts: 5
env: {NCCL_IB_DISABLE: "1"}
k8s:
  namespace: research
  storage_class: fast-rwx
  shm_size: 2Gi
  cpu: "4"
  memory: 16Gi
  port: 29600
  labels: {team: llm}
)";

/// Documents of a stream, by kind.
std::map<std::string, YAML::Node> by_kind(const std::string& text) {
  std::map<std::string, YAML::Node> docs;
  for (const YAML::Node& d : YAML::LoadAll(text)) docs[d["kind"].as<std::string>()] = d;
  return docs;
}

/// The entry of a list of {name: ...} mappings called `name`.
YAML::Node named(const YAML::Node& list, const std::string& name) {
  for (const YAML::Node& e : list)
    if (e["name"].as<std::string>() == name) return e;
  ADD_FAILURE() << "no entry named " << name << " in\n" << YAML::Dump(list);
  return YAML::Node();
}

std::string value_of(const YAML::Node& env, const std::string& name) {
  return named(env, name)["value"].as<std::string>("");
}

/// Runs run_k8s with these arguments (as after `blutrain`).
int k8s_cli(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return run_k8s(static_cast<int>(argv.size()), argv.data());
}

class K8sRender : public ::testing::Test {
 protected:
  std::string spec_file(const std::string& text) {
    const std::string p = dir_.file("spec" + std::to_string(n_++) + ".yaml");
    std::ofstream(p) << text;
    return p;
  }
  std::string render(K8sMode mode, const std::string& text = kSpec) {
    return render_k8s(load_job_spec(spec_file(text)), mode);
  }
  std::string error_of(const std::string& text, const std::string& mode = "indexed") {
    const std::string p = spec_file(text);
    return test::error_message([&] {
      k8s_cli({"k8s", "render", p, "--mode", mode, "-o", dir_.file("out.yaml")});
    });
  }
  test::TempDir dir_{"bt_k8s"};
  int n_ = 0;
};

TEST_F(K8sRender, EveryObjectIsNamespacedAndLabelled) {
  for (K8sMode mode : {K8sMode::indexed, K8sMode::mpijob}) {
    const std::vector<YAML::Node> docs = YAML::LoadAll(render(mode));
    ASSERT_EQ(docs.size(), mode == K8sMode::indexed ? 5u : 3u);
    for (const YAML::Node& d : docs) {
      SCOPED_TRACE(d["kind"].as<std::string>());
      EXPECT_EQ(d["metadata"]["namespace"].as<std::string>(), "research");
      EXPECT_EQ(d["metadata"]["labels"]["app.kubernetes.io/name"].as<std::string>(), "blutrain");
      EXPECT_EQ(d["metadata"]["labels"]["app.kubernetes.io/instance"].as<std::string>(), "tiny-k8s");
      EXPECT_EQ(d["metadata"]["labels"]["team"].as<std::string>(), "llm");
    }
  }
}

TEST_F(K8sRender, IndexedJobGivesEveryRankItsRendezvous) {
  auto docs = by_kind(render(K8sMode::indexed));
  const YAML::Node job = docs["Job"], svc = docs["Service"];
  EXPECT_EQ(job["apiVersion"].as<std::string>(), "batch/v1");
  EXPECT_EQ(job["spec"]["completionMode"].as<std::string>(), "Indexed");
  EXPECT_EQ(job["spec"]["completions"].as<int>(), 4);
  EXPECT_EQ(job["spec"]["parallelism"].as<int>(), 4);
  const YAML::Node pod = job["spec"]["template"]["spec"];
  const YAML::Node c = pod["containers"][0];
  const YAML::Node env = c["env"];
  // RANK is the completion index Kubernetes gives each pod.
  EXPECT_EQ(named(env, "RANK")["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(),
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(value_of(env, "WORLD_SIZE"), "4");
  EXPECT_EQ(value_of(env, "LOCAL_RANK"), "0");
  EXPECT_EQ(value_of(env, "LOCAL_WORLD_SIZE"), "1");
  EXPECT_EQ(value_of(env, "MASTER_ADDR"), "tiny-k8s-0.tiny-k8s");
  EXPECT_EQ(value_of(env, "MASTER_PORT"), "29600");
  EXPECT_EQ(value_of(env, "NCCL_IB_DISABLE"), "1");
  EXPECT_EQ(value_of(env, "HDF5_USE_FILE_LOCKING"), "FALSE");
  EXPECT_EQ(value_of(env, "BT_NUM_THREADS"), "4");
  // Strings that read as numbers or booleans are quoted (Note [K8s scalars]).
  EXPECT_EQ(named(env, "WORLD_SIZE")["value"].Tag(), "!");
  EXPECT_EQ(named(env, "HDF5_USE_FILE_LOCKING")["value"].Tag(), "!");
  // MASTER_ADDR is pod 0 under the headless Service the pods are a subdomain of.
  EXPECT_EQ(svc["spec"]["clusterIP"].as<std::string>(), "None");
  EXPECT_TRUE(svc["spec"]["publishNotReadyAddresses"].as<bool>());
  EXPECT_EQ(pod["subdomain"].as<std::string>(), svc["metadata"]["name"].as<std::string>());
  EXPECT_EQ(svc["spec"]["ports"][0]["port"].as<int>(), 29600);
  for (const auto& kv : svc["spec"]["selector"])
    EXPECT_EQ(job["spec"]["template"]["metadata"]["labels"][kv.first.as<std::string>()].as<std::string>(""),
              kv.second.as<std::string>());
  EXPECT_EQ(c["image"].as<std::string>(), "registry.example/blutrain:1.0");
  EXPECT_EQ(c["command"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"blutrain", "train", "--config", "/etc/blutrain/config.yaml"}));
}

// Note [Authenticated rendezvous]: an Indexed Job's ranks read the job token
// from a Secret of its own, never from the pod spec; every render makes a new
// 64-hex-digit token; -o writes the file for its owner only; an MPIJob, whose
// ranks mpirun starts, has no TCP rendezvous and no token.
TEST_F(K8sRender, IndexedJobRanksReadANewJobTokenFromASecret) {
  auto docs = by_kind(render(K8sMode::indexed));
  const YAML::Node secret = docs["Secret"];
  EXPECT_EQ(secret["metadata"]["name"].as<std::string>(), "tiny-k8s-token");
  EXPECT_EQ(secret["type"].as<std::string>(), "Opaque");
  const std::string token = secret["stringData"]["token"].as<std::string>();
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
  const YAML::Node env = docs["Job"]["spec"]["template"]["spec"]["containers"][0]["env"];
  const YAML::Node ref = named(env, "BT_JOB_TOKEN")["valueFrom"]["secretKeyRef"];
  EXPECT_EQ(ref["name"].as<std::string>(), "tiny-k8s-token");
  EXPECT_EQ(ref["key"].as<std::string>(), "token");
  EXPECT_FALSE(named(env, "BT_JOB_TOKEN")["value"].IsDefined()) << "the token is not in the pod spec";
  EXPECT_EQ(YAML::Dump(docs["Job"]).find(token), std::string::npos);
  EXPECT_NE(by_kind(render(K8sMode::indexed))["Secret"]["stringData"]["token"].as<std::string>(), token)
      << "each render, a new job";
  EXPECT_EQ(by_kind(render(K8sMode::mpijob)).count("Secret"), 0u);
  const std::string p = spec_file(kSpec), out = dir_.file("private.yaml");
  ASSERT_EQ(k8s_cli({"k8s", "render", p, "--mode", "indexed", "-o", out}), 0);
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(K8sRender, IndexedJobPodHasOneGpuShmAndTheVolumes) {
  auto docs = by_kind(render(K8sMode::indexed));
  const YAML::Node pod = docs["Job"]["spec"]["template"]["spec"];
  const YAML::Node c = pod["containers"][0];
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<std::string>(), "1");
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"].as<std::string>(), "1");
  EXPECT_EQ(c["resources"]["requests"]["cpu"].as<std::string>(), "4");
  EXPECT_EQ(c["resources"]["limits"]["memory"].as<std::string>(), "16Gi");
  const YAML::Node shm = named(pod["volumes"], "shm");
  EXPECT_EQ(shm["emptyDir"]["medium"].as<std::string>(), "Memory");
  EXPECT_EQ(shm["emptyDir"]["sizeLimit"].as<std::string>(), "2Gi");
  EXPECT_EQ(named(c["volumeMounts"], "shm")["mountPath"].as<std::string>(), "/dev/shm");
  EXPECT_EQ(named(c["volumeMounts"], "checkpoints")["mountPath"].as<std::string>(), "/ckpt");
  EXPECT_EQ(named(pod["volumes"], "checkpoints")["persistentVolumeClaim"]["claimName"].as<std::string>(),
            "tiny-k8s-ckpt");
  EXPECT_EQ(named(pod["volumes"], "config")["configMap"]["name"].as<std::string>(), "tiny-k8s-train-config");
  EXPECT_EQ(pod["securityContext"]["runAsUser"].as<int>(), 1000);
  EXPECT_EQ(pod["securityContext"]["fsGroup"].as<int>(), 1000);
  EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>());
  const YAML::Node pvc = docs["PersistentVolumeClaim"];
  EXPECT_EQ(pvc["metadata"]["name"].as<std::string>(), "tiny-k8s-ckpt");
  EXPECT_EQ(pvc["spec"]["accessModes"][0].as<std::string>(), "ReadWriteMany");
  EXPECT_EQ(pvc["spec"]["storageClassName"].as<std::string>(), "fast-rwx");
  EXPECT_EQ(pvc["spec"]["resources"]["requests"]["storage"].as<std::string>(), "100Gi");
}

TEST_F(K8sRender, IndexedJobFailsAsAWholeAndRetriesStops) {
  // Note [K8s restarts]: exit 75 and disruptions are replaced for free; any
  // other failure fails the Job; backoffLimit is max_restarts.
  auto docs = by_kind(render(K8sMode::indexed));
  const YAML::Node spec = docs["Job"]["spec"];
  EXPECT_EQ(spec["backoffLimit"].as<int>(), 5);
  EXPECT_EQ(spec["activeDeadlineSeconds"].as<int>(), 5400);
  EXPECT_EQ(spec["template"]["spec"]["restartPolicy"].as<std::string>(), "Never");
  EXPECT_GE(spec["template"]["spec"]["terminationGracePeriodSeconds"].as<int>(), 60);
  const YAML::Node rules = spec["podFailurePolicy"]["rules"];
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[0]["action"].as<std::string>(), "Ignore");
  EXPECT_EQ(rules[0]["onPodConditions"][0]["type"].as<std::string>(), "DisruptionTarget");
  EXPECT_EQ(rules[1]["action"].as<std::string>(), "Ignore");
  EXPECT_EQ(rules[1]["onExitCodes"]["operator"].as<std::string>(), "In");
  EXPECT_EQ(rules[1]["onExitCodes"]["values"].as<std::vector<int>>(), std::vector<int>{75});
  EXPECT_EQ(rules[2]["action"].as<std::string>(), "FailJob");
  EXPECT_EQ(rules[2]["onExitCodes"]["operator"].as<std::string>(), "NotIn");
  EXPECT_EQ(rules[2]["onExitCodes"]["values"].as<std::vector<int>>(), std::vector<int>{75});
  for (const YAML::Node& r : rules) {
    if (r["onExitCodes"]) {
      EXPECT_EQ(r["onExitCodes"]["containerName"].as<std::string>(), "trainer");
    }
  }
}

TEST_F(K8sRender, ConfigMapHoldsTheResolvedTrainingConfig) {
  const JobSpec s = load_job_spec(spec_file(kSpec));
  auto docs = by_kind(render_k8s(s, K8sMode::indexed));
  const std::string embedded = docs["ConfigMap"]["data"]["config.yaml"].as<std::string>();
  EXPECT_EQ(embedded, config_to_yaml(s.train));
  const std::string p = dir_.file("config.yaml");
  std::ofstream(p) << embedded;
  const train::TrainConfig back = load_train_config(p, {}, static_cast<int>(s.world()));
  EXPECT_EQ(config_to_yaml(back), embedded);
  EXPECT_EQ(back.checkpoint.dir, "/ckpt/tiny");
  EXPECT_EQ(back.train.resume, "auto");
}

// A Llama job: the model's family and its keys travel in the ConfigMap.
TEST_F(K8sRender, ALlamaJobsConfigMapReadsBackWithItsFamily) {
  const std::string cfg = dir_.file("llama.yaml");
  std::ofstream(cfg) << "model:\n  preset: llama-150m\n  n_kv_head: 2\n  rope_theta: 500000\n"
                        "data:\n  train: /data/fineweb_train_*.bin\n"
                        "train:\n  batch_size: 64\n  micro_batch: 16\n";
  const JobSpec s = load_job_spec(spec_file(std::string(kSpec) + "config: " + cfg + "\n"));
  EXPECT_EQ(s.train.model.arch, "llama");
  auto docs = by_kind(render_k8s(s, K8sMode::indexed));
  const std::string p = dir_.file("embedded.yaml");
  std::ofstream(p) << docs["ConfigMap"]["data"]["config.yaml"].as<std::string>();
  const train::TrainConfig back = load_train_config(p, {}, static_cast<int>(s.world()));
  EXPECT_EQ(back.model.arch, "llama");
  EXPECT_EQ(back.model.n_kv_head, 2);
  EXPECT_EQ(back.model.rope_theta, 500000.0);
  EXPECT_EQ(back.model.n_layer, 12);
  EXPECT_EQ(config_to_yaml(back), config_to_yaml(s.train));
}

TEST_F(K8sRender, ExistingClaimReplacesThePvc) {
  auto docs = by_kind(render(K8sMode::indexed, std::string(kSpec) + "  existing_claim: shared-ckpt\n"));
  EXPECT_FALSE(docs.count("PersistentVolumeClaim"));
  const YAML::Node pod = docs["Job"]["spec"]["template"]["spec"];
  EXPECT_EQ(named(pod["volumes"], "checkpoints")["persistentVolumeClaim"]["claimName"].as<std::string>(),
            "shared-ckpt");
}

// Field names from kubeflow/mpi-operator, pkg/apis/kubeflow/v2beta1/types.go:
// MPIJob{Spec MPIJobSpec `spec`}; MPIJobSpec{SlotsPerWorker `slotsPerWorker`,
// RunPolicy `runPolicy`, MPIReplicaSpecs map[MPIReplicaType]*ReplicaSpec
// `mpiReplicaSpecs` (keys MPIReplicaTypeLauncher "Launcher",
// MPIReplicaTypeWorker "Worker"), SSHAuthMountPath `sshAuthMountPath`,
// LauncherCreationPolicy `launcherCreationPolicy`, MPIImplementation
// `mpiImplementation` ("OpenMPI")}; RunPolicy{CleanPodPolicy `cleanPodPolicy`,
// ActiveDeadlineSeconds `activeDeadlineSeconds`, BackoffLimit `backoffLimit`};
// ReplicaSpec{Replicas `replicas`, Template v1.PodTemplateSpec `template`,
// RestartPolicy `restartPolicy`}.
TEST_F(K8sRender, MpiJobFollowsTheV2beta1Types) {
  auto docs = by_kind(render(K8sMode::mpijob));
  EXPECT_FALSE(docs.count("Job"));
  EXPECT_FALSE(docs.count("Service"));  // the operator creates NAME, NAME-config and NAME-ssh itself
  EXPECT_EQ(docs["ConfigMap"]["metadata"]["name"].as<std::string>(), "tiny-k8s-train-config");
  const YAML::Node m = docs["MPIJob"];
  EXPECT_EQ(m["apiVersion"].as<std::string>(), "kubeflow.org/v2beta1");
  const YAML::Node spec = m["spec"];
  EXPECT_EQ(spec["slotsPerWorker"].as<int>(), 2);
  EXPECT_EQ(spec["runPolicy"]["backoffLimit"].as<int>(), 5);
  EXPECT_EQ(spec["runPolicy"]["activeDeadlineSeconds"].as<int>(), 5400);
  EXPECT_EQ(spec["runPolicy"]["cleanPodPolicy"].as<std::string>(), "Running");
  EXPECT_EQ(spec["sshAuthMountPath"].as<std::string>(), "/home/bt/.ssh");
  EXPECT_EQ(spec["mpiImplementation"].as<std::string>(), "OpenMPI");
  EXPECT_EQ(spec["launcherCreationPolicy"].as<std::string>(), "WaitForWorkersReady");
  ASSERT_EQ(spec["mpiReplicaSpecs"].size(), 2u);
  const YAML::Node launcher = spec["mpiReplicaSpecs"]["Launcher"], worker = spec["mpiReplicaSpecs"]["Worker"];
  EXPECT_EQ(launcher["replicas"].as<int>(), 1);
  EXPECT_EQ(launcher["restartPolicy"].as<std::string>(), "OnFailure");
  EXPECT_EQ(worker["replicas"].as<int>(), 2);
  const std::vector<std::string> cmd =
      launcher["template"]["spec"]["containers"][0]["command"].as<std::vector<std::string>>();
  ASSERT_GE(cmd.size(), 3u);
  EXPECT_EQ(cmd[0], "mpirun");
  EXPECT_EQ(cmd[1], "-np");
  EXPECT_EQ(cmd[2], "4");
  auto has = [&](const std::string& a) { return std::find(cmd.begin(), cmd.end(), a) != cmd.end(); };
  EXPECT_TRUE(has("NCCL_IB_DISABLE=1"));
  EXPECT_TRUE(has("HDF5_USE_FILE_LOCKING=FALSE"));
  EXPECT_TRUE(has("BT_NUM_THREADS=2"));  // 4 CPUs over 2 ranks per worker
  EXPECT_EQ(std::vector<std::string>(cmd.end() - 4, cmd.end()),
            (std::vector<std::string>{"blutrain", "train", "--config", "/etc/blutrain/config.yaml"}));
  const YAML::Node w = worker["template"]["spec"];
  EXPECT_EQ(w["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].as<std::string>(), "2");
  EXPECT_EQ(named(w["volumes"], "shm")["emptyDir"]["sizeLimit"].as<std::string>(), "2Gi");
  EXPECT_EQ(named(w["containers"][0]["volumeMounts"], "checkpoints")["mountPath"].as<std::string>(), "/ckpt");
  EXPECT_EQ(named(w["volumes"], "config")["configMap"]["name"].as<std::string>(), "tiny-k8s-train-config");
}

/// kSpec with its first `from` replaced by `to`.
std::string spec_with(const std::string& from, const std::string& to) {
  std::string s = kSpec;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

TEST_F(K8sRender, ErrorsNameTheKey) {
  const std::string outside = error_of(spec_with("/ckpt/tiny", "/data/tiny"));
  EXPECT_NE(outside.find("'checkpoint_dir' in job spec"), std::string::npos) << outside;
  EXPECT_NE(outside.find("must be under 'k8s.mount' (/ckpt)"), std::string::npos) << outside;
  const std::string unknown = error_of(std::string(kSpec) + "  nmespace: x\n");
  EXPECT_NE(unknown.find("unknown key 'k8s.nmespace'"), std::string::npos) << unknown;
  const std::string name = error_of(spec_with("name: tiny-k8s", "name: Tiny_K8s"));
  EXPECT_NE(name.find("'name' in job spec"), std::string::npos) << name;
  const std::string qty = error_of(spec_with("memory: 16Gi", "memory: 16GB"));
  EXPECT_NE(qty.find("'k8s.memory' in job spec"), std::string::npos) << qty;
  const std::string image = error_of(spec_with("image: registry.example/blutrain:1.0\n", ""));
  EXPECT_NE(image.find("'image' in job spec"), std::string::npos) << image;
  const std::string rank = error_of(spec_with("env: {", "env: {RANK: \"3\", "));
  EXPECT_NE(rank.find("'env' in job spec"), std::string::npos) << rank;
  EXPECT_NE(rank.find("must not set RANK"), std::string::npos) << rank;
  const std::string mode = error_of(kSpec, "all");
  EXPECT_NE(mode.find("--mode must be indexed"), std::string::npos) << mode;
}

TEST_F(K8sRender, CliWritesTheStream) {
  const std::string spec = spec_file(kSpec), out = dir_.file("m.yaml");
  EXPECT_EQ(k8s_cli({"k8s", "render", spec, "--mode", "mpijob", "-o", out}), 0);
  EXPECT_EQ(test::read_file(out), render(K8sMode::mpijob));
  EXPECT_EQ(k8s_cli({"k8s", "--help"}), 0);
  EXPECT_EQ(k8s_cli({"k8s"}), 2);
}

/// Expects `a` and `b` to be the same YAML tree (mapping order aside),
/// naming the path where they differ.
void expect_same_tree(const YAML::Node& a, const YAML::Node& b, const std::string& path) {
  ASSERT_EQ(a.Type(), b.Type()) << path;
  if (a.IsScalar()) {
    EXPECT_EQ(a.Scalar(), b.Scalar()) << path;
  } else if (a.IsSequence()) {
    ASSERT_EQ(a.size(), b.size()) << path;
    for (size_t i = 0; i < a.size(); ++i) expect_same_tree(a[i], b[i], path + "/" + std::to_string(i));
  } else if (a.IsMap()) {
    ASSERT_EQ(a.size(), b.size()) << path << "\n" << YAML::Dump(a) << "\nvs\n" << YAML::Dump(b);
    for (const auto& kv : a)
      expect_same_tree(kv.second, b[kv.first.Scalar()], path + "/" + kv.first.Scalar());
  }
}

YAML::Node without_namespace(YAML::Node doc) {
  YAML::Node d = YAML::Clone(doc);
  d["metadata"].remove("namespace");
  return d;
}

TEST(K8sFolder, BaseAndOverlaysAreWhatTheExampleRenders) {
  // k8s/base and the MPIJob overlay are `blutrain k8s render k8s/example-job.yaml`
  // split into files, without namespaces (kustomize or kubectl -n sets them).
  const JobSpec s = load_job_spec(kSrc + "/k8s/example-job.yaml");
  auto indexed = by_kind(render_k8s(s, K8sMode::indexed));
  auto mpi = by_kind(render_k8s(s, K8sMode::mpijob));
  EXPECT_EQ(test::read_file(kSrc + "/k8s/base/config.yaml"),
            indexed["ConfigMap"]["data"]["config.yaml"].as<std::string>());
  const std::map<std::string, YAML::Node> files = {{"base/pvc.yaml", indexed["PersistentVolumeClaim"]},
                                                   {"base/service.yaml", indexed["Service"]},
                                                   {"base/job.yaml", indexed["Job"]},
                                                   {"overlays/mpijob/mpijob.yaml", mpi["MPIJob"]}};
  for (const auto& [file, doc] : files) {
    SCOPED_TRACE(file);
    expect_same_tree(YAML::LoadFile(kSrc + "/k8s/" + file), without_namespace(doc), "");
  }
  // The kustomizations name files that exist, and the base's ConfigMap keeps its rendered name.
  for (const char* k : {"base", "overlays/indexed", "overlays/mpijob"}) {
    const YAML::Node kz = YAML::LoadFile(kSrc + "/k8s/" + k + "/kustomization.yaml");
    for (const char* list : {"resources", "patches"})
      for (const YAML::Node& e : kz[list]) {
        const std::string f = e.IsScalar() ? e.Scalar() : e["path"].as<std::string>("");
        if (!f.empty()) {
          EXPECT_TRUE(fs::exists(kSrc + "/k8s/" + k + "/" + f)) << k << ": " << f;
        }
      }
  }
  const YAML::Node base = YAML::LoadFile(kSrc + "/k8s/base/kustomization.yaml");
  EXPECT_EQ(base["configMapGenerator"][0]["name"].as<std::string>(), k8s_config_map_name(s));
}

// ------------------------------------------------------------ schemas (node)

/// The node project of tests/launcher/k8s_validate, installed by `npm ci`
/// into a folder beside this test named by a hash of its package files
/// (reused while they are unchanged); "" with `why` set if npm failed.
std::string node_project(std::string& why) {
  const fs::path src = kSrc + "/tests/launcher/k8s_validate";
  const std::string lock = test::read_file((src / "package.json").string()) +
                           test::read_file((src / "package-lock.json").string());
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : lock) h = (h ^ ch) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  const fs::path dir = fs::read_symlink("/proc/self/exe").parent_path() / "k8s_validate_npm" / hex;
  if (!fs::exists(dir / "node_modules" / ".package-lock.json")) {
    const fs::path tmp = dir.string() + ".tmp" + std::to_string(::getpid());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    for (const char* f : {"package.json", "package-lock.json"}) fs::copy_file(src / f, tmp / f);
    const test::CommandResult r = test::run_command("cd " + test::shell_quote(tmp.string()) +
                                                    " && npm ci --no-audit --no-fund --loglevel=error");
    if (r.status != 0) {
      fs::remove_all(tmp);
      why = "npm ci failed (no network to the npm registry?): " + r.out;
      return "";
    }
    std::error_code ec;
    fs::rename(tmp, dir, ec);  // another test process may have won: use its folder
    if (ec) fs::remove_all(tmp);
  }
  // The script sits beside its node_modules (ESM resolves imports from the script's folder).
  const fs::path script = dir / ("validate.mjs.tmp" + std::to_string(::getpid()));
  fs::copy_file(src / "validate.mjs", script, fs::copy_options::overwrite_existing);
  fs::rename(script, dir / "validate.mjs");
  return dir.string();
}

class K8sSchemas : public ::testing::Test {
 protected:
  void SetUp() override {
    BT_NEED(test::node_available() && std::system("npm --version >/dev/null 2>&1") == 0,
            "node and npm are not installed; install them (scripts/install-deps) to validate the manifests");
    std::string why;
    project_ = node_project(why);
    BT_NEED(!project_.empty(), why);
  }
  test::CommandResult validate(const std::vector<std::string>& files, bool partial = false) {
    std::string cmd = "node " + test::shell_quote(project_ + "/validate.mjs") + (partial ? " --partial" : "");
    for (const std::string& f : files) cmd += " " + test::shell_quote(f);
    return test::run_command(cmd);
  }
  test::TempDir dir_{"bt_k8s_schemas"};
  std::string project_;
};

TEST_F(K8sSchemas, RenderedManifestsAndTheK8sFolderAreValid) {
  std::vector<std::string> files;
  std::ofstream(dir_.file("tiny.yaml")) << kSpec;
  for (const char* mode : {"indexed", "mpijob"}) {
    for (const std::string& spec : {kSrc + "/k8s/example-job.yaml", dir_.file("tiny.yaml")}) {
      files.push_back(dir_.file(std::string(mode) + std::to_string(files.size()) + ".yaml"));
      ASSERT_EQ(k8s_cli({"k8s", "render", spec, "--mode", mode, "-o", files.back()}), 0);
    }
  }
  for (const char* f : {"base/pvc.yaml", "base/service.yaml", "base/job.yaml", "overlays/mpijob/mpijob.yaml"})
    files.push_back(kSrc + "/k8s/" + f);
  const test::CommandResult r = validate(files);
  EXPECT_EQ(r.status, 0) << r.out;
  std::vector<std::string> patches;
  for (const fs::path& overlay :
       {fs::path(kSrc + "/k8s/overlays/indexed"), fs::path(kSrc + "/k8s/overlays/mpijob")})
    for (const auto& e : fs::directory_iterator(overlay))
      if (e.path().filename().string().rfind("patch-", 0) == 0) patches.push_back(e.path().string());
  ASSERT_FALSE(patches.empty());
  const test::CommandResult p = validate(patches, true);
  EXPECT_EQ(p.status, 0) << p.out;
}

TEST_F(K8sSchemas, AnInvalidManifestFailsNamingObjectAndField) {
  const std::string f = dir_.file("bad.yaml");
  std::ofstream(f) << "apiVersion: batch/v1\nkind: Job\nmetadata: {name: broken}\nspec:\n"
                      "  backoffLimit: \"three\"\n  podFailurPolicy: {}\n"
                      "  template:\n    spec:\n      restartPolicy: Never\n"
                      "      containers: [{name: c, image: i, env: [{name: X, value: 1}]}]\n";
  const test::CommandResult r = validate({f});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("Job broken"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/spec/backoffLimit: must be integer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/spec/podFailurPolicy: unknown field"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/env/0/value: must be string"), std::string::npos) << r.out;
  const std::string m = dir_.file("bad_mpi.yaml");
  std::ofstream(m)
      << "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nmetadata: {name: m}\nspec:\n"
         "  slotPerWorker: 2\n  mpiReplicaSpecs:\n    Worker:\n      replicas: 1\n"
         "      template: {spec: {containers: [{name: w, image: i, ports: [{containerPort: x}]}]}}\n";
  const test::CommandResult rm = validate({m});
  EXPECT_EQ(rm.status, 1) << rm.out;
  EXPECT_NE(rm.out.find("/spec/slotPerWorker: unknown field"), std::string::npos) << rm.out;
  EXPECT_NE(rm.out.find("/spec/mpiReplicaSpecs/Worker/template/spec/containers/0/ports/0/containerPort"),
            std::string::npos)
      << rm.out;
}

}  // namespace
}  // namespace bt::launcher
