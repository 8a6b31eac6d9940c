// Trainer: one GPT training job on one process. Owns the model, the AdamW
// optimizer, the LR schedule and the data loaders; step() runs one optimizer
// step (grad_accum micro-batches, global-norm clipping, AdamW), evaluate() a
// validation pass. Printing and files are the launcher's business.
//
// One step, in order (bench/gpt2_ref.py follows the same contract):
//   1. for each of A micro-batches: loss_j = CE(model(x_j), y_j);
//      backward of loss_j / A (gradients accumulate in the f32 masters)
//   2. norm = global L2 norm of the gradients; c = min(1, clip / (norm + 1e-6))
//   3. AdamW with lr(step) on gradients scaled by c (fused into the update);
//      weight decay on 2-D parameters only
//   4. reported loss = mean of the A micro-batch losses
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/data/loader.h"
#include "runtime/nn/gpt.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/train/config.h"

namespace bt::train {

struct StepStats {
  int64_t step = 0;  // 1-based index of the step just taken
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // tokens processed by this step (all ranks)
  double seconds = 0;    // wall time of the step, device work included
  double tokens_per_s = 0;
  uint64_t peak_mem_bytes = 0;  // CUDA: peak allocated; CPU: peak RSS
};

class Trainer {
 public:
  /// Validates `cfg`, resolves the device, sets the precision, builds the
  /// model (seeded init) and opens the loaders. Throws bt::Error on bad input.
  explicit Trainer(const TrainConfig& cfg);

  StepStats step();
  /// Mean validation loss over train.eval_batches batches, always the same
  /// batches (the val loader restarts at its beginning). Requires data.val.
  double evaluate();
  bool has_val() const { return val_ != nullptr; }

  int64_t steps_done() const { return step_; }
  const TrainConfig& config() const { return cfg_; }
  const Device& device() const { return device_; }
  nn::Gpt& model() { return *model_; }
  int64_t grad_accum() const { return accum_; }
  const TokenLoader& train_loader() const { return *train_; }

 private:
  TrainConfig cfg_;
  Device device_;
  std::unique_ptr<nn::Gpt> model_;
  std::unique_ptr<AdamW> opt_;
  CosineSchedule schedule_;
  std::unique_ptr<TokenLoader> train_, val_;
  int64_t accum_ = 1;
  int64_t step_ = 0;
};

/// "auto" -> cuda:0 when a device is visible, else cpu; otherwise parse_device.
Device resolve_device(const std::string& spec);
/// The peak memory figure StepStats reports for `d`.
uint64_t peak_memory_bytes(const Device& d);

}  // namespace bt::train
