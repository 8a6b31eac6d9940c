#include "runtime/dist/strategy.h"

#include <algorithm>

#include "runtime/dist/ddp.h"
#include "runtime/dist/zero.h"
#include "runtime/dist/zero3.h"
#include "runtime/optim/clip.h"

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

class LocalStrategy : public Strategy {
 public:
  LocalStrategy(const StrategyOptions& o, std::vector<ParamSpec> ps)
      : params_(tensors_of(ps)), opt_(full_adamw(ps, o.adamw)) {}
  std::string name() const override { return "local"; }
  void zero_grad() override { opt_->zero_grad(); }
  void before_backward(bool) override {}
  void after_backward() override {}
  double grad_norm() override { return global_grad_norm(params_); }
  void step(double lr, double scale) override {
    opt_->set_lr(lr);
    opt_->step(scale);
  }
  uint64_t optimizer_state_bytes() const override { return 2 * f32_bytes(params_); }
  uint64_t gradient_bytes() const override { return f32_bytes(params_); }
  uint64_t parameter_bytes() const override { return f32_bytes(params_); }

 protected:
  std::vector<Tensor> params_;
  std::unique_ptr<AdamW> opt_;
};

class DdpStrategy : public LocalStrategy {
 public:
  DdpStrategy(const StrategyOptions& o, std::vector<ParamSpec> ps, std::shared_ptr<ProcessGroup> pg)
      : LocalStrategy(o, ps), ddp_(tensors_of(ps), std::move(pg), o.bucket_mb) {
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
