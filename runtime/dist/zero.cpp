#include "runtime/dist/zero.h"

#include <algorithm>
#include <cmath>

#include "runtime/autograd/grad_mode.h"
#include "runtime/optim/clip.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {

ZeroStrategy::ZeroStrategy(int stage, const AdamWOptions& o, std::vector<ParamSpec> params,
                           std::shared_ptr<ProcessGroup> pg)
    : stage_(stage), params_(std::move(params)), pg_(std::move(pg)) {
  BT_CHECK(stage_ == 1 || stage_ == 2, "ZeroStrategy: stage must be 1 or 2, got ", stage_);
  BT_CHECK(!params_.empty(), "ZeroStrategy: no parameters");
  NoGradGuard ng;
  const Device dev = params_[0].param.device();
  int64_t total = 0;
  for (const ParamSpec& p : params_) {
    BT_CHECK(p.param.dtype() == DType::F32 && p.param.device() == dev && p.param.is_contiguous(),
             "ZeroStrategy: parameters must be contiguous f32 tensors, all on ", dev);
    offsets_.push_back(total);
    total += p.param.numel();
  }
  const int64_t n = pg_->size();
  shard_ = (total + n - 1) / n;
  padded_ = shard_ * n;

  // Note [ZeRO flat layout]: parameters become views of one padded buffer.
  const TensorOptions f32 = TensorOptions{}.with_device(dev);
  flat_param_ = zeros({padded_}, f32);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i].param;
    Tensor slot = flat_param_.narrow(0, offsets_[i], p.numel()).view(p.shape());
    slot.copy_(p);
    p.set_data_(slot);
  }
  pg_->broadcast(flat_param_, 0);  // every rank starts from rank 0's values

  if (stage_ == 2) shard_grad_ = zeros({shard_}, f32);
  zero_grad();  // allocates and binds the flat gradient

  // This rank's pieces of the parameters, each with its gradient and decay.
  const int64_t lo = pg_->rank() * shard_, hi = lo + shard_;
  std::vector<AdamW::Group> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t a = std::max(lo, offsets_[i]), b = std::min(hi, offsets_[i] + params_[i].param.numel());
    if (a >= b) continue;
    Tensor piece = flat_param_.narrow(0, a, b - a);
    piece.set_grad(stage_ == 1 ? flat_grad_.narrow(0, a, b - a) : shard_grad_.narrow(0, a - lo, b - a));
    pieces_.push_back(piece);
    piece_at_.emplace_back(i, a - offsets_[i]);
    add_to_group(groups, piece, params_[i].weight_decay);
  }
  opt_ = std::make_unique<AdamW>(std::move(groups), o);
}

void ZeroStrategy::bind_grads(const Tensor& flat_grad) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].param;
    p.set_grad(flat_grad.defined() ? flat_grad.narrow(0, offsets_[i], p.numel()).view(p.shape()) : Tensor());
  }
}

void ZeroStrategy::zero_grad() {
  NoGradGuard ng;
  if (stage_ == 1 && flat_grad_.defined()) {
    flat_grad_.zero_();
    return;
  }
  flat_grad_ = zeros({padded_}, TensorOptions{}.with_device(flat_param_.device()));
  bind_grads(flat_grad_);
}

void ZeroStrategy::after_backward() {
  NoGradGuard ng;
  Tensor mine = shard_of(flat_grad_);
  pg_->reduce_scatter(flat_grad_, mine, ReduceOp::Avg);
  if (stage_ == 2) {
    shard_grad_.copy_(mine);
    bind_grads(Tensor());
    flat_grad_ = Tensor();  // only the shard stays (Note [ZeRO flat layout])
  }
}

Tensor ZeroStrategy::grad_sum_squares() { return sharded_sum_squares(pieces_, device(), *pg_); }

Device ZeroStrategy::device() const { return flat_param_.device(); }

void ZeroStrategy::apply_step(const Tensor& hyper, const Tensor& grad_scale) {
  opt_->apply(hyper, grad_scale);
  pg_->all_gather(shard_of(flat_param_), flat_param_);
  flat_param_.bump_version();
}

std::vector<StatePiece> ZeroStrategy::state_pieces(bool to_write) const {
  // Parameters: all of them are here; this rank writes its range. AdamW's
  // moments: only this rank's pieces exist.
  std::vector<StatePiece> out;
  const int64_t lo = to_write ? pg_->rank() * shard_ : 0, hi = to_write ? lo + shard_ : padded_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto [a, b] = overlap(lo, hi, offsets_[i], params_[i].param.numel());
    if (a < b)
      out.push_back(state_piece("param", params_[i], a - offsets_[i], flat_param_.narrow(0, a, b - a)));
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const auto [m, v] = opt_->moments(pieces_[k]);
    const ParamSpec& p = params_[piece_at_[k].first];
    out.push_back(state_piece("adam_m", p, piece_at_[k].second, m));
    out.push_back(state_piece("adam_v", p, piece_at_[k].second, v));
  }
  return out;
}

void ZeroStrategy::state_loaded(int64_t steps) {
  opt_->set_steps(steps);
  flat_param_.bump_version();
}

uint64_t ZeroStrategy::optimizer_state_bytes() const {
  uint64_t n = 0;
  for (const Tensor& p : pieces_) n += static_cast<uint64_t>(p.numel());
  return 2 * n * sizeof(float);
}

uint64_t ZeroStrategy::gradient_bytes() const {
  return static_cast<uint64_t>(stage_ == 1 ? padded_ : shard_) * sizeof(float);
}

}  // namespace bt::dist
