// The training job's side of checkpoints: saving a Trainer's state through
// checkpoint/checkpoint.h, and resuming it (train.resume).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/train/trainer.h"

namespace bt::launcher {

/// Collective: saves `tr`'s state under cfg.checkpoint.dir; returns the
/// checkpoint directory.
std::string save_checkpoint(train::Trainer& tr, const nlohmann::json& resolved_config);

/// Collective: applies cfg.train.resume. "auto" takes checkpoint.dir's latest
/// complete checkpoint and, when it is corrupt or unreadable on any rank,
/// falls back to the one before (saying so); a checkpoint of another model
/// is an error. Returns what happened, for the log ("" when starting fresh).
std::string resume(train::Trainer& tr);

}  // namespace bt::launcher
