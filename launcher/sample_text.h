// Text sampling shared by `blutrain train` (the final sample) and `blutrain sample`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/bpe.h"
#include "runtime/nn/model.h"

namespace bt::launcher {

/// What a sample starts from: the tokenizer and the encoded prompt. Made
/// before any work that the sample ends (training), so that a missing
/// tokenizer or a prompt the model cannot read fails first.
struct SamplePrompt {
  Gpt2Tokenizer tokenizer;
  std::string text;          // the prompt as given
  std::vector<int32_t> ids;  // an end-of-text token (as documents start in the shards), then the prompt
};

/// Loads the GPT-2 tokenizer in `tokenizer_dir` and encodes `prompt` for a
/// model of `vocab` tokens. A missing tokenizer is a bt::Error that says how
/// to fetch it; so is a prompt with a token outside the vocabulary.
SamplePrompt prepare_sample(const std::string& tokenizer_dir, const std::string& prompt, int64_t vocab);

/// Samples `tokens` new tokens after the prompt and prints prompt + continuation.
void print_sample(const nn::Model& model, const SamplePrompt& p, int64_t tokens, double temperature,
                  int64_t top_k, uint64_t seed);

}  // namespace bt::launcher
