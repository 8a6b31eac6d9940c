#include "runtime/train/trainer.h"

#include <chrono>

#include <sys/resource.h>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/profiler.h"
#include "runtime/core/stream.h"
#include "runtime/dist/world.h"
#include "runtime/ops/elementwise.h"
#include "runtime/optim/clip.h"
#include "runtime/tensor/factory.h"

namespace bt::train {

Device resolve_device(const std::string& spec, int local_rank) {
  Device d;
  if (spec == "auto")
    d = cuda_available() ? Device::cuda(local_rank % cuda_device_count()) : Device::cpu();
  else if (spec == "cuda")
    d = Device::cuda(local_rank);  // one GPU per rank on a host
  else
    d = parse_device(spec);
  check_device_usable(d);
  return d;
}

uint64_t peak_memory_bytes(const Device& d) {
  if (d.is_cuda()) return cuda_memory_stats(d.index).peak_allocated;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

Trainer::Trainer(const TrainConfig& cfg, const std::function<void(nn::Gpt&)>& init) : cfg_(cfg) {
  const dist::World& w = dist::world();
  rank_ = w.rank;
  world_ = w.size;
  cfg_.validate(world_);
  cfg_.train.micro_batch = cfg_.micro_batch_for(world_);  // Note [Batch split]: what this job runs
  accum_ = cfg_.grad_accum(world_);
  device_ = resolve_device(cfg_.train.device, w.local_rank);
  set_current_device(device_);  // each rank selects its GPU (cuda:local_rank)
  set_precision(parse_precision(cfg_.train.precision));
  const TrainOptions& t = cfg_.train;
  const int64_t T = cfg_.model.seq_len;
  train_ = std::make_unique<TokenLoader>(cfg_.data.train, t.micro_batch, T, rank_, world_, t.seed,
                                         cfg_.data.shuffle);
  if (!cfg_.data.val.empty())
    val_ = std::make_unique<TokenLoader>(cfg_.data.val, t.micro_batch, T, rank_, world_, t.seed,
                                         /*shuffle=*/false);
  model_ = std::make_unique<nn::Gpt>(cfg_.model, device_, t.seed);
  model_->set_recompute(cfg_.recompute());
  if (init) init(*model_);
  dist::StrategyOptions so;
  so.name = world_ > 1 ? cfg_.dist.strategy : "local";
  so.bucket_mb = cfg_.dist.bucket_mb;
  so.adamw.lr = t.lr;
  so.adamw.beta1 = t.beta1;
  so.adamw.beta2 = t.beta2;
  so.adamw.eps = t.eps;
  if (world_ > 1) {
    pg_ = dist::device_group(device_);
    pg_->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(cfg_.dist.timeout_s * 1000)));
  }
  std::vector<dist::ParamSpec> ps;
  const std::vector<int> units = model_->param_units();
  const nn::NamedTensors& named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& p = named[i].second;
    ps.push_back({p, nn::Gpt::decays(p) ? t.weight_decay : 0.0, units[i], named[i].first,
                  nn::Gpt::keeps_f32(named[i].first)});
  }
  strategy_ = dist::make_strategy(so, std::move(ps), pg_);
  model_->set_weight_source(strategy_->weight_source());
  schedule_ = CosineSchedule{t.lr, t.min_lr, t.warmup_steps, t.steps};
  if (device_.is_cuda()) cuda_reset_peak_stats(device_.index);
}

