// Token shards: write/read round trip, header validation, glob expansion.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "runtime/data/shard.h"
#include "tests/support/error_message.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

namespace fs = std::filesystem;

class ShardTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.file(name); }

  // Writes raw header ints and `ntok_bytes` bytes of token data.
  void write_raw(const std::string& p, int32_t magic, int32_t version, int32_t n, size_t token_bytes) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = n;
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    std::vector<char> data(token_bytes, 0);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }

  test::TempDir tmp_{"bt_shard_test"};
};

TEST_F(ShardTest, RoundTrip) {
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7919u);
  const std::string p = path("a.bin");
  write_shard(p, tokens);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(fs::file_size(p), 1024u + 2 * tokens.size());
  const ShardInfo info = read_shard_header(p);
  EXPECT_EQ(info.path, p);
  EXPECT_EQ(info.num_tokens, 5000);
  EXPECT_EQ(read_shard_tokens(info), tokens);
}

TEST_F(ShardTest, EmptyShardRoundTrip) {
  const std::string p = path("empty.bin");
  write_shard(p, {});
  const ShardInfo info = read_shard_header(p);
  EXPECT_EQ(info.num_tokens, 0);
  EXPECT_TRUE(read_shard_tokens(info).empty());
}

TEST_F(ShardTest, HeaderIsLlmcLayout) {
  const std::string p = path("h.bin");
  write_shard(p, {1, 2, 3});
  std::ifstream f(p, std::ios::binary);
  std::vector<int32_t> header(256);
  f.read(reinterpret_cast<char*>(header.data()), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  for (size_t i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << i;
}

TEST_F(ShardTest, WriteToMissingDirectoryNamesPath) {
  const std::string p = path("no/such/dir/x.bin");
  const std::string msg = test::error_message([&] { write_shard(p, {1, 2}); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

TEST_F(ShardTest, MissingFile) {
  const std::string p = path("missing.bin");
  const std::string msg = test::error_message([&] { read_shard_header(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("blutrain tokenize"), std::string::npos) << msg;
}

TEST_F(ShardTest, BadMagic) {
  const std::string p = path("magic.bin");
  write_raw(p, 12345, 1, 4, 8);
  const std::string msg = test::error_message([&] { read_shard_header(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("12345"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20240520"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an llm.c token shard"), std::string::npos) << msg;
}

TEST_F(ShardTest, WrongVersion) {
  const std::string p = path("version.bin");
  write_raw(p, 20240520, 2, 4, 8);
  const std::string msg = test::error_message([&] { read_shard_header(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("version 2"), std::string::npos) << msg;
}

TEST_F(ShardTest, TruncatedFile) {
  const std::string p = path("trunc.bin");
  write_raw(p, 20240520, 1, 100, 150);
  const std::string msg = test::error_message([&] { read_shard_header(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("1224"), std::string::npos) << msg;  // expected size
  EXPECT_NE(msg.find("1174"), std::string::npos) << msg;  // actual size
}

TEST_F(ShardTest, SmallerThanHeader) {
  const std::string p = path("tiny.bin");
  {
    std::ofstream f(p, std::ios::binary);
    f << "hello";
  }
  const std::string msg = test::error_message([&] { read_shard_header(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

TEST_F(ShardTest, GlobIsSorted) {
  for (const char* n : {"s_002.bin", "s_000.bin", "s_001.bin", "other.txt"}) write_shard(path(n), {1});
  const auto files = expand_glob(path("s_*.bin"));
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], path("s_000.bin"));
  EXPECT_EQ(files[1], path("s_001.bin"));
  EXPECT_EQ(files[2], path("s_002.bin"));
}

TEST_F(ShardTest, EmptyGlobNamesPattern) {
  const std::string pattern = path("nothing_*.bin");
  const std::string msg = test::error_message([&] { expand_glob(pattern); });
  EXPECT_NE(msg.find(pattern), std::string::npos) << msg;
}

}  // namespace
}  // namespace bt
