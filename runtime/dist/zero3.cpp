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
  // Note [ZeRO-3 units]: a unit's parameters of one compute dtype are a part.
  unit_parts_.resize(static_cast<size_t>(max_unit) + 1);
  for (const ParamSpec& p : params) {
    const DType dt = p.keep_f32 ? DType::F32 : compute_dtype_;
    std::vector<size_t>& ids = unit_parts_[static_cast<size_t>(p.unit)];
    auto it = std::find_if(ids.begin(), ids.end(), [&](size_t k) { return parts_[k].dtype == dt; });
    if (it == ids.end()) {
      ids.push_back(parts_.size());
      parts_.push_back(Part{});
      parts_.back().unit = p.unit;
      parts_.back().dtype = dt;
      it = ids.end() - 1;
    }
    Part& u = parts_[*it];
    u.members.push_back(members_.size());
    index_[p.param.impl()] = members_.size();
    members_.push_back(Member{p, p.param, *it, u.numel});
    u.numel += p.param.numel();
  }
  for (size_t k = 0; k < unit_parts_.size(); ++k)
    BT_CHECK(!unit_parts_[k].empty(), "Zero3Strategy: unit ", k,
             " has no parameters (units must be 0, 1, ...)");
  const int64_t n = pg_->size(), rank = pg_->rank();
  const TensorOptions f32 = TensorOptions{}.with_device(dev);
  std::vector<AdamW::Group> groups;
  for (size_t k = 0; k < parts_.size(); ++k) {
    Part& u = parts_[k];
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
    u.compute = released(n * u.shard, u.dtype, dev);

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
      members_[i].param.register_grad_ready_hook([this, k](const Tensor&) { on_grad_ready(k); });
    }
  }
  opt_ = std::make_unique<AdamW>(std::move(groups), o);
}

Zero3Strategy::~Zero3Strategy() {
  // Collectives still in flight write into buffers this object owns. A
  // collective that times out here is already being reported (the job ends).
  try {
    for (Part& u : parts_)
      if (u.gather) u.gather->wait();
    for (auto& w : reductions_) w->wait();
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
  }
}

uint64_t Zero3Strategy::shard_bytes() const {
  uint64_t n = 0;
  for (const Part& u : parts_) n += static_cast<uint64_t>(u.shard);
  return n * sizeof(float);
}

uint64_t Zero3Strategy::optimizer_state_bytes() const {
  uint64_t n = 0;
  for (const Tensor& p : pieces_) n += static_cast<uint64_t>(p.numel());
  return 2 * n * sizeof(float);
}

void Zero3Strategy::start_gather(Part& u) {
  if (u.resident || u.gather) return;
  NoGradGuard ng;
  storage_of(u.compute).reacquire(Stream::current(u.compute.device()));
  const Tensor in = u.dtype == DType::F32 ? u.master : u.master.to(u.dtype);
  u.gather = pg_->all_gather_async(in, u.compute);
}

void Zero3Strategy::ensure_gathered(Part& u) {
  start_gather(u);
  if (u.gather) {
    u.gather->wait();
    u.gather.reset();
  }
  u.resident = true;
}

void Zero3Strategy::release(Part& u) {
  if (u.gather) {  // a prefetch nobody used (a forward cut short)
    u.gather->wait();
    u.gather.reset();
  }
  storage_of(u.compute).release();
  u.resident = false;
}

const std::vector<size_t>& Zero3Strategy::parts_of(int unit) const {
  BT_CHECK(unit >= 0 && unit < num_units(), "zero3: unit ", unit, " is outside [0, ", num_units(), ")");
  return unit_parts_[static_cast<size_t>(unit)];
}

bool Zero3Strategy::gathered(int unit) const {
  bool all = true;
  for (size_t k : parts_of(unit)) all = all && parts_[k].resident;
  return all;
}

void Zero3Strategy::enter(int unit) {
  for (size_t k : parts_of(unit)) ensure_gathered(parts_[k]);
  if (unit + 1 < num_units())
    for (size_t k : parts_of(unit + 1)) start_gather(parts_[k]);  // forward prefetch
}

Tensor Zero3Strategy::weight(const Tensor& param) {
  auto it = index_.find(param.impl());
  BT_CHECK(it != index_.end(), "zero3: the model asked for a weight the strategy does not hold");
  const Member& m = members_[it->second];
  const Part& u = parts_[m.part];
  BT_CHECK(u.resident, "zero3: a weight of unit ", u.unit, " was used outside that unit's forward");
  Tensor w;
  {
    NoGradGuard ng;
    w = u.compute.narrow(0, m.offset, param.numel()).view(param.shape());
  }
  // The recorded cast of Note [ZeRO-3 units]: the gradient goes to the f32 leaf.
  record_cast_to_master("Zero3WeightBackward", param, w);
  return w;
}

