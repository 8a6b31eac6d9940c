// Zero3Strategy (dist.strategy: zero3): parameters, gradients and AdamW state
// all sharded over the ranks of a group; the model takes its weights from the
// strategy (nn::WeightSource), one unit at a time.
//
// Note [ZeRO-3 units]: parameters come in units (ParamSpec::unit; GPT: unit 0
// = embeddings + final LayerNorm, unit 1 + l = block l). Each unit u has the
// flat layout of Note [ZeRO flat layout] on its own: its P_u floats in
// parameter order, padded to N * S_u (S_u = ceil(P_u / N)); rank r owns
// [r*S_u, (r+1)*S_u). Between steps a rank holds, per unit, its f32 master
// shard, its gradient shard and AdamW's m and v for it: 4 * S_u floats.
// Under bf16 the parameters the model uses in f32 (ParamSpec::keep_f32: GPT's
// LayerNorm affine, Note [f32 LayerNorm parameters] in runtime/nn/gpt2/gpt.h) are
// a second part of their unit, with a flat layout, shards and a compute
// buffer of their own, gathered in f32 beside the bf16 part: a unit is then
// two small all-gathers, and every "unit" below means all of its parts.
//
//   forward   enter(u) waits for u's all-gather -- the master shards cast to
//             the compute dtype (bf16 under Precision::BF16), gathered into
//             u's compute buffer -- and starts u+1's (prefetch). weight(p) is
//             a view of that buffer, linked to the f32 leaf p by a recorded
//             cast. leave(u) frees the buffer (Note [Released storage]: the
//             views autograd saved stay valid handles) and wraps u's outputs
//             in one node whose backward re-enters u.
//   backward  re-entering u gathers it into the same storage again and
//             starts u-1's gather; u's full f32 gradient buffer is allocated
//             (zeroed) if absent and every p.grad becomes a view of it. When
//             the last parameter of u has its gradient (grad-ready hooks):
//             on the last micro-step, reduce_scatter(avg) into u's gradient
//             shard and drop the full gradient; in every case free the
//             compute buffer. With gradient accumulation the full gradients
//             stay between micro-steps (as DDP's no-sync steps do).
//   step      norm from the gradient shards, AdamW on the master shards; the
//             next forward gathers the new values.
//
// Unit 0 stays gathered from its enter until its backward ends, since the LM
// head uses it last in forward and first in backward; in a forward without
// grad it stays until the next step(). A gathered unit is always current:
// step() frees every compute buffer. The checkpoint issue writes these
// per-unit shards; docs/distributed.md describes the layout.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/dist/strategy.h"

namespace bt::dist {

class Zero3Strategy : public Strategy, public nn::WeightSource {
 public:
  /// The compute dtype is fixed here: bf16 when precision() is BF16, else f32.
  Zero3Strategy(const AdamWOptions& o, std::vector<ParamSpec> params, std::shared_ptr<ProcessGroup> pg);
  ~Zero3Strategy() override;

  std::string name() const override { return "zero3"; }
  void zero_grad() override;
  void before_backward(bool last_micro_step) override { last_ = last_micro_step; }
  void after_backward() override;
  Tensor grad_sum_squares() override;
  AdamW::StepScalars advance(double lr) override { return opt_->advance(lr); }
  void apply_step(const Tensor& hyper, const Tensor& grad_scale) override;
  Device device() const override;
  void step_skipped() override { opt_->retract(); }
  std::vector<std::pair<size_t, Tensor>> gradient_parts() const override {
    return piece_gradients(pieces_, piece_at_);
  }
  uint64_t optimizer_state_bytes() const override;
  uint64_t gradient_bytes() const override { return shard_bytes(); }
  uint64_t parameter_bytes() const override { return shard_bytes(); }
  nn::WeightSource* weight_source() override { return this; }
  void gather_parameters() override;
  std::vector<StatePiece> state_pieces(bool to_write) const override;
  int64_t optimizer_steps() const override { return opt_->steps(); }
  void state_loaded(int64_t steps) override;

  // nn::WeightSource
  void enter(int unit) override;
  Tensor weight(const Tensor& param) override;
  std::vector<Tensor> leave(int unit, const std::vector<Tensor>& outs) override;

  int num_units() const { return static_cast<int>(unit_parts_.size()); }
  /// Whether unit u's compute buffers currently hold its weights.
  bool gathered(int unit) const;

 private:
  struct Member {
    ParamSpec spec;
    Tensor param;
    size_t part = 0;
    int64_t offset = 0;  // in the part's flat layout
  };
  /// A unit's parameters of one compute dtype (Note [ZeRO-3 units]).
  struct Part {
    int unit = 0;
    DType dtype = DType::F32;      // of `compute`
    std::vector<size_t> members;   // indices into members_
    int64_t numel = 0, shard = 0;  // P_u and S_u
    Tensor master, shard_grad;     // f32 [S_u]: this rank's range
    Tensor compute;                // [N * S_u], compute dtype; storage released unless gathered
    Tensor full;                   // f32 [N * S_u]: the parameters' storage (gather_parameters)
    Tensor full_grad;              // f32 [N * S_u] while backward needs it
    std::shared_ptr<Work> gather;  // all-gather into `compute` in flight
    bool resident = false, reduced = false;
    int ready = 0;  // parameters whose gradient is final in this backward
  };

  uint64_t shard_bytes() const;
  const std::vector<size_t>& parts_of(int unit) const;
  void start_gather(Part& u);
  void ensure_gathered(Part& u);
  void release(Part& u);
  void enter_backward(int unit);
  void on_grad_ready(size_t part);
  void reduce(Part& u);
  void bind_grads(Part& u, const Tensor& flat);

  std::shared_ptr<ProcessGroup> pg_;
  DType compute_dtype_;
  std::vector<Member> members_;
  std::unordered_map<const TensorImpl*, size_t> index_;  // parameter -> members_ index
  std::vector<Part> parts_;
  std::vector<std::vector<size_t>> unit_parts_;  // unit -> indices into parts_
  std::vector<Tensor> pieces_;                   // master pieces in this rank's ranges (AdamW's parameters)
  std::vector<std::pair<size_t, int64_t>> piece_at_;  // each piece's member and first element in it
  std::vector<std::shared_ptr<Work>> reductions_;
  std::unique_ptr<AdamW> opt_;
  bool last_ = true;
};

}  // namespace bt::dist
