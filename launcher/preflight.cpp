#include "launcher/preflight.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "launcher/checkpointing.h"
#include "launcher/progress.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;

/// Creates and removes a file in `dir`; "" when that worked, else why not.
std::string probe_write(const fs::path& dir) {
  const fs::path probe = dir / (".bt-write-probe-" + std::to_string(::getpid()));
  FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) return std::strerror(errno);
  const bool wrote = std::fputs("probe\n", f) >= 0;
  const int closed = std::fclose(f);
  std::error_code ec;
  fs::remove(probe, ec);
  if (!wrote || closed != 0) return "a test write failed";
  return "";
}

}  // namespace

uint64_t checkpoint_bytes(const nn::ModelConfig& c) {
  return static_cast<uint64_t>(c.num_params()) * 3 * sizeof(float);
}

void check_room(const std::string& dir, uint64_t need, uint64_t free_bytes) {
  const uint64_t want = need + need / 10;
  BT_CHECK(free_bytes >= want, "checkpoint.dir '", dir, "' has ", human_bytes(free_bytes),
           " free, but one checkpoint of this model takes about ", human_bytes(need),
           " (parameters and AdamW state in f32); free some space, lower checkpoint.keep_last, or point "
           "checkpoint.dir at a larger filesystem");
}

void check_writable_target(const std::string& path, const std::string& what) {
  if (path.empty()) return;
  std::error_code ec;
  const fs::path p(path);
  BT_CHECK(!fs::is_directory(p, ec), what, " '", path, "' is a folder; give a file path inside it");
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  BT_CHECK(fs::is_directory(dir, ec), what, " '", path, "': its folder '", dir.string(),
           "' does not exist; create it (mkdir -p ", dir.string(), ") or choose another path");
  const std::string why = probe_write(dir);
  BT_CHECK(why.empty(), what, " '", path, "': cannot create a file in '", dir.string(), "' (", why,
           "); choose a folder you can write to");
}

void check_run_inputs(const train::TrainConfig& cfg) {
  const std::string& dir = cfg.checkpoint.dir;
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    BT_CHECK(!ec && fs::is_directory(dir), "checkpoint.dir '", dir, "' cannot be created (",
             ec ? ec.message() : "a file of that name exists", "); choose another folder");
    const std::string why = probe_write(dir);
    BT_CHECK(why.empty(), "checkpoint.dir '", dir, "' is not writable (", why,
             "); choose a folder you can write to, or fix its permissions");
    const fs::space_info s = fs::space(dir, ec);
    BT_CHECK(!ec, "checkpoint.dir '", dir, "': cannot read its free space (", ec.message(), ")");
    check_room(dir, checkpoint_bytes(cfg.model), s.available);
  }
  const std::string& resume = cfg.train.resume;
  if (resume != "none" && resume != "auto") resume_target(resume);
}

}  // namespace bt::launcher
