#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <sys/resource.h>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/compile/lazy.h"
#include "runtime/core/precision.h"
#include "runtime/core/profiler.h"
#include "runtime/core/stream.h"
#include "runtime/dist/world.h"
#include "runtime/nn/registry.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/optim/clip.h"
#include "runtime/tensor/factory.h"

namespace bt::train {

// Note [Whole-step CUDA graphs]
// A GPT-2 step queues about two thousand kernels, many of them short, and the
// host work around each (autograd, the allocator, argument checks) can leave
// the GPU idle between them. With train.cuda_graph (the default) and a CUDA
// device, the Trainer runs its first kEagerSteps steps eagerly, then captures
// the whole device part of a step -- the batches' host-to-device copies,
// forward, backward, the gradient norm and clipping factor, AdamW -- as one
// CUDA graph (runtime/core/cuda_graph.h), and from then on each step is one
// graph launch. What makes that correct:
//   - Static inputs. The graph replays the copies it captured, from the same
//     addresses: each micro-batch is checked and copied on the host into
//     pinned staging tensors (inputs_, targets_), and AdamW's per-step scalars
//     into hyper_ (Note [Step scalars] in runtime/optim/adamw.h). The clipping
//     factor is computed on the device (clip_scale). The loss and norm land in
//     report_, read back after the step. Eager steps use the same staging,
//     kernels and values, so they give the same bits as replays.
//   - Checks on the host. A capture cannot read the device back, so the token
//     ids are checked here (stage()) and the embedding's device check stands
//     down during the capture; every target being a real id, cross-entropy's
//     count of counted rows (baked into the graph) is the same every step.
//   - A private memory pool. Steps run on the Trainer's own stream; the
//     caching allocator keeps blocks per stream, so the eager steps warm a
//     pool that the capture reuses without new segments, and after the
//     capture only replays run on that stream: nothing else can take the
//     blocks the graph uses between its nodes (Note [Allocation under
//     capture] in runtime/alloc/caching_pool.cpp). Work outside steps
//     (evaluation, checkpoints, sampling) runs on other streams; each step
//     first waits for them and ends synchronized.
//   - Host state that does not move. Everything the captured work touches
//     on the host stays put between replays: parameters, gradients and
//     optimizer state keep their buffers; the host-side AdamW count advances
//     in advance(), outside the graph.
//   - Collectives inside. In a job of several ranks on GPUs the NCCL
//     collectives of the step (DDP's bucket all-reduces from the gradient
//     hooks, ZeRO's reduce-scatters and all-gathers, ZeRO-3's gathers of each
//     unit, the sharded gradient norm) are recorded with it, their stream
//     forked into the capture and joined back; gradient accumulation only
//     changes which micro-step's hooks launch them, which is fixed. Each
//     replay then gets one deadline (ProcessGroup::watch) in place of the
//     one each collective had (Note [Collectives in a CUDA graph] in
//     runtime/dist/nccl_process_group.h). The mean loss over ranks stays an
//     eager all-reduce after the replay.
// Not captured, so steps stay eager: a process group whose collectives run on
// the host (graph_blocker()), BT_PROFILE (it synchronizes inside the step),
// the CPU. A capture that fails falls back to eager steps with a notice; the
// switch and the reason are logged (take_notice()).

// Note [Non-finite steps]
// A NaN or an infinity in one gradient, on one rank, must not reach the
// weights: a checkpoint of that step would keep them, and every later step
// would build on them. So a step whose gradients or loss are not finite does
// not update at all, whatever train.nonfinite says:
//   - The gate is on the device, inside the step (a CUDA graph replays it):
//     clip_scale turns the global gradient norm and the step's loss into the
//     gradient multiplier, NaN when either is not finite, and the AdamW
//     kernels write nothing when their multiplier is not finite
//     (kernels/adamw.h). Parameters, m and v keep their bits.
//   - Every rank decides the same. A non-finite gradient on one rank reaches
//     every rank's reduced gradients, so the global norm is not finite on all
//     of them; the loss the gate reads is the sum over ranks (an all-reduce in
//     the step, which the reported mean also comes from). So no extra
//     collective is needed to agree, and none can disagree.
//   - On the host afterwards the step is counted out of AdamW's step count
//     (Strategy::step_skipped), so the next update uses the bias corrections
//     it would have used. The step itself still counts: its batch was
//     consumed and the learning-rate schedule moves on, as if that batch's
//     update had been zero and AdamW had not seen it.
//   - nonfinite_cause names the first parameter, in the model's order, whose
//     gradient (this rank's part, after the reduction) holds a NaN or an
//     infinity on any rank: one all-reduce of a flag per parameter, on this
//     failure path only. x * 0 is 0 for a finite x and NaN otherwise, so the
//     sum of g * 0 tells without a new kernel.
// train.nonfinite=stop (the default) ends the run with that message; skip
// goes on with the next batch, and stops once more than
// train.max_skipped_steps steps in a row were skipped.
// Tests make a gradient non-finite through BT_FAULT_NONFINITE=STEPS:PARAM[:RANK]
// (STEPS = N or N-M): a grad-ready hook, registered before the strategy's,
// multiplies PARAM's gradient by a staged device scalar, NaN in those steps
// and 1 otherwise (x * 1 keeps x's bits), on every rank or on RANK only.

namespace {
constexpr int64_t kEagerSteps = 2;  // before the capture: the allocator and cuBLASLt are warm after these
}  // namespace

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

Trainer::Trainer(const TrainConfig& cfg, const std::function<void(nn::Model&)>& init) : cfg_(cfg) {
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
  model_ = nn::make_model(cfg_.model, device_, t.seed);
  model_->set_recompute(cfg_.recompute());
  if (init) init(*model_);
  install_fault();  // before the strategy: its hook must see the gradient first
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
    ps.push_back({p, model_->decays(named[i].first) ? t.weight_decay : 0.0, units[i], named[i].first,
                  model_->keeps_f32(named[i].first)});
  }
  strategy_ = dist::make_strategy(so, std::move(ps), pg_);
  model_->set_weight_source(strategy_->weight_source());
  schedule_ = CosineSchedule{t.lr, t.min_lr, t.warmup_steps, t.steps};

