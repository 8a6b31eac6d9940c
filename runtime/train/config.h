// The resolved configuration of one training job. The launcher fills it from
// YAML plus --set overrides (launcher/config.h); the runtime only validates it.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/autograd/recompute_mode.h"
#include "runtime/nn/model_config.h"

namespace bt::train {

struct DataConfig {
  std::string train;  // glob of llm.c token shards
  std::string val;    // glob; empty = no validation
  bool shuffle = true;
  std::string tokenizer = "data/tokenizer";  // for samples (encoder.json, vocab.bpe)
};

/// The `train:` section: optimization, schedule and run options.
struct TrainOptions {
  int64_t steps = 300;
  int64_t batch_size = 16;   // global sequences per optimizer step
  int64_t micro_batch = 16;  // sequences per forward pass on one rank, at most (Note [Batch split])
  double lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 = off
  // A step whose loss or gradient is not finite (Note [Non-finite steps] in
  // trainer.cpp) never updates; then: stop = end the run, skip = go on, up to
  // max_skipped_steps such steps in a row.
  std::string nonfinite = "stop";  // stop | skip
  int64_t max_skipped_steps = 5;
  std::string device = "auto";     // auto | cpu | cuda | cuda:N
  std::string precision = "fp32";  // fp32 | tf32 | fp32x3 | bf16
  std::string recompute = "auto";  // auto | none | selective | full (Note [Recompute defaults])
  bool cuda_graph = true;  // CUDA: replay each step as one captured graph (Note [Whole-step CUDA graphs])
  // auto | true | false: fuse the step's elementwise and reduction regions
  // (Note [Lazy fusion]); auto = on for llama models on CUDA (compile_on()).
  std::string compile = "auto";
  uint64_t seed = 1337;
  int64_t eval_every = 100;  // steps; 0 = only at the end (if data.val is set)
  int64_t eval_batches = 20;
  int64_t log_every = 1;
  int64_t sample_tokens = 200;  // 0 = no sample at the end
  std::string sample_prompt = "\n";
  double sample_temperature = 0.8;
  int64_t sample_top_k = 40;    // 0 = whole vocabulary
  std::string save_weights;     // HDF5 weights file written at the end; empty = none
  std::string metrics;          // JSONL file, one object per step; a resumed run appends
  std::string resume = "none";  // none | auto (checkpoint.dir's latest) | a checkpoint directory
  int64_t stop_at_step = 0;     // end this run after this step (a checkpoint is saved); 0 = train.steps
};

/// The `checkpoint:` section (docs/checkpoint-format.md).
struct CheckpointOptions {
  std::string dir;         // root of step_XXXXXXXX/ checkpoints; empty = no checkpoints
  int64_t every = 0;       // steps between saves (0: only at the end of the run)
  int64_t keep_last = 3;   // keep the newest K (0: all) ...
  int64_t keep_every = 0;  // ... plus every checkpoint whose step is a multiple of M
  bool async = false;      // write on a background thread (Note [Asynchronous checkpoints])
};

/// The `compile:` section: how train.compile compiles (docs/compiler.md).
struct CompileOptions {
  std::string dump;    // folder for each fusion group's stages; empty = none
  bool check = false;  // run each new group eagerly too and report the largest difference
  // The on-disk kernel cache (Note [Kernel cache] in compiler/kernel_cache.h):
  // empty = $XDG_CACHE_HOME/blutrain/kernels, else ~/.cache/blutrain/kernels; "off" = none.
  std::string cache_dir;
};

/// The `dist:` section: how a job of several ranks splits the work (ignored
/// by a single process). See docs/distributed.md.
struct DistOptions {
  std::string strategy = "ddp";  // ddp | zero1 | zero2 | zero3
  double bucket_mb = 25.0;       // gradient bucket size (ddp)
  double timeout_s = 300.0;      // deadline of every collective
  // A torchrun-style job runs its rendezvous without a job token (Note
  // [Authenticated rendezvous] in runtime/dist/auth.cpp): trusted networks only.
  bool insecure = false;
};

struct TrainConfig {
  std::string preset = "tiny";
  nn::ModelConfig model;
  DataConfig data;
  TrainOptions train;
  DistOptions dist;
  CheckpointOptions checkpoint;
  CompileOptions compile;

  /// The micro-batch a job of `world` ranks runs: train.micro_batch when it
  /// fits, else the largest that does (Note [Batch split]). Throws a bt::Error
  /// naming train.batch_size and the rank count when no split exists.
  int64_t micro_batch_for(int world = 1) const;
  /// train.recompute with `auto` resolved for train.precision (Note [Recompute defaults]).
  Recompute recompute() const;
  /// train.compile with `auto` resolved for the model and the device: on for
  /// llama on CUDA (its glue is primitive ops, slow unfused), else off.
  bool compile_on(bool cuda) const;
  /// Micro-batches per rank per optimizer step for `world` ranks:
  /// train.batch_size / (micro_batch_for(world) x world).
  int64_t grad_accum(int world = 1) const;
  /// One line for a run's header when micro_batch_for(world) differs from
  /// train.micro_batch (what was chosen, and why); "" when it does not.
  std::string batch_split_note(int world = 1) const;
  /// Checks every field; errors name the key ("train.lr must be > 0, got -1").
  void validate(int world = 1) const;
};

}  // namespace bt::train
