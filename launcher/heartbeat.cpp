#include "launcher/heartbeat.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <unistd.h>

namespace bt::launcher {

Heartbeat::Heartbeat(const dist::World& w) {
  const char* dir = std::getenv("BT_RANK_LOG_DIR");
  if (!dir || !*dir) return;
  path_ = std::string(dir) + "/rank-" + std::to_string(w.rank) + ".status";
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  prefix_ = std::to_string(::getpid()) + " " + host + " ";
}

void Heartbeat::beat(const std::string& what) {
  if (path_.empty()) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%.3f ", now);
  const std::string tmp = path_ + ".tmp";
  // Best effort: a full disk must not stop training, only blind the watchdog.
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    const bool ok = std::fprintf(f, "%s%s%s\n", prefix_.c_str(), stamp, what.c_str()) > 0;
    if (std::fclose(f) == 0 && ok) std::rename(tmp.c_str(), path_.c_str());
  }
}

bool parse_rank_status(const std::string& line, RankStatus& out) {
  std::istringstream is(line);
  if (!(is >> out.pid >> out.host >> out.since)) return false;
  std::getline(is >> std::ws, out.what);
  return !out.what.empty();
}

}  // namespace bt::launcher
