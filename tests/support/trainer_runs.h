// A Trainer run step by step, as the GPU tests compare them, and the check
// that a run replaying CUDA graphs gives an eager run's bits (Note
// [Whole-step CUDA graphs] in runtime/train/trainer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/train/config.h"

namespace bt::test {

struct TrainerRun {
  std::vector<double> losses, norms;
  std::vector<float> params;    // every parameter, flattened, after the last step (when asked for)
  std::vector<bool> replaying;  // after each step: whether the next replays a graph
  std::string notices;          // the Trainer's notices, one line each
  uint64_t peak = 0;            // the last step's peak memory
};

/// Runs `c.train.steps` steps of a new Trainer; `params`: also read the parameters back.
TrainerRun run_trainer(const train::TrainConfig& c, bool params = true);

/// `graph` (train.cuda_graph on) ran eagerly for two steps, captured the
/// third and replayed from then on; `eager` (off) never did; both have the
/// same losses, gradient norms and (when read) parameters, bit for bit.
void expect_graph_gives_eager_bits(const TrainerRun& eager, const TrainerRun& graph);

}  // namespace bt::test
