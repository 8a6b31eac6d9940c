// libFuzzer target: a checkpoint's index.json (checkpoint/index.h) from a
// hostile or damaged file. Whatever the bytes, parsing and the completeness
// check either succeed or throw bt::Error (a JSON syntax error counts as
// refused): never a crash, an uncaught exception, a hang or a leak. An index
// it accepts names only plain file names (Note [Files confined to their
// checkpoint]) and writes back to JSON that reads back to the same index.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/index.h"
#include "kernels/common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const bt::ckpt::Index index = bt::ckpt::Index::from_json(j, "fuzz/index.json");
    (void)index.completeness_problems();
    for (const bt::ckpt::RankRecord& r : index.ranks)
      if (r.file.find('/') != std::string::npos || r.file == ".." || r.file == ".") __builtin_trap();
    const bt::ckpt::Index again = bt::ckpt::Index::from_json(index.to_json(), "fuzz/again.json");
    if (again.to_json() != index.to_json()) __builtin_trap();
  } catch (const bt::Error&) {  // refused
  }
  return 0;
}
