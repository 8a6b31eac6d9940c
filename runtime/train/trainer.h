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
//
// In a job of several ranks (dist::world(), set up by dist::init_world()),
// each rank runs A = batch_size / (micro_batch * ranks) micro-batches of its
// own samples, and the strategy (dist.strategy) makes step 1's gradients the
// average over ranks, so every rank takes the same step as one process with
// the whole global batch; the reported loss is averaged over ranks too.
//
// Note [Deterministic by construction]
// There is no switch between deterministic and fast kernels (the key
// train.deterministic was removed): every kernel writes each output once and
// reduces in an order fixed by the shapes, never by timing -- no atomics in
// any sum (the CUDA embedding, LayerNorm and bias gradients, attention's
// backward, the split reductions of kernels/cuda/reduce.cu, sum_squares), CPU
// chunks fixed by the shape (Note [Deterministic CPU parallelism]); cuBLASLt
// runs with one workspace per stream, cuBLAS's condition for bitwise results;
// random numbers are Philox by element index (Note [Portable RNG]). So two runs
// give bit-identical losses, gradient norms and weights when they share
//   - the build (the binary and its OpenBLAS, cuBLAS, NCCL and MPI);
//   - the device kind: one GPU model (cuBLAS promises its bits for one
//     architecture and SM count), or on CPUs the OpenBLAS kernel (chosen for
//     the CPU) and OpenBLAS's thread count (OPENBLAS_NUM_THREADS, by default
//     the core count): OpenBLAS 0.3.21 (Haswell kernels) gives a 128x192x64
//     sgemm other bits in 15-30% of its elements on 1, 2, 3 and 4 threads;
//   - the config, world size included;
// whatever BT_NUM_THREADS (the kernels' own pool), dist.bucket_mb with two
// ranks, checkpoint.async, or a stop and resume at a checkpoint.
// Not bit-identical, and why (the tests bound these differences instead):
//   - another world size or micro-batch: the micro-batch gradients are added
//     in another association, ((g1 + g2) + g3) + g4 against (g1 + g2) +
//     (g3 + g4). Where the association is the same -- one process adding two
//     micro-batches, two ranks with one each (a + b, then an exact halving)
//     -- the weights are the same bits;
//   - another strategy: zero1/2/3 sum the clip norm from per-rank shard sums
//     (all-reduced in double), one process and ddp over whole gradients, so
//     the clip coefficient may differ in its last bit when clipping is on;
//   - more than two ranks: MPI may add all_reduce and reduce_scatter terms in
//     different orders and pick its algorithm by message size (bucket_mb), and
//     the TCP group adds in rank order (Note [TCP process group]);
//   - another precision, device kind, OpenBLAS thread count or build.
// Tests: TrainerTest.SameSeedIsBitwiseIdentical (CPU; pool threads 3 and 1),
// Precisions/TrainerGpu.* (one GPU, every precision), TrainDist.Bf16* in
// tests/launcher/test_train_dist_mpi.cpp (one process = ddp = zero3, bit for
// bit) and the exact resume of tests/launcher/test_checkpoint_mpi.cpp.
// A faster kernel that is not deterministic (atomics in the embedding or
// bias gradients, a split-K GEMM reducing with atomics) must not replace a
// deterministic one silently: bring back an opt-in key (off by default, and
// out of kRetiredKeys in launcher/config.cpp), keep both kernels, and test
// both behaviours: the tests above with the key off, and with it on the fast
// kernel against the deterministic one within a bound derived from its
// reduction length and precision, plus a test that the key selects it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/cuda_graph.h"
#include "runtime/core/stream.h"
#include "runtime/data/loader.h"
#include "runtime/dist/strategy.h"
#include "runtime/nn/model.h"
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
  uint64_t peak_mem_bytes = 0;         // CUDA: peak allocated; CPU: peak RSS
  uint64_t optimizer_state_bytes = 0;  // AdamW m and v held by this rank
  uint64_t gradient_bytes = 0;         // gradient buffers this rank keeps between steps
  uint64_t parameter_bytes = 0;        // f32 parameters this rank keeps between steps
  uint64_t compute_copy_bytes = 0;     // the bf16 copies of them a forward takes (Note [Compute copies])
  bool compiled = false;               // train.compile was in effect (the next five are set)
  double compile_s = 0;                // seconds spent compiling (or loading) fusion kernels in this step
  int64_t fused_groups = 0;            // fusion groups this step computed
  int64_t recompiles = 0;              // groups compiled in this step, after this run's first step
  int64_t kernels_compiled = 0;        // kernels whose code this step generated
  int64_t kernels_loaded = 0;          // kernels this step loaded from the compiler's kernel cache
  // Note [Non-finite steps] in trainer.cpp: a step whose loss or gradient
  // norm is not finite did not update anything (train.nonfinite=skip; under
  // stop, step() throws instead).
  bool skipped = false;
  std::string nonfinite;      // skipped: what was not finite, and where
  int64_t skipped_steps = 0;  // steps skipped so far by this Trainer
};

/// The scalar training state a checkpoint keeps besides the state pieces.
struct TrainerCounters {
  int64_t step = 0;                       // optimizer steps taken
  int64_t optimizer_steps = 0;            // AdamW's count (bias correction)
  int64_t data_epoch = 0;                 // training loader: epoch ...
  int64_t data_samples = 0;               // ... and samples of it consumed (independent of the world size)
  uint64_t rng_seed = 0, rng_offset = 0;  // this rank's default generator
};

