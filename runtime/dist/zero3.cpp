#include "runtime/dist/zero3.h"

#include <algorithm>
#include <cmath>

#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/precision.h"
#include "runtime/optim/clip.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {
namespace {

/// A flat tensor whose storage is released at once (Note [Released storage]).
Tensor released(int64_t n, DType dt, const Device& dev) {
  Tensor t = empty({n}, TensorOptions{}.with_dtype(dt).with_device(dev));
  t.impl()->storage->release();
  return t;
}

Storage& storage_of(const Tensor& t) { return *t.impl()->storage; }

}  // namespace

Zero3Strategy::Zero3Strategy(const AdamWOptions& o, std::vector<ParamSpec> params,
                             std::shared_ptr<ProcessGroup> pg)
    : pg_(std::move(pg)), compute_dtype_(precision() == Precision::BF16 ? DType::BF16 : DType::F32) {
  BT_CHECK(!params.empty(), "Zero3Strategy: no parameters");
  NoGradGuard ng;
  const Device dev = params[0].param.device();
  int max_unit = 0;
  for (const ParamSpec& p : params) {
    BT_CHECK(p.param.dtype() == DType::F32 && p.param.device() == dev && p.param.is_contiguous() &&
                 p.param.requires_grad() && p.param.is_leaf(),
             "Zero3Strategy: parameters must be contiguous f32 leaves that require grad, all on ", dev);
    BT_CHECK(p.unit >= 0, "Zero3Strategy: parameter unit ", p.unit, " is negative");
    max_unit = std::max(max_unit, p.unit);
  }
  units_.resize(static_cast<size_t>(max_unit) + 1);
  for (const ParamSpec& p : params) {
    Unit& u = units_[static_cast<size_t>(p.unit)];
    u.members.push_back(members_.size());
    index_[p.param.impl()] = members_.size();
    members_.push_back(Member{p, p.param, p.unit, u.numel});
    u.numel += p.param.numel();
  }
  const int64_t n = pg_->size(), rank = pg_->rank();
  const TensorOptions f32 = TensorOptions{}.with_device(dev);
  std::vector<AdamW::Group> groups;
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = units_[k];
    BT_CHECK(!u.members.empty(), "Zero3Strategy: unit ", k, " has no parameters (units must be 0, 1, ...)");
    u.shard = (u.numel + n - 1) / n;
    // The unit's flat layout (Note [ZeRO-3 units]); rank 0's values win.
    Tensor flat = zeros({n * u.shard}, f32);
    for (size_t i : u.members) {
      Member& m = members_[i];
      Tensor slot = flat.narrow(0, m.offset, m.param.numel()).view(m.param.shape());
      slot.copy_(m.param);
      m.param.set_data_(slot);  // the parameter's own memory goes
    }
    pg_->broadcast(flat, 0);
    u.master = flat.narrow(0, rank * u.shard, u.shard).clone();
    u.shard_grad = zeros({u.shard}, f32);
    u.full = flat;
    storage_of(u.full).release();  // the parameters keep shapes, not values
    u.compute = released(n * u.shard, compute_dtype_, dev);

    // This rank's pieces of the unit's parameters, split at their boundaries
    // so weight decay still applies per parameter.
    const int64_t lo = rank * u.shard, hi = lo + u.shard;
    for (size_t i : u.members) {
      const Member& m = members_[i];
      const int64_t a = std::max(lo, m.offset), b = std::min(hi, m.offset + m.param.numel());
      if (a >= b) continue;
      Tensor piece = u.master.narrow(0, a - lo, b - a);
      piece.set_grad(u.shard_grad.narrow(0, a - lo, b - a));
      pieces_.push_back(piece);
      piece_at_.emplace_back(i, a - m.offset);
      add_to_group(groups, piece, params[i].weight_decay);
    }
    for (size_t i : u.members) {
      members_[i].param.register_grad_ready_hook(
          [this, k](const Tensor&) { on_grad_ready(static_cast<int>(k)); });
    }
  }
  opt_ = std::make_unique<AdamW>(std::move(groups), o);
}

Zero3Strategy::~Zero3Strategy() {
  // Collectives still in flight write into buffers this object owns. A
  // collective that times out here is already being reported (the job ends).
  try {
    for (Unit& u : units_)
      if (u.gather) u.gather->wait();
    for (auto& w : reductions_) w->wait();
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
  }
}

uint64_t Zero3Strategy::shard_bytes() const {
  uint64_t n = 0;
  for (const Unit& u : units_) n += static_cast<uint64_t>(u.shard);
  return n * sizeof(float);
}

uint64_t Zero3Strategy::optimizer_state_bytes() const {
  uint64_t n = 0;
  for (const Tensor& p : pieces_) n += static_cast<uint64_t>(p.numel());
  return 2 * n * sizeof(float);
}

void Zero3Strategy::start_gather(Unit& u) {
  if (u.resident || u.gather) return;
  NoGradGuard ng;
  storage_of(u.compute).reacquire(Stream::current(u.compute.device()));
  const Tensor in = compute_dtype_ == DType::F32 ? u.master : u.master.to(compute_dtype_);
  u.gather = pg_->all_gather_async(in, u.compute);
}

void Zero3Strategy::ensure_gathered(Unit& u) {
  start_gather(u);
  if (u.gather) {
    u.gather->wait();
    u.gather.reset();
  }
  u.resident = true;
}

void Zero3Strategy::release(Unit& u) {
  if (u.gather) {  // a prefetch nobody used (a forward cut short)
    u.gather->wait();
    u.gather.reset();
  }
  storage_of(u.compute).release();
  u.resident = false;
}