  // Staging and streams (Note [Whole-step CUDA graphs]).
  const bool cuda = device_.is_cuda();
  stream_ = cuda ? Stream::create(device_) : Stream::current(device_);
  const TensorOptions host{DType::I32, Device::cpu(), false, /*pinned=*/cuda};
  for (int64_t j = 0; j < accum_; ++j) {
    inputs_.push_back(empty({t.micro_batch, T}, host));
    targets_.push_back(empty({t.micro_batch, T}, host));
  }
  hyper_ = empty({3}, TensorOptions{DType::F32, Device::cpu(), false, cuda});
  report_ = zeros({2}, TensorOptions{DType::F64, device_});
  if (!cuda || !t.cuda_graph)
    graph_off_ = cuda ? "train.cuda_graph is false" : "not a CUDA device";
  else if (pg_ && !pg_->graph_blocker().empty())
    graph_off_ = cat("the ", pg_->backend(), " process group of this job of ", world_,
                     " ranks cannot be captured: ", pg_->graph_blocker());
  else if (profiling_enabled())
    graph_off_ = "BT_PROFILE synchronizes inside the step";
  if (cuda && t.cuda_graph && !graph_off_.empty()) notice_ = "CUDA graphs off: " + graph_off_;
  // train.compile (Note [Lazy fusion] in runtime/compile/lazy.h): the step's
  // fusible ops are recorded and computed as compiled fusion groups.
  if (cfg_.compile_on(cuda)) {
    const char* env = std::getenv("BT_COMPILE");
    const std::string why = env && std::string(env) == "0" ? std::string("BT_COMPILE=0 is set")
                                                           : fusion::backend()->unavailable(device_);
    compile_ = why.empty();
    const std::string line =
        compile_ ? cat("train.compile: fusing the step's elementwise and reduction regions (",
                       fusion::backend()->describe(),
                       cfg_.compile.dump.empty() ? "" : ", dumps in " + cfg_.compile.dump, ")")
                 : cat("train.compile: off, the step runs eagerly: ", why);
    notice_ = notice_.empty() ? line : notice_ + "\n" + line;
  }
  if (cuda) cuda_reset_peak_stats(device_.index);
}

