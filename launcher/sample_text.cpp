#include "launcher/sample_text.h"

#include <cstdio>

#include "kernels/common/error.h"
#include "runtime/nn/generate.h"

namespace bt::launcher {

SamplePrompt prepare_sample(const std::string& tokenizer_dir, const std::string& prompt, int64_t vocab) {
  SamplePrompt p{Gpt2Tokenizer::load(tokenizer_dir), prompt, {}};
  if (p.tokenizer.eot() < vocab) p.ids.push_back(p.tokenizer.eot());
  for (int32_t id : p.tokenizer.encode(prompt)) {
    BT_CHECK(id < vocab, "the prompt '", prompt, "' encodes to token ", id,
             ", outside this model's vocabulary of ", vocab, " tokens; use another prompt");
    p.ids.push_back(id);
  }
  BT_CHECK(!p.ids.empty(),
           "the prompt is empty and this model's vocabulary has no end-of-text token; give a prompt");
  return p;
}

void print_sample(const nn::Model& model, const SamplePrompt& p, int64_t tokens, double temperature,
                  int64_t top_k, uint64_t seed) {
  const std::vector<int32_t> out = nn::generate(model, p.ids, {tokens, temperature, top_k, seed});
  std::printf("---- sample (%lld tokens, temperature %.2f, top-k %lld) ----\n%s%s\n----\n",
              static_cast<long long>(tokens), temperature, static_cast<long long>(top_k), p.text.c_str(),
              p.tokenizer.decode(out).c_str());
  std::fflush(stdout);
}

}  // namespace bt::launcher
