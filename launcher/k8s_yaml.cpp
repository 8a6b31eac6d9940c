#include "launcher/k8s_yaml.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace bt::launcher {
namespace {

// Note [K8s scalars]: a YAML::Node forgets how a scalar was written, so the
// number 8 and the string "8" emit alike, and Kubernetes rejects an env value
// or a label that arrives as a number. Numbers and booleans are built with
// k8s_int() and k8s_bool(), which tag them; every other scalar is a string, quoted
// when its plain form could read as something else.

const std::string kIntTag = "tag:yaml.org,2002:int";
const std::string kBoolTag = "tag:yaml.org,2002:bool";

/// Whether a YAML 1.1 reader (Kubernetes' is one) could take `s` unquoted for
/// a number, a boolean or null: numbers, times and octals start with a digit,
/// a sign or a dot.
bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  const unsigned char c0 = static_cast<unsigned char>(s[0]);
  if (std::isdigit(c0) || c0 == '.' ||
      ((c0 == '+' || c0 == '-') && s.size() > 1 &&
       (std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.')))
    return true;
  std::string low = s;
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* w : {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"})
    if (low == w) return true;
  return false;
}

void emit(YAML::Emitter& out, const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& kv : n) {
        out << YAML::Key << kv.first.Scalar() << YAML::Value;
        emit(out, kv.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const YAML::Node& e : n) emit(out, e);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      if (n.Tag() == kIntTag || n.Tag() == kBoolTag)
        out << n.Scalar();
      else if (n.Scalar().find('\n') != std::string::npos)
        out << YAML::Literal << n.Scalar();
      else if (needs_quotes(n.Scalar()))
        out << YAML::DoubleQuoted << n.Scalar();
      else
        out << n.Scalar();
      break;
    default:
      out << YAML::Null;
  }
}

}  // namespace

YAML::Node k8s_int(int64_t v) {
  YAML::Node n(v);
  n.SetTag(kIntTag);
  return n;
}

YAML::Node k8s_bool(bool v) {
  YAML::Node n(v);
  n.SetTag(kBoolTag);
  return n;
}

void emit_k8s_document(YAML::Emitter& out, const YAML::Node& doc) {
  out << YAML::BeginDoc;
  emit(out, doc);
}

}  // namespace bt::launcher
