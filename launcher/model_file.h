// GPT weights files (checkpoint/weights.h) with the model config as their
// attributes, so a file alone rebuilds its model (`blutrain sample`).
#pragma once

#include <memory>
#include <string>

#include "runtime/nn/gpt.h"

namespace bt::launcher {

/// Saves the parameters of `m` with its config (n_layer, n_head, n_embd,
/// seq_len, vocab_size, padded_vocab) as attributes.
void save_model(const std::string& path, const nn::Gpt& m);
/// Loads `path` into `m`; throws bt::Error naming the path and the first
/// attribute or tensor that does not match m's config.
void load_model_into(const std::string& path, nn::Gpt& m);
/// Builds the model the file describes on `device` and loads its weights.
std::unique_ptr<nn::Gpt> load_model(const std::string& path, const Device& device);

}  // namespace bt::launcher
