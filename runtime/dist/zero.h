// ZeroStrategy (dist.strategy: zero1 | zero2): optimizer state sharded over
// the ranks of a group.
//
// Note [ZeRO flat layout]: the parameters, in forward order, are packed into
// one flat f32 buffer of P = sum of their sizes, padded with zeros to
// P' = N * S (N ranks, S = ceil(P / N)); each parameter becomes a view of it
// (Tensor::set_data_), and its gradient a view of a flat gradient buffer with
// the same layout. Rank r owns the contiguous range [r*S, (r+1)*S): AdamW's m
// and v exist only for that range, split at parameter boundaries so weight
// decay still applies to matrices only. A step is
//   reduce_scatter(avg) of the flat gradient  -> this rank's gradient shard
//   norm^2 = all_reduce(sum) of the shard's sum of squares
//   AdamW on the shard (m, v: 2 * S floats)
//   all_gather of the parameter shards         -> every rank's full parameters
// zero2 also releases the flat gradient once it is reduced: between steps a
// rank holds only its S-float gradient shard (the full buffer is allocated
// again by zero_grad for the next backward). The checkpoint issue writes
// exactly these shards; docs/distributed.md describes the layout.
#pragma once

#include "runtime/dist/strategy.h"

namespace bt::dist {

class ZeroStrategy : public Strategy {
 public:
  ZeroStrategy(int stage, const AdamWOptions& o, std::vector<ParamSpec> params,
               std::shared_ptr<ProcessGroup> pg);

  std::string name() const override { return stage_ == 1 ? "zero1" : "zero2"; }
  void zero_grad() override;
  void before_backward(bool) override {}
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
  uint64_t gradient_bytes() const override;
  uint64_t parameter_bytes() const override { return static_cast<uint64_t>(padded_) * sizeof(float); }
  std::vector<StatePiece> state_pieces(bool to_write) const override;
  int64_t optimizer_steps() const override { return opt_->steps(); }
  void state_loaded(int64_t steps) override;

  int64_t shard_numel() const { return shard_; }
  int64_t padded_numel() const { return padded_; }

 private:
  Tensor shard_of(const Tensor& flat) const { return flat.narrow(0, pg_->rank() * shard_, shard_); }
  void bind_grads(const Tensor& flat_grad);  // every parameter's .grad := its view of flat_grad

  int stage_;
  std::vector<ParamSpec> params_;
  std::vector<int64_t> offsets_;
  std::shared_ptr<ProcessGroup> pg_;
  int64_t padded_ = 0, shard_ = 0;
  Tensor flat_param_, flat_grad_, shard_grad_;        // shard_grad_: zero2's gradient between steps
  std::vector<Tensor> pieces_;                        // parameter pieces in this rank's range
  std::vector<std::pair<size_t, int64_t>> piece_at_;  // each piece's parameter and first element in it
  std::unique_ptr<AdamW> opt_;
};

}  // namespace bt::dist
