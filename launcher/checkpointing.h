// The training job's side of checkpoints: saving a Trainer's state through
// checkpoint/checkpoint.h, and resuming it (train.resume).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/async_writer.h"
#include "runtime/train/trainer.h"

namespace bt::launcher {

/// Saves a Trainer's state under checkpoint.dir, synchronously or, with
/// checkpoint.async, through a background writer (Note [Asynchronous
/// checkpoints]). Every method is collective; each returns a line for the
/// log ("" when there is nothing to say).
class Checkpointer {
 public:
  Checkpointer(train::Trainer& tr, nlohmann::json resolved_config);
  ~Checkpointer();
  /// A save now (after a step). Async: waits for the previous save first.
  std::string save();
  /// After every step: commits the pending asynchronous save once every
  /// rank has written its part.
  std::string poll();
  /// End of the run: waits for the pending save and commits it.
  std::string flush();

 private:
  std::string finish(bool block);
  ckpt::SaveRequest request() const;

  train::Trainer& tr_;
  nlohmann::json config_;
  ckpt::AsyncWriter writer_;
  std::optional<Stream> side_;  // CUDA: the snapshot copies' stream
  double started_ = 0;          // seconds (steady clock) at the pending save's start
};

/// Collective: applies cfg.train.resume. "auto" takes checkpoint.dir's latest
/// complete checkpoint and, when it is corrupt or unreadable on any rank,
/// falls back to the one before (saying so); a checkpoint of another model
/// is an error. Returns what happened, for the log ("" when starting fresh).
std::string resume(train::Trainer& tr);

/// The checkpoint train.resume=PATH (not none or auto) loads: PATH, or its
/// latest when PATH is a checkpoint root (`chosen` then says so). Throws
/// bt::Error naming train.resume when PATH is neither.
std::string resume_target(const std::string& resume, std::string* chosen = nullptr);

}  // namespace bt::launcher
