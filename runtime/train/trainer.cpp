#include "runtime/train/trainer.h"

#include <chrono>

#include <sys/resource.h>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/profiler.h"
#include "runtime/core/stream.h"
#include "runtime/ops/elementwise.h"
#include "runtime/optim/clip.h"

namespace bt::train {

Device resolve_device(const std::string& spec) {
  const Device d = spec == "auto" ? (cuda_available() ? Device::cuda(0) : Device::cpu()) : parse_device(spec);
  check_device_usable(d);
  return d;
}

uint64_t peak_memory_bytes(const Device& d) {
  if (d.is_cuda()) return cuda_memory_stats(d.index).peak_allocated;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

Trainer::Trainer(const TrainConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  accum_ = cfg_.grad_accum();
  device_ = resolve_device(cfg_.train.device);
  set_precision(parse_precision(cfg_.train.precision));
  const TrainOptions& t = cfg_.train;
  const int64_t T = cfg_.model.seq_len;
  train_ = std::make_unique<TokenLoader>(cfg_.data.train, t.micro_batch, T, 0, 1, t.seed, cfg_.data.shuffle);
  if (!cfg_.data.val.empty())
    val_ = std::make_unique<TokenLoader>(cfg_.data.val, t.micro_batch, T, 0, 1, t.seed, /*shuffle=*/false);
  model_ = std::make_unique<nn::Gpt>(cfg_.model, device_, t.seed);

  AdamW::Group decay{{}, t.weight_decay}, no_decay{{}, 0.0};
  for (const Tensor& p : model_->parameters()) (nn::Gpt::decays(p) ? decay : no_decay).params.push_back(p);
  AdamWOptions o;
  o.lr = t.lr;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  opt_ = std::make_unique<AdamW>(std::vector<AdamW::Group>{decay, no_decay}, o);
  schedule_ = CosineSchedule{t.lr, t.min_lr, t.warmup_steps, t.steps};
  if (device_.is_cuda()) cuda_reset_peak_stats(device_.index);
}

StepStats Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  ProfileScope prof_step("step");
  {
    ProfileScope prof("zero_grad");
    opt_->zero_grad();
  }
  Tensor loss_sum;
  for (int64_t j = 0; j < accum_; ++j) {
    Tensor x, y, loss;
    {
      ProfileScope prof("data");
      Batch b = train_->next();
      x = b.inputs.to(device_, /*non_blocking=*/true);
      y = b.targets.to(device_, /*non_blocking=*/true);
    }
    {
      ProfileScope prof("forward");
      loss = model_->loss(x, y);
    }
    {
      ProfileScope prof("backward");
      (accum_ == 1 ? loss : mul(loss, 1.0 / static_cast<double>(accum_))).backward();
    }
    NoGradGuard ng;
    Tensor l = loss.detach();
    loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
  }
  StepStats s;
  {
    ProfileScope prof("grad_norm");
    s.grad_norm = global_grad_norm(model_->parameters());
  }
  s.lr = schedule_.at(step_);
  opt_->set_lr(s.lr);
  {
    ProfileScope prof("optimizer");
    opt_->step(clip_coefficient(s.grad_norm, cfg_.train.grad_clip));
  }
  s.loss = static_cast<double>(loss_sum.item<float>()) / static_cast<double>(accum_);
  if (device_.is_cuda()) Stream::current(device_).synchronize();
  s.step = ++step_;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.tokens = cfg_.train.batch_size * cfg_.model.seq_len;
  s.tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
  s.peak_mem_bytes = peak_memory_bytes(device_);
  return s;
}

double Trainer::evaluate() {
  BT_CHECK(val_ != nullptr, "evaluate: no validation data; set data.val to a glob of token shards");
  NoGradGuard ng;
  val_->restore(LoaderState{0, 0, cfg_.train.seed});
  const int64_t n = std::min<int64_t>(cfg_.train.eval_batches, val_->batches_per_epoch());
  Tensor total;
  for (int64_t i = 0; i < n; ++i) {
    Batch b = val_->next();
    Tensor l = model_->loss(b.inputs.to(device_, true), b.targets.to(device_, true));
    total = total.defined() ? add(total, l) : l;
  }
  return static_cast<double>(total.item<float>()) / static_cast<double>(n);
}

}  // namespace bt::train
