#include "tests/support/trainer_runs.h"

#include <optional>

#include <gtest/gtest.h>

#include "runtime/train/trainer.h"
#include "tests/support/scoped_env.h"

namespace bt::test {

std::vector<float> flat_params(train::Trainer& t) {
  std::vector<float> out;
  for (const Tensor& p : t.model().parameters()) {
    const std::vector<float> v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TrainerRun run_trainer(const train::TrainConfig& c, bool params) {
  TrainerRun r;
  train::Trainer t(c);
  for (int64_t i = 0; i < c.train.steps; ++i) {
    const train::StepStats s = t.step();
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
    r.replaying.push_back(t.graph_replaying());
    r.notices += t.take_notice() + "\n";
    r.peak = s.peak_mem_bytes;
  }
  if (params) r.params = flat_params(t);
  return r;
}

FaultRun run_with_fault(const train::TrainConfig& c, const std::string& fault, int64_t last) {
  FaultRun r;
  std::optional<train::Trainer> t;
  {
    const ScopedEnv env("BT_FAULT_NONFINITE", fault);  // read when the Trainer is made
    t.emplace(c);
  }
  for (int64_t i = 0; i < last; ++i) {
    r.steps.push_back(t->step());
    r.notices.push_back(t->take_notice());
  }
  r.params = flat_params(*t);
  r.optimizer_steps = t->counters().optimizer_steps;
  return r;
}

std::pair<std::vector<double>, std::vector<float>> run_past_step(const train::TrainConfig& c, int64_t skip,
                                                                 int64_t last) {
  train::Trainer t(c);
  for (int64_t i = 1; i < skip; ++i) t.step();
  train::TrainerCounters k = t.counters();
  k.step += 1;
  k.data_samples += c.train.batch_size;  // step `skip`'s batch, consumed without an update
  t.restore(k);
  std::vector<double> losses;
  for (int64_t i = skip + 1; i <= last; ++i) losses.push_back(t.step().loss);
  return {losses, flat_params(t)};
}

void expect_graph_gives_eager_bits(const TrainerRun& eager, const TrainerRun& graph) {
  const size_t n = eager.losses.size();
  ASSERT_GE(n, 3u) << "the capture happens at step 3";
  std::vector<bool> replays(n, true);
  replays[0] = replays[1] = false;
  EXPECT_EQ(eager.replaying, std::vector<bool>(n, false)) << eager.notices;
  EXPECT_EQ(graph.replaying, replays) << graph.notices;
  EXPECT_NE(graph.notices.find("step 3: captured the step as a CUDA graph"), std::string::npos)
      << graph.notices;
  EXPECT_EQ(eager.losses, graph.losses);
  EXPECT_EQ(eager.norms, graph.norms);
  EXPECT_EQ(eager.params, graph.params);
}

}  // namespace bt::test
