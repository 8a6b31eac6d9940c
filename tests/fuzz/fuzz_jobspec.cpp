// libFuzzer target: a job spec (launcher/jobspec.h) from a hostile or damaged
// file, with the training config it names. The input is the spec's text,
// then optionally a NUL byte and the text of config.yaml, written beside the
// spec (a spec reaches it as `config: config.yaml`). Whatever the bytes,
// load_job_spec either returns a checked spec or throws bt::Error: no crash,
// other exception, hang or leak. A spec it accepts has a world of at least
// one rank, an absolute checkpoint folder, a CPU device when it asks for no
// GPUs, a valid name, and an environment of distinct variable names.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>
#include <string>

#include "kernels/common/error.h"
#include "launcher/jobspec.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_model_stubs.h"

namespace {

bool env_name(const std::string& s) {
  return !s.empty() && !std::isdigit(static_cast<unsigned char>(s[0])) &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = std::find(data, data + size, uint8_t{0});
  const std::string spec = bt::fuzz::write_input("job.yaml", data, static_cast<size_t>(nul - data));
  const uint8_t* cfg = nul == data + size ? nul : nul + 1;
  bt::fuzz::write_input("config.yaml", cfg, static_cast<size_t>(data + size - cfg));
  bt::launcher::JobSpec s;
  try {
    s = bt::launcher::load_job_spec(spec);
  } catch (const bt::Error&) {  // refused
    return 0;
  }
  if (s.world() < 1 || s.checkpoint_dir.empty() || s.checkpoint_dir[0] != '/') __builtin_trap();
  if (s.gpus_per_node == 0 && s.train.train.device != "cpu") __builtin_trap();
  if (s.name.empty() || s.name.size() > 40) __builtin_trap();
  std::set<std::string> names;
  for (const auto& [k, v] : bt::launcher::job_env(s))
    if (!env_name(k) || !names.insert(k).second) __builtin_trap();
  return 0;
}
