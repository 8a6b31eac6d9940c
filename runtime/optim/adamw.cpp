#include "runtime/optim/adamw.h"

#include <cmath>

#include "kernels/adamw.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/meta.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {

AdamW::AdamW(std::vector<Group> groups, const AdamWOptions& opts) : opts_(opts) {
  BT_CHECK(opts.lr >= 0, "AdamW: learning rate must be >= 0, got ", opts.lr);
  BT_CHECK(opts.beta1 >= 0 && opts.beta1 < 1 && opts.beta2 >= 0 && opts.beta2 < 1,
           "AdamW: betas must be in [0, 1), got (", opts.beta1, ", ", opts.beta2, ")");
  BT_CHECK(opts.eps > 0, "AdamW: eps must be > 0, got ", opts.eps);
  for (Group& g : groups)
    for (Tensor& p : g.params) {
      BT_CHECK(p.dtype() == DType::F32, "AdamW: parameters must be f32 master weights, got ", p.dtype(),
               "; keep bf16 compute copies separately");
      BT_CHECK(p.is_contiguous(), "AdamW: parameters must be contiguous (shape ", shape_str(p.shape()), ")");
      TensorOptions o{DType::F32, p.device()};
      state_.push_back({p, zeros(p.shape(), o), zeros(p.shape(), o), g.weight_decay});
    }
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& opts)
    : AdamW(std::vector<Group>{Group{std::move(params), opts.weight_decay}}, opts) {}

std::pair<Tensor, Tensor> AdamW::moments(const Tensor& p) const {
  for (const State& s : state_)
    if (s.param.impl() == p.impl()) return {s.m, s.v};
  BT_FAIL("AdamW::moments: a tensor of shape ", shape_str(p.shape()),
          " is not one of the optimizer's parameters");
}

void AdamW::step(double grad_scale) {
  NoGradGuard ng;
  ++steps_;
  const float bias1 = static_cast<float>(1.0 - std::pow(opts_.beta1, static_cast<double>(steps_)));
  const float bias2 = static_cast<float>(1.0 - std::pow(opts_.beta2, static_cast<double>(steps_)));
  for (State& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    BT_CHECK(g.shape() == s.param.shape(), "AdamW: gradient shape ", shape_str(g.shape()),
             " does not match parameter ", shape_str(s.param.shape()));
    kernels::AdamWArgs a;
    a.param = s.param.data<float>();
    a.grad = g.data_ptr();
    a.grad_dt = g.dtype();
    a.m = s.m.data<float>();
    a.v = s.v.data<float>();
    a.n = s.param.numel();
    a.lr = static_cast<float>(opts_.lr);
    a.beta1 = static_cast<float>(opts_.beta1);
    a.beta2 = static_cast<float>(opts_.beta2);
    a.eps = static_cast<float>(opts_.eps);
    a.weight_decay = static_cast<float>(s.weight_decay);
    a.bias1 = bias1;
    a.bias2 = bias2;
    a.grad_scale = static_cast<float>(grad_scale);
    detail::on_device(
        s.param.device(), [&] { kernels::cpu::adamw(a); }, BT_CUDA_LAMBDA(kernels::cuda::adamw(a, stream)));
    s.param.bump_version();
  }
}

void AdamW::zero_grad(bool set_to_none) {
  for (State& s : state_) {
    if (!set_to_none)
      s.param.zero_grad();
    else if (AutogradMeta* m = autograd::meta_or_null(s.param))
      m->grad = Tensor();
  }
}

}  // namespace bt
