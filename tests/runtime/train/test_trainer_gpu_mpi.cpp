// The Trainer on several GPUs, one per rank (mpirun -np 2|4 on a machine with
// that many; skipped otherwise): Note [Whole-step CUDA graphs] with the
// step's NCCL collectives inside the graph (Note [Collectives in a CUDA
// graph]). Under ddp, zero1, zero2 and zero3, with two micro-batches a step
// on 2 ranks, the step is captured after two eager steps and the replays
// give the eager run's losses and gradient norms bit for bit.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/dist/world.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"
#include "tests/support/trainer_runs.h"

namespace bt::train {
namespace {

TEST(TrainerGpuMpi, CudaGraphsCaptureTheCollectivesOfEveryStrategy) {
  const dist::World& w = dist::world();
  if (w.size < 2) GTEST_SKIP() << "one process: there are no collectives to capture";
  if (cuda_device_count() < w.local_size)
    GTEST_SKIP() << "needs one GPU per rank: " << w.local_size << " ranks on this host, "
                 << cuda_device_count() << " GPUs";
  test::TempDir dir("bt_trainer_gpu_mpi");  // each rank writes the same shards into its own folder
  TrainConfig c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 128;
  c.model.seq_len = 128;
  c.model.vocab_size = 1024;
  c.data.train = test::write_token_shards(dir.path().string(), "train", 2, 20'000, 1024, 3);
  c.data.val = "";
  c.train.device = "cuda";
  c.train.precision = "bf16";
  c.train.steps = 6;
  c.train.batch_size = 16;
  c.train.micro_batch = 4;  // two micro-batches a step on 2 ranks, one on 4
  c.train.lr = 3e-3;
  c.train.warmup_steps = 2;
  c.train.grad_clip = 0.5;
  c.dist.bucket_mb = 0.25;  // several DDP buckets, launched from the gradient hooks
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    SCOPED_TRACE(strategy);
    c.dist.strategy = strategy;
    c.train.cuda_graph = false;
    const test::TrainerRun eager = test::run_trainer(c, /*params=*/false);
    c.train.cuda_graph = true;
    const test::TrainerRun graph = test::run_trainer(c, /*params=*/false);
    test::expect_graph_gives_eager_bits(eager, graph);
    EXPECT_LT(graph.losses.back(), graph.losses.front()) << "the steps must learn";
    if (w.rank == 0)
      std::printf("%s on %d ranks: peak memory %.1f MiB eager, %.1f MiB with the graph\n", strategy, w.size,
                  static_cast<double>(eager.peak) / (1 << 20), static_cast<double>(graph.peak) / (1 << 20));
  }
}

}  // namespace
}  // namespace bt::train
