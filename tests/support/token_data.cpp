#include "tests/support/token_data.h"

#include <cstdio>
#include <random>
#include <vector>

#include "runtime/data/shard.h"

namespace bt::test {

std::string write_token_shards(const std::string& dir, const std::string& prefix, int shards,
                               int64_t tokens_per_shard, int32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed), phrase_rng(vocab);  // the phrase depends on the vocabulary only
  std::vector<uint16_t> phrase(37);
  for (auto& t : phrase) t = static_cast<uint16_t>(phrase_rng() % vocab);
  for (int s = 0; s < shards; ++s) {
    std::vector<uint16_t> tokens(static_cast<size_t>(tokens_per_shard));
    for (size_t i = 0; i < tokens.size(); ++i)  // 1 in 8 tokens is noise
      tokens[i] = rng() % 8 == 0 ? static_cast<uint16_t>(rng() % vocab) : phrase[i % phrase.size()];
    char name[64];
    std::snprintf(name, sizeof name, "_%06d.bin", s);
    write_shard(dir + "/" + prefix + name, tokens);
  }
  return dir + "/" + prefix + "_*.bin";
}

}  // namespace bt::test
