// Weights files (checkpoint/weights.h) with the model's shape attributes
// (nn::Model::shape_attrs) and its config as JSON (the `model` attribute), so
// a file alone rebuilds its model (`blutrain sample`).
#pragma once

#include <memory>
#include <string>

#include "runtime/nn/model.h"

namespace bt::launcher {

/// Saves the parameters of `m` with its shape attributes and config.
void save_model(const std::string& path, const nn::Model& m);
/// Loads `path` into `m`; throws bt::Error naming the path and the
/// architecture, first attribute or tensor that does not match m.
void load_model_into(const std::string& path, nn::Model& m);
/// Builds the model the file describes on `device` and loads its weights.
/// Files without a `model` attribute (before model.arch) are GPT-2, their
/// shape read from the integer attributes.
std::unique_ptr<nn::Model> load_model(const std::string& path, const Device& device);

}  // namespace bt::launcher
