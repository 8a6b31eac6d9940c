// Note [Fail fast]: a run checks, before its first step, every input that it
// needs later, so that hours of training never end in an error a look at the
// start would have found. Each failure names the input (the config key or
// option) and says what to do. What is checked where:
//   every rank   checkpoint.dir: created if missing, writable, and with free
//                space for one more checkpoint (estimated from the state:
//                f32 parameters and both AdamW moments); train.resume's
//                target; the token shards (opened by the Trainer's loaders)
//   rank 0       the tokenizer and the prompt of the final sample (when
//                train.sample_tokens > 0; prepared here, used at the end);
//                the folders of train.save_weights, train.metrics and
//                --save-init / --resolved-config (written only by rank 0)
// A sample that still cannot run at the end (it is the only output that is
// not the model) is reported and leaves the exit status 0.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/train/config.h"

namespace bt::launcher {

/// Bytes one checkpoint of `c`'s model holds on disk, at least: the f32
/// parameters and AdamW's two f32 moments (metadata is small beside them).
uint64_t checkpoint_bytes(const nn::ModelConfig& c);

/// Throws bt::Error naming checkpoint.dir when `free_bytes` cannot hold
/// `need` bytes (a tenth more for slack).
void check_room(const std::string& dir, uint64_t need, uint64_t free_bytes);

/// That a file can be created at `path` (its folder exists and is writable),
/// without leaving one behind. `what` names the input in the error
/// ("train.save_weights").
void check_writable_target(const std::string& path, const std::string& what);

/// Every rank's checks of Note [Fail fast] that need no model or data: the
/// checkpoint folder and the resume target. Throws bt::Error.
void check_run_inputs(const train::TrainConfig& cfg);

}  // namespace bt::launcher
