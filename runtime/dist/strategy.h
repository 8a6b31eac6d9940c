// Strategy: how one optimizer step's gradients and updates are shared among
// the ranks of a job. The Trainer drives it the same way for every strategy:
//
//   zero_grad()
//   for each micro-step j of A: before_backward(j == A - 1); loss.backward()
//   after_backward()            gradients averaged over ranks (all, or this rank's shard)
//   sq = grad_sum_squares()     global sum of squares, the same on every rank
//   h = advance(lr)             host: AdamW's count, lr and bias corrections
//   apply_step(h, clip factor)  device: AdamW; parameters equal on every rank afterwards
// (the last three are step() split for CUDA graphs: Note [Step scalars] in
// runtime/optim/adamw.h)
//
// Strategies (dist.strategy; docs/distributed.md has the buffer layouts):
//   local  one process: AdamW over the parameters
//   ddp    DataParallel buckets (ddp.h), full AdamW state on every rank
//   zero1  optimizer state (m, v) sharded: reduce-scatter the gradients,
//          update this rank's shard, all-gather the parameters (zero.h)
//   zero2  zero1, and the full gradient buffer is released once reduced:
//          between steps each rank keeps only its gradient shard
//   zero3  zero2, and the parameters sharded too: the model takes each
//          unit's weights from the strategy (weight_source()), which gathers
//          them just before the unit's forward and backward (zero3.h)
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dist/process_group.h"
#include "runtime/nn/weight_source.h"
#include "runtime/optim/adamw.h"

namespace bt::dist {

/// One parameter and its AdamW weight decay.
struct ParamSpec {
  Tensor param;
  double weight_decay = 0.0;
  int unit = 0;           // the model's unit (nn::WeightSource); zero3 shards per unit
  std::string name;       // the model's name for it (checkpoints)
  bool keep_f32 = false;  // the model uses it in f32 under bf16 too (zero3 gathers it so)
};

// Note [State pieces]: the training state of a strategy, independent of how
// it is sharded, is three global f32 tensors per parameter -- "param/NAME"
// (the f32 master), "adam_m/NAME" and "adam_v/NAME", each of the parameter's
// shape -- plus AdamW's step count. A piece is a range of one of them,
// flattened, and the memory a rank keeps it in. Whatever strategy and world
// size saved a checkpoint, a rank fills the pieces it holds now from the
// saved pieces that overlap them (checkpoint/checkpoint.h).
struct StatePiece {
  std::string name;            // "param/h.0.ln_1.weight", "adam_m/...", "adam_v/..."
  Shape shape;                 // the global tensor's shape
  int64_t begin = 0, end = 0;  // flattened elements [begin, end)
  Tensor data;                 // 1-D contiguous f32, end - begin elements, on this rank's device
};

/// Links `w`, the compute-dtype tensor a weight source hands out for master
/// `param`, to it in autograd (when grad mode is on and `param` needs one): a
/// recorded cast named `name` whose backward returns the gradient in f32,
/// uncopied when it already is (Note [Gradients in a wider dtype]).
void record_cast_to_master(const char* name, const Tensor& param, const Tensor& w);
/// The piece "KIND/p.name" of elements [begin, begin + data.numel()).
StatePiece state_piece(const char* kind, const ParamSpec& p, int64_t begin, const Tensor& data);
/// [max(lo, off), min(hi, off + n)): where a range meets a parameter's span.
inline std::pair<int64_t, int64_t> overlap(int64_t lo, int64_t hi, int64_t off, int64_t n) {
  return {std::max(lo, off), std::min(hi, off + n)};
}

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  virtual void zero_grad() = 0;
  virtual void before_backward(bool last_micro_step) = 0;
  virtual void after_backward() = 0;
  /// The global sum of squares of the gradients (after after_backward), the
  /// same on every rank: one F32 or F64 value on this rank's device. No host
  /// read (Note [Step scalars] in runtime/optim/adamw.h).
  virtual Tensor grad_sum_squares() = 0;
  /// The host half of a step: AdamW's count, and its scalars for `lr`.
  virtual AdamW::StepScalars advance(double lr) = 0;
  /// The device half: AdamW reading {lr, bias1, bias2} from `hyper` and the
  /// gradients' multiplier from `grad_scale` (AdamW::apply), then what the
  /// strategy does after an update (gathers, releases). No host read.
  virtual void apply_step(const Tensor& hyper, const Tensor& grad_scale) = 0;
  /// The device this rank's parameters live on.
  virtual Device device() const = 0;
  /// After apply_step skipped its update (a non-finite multiplier, Note
  /// [Non-finite steps] in runtime/train/trainer.cpp): counts advance()'s
  /// step back out, so the state is what the step before left.
  virtual void step_skipped() = 0;
  /// This rank's gradients as after_backward leaves them, each with the index
  /// of its parameter (in the order the strategy was given them): whole
  /// gradients (local, ddp) or this rank's pieces of them (zero1/2/3). For
  /// diagnosis (which parameter's gradient is not finite), not for the step.
  virtual std::vector<std::pair<size_t, Tensor>> gradient_parts() const = 0;

