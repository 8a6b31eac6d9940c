// Heartbeats: what each rank of a job started by `blutrain launch` is doing,
// for the launcher's hang watchdog (launcher/launch.cpp).
//
// Each rank rewrites BT_RANK_LOG_DIR/rank-<R>.status (a temporary file, then
// a rename, so a reader never sees half of one) whenever it starts something
// new: a training step, an evaluation, a checkpoint save. The file holds one
// line: "<pid> <host> <unix seconds> <what>". A job in which no status file
// has changed for --hang-timeout seconds is hung; the watchdog stops it and
// prints every rank's line. Without BT_RANK_LOG_DIR nothing is written.
#pragma once

#include <string>

#include "runtime/dist/world.h"

namespace bt::launcher {

class Heartbeat {
 public:
  /// Writes nothing unless BT_RANK_LOG_DIR is set.
  explicit Heartbeat(const dist::World& w);
  /// Records that this rank is now doing `what` ("step 12", "saving the checkpoint of step 10").
  void beat(const std::string& what);

 private:
  std::string path_, prefix_;
};

struct RankStatus {
  long pid = 0;
  std::string host, what;
  double since = 0;  // unix seconds
};

/// Parses one status file's line; false when it is not one.
bool parse_rank_status(const std::string& line, RankStatus& out);

}  // namespace bt::launcher
