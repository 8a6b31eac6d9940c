#include "runtime/data/shard.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>

#include <glob.h>

#include "kernels/common/error.h"

namespace bt {

// Tokens and header ints are copied as raw bytes; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

std::string errno_text() { return std::strerror(errno); }

int64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  BT_CHECK(!ec, "cannot read the size of token shard '", path, "': ", ec.message());
  return static_cast<int64_t>(size);
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  BT_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "cannot write token shard '", path, "': ", tokens.size(),
           " tokens do not fit the header's int32 count; split them into several shards");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp";
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    BT_CHECK(f, "cannot open '", tmp, "' for writing token shard '", path, "': ", errno_text());
    bool ok = std::fwrite(header, sizeof(header), 1, f.get()) == 1;
    if (ok && !tokens.empty())
      ok = std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f.get()) == tokens.size();
    ok = ok && std::fflush(f.get()) == 0;
    const int err = errno;
    const bool closed = std::fclose(f.release()) == 0;
    if (!ok || !closed) {
      std::remove(tmp.c_str());
      BT_FAIL("failed writing token shard '", path, "' (via '", tmp, "'): ", std::strerror(ok ? errno : err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    std::remove(tmp.c_str());
    BT_FAIL("cannot rename '", tmp, "' to token shard '", path, "': ", why);
  }
}

ShardInfo read_shard_header(const std::string& path) {
  std::error_code ec;
  BT_CHECK(std::filesystem::is_regular_file(path, ec), "token shard '", path,
           "' does not exist (or is not a file); create shards with `blutrain tokenize`");
  const int64_t size = file_size(path);
  BT_CHECK(size >= kShardHeaderBytes, "token shard '", path, "' is ", size, " bytes, smaller than the ",
           kShardHeaderBytes, "-byte header; it is truncated or not an llm.c token shard");

  int32_t header[kShardHeaderInts];
  File f(std::fopen(path.c_str(), "rb"));
  BT_CHECK(f, "cannot open token shard '", path, "': ", errno_text());
  BT_CHECK(std::fread(header, sizeof(header), 1, f.get()) == 1, "cannot read the header of token shard '",
           path, "'");

  BT_CHECK(header[0] == kShardMagic, "token shard '", path, "' has magic ", header[0], ", expected ",
           kShardMagic, ": the file is not an llm.c token shard");
  BT_CHECK(header[1] == kShardVersion, "token shard '", path, "' has version ", header[1],
           ", but only version ", kShardVersion, " (uint16 tokens) is supported");
  BT_CHECK(header[2] >= 0, "token shard '", path, "' has a negative token count ", header[2]);
  const int64_t n = header[2];
  const int64_t expected = kShardHeaderBytes + 2 * n;
  BT_CHECK(size == expected, "token shard '", path, "' declares ", n, " tokens, so it should be ", expected,
           " bytes, but it is ", size, " bytes (", size < expected ? "truncated" : "trailing garbage",
           "); re-create it with `blutrain tokenize`");
  return ShardInfo{path, n};
}

std::vector<uint16_t> read_shard_tokens(const ShardInfo& info) {
  std::vector<uint16_t> tokens(static_cast<size_t>(info.num_tokens));
  File f(std::fopen(info.path.c_str(), "rb"));
  BT_CHECK(f, "cannot open token shard '", info.path, "': ", errno_text());
  BT_CHECK(std::fseek(f.get(), kShardHeaderBytes, SEEK_SET) == 0, "cannot seek in token shard '", info.path,
           "': ", errno_text());
  BT_CHECK(std::fread(tokens.data(), sizeof(uint16_t), tokens.size(), f.get()) == tokens.size(),
           "token shard '", info.path, "' ended before its ", info.num_tokens,
           " tokens; it changed since its header was read");
  return tokens;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  BT_CHECK(rc != GLOB_NOMATCH, "no files match the data pattern '", pattern,
           "'; check the path, or create shards with `blutrain tokenize`");
  BT_CHECK(rc == 0, "expanding the data pattern '", pattern, "' failed (glob error ", rc,
           rc == GLOB_NOSPACE   ? ": out of memory"
           : rc == GLOB_ABORTED ? ": read error"
                                : "",
           ")");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace bt
