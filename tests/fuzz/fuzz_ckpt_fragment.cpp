// libFuzzer target: the rank fragments (rank_RRRRR.json) that a checkpoint's
// commit merges into its index (Index::merge_fragment, checkpoint/index.h),
// from hostile or damaged files. The input is one fragment per rank,
// separated by NUL bytes (at most 8 ranks). Whatever the bytes, merging
// either succeeds or throws bt::Error: no crash, other exception, hang or
// leak. An index merged from them names only plain rank file names (Note
// [Files confined to their checkpoint]); once complete, it writes to JSON
// that reads back (Index::from_json) to the same index, as resume reads it.
#include <algorithm>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/index.h"
#include "kernels/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bt::ckpt::Index index;
  index.strategy = "zero2";
  index.counters = {{"step", 7}};
  const uint8_t* end = data + size;
  int rank = 0;
  try {
    for (const uint8_t* p = data; p <= end && rank < 8; ++rank) {
      const uint8_t* q = std::find(p, end, uint8_t{0});
      const nlohmann::json frag = nlohmann::json::parse(p, q, nullptr, /*allow_exceptions=*/false);
      if (frag.is_discarded()) return 0;  // the commit refuses a fragment that is not JSON
      index.merge_fragment(frag, rank, "fuzz/rank_" + std::to_string(rank) + ".json");
      p = q + 1;
    }
  } catch (const bt::Error&) {  // refused
    return 0;
  }
  index.world_size = rank;
  index.sort_pieces();
  for (const bt::ckpt::RankRecord& r : index.ranks)
    if (r.file.empty() || r.file.find('/') != std::string::npos || r.file == ".." || r.file == ".")
      __builtin_trap();
  if (!index.completeness_problems().empty()) return 0;  // the commit refuses it
  const nlohmann::json written = index.to_json();
  if (bt::ckpt::Index::from_json(written, "fuzz/index.json").to_json() != written) __builtin_trap();
  return 0;
}