StepStats Trainer::step() {
  BT_CHECK(!finished_, "Trainer::step: training was finished (finish_training)");
  const auto t0 = std::chrono::steady_clock::now();
  ProfileScope prof_step("step");
  if (pg_) pg_->set_step(step_ + 1);
  {
    ProfileScope prof("zero_grad");
    strategy_->zero_grad();
  }
  Tensor loss_sum;
  for (int64_t j = 0; j < accum_; ++j) {
    Tensor x, y, loss;
    {
      ProfileScope prof("data");
      Batch b = train_->next();
      x = b.inputs.to(device_, /*non_blocking=*/true);
      y = b.targets;  // checked on the host by the loss, then copied (Note [Targets on the host])
    }
    {
      ProfileScope prof("forward");
      loss = model_->loss(x, y);
    }
    {
      ProfileScope prof("backward");
      strategy_->before_backward(j == accum_ - 1);  // ranks communicate on the last micro-step only
      (accum_ == 1 ? loss : mul(loss, 1.0 / static_cast<double>(accum_))).backward();
    }
    NoGradGuard ng;
    Tensor l = loss.detach();
    loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
  }
  {
    ProfileScope prof("grad_sync");
    strategy_->after_backward();
  }
  StepStats s;
  {
    ProfileScope prof("grad_norm");
    s.grad_norm = strategy_->grad_norm();
  }
  s.lr = schedule_.at(step_);
  {
    ProfileScope prof("optimizer");
    if (update_fence_) {  // a checkpoint snapshot still reads the parameters
      stream_wait(Stream::current(device_), *update_fence_);
      update_fence_.reset();
    }
    strategy_->step(s.lr, clip_coefficient(s.grad_norm, cfg_.train.grad_clip));
  }
  s.loss = mean_over_ranks(static_cast<double>(loss_sum.item<float>()) / static_cast<double>(accum_));
  if (device_.is_cuda()) Stream::current(device_).synchronize();
  s.step = ++step_;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.tokens = cfg_.train.batch_size * cfg_.model.seq_len;
  s.tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
  s.peak_mem_bytes = peak_memory_bytes(device_);
  s.optimizer_state_bytes = strategy_->optimizer_state_bytes();
  s.gradient_bytes = strategy_->gradient_bytes();
  s.parameter_bytes = strategy_->parameter_bytes();
  return s;
}

TrainerCounters Trainer::counters() const {
  TrainerCounters c;
  c.step = step_;
  c.optimizer_steps = strategy_->optimizer_steps();
  const LoaderState ls = train_->state();
  c.data_epoch = ls.epoch;
  c.data_samples = ls.position * cfg_.train.micro_batch * world_;
  c.rng_seed = default_generator().seed();
  c.rng_offset = default_generator().offset();
  return c;
}

void Trainer::restore(const TrainerCounters& c) {
  const int64_t batch = cfg_.train.micro_batch * world_;
  BT_CHECK(c.data_samples % batch == 0, "the checkpoint's data position (", c.data_samples,
           " samples into epoch ", c.data_epoch, ") is not a multiple of train.micro_batch x ranks = ", batch,
           "; resume with a micro-batch and rank count whose product divides it");
  train_->restore(LoaderState{c.data_epoch, c.data_samples / batch, cfg_.train.seed});
  strategy_->state_loaded(c.optimizer_steps);
  default_generator().set_state(c.rng_seed, c.rng_offset);
  step_ = c.step;
}

void Trainer::finish_training() {
  if (finished_) return;
  strategy_->gather_parameters();
  model_->set_weight_source(nullptr);
  finished_ = true;
}

double Trainer::evaluate() {
  BT_CHECK(val_ != nullptr, "evaluate: no validation data; set data.val to a glob of token shards");
  NoGradGuard ng;
  val_->restore(LoaderState{0, 0, cfg_.train.seed});
  const int64_t n = std::min<int64_t>(cfg_.train.eval_batches, val_->batches_per_epoch());
  Tensor total;
  for (int64_t i = 0; i < n; ++i) {
    Batch b = val_->next();
    Tensor l = model_->loss(b.inputs.to(device_, true), b.targets);
    total = total.defined() ? add(total, l) : l;
  }
  return mean_over_ranks(static_cast<double>(total.item<float>()) / static_cast<double>(n));
}

bool Trainer::all_ranks(bool ok) { return mean_over_ranks(ok ? 1.0 : 0.0) == 1.0; }

double Trainer::mean_over_ranks(double v) {
  if (!pg_) return v;
  Tensor t = full({1}, v, TensorOptions{}.with_dtype(DType::F64).with_device(device_));
  pg_->all_reduce(t, dist::ReduceOp::Avg);
  return t.item<double>();
}

}  // namespace bt::train
