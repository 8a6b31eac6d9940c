// Kubernetes manifests as YAML::Node trees, emitted so that Kubernetes reads
// every scalar as the type it was built with (Note [K8s scalars]).
#pragma once

#include <cstdint>

#include <yaml-cpp/yaml.h>

namespace bt::launcher {

/// A number, emitted plain (other scalars are strings).
YAML::Node k8s_int(int64_t v);
/// A boolean, emitted plain.
YAML::Node k8s_bool(bool v);

/// Appends `doc` to the stream `out` as one document ("---" first): numbers
/// and booleans from k8s_int / k8s_bool plain, multi-line strings as literal
/// blocks, and strings quoted when a YAML 1.1 reader would take them for
/// something else (8, 1.5, true, yes, null, "").
void emit_k8s_document(YAML::Emitter& out, const YAML::Node& doc);

}  // namespace bt::launcher
