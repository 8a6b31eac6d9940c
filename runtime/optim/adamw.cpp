#include "runtime/optim/adamw.h"

#include <cmath>
#include <utility>
#include <vector>

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

const AdamW::State& AdamW::state_of(const Tensor& p, const char* what) const {
  for (const State& s : state_)
    if (s.param.impl() == p.impl()) return s;
  BT_FAIL("AdamW::", what, ": a tensor of shape ", shape_str(p.shape()),
          " is not one of the optimizer's parameters");
}

AdamW::State& AdamW::state_of(const Tensor& p, const char* what) {
  return const_cast<State&>(std::as_const(*this).state_of(p, what));
}

std::pair<Tensor, Tensor> AdamW::moments(const Tensor& p) const {
  const State& s = state_of(p, "moments");
  return {s.m, s.v};
}

void AdamW::set_copy(const Tensor& p, const Tensor& copy) {
  State& s = state_of(p, "set_copy");
  BT_CHECK(
      !copy.defined() || ((copy.dtype() == DType::BF16 || copy.dtype() == DType::F32) &&
                          copy.numel() == p.numel() && copy.is_contiguous() && copy.device() == p.device()),
      "AdamW::set_copy: the copy of a parameter of shape ", shape_str(p.shape()), " on ", p.device(),
      " must be ", p.numel(), " contiguous bf16 or f32 values on that device");
  s.copy = copy;
}

AdamW::StepScalars AdamW::advance(double lr) {
  BT_CHECK(std::isfinite(lr) && lr >= 0, "AdamW: learning rate must be finite and >= 0, got ", lr);
  ++steps_;
  StepScalars s;
  s.lr = static_cast<float>(lr);
  s.bias1 = static_cast<float>(1.0 - std::pow(opts_.beta1, static_cast<double>(steps_)));
  s.bias2 = static_cast<float>(1.0 - std::pow(opts_.beta2, static_cast<double>(steps_)));
  return s;
}

void AdamW::retract() {
  BT_CHECK(steps_ > 0, "AdamW::retract: no step was counted");
  --steps_;
}

void AdamW::apply(const Tensor& hyper, const Tensor& scale) {
  NoGradGuard ng;
  auto check = [](const Tensor& t, int64_t n, const Tensor& p, const char* what) {
    BT_CHECK(t.defined() && t.dtype() == DType::F32 && t.numel() == n && t.is_contiguous() &&
                 t.device() == p.device(),
             "AdamW::apply: ", what, " must be ", n, " contiguous f32 value(s) on ", p.device());
  };
  // One call of the kernels for each run of parameters on one device (Note
  // [One AdamW launch] in kernels/cuda/adamw.cu); `grads` keeps the
  // contiguous gradients alive until then.
  std::vector<Tensor> grads;
  std::vector<kernels::AdamWArgs> args;
  std::vector<State*> updated;
  auto flush = [&] {
    if (args.empty()) return;
    detail::on_device(
        updated[0]->param.device(),
        [&] {
          for (const kernels::AdamWArgs& a : args) kernels::cpu::adamw(a);
        },
        BT_CUDA_LAMBDA(kernels::cuda::adamw_many(args, stream)));
    for (State* s : updated) {
      s->param.bump_version();
      if (s->copy.defined()) s->copy.bump_version();
    }
    grads.clear(), args.clear(), updated.clear();
  };
  for (State& s : state_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    check(hyper, 3, s.param, "hyper {lr, bias1, bias2}");
    check(scale, 1, s.param, "the gradient scale");
    g = g.contiguous();
    BT_CHECK(g.shape() == s.param.shape(), "AdamW: gradient shape ", shape_str(g.shape()),
             " does not match parameter ", shape_str(s.param.shape()));
    if (!updated.empty() && updated[0]->param.device() != s.param.device()) flush();
    kernels::AdamWArgs a;
    a.param = s.param.data<float>();
    a.grad = g.data_ptr();
    a.grad_dt = g.dtype();
    a.m = s.m.data<float>();
    a.v = s.v.data<float>();
    a.n = s.param.numel();
    a.beta1 = static_cast<float>(opts_.beta1);
    a.beta2 = static_cast<float>(opts_.beta2);
    a.eps = static_cast<float>(opts_.eps);
    a.weight_decay = static_cast<float>(s.weight_decay);
    a.hyper = hyper.data<float>();
    a.scale = scale.data<float>();
    if (s.copy.defined()) {
      a.param_copy = s.copy.data_ptr();
      a.copy_dt = s.copy.dtype();
    }
    grads.push_back(std::move(g));
    args.push_back(a);
    updated.push_back(&s);
  }
  flush();
}

void AdamW::step(double grad_scale) {
  const StepScalars h = advance(opts_.lr);
  if (state_.empty()) return;
  const TensorOptions o{DType::F32, state_[0].param.device()};
  apply(from_vector<float>({h.lr, h.bias1, h.bias2}, {3}, o),
        from_vector<float>({static_cast<float>(grad_scale)}, {1}, o));
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
