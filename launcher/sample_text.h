// Text sampling shared by `blutrain train` (the final sample) and `blutrain sample`.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/nn/gpt.h"

namespace bt::launcher {

/// Encodes `prompt` with the GPT-2 tokenizer in `tokenizer_dir` (after an
/// end-of-text token, as documents start in the shards), samples `tokens` new
/// tokens and prints prompt + continuation. A missing tokenizer is a bt::Error
/// that says how to fetch it.
void print_sample(const nn::Gpt& model, const std::string& tokenizer_dir, const std::string& prompt,
                  int64_t tokens, double temperature, int64_t top_k, uint64_t seed);

}  // namespace bt::launcher