void Trainer::install_fault() {
  const char* env = std::getenv("BT_FAULT_NONFINITE");
  if (env == nullptr || *env == '\0') return;
  const std::string spec = env;
  long long first = 0, last = 0;
  int used = 0;
  const bool range = std::sscanf(spec.c_str(), "%lld-%lld:%n", &first, &last, &used) == 2 && used > 0;
  if (!range) {
    used = 0;
    BT_CHECK(std::sscanf(spec.c_str(), "%lld:%n", &first, &used) == 1 && used > 0, "BT_FAULT_NONFINITE='",
             spec, "': expected STEPS:PARAM[:RANK], STEPS = N or N-M");
    last = first;
  }
  std::string param = spec.substr(static_cast<size_t>(used));
  int only_rank = -1;
  if (const size_t colon = param.rfind(':'); colon != std::string::npos) {
    char* end = nullptr;
    const long r = std::strtol(param.c_str() + colon + 1, &end, 10);
    BT_CHECK(colon + 1 < param.size() && *end == '\0' && r >= 0 && r < world_, "BT_FAULT_NONFINITE='", spec,
             "': RANK must be a rank of this job, 0 to ", world_ - 1);
    only_rank = static_cast<int>(r);
    param.resize(colon);
  }
  BT_CHECK(first >= 1 && last >= first, "BT_FAULT_NONFINITE='", spec, "': steps must be 1 <= N <= M");
  const nn::NamedTensors& named = model_->named_parameters();
  const auto it = std::find_if(named.begin(), named.end(), [&](const auto& p) { return p.first == param; });
  BT_CHECK(it != named.end(), "BT_FAULT_NONFINITE='", spec, "': the model has no parameter '", param,
           "' (its first is '", named.front().first, "')");
  if (only_rank >= 0 && only_rank != rank_) return;
  fault_first_ = first;
  fault_last_ = last;
  const bool cuda = device_.is_cuda();
  poison_host_ = full({1}, 1.0, TensorOptions{DType::F32, Device::cpu(), false, /*pinned=*/cuda});
  it->second.register_grad_ready_hook([this](const Tensor& leaf) {
    NoGradGuard ng;
    Tensor g = leaf.grad();
    g.copy_(mul(g, poison_));
  });
}

void Trainer::stage(int64_t j, const Batch& b) {
  const int64_t vocab = cfg_.model.vocab_size;
  auto put = [&](const Tensor& src, Tensor& dst, const char* what) {
    BT_CHECK(src.shape() == dst.shape() && src.dtype() == DType::I32 && src.is_contiguous(),
             "Trainer: the loader's ", what, " are ", src.dtype(), " ", shape_str(src.shape()),
             ", expected i32 ", shape_str(dst.shape()));
    // One branch-free pass finds whether any id is out of range (a step's
    // 16K ids in a few microseconds, while the GPU waits for the step); the
    // position is looked for only then.
    const int32_t* ids = src.data<int32_t>();
    const int64_t n = src.numel();
    const auto lim = static_cast<uint32_t>(std::min<int64_t>(vocab, int64_t{1} << 31));  // negatives: >= 2^31
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>(ids[i]) >= lim;
    for (int64_t i = 0; bad && i < n; ++i)
      BT_CHECK(ids[i] >= 0 && ids[i] < vocab, "data.train: token id ", ids[i], " (", what, " of micro-batch ",
               j, ", position ", i, ") is outside [0, model.vocab_size=", vocab,
               "); the shards were made with another tokenizer, or model.vocab_size is too small");
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
  };
  put(b.inputs, inputs_[j], "inputs");
  put(b.targets, targets_[j], "targets");
}

void Trainer::device_step() {
  std::optional<fusion::LazyScope> lazy;  // computes what is pending when the step ends
  if (compile_) lazy.emplace(fusion::LazyOptions{cfg_.compile.check});
  {
    ProfileScope prof("zero_grad");
    strategy_->zero_grad();
  }
  const Tensor hyper = hyper_.to(device_, /*non_blocking=*/true);
  if (poison_host_.defined()) poison_ = poison_host_.to(device_, /*non_blocking=*/true);
  Tensor loss_sum;
  for (int64_t j = 0; j < accum_; ++j) {
    Tensor x, loss;
    {
      ProfileScope prof("data");
      x = inputs_[j].to(device_, /*non_blocking=*/true);
    }
    // Each micro-step's loss enters backward with gradient 1 / A (the mean over
    // micro-steps), which the loss knows in advance (Note [Gradient in the
    // forward pass]).
    const float grad = 1.0f / static_cast<float>(accum_);
    {
      ProfileScope prof("forward");
      // The targets stay on the host (Note [Targets on the host]).
      loss = model_->loss(x, targets_[j], grad);
    }
    {
      ProfileScope prof("backward");
      strategy_->before_backward(j == accum_ - 1);  // ranks communicate on the last micro-step only
      loss.backward(full(loss.shape(), grad, TensorOptions{DType::F32, device_}));
    }
    NoGradGuard ng;
    Tensor l = loss.detach();
    loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
  }
  {
    ProfileScope prof("grad_sync");
    strategy_->after_backward();
  }
  NoGradGuard ng;
  Tensor clip;
  // The step's loss summed over micro-steps and ranks: the gate reads it
  // (Note [Non-finite steps]), and the reported mean comes from it. A copy,
  // not to(F64): under train.compile a cast is recorded into a fusion group,
  // and CUDA fusion kernels are generated for f32 and bf16 only.
  Tensor loss_total = empty({1}, TensorOptions{DType::F64, device_});
  loss_total.copy_(loss_sum.reshape({1}));
  {
    ProfileScope prof("grad_norm");
    if (pg_) pg_->all_reduce(loss_total, dist::ReduceOp::Sum);
    clip = clip_scale(strategy_->grad_sum_squares(), cfg_.train.grad_clip, loss_total);  // {norm, factor}
  }
  {
    ProfileScope prof("optimizer");
    strategy_->apply_step(hyper, clip.narrow(0, 1, 1));
  }
  report_.narrow(0, 0, 1).copy_(loss_total);
  report_.narrow(0, 1, 1).copy_(clip.narrow(0, 0, 1));
}

