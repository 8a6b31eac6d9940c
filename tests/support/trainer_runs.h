// A Trainer run step by step, as the GPU tests compare them, and the check
// that a run replaying CUDA graphs gives an eager run's bits (Note
// [Whole-step CUDA graphs] in runtime/train/trainer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/train/config.h"
#include "runtime/train/trainer.h"

namespace bt::test {

struct TrainerRun {
  std::vector<double> losses, norms;
  std::vector<float> params;    // every parameter, flattened, after the last step (when asked for)
  std::vector<bool> replaying;  // after each step: whether the next replays a graph
  std::string notices;          // the Trainer's notices, one line each
  uint64_t peak = 0;            // the last step's peak memory
};

/// Every parameter of `t`'s model, flattened, in the model's order.
std::vector<float> flat_params(train::Trainer& t);

/// Runs `c.train.steps` steps of a new Trainer; `params`: also read the parameters back.
TrainerRun run_trainer(const train::TrainConfig& c, bool params = true);

/// Note [Non-finite steps]: `last` steps of a new Trainer made while
/// BT_FAULT_NONFINITE=`fault`, each step's stats and notice, and the
/// parameters and AdamW's step count after them.
struct FaultRun {
  std::vector<train::StepStats> steps;
  std::vector<std::string> notices;
  std::vector<float> params;
  int64_t optimizer_steps = 0;
};
FaultRun run_with_fault(const train::TrainConfig& c, const std::string& fault, int64_t last);
/// What a run that skipped step `skip` must equal: a new Trainer runs steps
/// 1 .. skip-1, moves past step `skip` without an update (the step count and
/// the data position advance by one step, AdamW's count does not), and runs
/// on to `last`. The losses of the steps after `skip`, and the parameters.
std::pair<std::vector<double>, std::vector<float>> run_past_step(const train::TrainConfig& c, int64_t skip,
                                                                 int64_t last);

/// `graph` (train.cuda_graph on) ran eagerly for two steps, captured the
/// third and replayed from then on; `eager` (off) never did; both have the
/// same losses, gradient norms and (when read) parameters, bit for bit.
void expect_graph_gives_eager_bits(const TrainerRun& eager, const TrainerRun& graph);

}  // namespace bt::test
