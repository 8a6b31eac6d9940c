#include "tests/support/trainer_runs.h"

#include <gtest/gtest.h>

#include "runtime/train/trainer.h"

namespace bt::test {

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
  if (params)
    for (const Tensor& p : t.model().parameters()) {
      const std::vector<float> v = p.to_vector<float>();
      r.params.insert(r.params.end(), v.begin(), v.end());
    }
  return r;
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