StepStats Trainer::step() {
  BT_CHECK(!finished_, "Trainer::step: training was finished (finish_training)");
  const auto t0 = std::chrono::steady_clock::now();
  ProfileScope prof_step("step");
  if (pg_) pg_->set_step(step_ + 1);
  {
    ProfileScope prof("data");
    for (int64_t j = 0; j < accum_; ++j) stage(j, train_->next());
  }
  StepStats s;
  s.lr = schedule_.at(step_);
  const AdamW::StepScalars h = strategy_->advance(s.lr);
  float* hp = hyper_.data<float>();
  hp[0] = h.lr, hp[1] = h.bias1, hp[2] = h.bias2;
  if (poison_host_.defined())
    *poison_host_.data<float>() = step_ + 1 >= fault_first_ && step_ + 1 <= fault_last_
                                      ? std::numeric_limits<float>::quiet_NaN()
                                      : 1.0f;
  // The step waits for work queued elsewhere: initialization, a checkpoint's
  // load, or a snapshot still reading the parameters.
  stream_wait(stream_, Stream::current(device_));
  if (update_fence_) {
    stream_wait(stream_, *update_fence_);
    update_fence_.reset();
  }
  std::vector<double> rep;
  const fusion::LazyStats before = fusion::lazy_stats();
  {
    StreamGuard on(stream_);
    const auto replay = [&] {
      graph_.replay(stream_);
      if (pg_) pg_->watch("the replay of the step's CUDA graph");  // its collectives' deadline
    };
    if (graph_.captured()) {
      replay();
    } else if (graph_off_.empty() && eager_steps_ >= kEagerSteps) {
      const auto c0 = std::chrono::steady_clock::now();
      try {
        graph_.capture(stream_, [this] { device_step(); });
        notice_ = fmt::format(
            "step {}: captured the step as a CUDA graph ({} nodes, {} small memsets as kernels, {:.0f} ms); "
            "replaying it from now on",
            step_ + 1, graph_.nodes(), graph_.memsets_replaced(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
        replay();
      } catch (const Error& e) {
        graph_off_ = cat("the capture failed: ", e.what());
        notice_ = cat("step ", step_ + 1, ": CUDA graphs off, running eagerly: ", graph_off_);
        device_step();
      }
    } else {
      device_step();
      ++eager_steps_;
    }
    rep = report_.to_vector<double>();  // waits for the step
  }
  s.grad_norm = rep[1];
  s.loss = rep[0] / static_cast<double>(accum_ * world_);  // the mean over micro-steps and ranks
  s.step = ++step_;
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))
    on_nonfinite(s);
  else
    skipped_in_row_ = 0;
  s.skipped_steps = skipped_total_;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.tokens = cfg_.train.batch_size * cfg_.model.seq_len;
  s.tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
  s.peak_mem_bytes = peak_memory_bytes(device_);
  s.optimizer_state_bytes = strategy_->optimizer_state_bytes();
  s.gradient_bytes = strategy_->gradient_bytes();
  s.parameter_bytes = strategy_->parameter_bytes();
  s.compute_copy_bytes = strategy_->compute_copy_bytes();
  if (compile_) {
    const fusion::LazyStats after = fusion::lazy_stats();
    s.compiled = true;
    s.compile_s = after.compile_s - before.compile_s;
    s.fused_groups = after.groups_run - before.groups_run;
    const int64_t compiled = after.kernels_compiled - before.kernels_compiled;
    s.kernels_loaded = after.kernels_loaded - before.kernels_loaded;
    s.kernels_compiled = compiled - s.kernels_loaded;
    if (compile_steps_ == 0 && compiled > 0)  // the run's first step: how its kernels came
      notice_ =
          cat(notice_.empty() ? "" : notice_ + "\n", "step ", s.step, ": ", compiled,
              " fusion kernel(s) ready in ", fmt::format("{:.2f}", s.compile_s), " s: ", s.kernels_loaded,
              " loaded from the kernel cache, ", s.kernels_compiled, " compiled");
    if (compile_steps_++ > 0 && compiled > 0) {  // after this run's first step: a new region or shape
      s.recompiles = compiled;
      notice_ = cat(notice_.empty() ? "" : notice_ + "\n", "step ", s.step, ": compiled ", compiled,
                    " new fusion group(s) after the first step (a shape or a region changed)");
    }
    if (cfg_.compile.check && compiled > 0)  // compile.check: the new groups against the eager ops
      notice_ = cat(notice_.empty() ? "" : notice_ + "\n", "step ", s.step, ": compile.check: ", compiled,
                    " new fusion group(s) checked against the eager ops; largest relative difference so far ",
                    fmt::format("{:.3g}", after.check_max_rel_diff));
    if (after.eager_fallbacks > before.eager_fallbacks)
      notice_ = cat(notice_.empty() ? "" : notice_ + "\n", "step ", s.step, ": ",
                    after.eager_fallbacks - before.eager_fallbacks,
                    " fusion group(s) ran eagerly (they did not compile; see the warnings above)");
  }
  return s;
}

