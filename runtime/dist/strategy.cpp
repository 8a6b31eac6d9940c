#include "runtime/dist/strategy.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/env.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/precision.h"
#include "runtime/dist/compute_copies.h"
#include "runtime/dist/ddp.h"
#include "runtime/dist/zero.h"
#include "runtime/dist/zero3.h"
#include "runtime/optim/clip.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {
namespace {

std::vector<Tensor> tensors_of(const std::vector<ParamSpec>& ps) {
  std::vector<Tensor> t;
  for (const ParamSpec& p : ps) t.push_back(p.param);
  return t;
}

/// AdamW over whole parameters, two groups (decay / none): local and ddp.
std::unique_ptr<AdamW> full_adamw(const std::vector<ParamSpec>& ps, const AdamWOptions& o) {
  std::vector<AdamW::Group> groups;
  for (const ParamSpec& p : ps) add_to_group(groups, p.param, p.weight_decay);
  return std::make_unique<AdamW>(std::move(groups), o);
}

uint64_t f32_bytes(const std::vector<Tensor>& ts) {
  uint64_t n = 0;
  for (const Tensor& t : ts) n += static_cast<uint64_t>(t.numel()) * sizeof(float);
  return n;
}

/// Under bf16, the copies a forward takes (Note [Compute copies]); null
/// otherwise, or when BT_COMPUTE_COPIES=0 (each forward casts, as before).
std::unique_ptr<ComputeCopies> compute_copies(const std::vector<ParamSpec>& ps, AdamW& opt) {
  if (precision() != Precision::BF16 ||
      env_int("BT_COMPUTE_COPIES", 1, 0, 1,
              "whether AdamW writes the bf16 weights (1) or each forward casts them (0)") == 0)
    return nullptr;
  auto c = std::make_unique<ComputeCopies>(ps, DType::BF16);
  for (const auto& [master, copy] : c->copies()) opt.set_copy(master, copy);
  return c;
}

class LocalStrategy : public Strategy {
 public:
  LocalStrategy(const StrategyOptions& o, std::vector<ParamSpec> ps)
      : specs_(ps),
        params_(tensors_of(ps)),
        opt_(full_adamw(ps, o.adamw)),
        copies_(compute_copies(ps, *opt_)) {}
  std::string name() const override { return "local"; }
  void zero_grad() override { opt_->zero_grad(/*set_to_none=*/true); }  // Note [Stealing the gradient]
  void before_backward(bool) override {}
  void after_backward() override {}
  Tensor grad_sum_squares() override { return bt::grad_sum_squares(params_, device()); }
  AdamW::StepScalars advance(double lr) override { return opt_->advance(lr); }
  void apply_step(const Tensor& hyper, const Tensor& scale) override {
    opt_->apply(hyper, scale);
    if (copies_) copies_->updated();
  }
  Device device() const override { return params_[0].device(); }
  nn::WeightSource* weight_source() override { return copies_.get(); }
  void step_skipped() override { opt_->retract(); }
  std::vector<std::pair<size_t, Tensor>> gradient_parts() const override {
    std::vector<std::pair<size_t, Tensor>> out;
    for (size_t i = 0; i < params_.size(); ++i)
      if (Tensor g = params_[i].grad(); g.defined()) out.emplace_back(i, std::move(g));
    return out;
  }
  uint64_t optimizer_state_bytes() const override { return 2 * f32_bytes(params_); }
  uint64_t gradient_bytes() const override { return f32_bytes(params_); }
  uint64_t parameter_bytes() const override { return f32_bytes(params_); }
  uint64_t compute_copy_bytes() const override { return copies_ ? copies_->bytes() : 0; }

  // Every rank holds everything; the write share of rank r of N is its range
  // [r*S, (r+1)*S) of the parameters laid end to end, S = ceil(P / N).
  std::vector<StatePiece> state_pieces(bool to_write) const override {
    int64_t total = 0;
    for (const Tensor& p : params_) total += p.numel();
    const int64_t s = (total + n_ - 1) / n_;
    const int64_t lo = to_write ? rank_ * s : 0, hi = to_write ? lo + s : total;
    std::vector<StatePiece> out;
    int64_t off = 0;
    for (const ParamSpec& p : specs_) {
      const int64_t n = p.param.numel();
      const auto [a, b] = overlap(lo, hi, off, n);
      if (a < b) {
        const auto [m, v] = opt_->moments(p.param);
        auto part = [&](const Tensor& t) { return t.reshape({-1}).narrow(0, a - off, b - a); };
        out.push_back(state_piece("param", p, a - off, part(p.param)));
        out.push_back(state_piece("adam_m", p, a - off, part(m)));
        out.push_back(state_piece("adam_v", p, a - off, part(v)));
      }
      off += n;
    }
    return out;
  }
  int64_t optimizer_steps() const override { return opt_->steps(); }
  void state_loaded(int64_t steps) override {
    opt_->set_steps(steps);
    for (const Tensor& p : params_) p.bump_version();
  }

