#include "launcher/sample_text.h"

#include <cstdio>

#include "kernels/common/error.h"
#include "runtime/data/bpe.h"
#include "runtime/nn/generate.h"

namespace bt::launcher {

void print_sample(const nn::Gpt& model, const std::string& tokenizer_dir, const std::string& prompt,
                  int64_t tokens, double temperature, int64_t top_k, uint64_t seed) {
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(tokenizer_dir);
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> ids;
  if (tok.eot() < vocab) ids.push_back(tok.eot());
  for (int32_t id : tok.encode(prompt)) {
    BT_CHECK(id < vocab, "the prompt '", prompt, "' encodes to token ", id,
             ", outside this model's vocabulary of ", vocab, " tokens; use another prompt");
    ids.push_back(id);
  }
  BT_CHECK(!ids.empty(),
           "the prompt is empty and this model's vocabulary has no end-of-text token; give --prompt");
  const std::vector<int32_t> out = nn::generate(model, ids, {tokens, temperature, top_k, seed});
  std::printf("---- sample (%lld tokens, temperature %.2f, top-k %lld) ----\n%s%s\n----\n",
              static_cast<long long>(tokens), temperature, static_cast<long long>(top_k), prompt.c_str(),
              tok.decode(out).c_str());
  std::fflush(stdout);
}

}  // namespace bt::launcher
