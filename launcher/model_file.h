// Weights files (checkpoint/weights.h) with the model's shape attributes
// (nn::Model::shape_attrs), so a file alone rebuilds its model (`blutrain
// sample`; GPT-2 only so far).
#pragma once

#include <memory>
#include <string>

#include "runtime/nn/gpt.h"

namespace bt::launcher {

/// Saves the parameters of `m` with its shape attributes.
void save_model(const std::string& path, const nn::Model& m);
/// Loads `path` into `m`; throws bt::Error naming the path and the first
/// attribute or tensor that does not match m's shape.
void load_model_into(const std::string& path, nn::Model& m);
/// Builds the model the file describes on `device` and loads its weights.
std::unique_ptr<nn::Gpt> load_model(const std::string& path, const Device& device);

}  // namespace bt::launcher
