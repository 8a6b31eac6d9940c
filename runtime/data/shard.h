// llm.c token shards: a header of 256 little-endian int32 (magic 20240520,
// version 1, number of tokens, the rest zero) followed by that many uint16
// tokens. This is the on-disk format `blutrain tokenize` writes and
// TokenLoader reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bt {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

/// Writes `tokens` as an llm.c shard. The data goes to `path + ".tmp"`, which
/// is then renamed to `path`, so readers never see a half-written shard.
/// Throws bt::Error naming the path on any I/O failure.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);

/// A validated shard: where it is and how many tokens it holds.
struct ShardInfo {
  std::string path;
  int64_t num_tokens = 0;
};

/// Reads and validates a shard's header (existence, magic, version, and that
/// the file size matches the token count). Throws bt::Error naming the path.
ShardInfo read_shard_header(const std::string& path);

/// Reads all tokens of a shard validated by read_shard_header().
std::vector<uint16_t> read_shard_tokens(const ShardInfo& info);

/// The files matching a POSIX glob pattern, sorted. Throws bt::Error naming
/// the pattern when nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace bt