std::vector<Tensor> Zero3Strategy::leave(int unit, const std::vector<Tensor>& outs) {
  if (unit != 0)
    for (size_t k : parts_of(unit)) release(parts_[k]);
  std::vector<const Tensor*> wrapped;
  for (const Tensor& o : outs)
    if (o.defined() && o.requires_grad()) wrapped.push_back(&o);
  if (!GradMode::enabled() || wrapped.empty()) return outs;
  // One node for all of them: backward re-enters the unit once, before any
  // of its gradients goes on into the unit.
  std::vector<Tensor> ys, ret = outs;
  {
    NoGradGuard ng;
    for (const Tensor* o : wrapped) ys.push_back(o->view(o->shape()));
  }
  autograd::record("Zero3UnitBackward", wrapped, ys, [this, unit](autograd::Grads& g) -> autograd::Grads {
    enter_backward(unit);
    return g;
  });
  for (size_t i = 0, j = 0; i < outs.size(); ++i)
    if (j < wrapped.size() && &outs[i] == wrapped[j]) ret[i] = ys[j++];
  return ret;
}

void Zero3Strategy::bind_grads(Part& u, const Tensor& flat) {
  for (size_t i : u.members) {
    const Member& m = members_[i];
    m.param.set_grad(flat.defined() ? flat.narrow(0, m.offset, m.param.numel()).view(m.param.shape())
                                    : Tensor());
  }
}

void Zero3Strategy::enter_backward(int unit) {
  NoGradGuard ng;
  for (size_t k : parts_of(unit)) ensure_gathered(parts_[k]);
  // Backward visits the blocks last to first after unit 0 (the head).
  const int prev = unit == 0 ? num_units() - 1 : unit - 1;
  if (prev > 0)
    for (size_t k : parts_of(prev)) start_gather(parts_[k]);
  for (size_t k : parts_of(unit)) {
    Part& u = parts_[k];
    if (!u.full_grad.defined()) {
      u.full_grad = zeros({pg_->size() * u.shard}, TensorOptions{}.with_device(u.master.device()));
      bind_grads(u, u.full_grad);
    }
    u.ready = 0;
  }
}

void Zero3Strategy::on_grad_ready(size_t part) {
  Part& u = parts_[part];
  if (++u.ready < static_cast<int>(u.members.size())) return;
  if (last_) reduce(u);
  release(u);
}

void Zero3Strategy::reduce(Part& u) {
  NoGradGuard ng;
  if (!u.full_grad.defined()) u.full_grad = zeros({pg_->size() * u.shard}, u.master.options());
  reductions_.push_back(pg_->reduce_scatter_async(u.full_grad, u.shard_grad, ReduceOp::Avg));
  bind_grads(u, Tensor());
  u.full_grad = Tensor();  // the collective keeps it alive until it is done
  u.reduced = true;
}

void Zero3Strategy::zero_grad() {
  for (Part& u : parts_) {
    if (u.full_grad.defined()) bind_grads(u, Tensor());
    u.full_grad = Tensor();  // allocated zeroed when backward first reaches the unit
    u.reduced = false;
  }
}

void Zero3Strategy::after_backward() {
  // A unit whose parameters got no gradient: every rank reduces it here, in
  // unit order (the same on every rank).
  for (Part& u : parts_)
    if (!u.reduced) reduce(u);
  for (auto& w : reductions_) w->wait();
  reductions_.clear();
}

Tensor Zero3Strategy::grad_sum_squares() { return sharded_sum_squares(pieces_, device(), *pg_); }

Device Zero3Strategy::device() const { return parts_[0].master.device(); }

void Zero3Strategy::apply_step(const Tensor& hyper, const Tensor& grad_scale) {
  opt_->apply(hyper, grad_scale);
  for (Part& u : parts_) {  // gathered values are stale now
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
  for (Part& u : parts_) {  // anything gathered holds the old values
    release(u);
    storage_of(u.full).release();
  }
}

void Zero3Strategy::gather_parameters() {
  NoGradGuard ng;
  for (Part& u : parts_) {
    storage_of(u.full).reacquire(Stream::current(u.full.device()));
    pg_->all_gather(u.master, u.full);
    u.full.bump_version();
  }
}

}  // namespace bt::dist