std::string Trainer::nonfinite_cause(const StepStats& s) {
  NoGradGuard ng;
  const nn::NamedTensors& named = model_->named_parameters();
  std::vector<float> bad(named.size(), 0.0f);
  for (const auto& [i, g] : strategy_->gradient_parts())
    if (!std::isfinite(sum(mul(g, 0.0)).item<float>())) bad[i] = 1.0f;
  if (pg_) {
    Tensor t =
        from_vector<float>(bad, {static_cast<int64_t>(bad.size())}, TensorOptions{DType::F32, device_});
    pg_->all_reduce(t, dist::ReduceOp::Sum);
    bad = t.to_vector<float>();
  }
  const auto first = std::find_if(bad.begin(), bad.end(), [](float b) { return b > 0; });
  const auto others =
      std::count_if(first == bad.end() ? first : first + 1, bad.end(), [](float b) { return b > 0; });
  std::string cause;
  if (first != bad.end())
    cause = cat("the gradient of ", named[static_cast<size_t>(first - bad.begin())].first, " is not finite",
                others > 0 ? cat(" (nor are those of ", others, " later parameters)") : std::string());
  else if (!std::isfinite(s.loss))
    cause = "the loss itself is not finite (every gradient is)";
  else
    cause = "every gradient is finite, but their global norm overflowed";
  return fmt::format("step {}: {}; loss {}, gradient norm {}", s.step, cause, s.loss, s.grad_norm);
}

void Trainer::on_nonfinite(StepStats& s) {
  strategy_->step_skipped();
  s.skipped = true;
  s.nonfinite = nonfinite_cause(s);
  ++skipped_total_;
  ++skipped_in_row_;
  const TrainOptions& t = cfg_.train;
  BT_CHECK(t.nonfinite == "skip", "training stopped at ", s.nonfinite,
           ". The update was not applied: the weights are those after step ", s.step - 1,
           ". Lower train.lr, raise train.warmup_steps or use train.precision=fp32; or set "
           "train.nonfinite=skip to skip such steps");
  BT_CHECK(skipped_in_row_ <= t.max_skipped_steps, "training stopped: ", skipped_in_row_,
           " steps in a row were skipped, more than train.max_skipped_steps=", t.max_skipped_steps,
           "; the last, ", s.nonfinite, ". The weights are those after step ", s.step - skipped_in_row_,
           ". Lower train.lr or use train.precision=fp32");
  notice_ = cat(notice_.empty() ? "" : notice_ + "\n", "skipped ", s.nonfinite,
                ". Weights and optimizer state are unchanged (", skipped_in_row_,
                " in a row; train.max_skipped_steps=", t.max_skipped_steps, ")");
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