 protected:
  std::vector<ParamSpec> specs_;
  int64_t rank_ = 0, n_ = 1;  // this rank's share of the state to write
  std::vector<Tensor> params_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<ComputeCopies> copies_;
};

class DdpStrategy : public LocalStrategy {
 public:
  DdpStrategy(const StrategyOptions& o, std::vector<ParamSpec> ps, std::shared_ptr<ProcessGroup> pg)
      : LocalStrategy(o, ps), ddp_(tensors_of(ps), std::move(pg), o.bucket_mb) {
    rank_ = ddp_.group().rank();
    n_ = ddp_.group().size();
    ddp_.broadcast_parameters();
  }
  std::string name() const override { return "ddp"; }
  void zero_grad() override { ddp_.zero_grad(); }
  void before_backward(bool last) override { ddp_.set_sync(last); }
  void after_backward() override { ddp_.finish(); }

 private:
  DataParallel ddp_;
};

}  // namespace

double Strategy::grad_norm() {
  NoGradGuard ng;
  return std::sqrt(grad_sum_squares().to(DType::F64).item<double>());
}

void Strategy::step(double lr, double grad_scale) {
  const AdamW::StepScalars h = advance(lr);
  const TensorOptions o{DType::F32, device()};
  apply_step(from_vector<float>({h.lr, h.bias1, h.bias2}, {3}, o),
             from_vector<float>({static_cast<float>(grad_scale)}, {1}, o));
}

Tensor sharded_sum_squares(const std::vector<Tensor>& pieces, const Device& device, ProcessGroup& pg) {
  NoGradGuard ng;
  Tensor sq = bt::grad_sum_squares(pieces, device).to(DType::F64);
  pg.all_reduce(sq, ReduceOp::Sum);
  return sq;
}

std::vector<std::pair<size_t, Tensor>> piece_gradients(const std::vector<Tensor>& pieces,
                                                       const std::vector<std::pair<size_t, int64_t>>& at) {
  std::vector<std::pair<size_t, Tensor>> out;
  for (size_t k = 0; k < pieces.size(); ++k)
    if (Tensor g = pieces[k].grad(); g.defined()) out.emplace_back(at[k].first, std::move(g));
  return out;
}

void record_cast_to_master(const char* name, const Tensor& param, const Tensor& w) {
  if (!GradMode::enabled() || !param.requires_grad()) return;
  autograd::record(name, {&param}, w, [](autograd::Grads& g) -> autograd::Grads {
    return {g[0].to(DType::F32)};
  }).any_grad_dtype = true;
}

StatePiece state_piece(const char* kind, const ParamSpec& p, int64_t begin, const Tensor& data) {
  return StatePiece{cat(kind, "/", p.name), p.param.shape(), begin, begin + data.numel(), data};
}

void add_to_group(std::vector<AdamW::Group>& groups, const Tensor& t, double wd) {
  auto it =
      std::find_if(groups.begin(), groups.end(), [&](const AdamW::Group& g) { return g.weight_decay == wd; });
  if (it == groups.end()) it = groups.insert(groups.end(), AdamW::Group{{}, wd});
  it->params.push_back(t);
}

std::unique_ptr<Strategy> make_strategy(const StrategyOptions& o, std::vector<ParamSpec> params,
                                        std::shared_ptr<ProcessGroup> pg) {
  if (o.name == "local") return std::make_unique<LocalStrategy>(o, std::move(params));
  BT_CHECK(pg != nullptr, "dist.strategy=", o.name, " needs a process group");
  if (o.name == "ddp") return std::make_unique<DdpStrategy>(o, std::move(params), std::move(pg));
  if (o.name == "zero1" || o.name == "zero2")
    return std::make_unique<ZeroStrategy>(o.name == "zero1" ? 1 : 2, o.adamw, std::move(params),
                                          std::move(pg));
  if (o.name == "zero3") return std::make_unique<Zero3Strategy>(o.adamw, std::move(params), std::move(pg));
  BT_FAIL("dist.strategy=", o.name, " is not available; use local, ddp, zero1, zero2 or zero3");
}

}  // namespace bt::dist
