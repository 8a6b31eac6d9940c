// Synthetic token shards for training tests: a learnable stream (a noisy
// repetition of a fixed random phrase) so a short run's loss must fall.
#pragma once

#include <cstdint>
#include <string>

namespace bt::test {

/// The phrase depends only on `vocab`, so shards written with different seeds
/// (train and validation) share it and differ in their noise.
/// Writes `shards` llm.c shards of `tokens_per_shard` tokens with ids in
/// [0, vocab) to dir/prefix_000000.bin, ... and returns the glob matching them.
std::string write_token_shards(const std::string& dir, const std::string& prefix, int shards,
                               int64_t tokens_per_shard, int32_t vocab, uint64_t seed);

}  // namespace bt::test