  /// sqrt(grad_sum_squares()), read back to the host.
  double grad_norm();
  /// advance(lr) and apply_step() with the multiplier `grad_scale` (tests, tools).
  void step(double lr, double grad_scale);
  /// Bytes of optimizer state this rank holds (AdamW m and v).
  virtual uint64_t optimizer_state_bytes() const = 0;
  /// Bytes of gradient buffers this rank holds between steps.
  virtual uint64_t gradient_bytes() const = 0;
  /// Bytes of f32 parameters (masters) this rank holds between steps.
  virtual uint64_t parameter_bytes() const = 0;
  /// Bytes of the lower-precision copies of the parameters that a forward
  /// takes, which this rank holds between steps (bf16 under the local and ddp
  /// strategies: Note [Compute copies] in runtime/dist/compute_copies.h).
  virtual uint64_t compute_copy_bytes() const { return 0; }
  /// Where the model must take its weights from (zero3), or null: from its
  /// parameters.
  virtual nn::WeightSource* weight_source() { return nullptr; }
  /// Collective: afterwards every parameter tensor holds its full current
  /// values on every rank (zero3 keeps only shards otherwise; a no-op for
  /// the others). The values go stale at the next step().
  virtual void gather_parameters() {}

  /// The training state this rank holds, as pieces of global tensors (Note
  /// [State pieces]). With `to_write`, this rank's share of a partition: the
  /// ranks' shares cover every element once (what a checkpoint writes);
  /// otherwise everything this rank holds (what a load must fill).
  virtual std::vector<StatePiece> state_pieces(bool to_write) const = 0;
  /// AdamW's step count (its bias correction).
  virtual int64_t optimizer_steps() const = 0;
  /// After the pieces of state_pieces(false) were filled from a checkpoint.
  virtual void state_loaded(int64_t optimizer_steps) = 0;
};

struct StrategyOptions {
  std::string name = "local";  // local | ddp | zero1 | zero2 | zero3
  AdamWOptions adamw;
  double bucket_mb = 25.0;
};

/// Appends `t` to the AdamW group with weight decay `wd`, creating the group
/// on first use (groups stay in order of first appearance).
void add_to_group(std::vector<AdamW::Group>& groups, const Tensor& t, double wd);

/// Each piece's gradient with its parameter's index (`at[k].first`): what
/// gradient_parts() returns for strategies that keep shards.
std::vector<std::pair<size_t, Tensor>> piece_gradients(const std::vector<Tensor>& pieces,
                                                       const std::vector<std::pair<size_t, int64_t>>& at);

/// The sum of squares of the gradients of `pieces` (this rank's shards) over
/// all ranks of `pg`: each rank's f32 sum, added in f64 by an all_reduce.
Tensor sharded_sum_squares(const std::vector<Tensor>& pieces, const Device& device, ProcessGroup& pg);

/// `params`: the model's parameters in forward order (f32 leaves on one
/// device). `pg` may be null only for "local". Throws bt::Error for an
/// unknown name.
std::unique_ptr<Strategy> make_strategy(const StrategyOptions& o, std::vector<ParamSpec> params,
                                        std::shared_ptr<ProcessGroup> pg);

}  // namespace bt::dist
