// The Kubernetes manifests of a job spec, as one YAML stream: the training
// config in a ConfigMap, a PersistentVolumeClaim for the checkpoints, and the
// workload, either a Secret with a new job token (Note [Authenticated
// rendezvous] in runtime/dist/auth.cpp), a headless Service and an Indexed Job
// (one pod per rank, torchrun-style variables) or a Kubeflow MPIJob (one
// worker pod per node, started by mpirun, which needs no token). How each survives failures and preemption is
// Note [K8s restarts] in k8s_manifests.cpp; the user's side is k8s/README.md.
#pragma once

#include <string>

#include "launcher/jobspec.h"

namespace bt::launcher {

enum class K8sMode { indexed, mpijob };

/// "indexed" or "mpijob"; throws naming `what` otherwise.
K8sMode parse_k8s_mode(const std::string& text, const std::string& what);

/// What only Kubernetes needs of a spec that load_job_spec accepted: an image,
/// checkpoint_dir under k8s.mount, quantities Kubernetes can read, ... Errors
/// name the spec file and the key.
void check_k8s_spec(const JobSpec& s, K8sMode mode);

/// The manifests, "---"-separated, each object namespaced and labelled.
/// Checks the spec first (check_k8s_spec).
std::string render_k8s(const JobSpec& s, K8sMode mode);

/// Names of the rendered objects (the workload itself is named s.name).
std::string k8s_config_map_name(const JobSpec& s);    // NAME-train-config
std::string k8s_claim_name(const JobSpec& s);         // NAME-ckpt, or k8s.existing_claim
std::string k8s_token_secret_name(const JobSpec& s);  // NAME-token (Indexed Jobs: the job token)

}  // namespace bt::launcher