class Trainer {
 public:
  /// Validates `cfg`, resolves the device, sets the precision, builds the
  /// model (seeded init), runs `init` on it (e.g. loading weights) before the
  /// strategy takes the parameters over, and opens the loaders. Throws
  /// bt::Error on bad input.
  explicit Trainer(const TrainConfig& cfg, const std::function<void(nn::Model&)>& init = {});

  StepStats step();
  /// Mean validation loss over train.eval_batches batches, always the same
  /// batches (the val loader restarts at its beginning). Requires data.val.
  double evaluate();
  bool has_val() const { return val_ != nullptr; }

  int64_t steps_done() const { return step_; }
  /// The config this job runs: train.micro_batch is the one it runs for its
  /// rank count (Note [Batch split] in runtime/train/config.cpp).
  const TrainConfig& config() const { return cfg_; }
  const Device& device() const { return device_; }
  nn::Model& model() { return *model_; }
  int64_t grad_accum() const { return accum_; }
  const TokenLoader& train_loader() const { return *train_; }
  /// The job's ranks (1 for a single process) and this one's index.
  int world_size() const { return world_; }
  int rank() const { return rank_; }
  /// The strategy in use ("local" for one process), with its memory figures.
  const dist::Strategy& strategy() const { return *strategy_; }
  /// The training state this rank holds (dist::Strategy::state_pieces).
  std::vector<dist::StatePiece> state_pieces(bool to_write) const {
    return strategy_->state_pieces(to_write);
  }
  TrainerCounters counters() const;
  /// After a checkpoint filled state_pieces(false): continue from `c`. Throws
  /// bt::Error when the data position does not fall on a batch boundary of
  /// this job (train.micro_batch x ranks).
  void restore(const TrainerCounters& c);

  /// The next optimizer update waits for the work queued so far on `s` (an
  /// asynchronous checkpoint's copies of the parameters; CUDA only).
  void hold_updates_until(const Stream& s) { update_fence_ = s; }
  /// The stream steps run on (CUDA: the Trainer's own, Note [Whole-step CUDA
  /// graphs]); step() returns after its work there is done.
  const Stream& stream() const { return stream_; }
  /// Whether steps replay a captured CUDA graph now.
  bool graph_replaying() const { return graph_.captured(); }
  /// What changed in how steps run since the last call, as one line for the
  /// log (graphs captured, or why they are off), or empty.
  std::string take_notice() { return std::exchange(notice_, std::string()); }

  /// The job's process group (null for one process).
  dist::ProcessGroup* process_group() const { return pg_.get(); }
  /// Collective: whether `ok` is true on every rank.
  bool all_ranks(bool ok);

  /// Collective, after the last step: every rank's model holds its full
  /// parameters and runs on its own (sampling, saving weights). Under zero3
  /// the model otherwise holds only shards; further steps are refused.
  void finish_training();

 private:
  TrainConfig cfg_;
  Device device_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<dist::Strategy> strategy_;  // local for one process
  CosineSchedule schedule_;
  std::unique_ptr<TokenLoader> train_, val_;
  int64_t accum_ = 1;
  int64_t step_ = 0;
  bool finished_ = false;
  std::optional<Stream> update_fence_;
  int rank_ = 0, world_ = 1;
  std::shared_ptr<dist::ProcessGroup> pg_;  // null for a single process

  // Note [Whole-step CUDA graphs] in trainer.cpp.
  Stream stream_;                         // where steps run (CUDA: created; CPU: a tag)
  std::vector<Tensor> inputs_, targets_;  // per micro-step: the batch, staged (pinned under CUDA)
  Tensor hyper_;                          // AdamW's {lr, bias1, bias2} of the step, staged likewise
  Tensor report_;                         // on the device: {sum of micro-step losses, gradient norm}
  CudaGraph graph_;
  std::string graph_off_;  // why steps are not captured ("" while they may be)
  int64_t eager_steps_ = 0;
  std::string notice_;
  bool compile_ = false;       // train.compile in effect (Note [Lazy fusion]; off without a compiler)
  int64_t compile_steps_ = 0;  // steps this Trainer ran with it
  // Note [Non-finite steps].
  int64_t skipped_in_row_ = 0, skipped_total_ = 0;
  int64_t fault_first_ = 0, fault_last_ = -1;  // BT_FAULT_NONFINITE's steps (none: first > last)
  Tensor poison_host_, poison_;                // its gradient multiplier: staged, and on the device
  /// Registers BT_FAULT_NONFINITE's hook, when the variable is set.
  void install_fault();
  /// After a step whose loss or norm was not finite: counts the skipped
  /// update out, names the cause, and throws under train.nonfinite=stop or
  /// past train.max_skipped_steps. Collective.
  void on_nonfinite(StepStats& s);
  /// What was not finite: the first parameter (in the model's order) whose
  /// gradient holds a NaN or an infinity on any rank, else the loss or the
  /// norm. Collective.
  std::string nonfinite_cause(const StepStats& s);
  /// Copies micro-batch `j` into the staging tensors after checking its ids.
  void stage(int64_t j, const Batch& b);
  /// The step's device work, from the staged batches and scalars to the
  /// update and report_: what a graph captures. Reads nothing back.
  void device_step();
  /// The mean over ranks of a scalar (itself for a single process).
  double mean_over_ranks(double v);
};

/// "auto" -> cuda:local_rank when a device is visible, else cpu; "cuda" ->
/// cuda:local_rank; otherwise parse_device.
Device resolve_device(const std::string& spec, int local_rank = 0);
/// The peak memory figure StepStats reports for `d`.
uint64_t peak_memory_bytes(const Device& d);

}  // namespace bt::train
