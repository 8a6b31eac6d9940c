// The model families, by model.arch. A family is a folder under runtime/nn/
// (gpt2/, llama/) that defines an nn::Model and a Family describing it, and
// one line in registry.cpp's table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/model.h"
#include "runtime/nn/model_config.h"

namespace bt::nn {

struct Family {
  std::string arch;
  /// Named configs ("tiny", "gpt2-124m"); each sets arch.
  std::vector<std::pair<std::string, ModelConfig>> presets;
  /// The family's checks (the common ones have run); names the keys.
  void (*validate)(const ModelConfig& c, const std::string& where) = nullptr;
  int64_t (*num_params)(const ModelConfig& c) = nullptr;
  double (*flops_per_token)(const ModelConfig& c, int64_t T) = nullptr;
  /// A model with fresh parameters drawn from `seed` (c validated).
  std::unique_ptr<Model> (*make)(const ModelConfig& c, const Device& device, uint64_t seed) = nullptr;
};

/// Every family, in registry order.
const std::vector<const Family*>& families();
/// The family of `arch`; throws bt::Error naming model.arch and the choices.
const Family& family(const std::string& arch);
/// Validates `c` and builds its family's model.
std::unique_ptr<Model> make_model(const ModelConfig& c, const Device& device, uint64_t seed);
/// The preset `name` of any family; throws bt::Error listing the names.
ModelConfig model_preset(const std::string& name);
/// Every preset name, families in registry order.
std::vector<std::string> model_preset_names();

}  // namespace bt::nn