void Zero3Strategy::enter(int unit) {
  ensure_gathered(units_.at(static_cast<size_t>(unit)));
  if (unit + 1 < num_units()) start_gather(units_[static_cast<size_t>(unit) + 1]);  // forward prefetch
}

Tensor Zero3Strategy::weight(const Tensor& param) {
  auto it = index_.find(param.impl());
  BT_CHECK(it != index_.end(), "zero3: the model asked for a weight the strategy does not hold");
  const Member& m = members_[it->second];
  const Unit& u = units_[static_cast<size_t>(m.unit)];
  BT_CHECK(u.resident, "zero3: a weight of unit ", m.unit, " was used outside that unit's forward");
  Tensor w;
  {
    NoGradGuard ng;
    w = u.compute.narrow(0, m.offset, param.numel()).view(param.shape());
  }
  if (GradMode::enabled()) {
    // The recorded cast of Note [ZeRO-3 units]: the gradient goes to the f32
    // leaf, uncopied when it comes in f32 (Note [Gradients in a wider dtype]).
    autograd::record("Zero3WeightBackward", {&param}, w, [](autograd::Grads& g) -> autograd::Grads {
      return {g[0].to(DType::F32)};
    }).any_grad_dtype = true;
  }
  return w;
}

Tensor Zero3Strategy::leave(int unit, const Tensor& out) {
  const bool grad = GradMode::enabled() && out.requires_grad();
  if (unit != 0) release(units_.at(static_cast<size_t>(unit)));
  if (!grad) return out;
  Tensor y;
  {
    NoGradGuard ng;
    y = out.view(out.shape());
  }
  autograd::record("Zero3UnitBackward", {&out}, y, [this, unit](autograd::Grads& g) -> autograd::Grads {
    enter_backward(unit);
    return {g[0]};
  });
  return y;
}

void Zero3Strategy::bind_grads(Unit& u, const Tensor& flat) {
  for (size_t i : u.members) {
    const Member& m = members_[i];
    m.param.set_grad(flat.defined() ? flat.narrow(0, m.offset, m.param.numel()).view(m.param.shape())
                                    : Tensor());
  }
}

void Zero3Strategy::enter_backward(int unit) {
  NoGradGuard ng;
  Unit& u = units_[static_cast<size_t>(unit)];
  ensure_gathered(u);
  // Backward visits the blocks last to first after unit 0 (the head).
  const int prev = unit == 0 ? num_units() - 1 : unit - 1;
  if (prev > 0) start_gather(units_[static_cast<size_t>(prev)]);
  if (!u.full_grad.defined()) {
    u.full_grad = zeros({pg_->size() * u.shard}, TensorOptions{}.with_device(u.master.device()));
    bind_grads(u, u.full_grad);
  }
  u.ready = 0;
}

void Zero3Strategy::on_grad_ready(int unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  if (++u.ready < static_cast<int>(u.members.size())) return;
  if (last_) reduce(u);
  release(u);
}

void Zero3Strategy::reduce(Unit& u) {
  NoGradGuard ng;
  if (!u.full_grad.defined()) u.full_grad = zeros({pg_->size() * u.shard}, u.master.options());
  reductions_.push_back(pg_->reduce_scatter_async(u.full_grad, u.shard_grad, ReduceOp::Avg));
  bind_grads(u, Tensor());
  u.full_grad = Tensor();  // the collective keeps it alive until it is done
  u.reduced = true;
}

void Zero3Strategy::zero_grad() {
  for (Unit& u : units_) {
    if (u.full_grad.defined()) bind_grads(u, Tensor());
    u.full_grad = Tensor();  // allocated zeroed when backward first reaches the unit
    u.reduced = false;
  }
}

void Zero3Strategy::after_backward() {
  // A unit whose parameters got no gradient: every rank reduces it here, in
  // unit order (the same on every rank).
  for (Unit& u : units_)
    if (!u.reduced) reduce(u);
  for (auto& w : reductions_) w->wait();
  reductions_.clear();
}

Tensor Zero3Strategy::grad_sum_squares() { return sharded_sum_squares(pieces_, device(), *pg_); }

Device Zero3Strategy::device() const { return units_[0].master.device(); }

void Zero3Strategy::apply_step(const Tensor& hyper, const Tensor& grad_scale) {
  opt_->apply(hyper, grad_scale);
  for (Unit& u : units_) {  // gathered values are stale now
    release(u);
    storage_of(u.full).release();
  }
}

std::vector<StatePiece> Zero3Strategy::state_pieces(bool) const {
  // Only this rank's pieces exist, masters and moments alike: they are both
  // what it writes and what it must fill.
  std::vector<StatePiece> out;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ParamSpec& p = members_[piece_at_[k].first].spec;
    const int64_t begin = piece_at_[k].second;
    const auto [m, v] = opt_->moments(pieces_[k]);
    out.push_back(state_piece("param", p, begin, pieces_[k]));
    out.push_back(state_piece("adam_m", p, begin, m));
    out.push_back(state_piece("adam_v", p, begin, v));
  }
  return out;
}

void Zero3Strategy::state_loaded(int64_t steps) {
  opt_->set_steps(steps);
  for (Unit& u : units_) {  // anything gathered holds the old values
    release(u);
    storage_of(u.full).release();
  }
}

void Zero3Strategy::gather_parameters() {
  NoGradGuard ng;
  for (Unit& u : units_) {
    storage_of(u.full).reacquire(Stream::current(u.full.device()));
    pg_->all_gather(u.master, u.full);
    u.full.bump_version();
  }
}

}  // namespace bt::dist
