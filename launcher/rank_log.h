// Per-rank log files for jobs started by `blutrain launch`.
//
// The launcher exports BT_RANK_LOG_DIR to every rank. Each rank then writes
// DIR/rank-<R>.log, starting with a line naming its rank, pid and host. Rank 0
// also keeps printing to the terminal (its stdout and stderr go to both, with
// no thread and no buffering between them, so nothing is lost when the job is
// aborted); the other ranks print only to their file.
#pragma once

#include "runtime/dist/world.h"

namespace bt::launcher {

/// Applies the rule above when BT_RANK_LOG_DIR is set; returns whether it was.
bool open_rank_log(const dist::World& w);

}  // namespace bt::launcher
