// libFuzzer target: a YAML training config (launcher/config.h) from a hostile
// or damaged file, with --set overrides. The input is the file's text, then
// optionally a NUL byte and one override per line. Whatever the bytes,
// load_train_config either returns a validated config or throws bt::Error: no
// crash, other exception (a YAML or JSON one included), hang or leak. A
// config it accepts writes back (config_to_yaml) to a file that reads back
// to the same config (config_to_json of both is equal).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "launcher/config.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_model_stubs.h"

namespace {

/// The bytes after the first NUL, one override per line.
std::vector<std::string> overrides_of(const uint8_t* data, size_t size, size_t* text_size) {
  const uint8_t* nul = std::find(data, data + size, uint8_t{0});
  *text_size = static_cast<size_t>(nul - data);
  std::vector<std::string> out;
  if (nul == data + size) return out;
  std::string line;
  for (const uint8_t* p = nul + 1; p < data + size; ++p) {
    if (*p != '\n') {
      line += static_cast<char>(*p);
    } else {
      out.push_back(line);
      line.clear();
    }
  }
  if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t text_size = 0;
  const std::vector<std::string> sets = overrides_of(data, size, &text_size);
  const std::string path = bt::fuzz::write_input("config.yaml", data, text_size);
  const int world = 1 + static_cast<int>(size % 4);
  bt::train::TrainConfig c;
  try {
    c = bt::launcher::load_train_config(path, sets, world);
  } catch (const bt::Error&) {  // refused
    return 0;
  }
  // Accepted: it writes back to the same config.
  const std::string yaml = bt::launcher::config_to_yaml(c);
  const std::string again =
      bt::fuzz::write_input("again.yaml", reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size());
  const bt::train::TrainConfig d = bt::launcher::load_train_config(again, {}, world);
  const std::string first = bt::launcher::config_to_json(c, world),
                    second = bt::launcher::config_to_json(d, world);
  if (first != second) {
    std::fprintf(stderr, "config_to_yaml did not read back:\n%s\nread back as\n%s\n", first.c_str(),
                 second.c_str());
    __builtin_trap();
  }
  return 0;
}
