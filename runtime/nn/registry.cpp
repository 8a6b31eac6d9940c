#include "runtime/nn/registry.h"

#include "kernels/common/error.h"
#include "runtime/nn/gpt2/gpt.h"
#include "runtime/nn/llama/llama.h"

namespace bt::nn {

const std::vector<const Family*>& families() {
  // One line per family (docs/ARCHITECTURE.md, "Adding a model family").
  static const std::vector<const Family*> all = {&gpt2_family(), &llama_family()};
  return all;
}

const Family& family(const std::string& arch) {
  std::string names;
  for (const Family* f : families()) {
    if (f->arch == arch) return *f;
    names += (names.empty() ? "" : ", ") + f->arch;
  }
  BT_FAIL("model.arch: unknown architecture '", arch, "'; choose one of: ", names);
}

std::unique_ptr<Model> make_model(const ModelConfig& c, const Device& device, uint64_t seed) {
  c.validate();
  return family(c.arch).make(c, device, seed);
}

ModelConfig model_preset(const std::string& name) {
  for (const Family* f : families())
    for (const auto& [n, c] : f->presets)
      if (n == name) return c;
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  BT_FAIL("model.preset: unknown preset '", name, "'; choose one of: ", names);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const Family* f : families())
    for (const auto& p : f->presets) out.push_back(p.first);
  return out;
}

}  // namespace bt::nn
