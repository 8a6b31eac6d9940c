// libFuzzer target: the token shard reader (runtime/data/shard.h) on arbitrary
// file contents. It must accept a valid shard and refuse anything else with
// bt::Error -- never crash, hang, leak or read past the file. A shard it
// accepts holds exactly the tokens its header promises.
#include <cstdint>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/data/shard.h"
#include "tests/fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = bt::fuzz::write_input("shard.bin", data, size);
  try {
    const bt::ShardInfo info = bt::read_shard_header(path);
    const std::vector<uint16_t> tokens = bt::read_shard_tokens(info);
    if (static_cast<int64_t>(tokens.size()) != info.num_tokens) __builtin_trap();
    if (size != static_cast<size_t>(bt::kShardHeaderBytes + 2 * info.num_tokens)) __builtin_trap();
  } catch (const bt::Error&) {  // refused, as it should be
  }
  return 0;
}
