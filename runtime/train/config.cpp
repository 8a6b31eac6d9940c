#include "runtime/train/config.h"

#include <algorithm>

#include "kernels/common/error.h"
#include "runtime/autograd/recompute_mode.h"
#include "runtime/core/device.h"
#include "runtime/core/precision.h"

namespace bt::train {

// Note [Batch split]: a step of train.batch_size sequences is split evenly
// over the ranks, and each rank's share into A micro-batches of m sequences:
// batch_size = A x m x ranks. train.micro_batch is the most a rank runs at
// once (a memory bound), not a demand: when it does not fit the rank count
// (the default 8 over 4 ranks would need 32 per step), the job runs the
// largest m below it that does, and the run's header says so. The step, and
// so the loss curve, is the same for every split (up to summation order).
// Only a batch that the ranks cannot share evenly (not a multiple of the rank
// count, e.g. smaller than it) has no split.
// Note [Recompute defaults]
// train.recompute = auto picks selective under bf16 and none otherwise. The
// issue-18 bench on one H100 (GPT-2 124M, T 1024, micro-batch 16, bench/
// RESULTS.md step 3) measured selective at 1.8% fewer tokens/s in bf16 for
// 22% less peak memory (7.83 -> 6.14 GiB), and in fp32 at 0.9% fewer for 25%
// less (13.8 -> 10.4 GiB). Measured again after the fused kernels of later
// steps (one H200, step 17): bf16 selective 518.0K tokens/s at 6.21 GiB,
// none 533.5K at 7.90 GiB, so selective now costs 3.0% for 21% less memory,
// and still gives the most tokens/s per GiB (83 against 68). bf16 is the
// training precision, where memory buys batch size, so it gets the trade by
// default; fp32 and tf32 stay fastest. full is never automatic: it costs a
// fifth of the throughput.
Recompute TrainConfig::recompute() const {
  if (train.recompute != "auto") return parse_recompute(train.recompute);
  return parse_precision(train.precision) == Precision::BF16 ? Recompute::Selective : Recompute::None;
}

bool TrainConfig::compile_on(bool cuda) const {
  if (train.compile != "auto") return train.compile == "true";
  return cuda && model.arch == "llama";
}

int64_t TrainConfig::micro_batch_for(int world) const {
  BT_CHECK(world >= 1, "the rank count must be >= 1, got ", world);
  BT_CHECK(train.batch_size > 0 && train.micro_batch > 0, "train.batch_size (", train.batch_size,
           ") and train.micro_batch (", train.micro_batch, ") must be > 0");
  if (train.batch_size % world != 0) {
    const int64_t below = train.batch_size / world * world, above = below + world;
    BT_FAIL("train.batch_size (", train.batch_size, ") cannot be split over ", world,
            " ranks: every rank takes the same whole number of sequences per step, so the batch must be a "
            "multiple of the rank count; set train.batch_size to ",
            below > 0 ? cat(below, " or ", above) : cat(above), ", or run a rank count that divides ",
            train.batch_size);
  }
  const int64_t per_rank = train.batch_size / world;
  int64_t m = std::min(train.micro_batch, per_rank);
  while (per_rank % m != 0) --m;
  return m;
}

int64_t TrainConfig::grad_accum(int world) const {
  return train.batch_size / (micro_batch_for(world) * world);
}

std::string TrainConfig::batch_split_note(int world) const {
  const int64_t m = micro_batch_for(world);
  if (m == train.micro_batch) return "";
  return cat("train.micro_batch ", train.micro_batch, " does not split train.batch_size ", train.batch_size,
             world > 1 ? cat(" over ", world, " ranks") : std::string(), ": running micro-batches of ", m,
             " (the largest that does), ", grad_accum(world), " per rank per step");
}

void TrainConfig::validate(int world) const {
  model.validate("model");
  const TrainOptions& t = train;
  auto positive = [](const char* key, double v) { BT_CHECK(v > 0, key, " must be > 0, got ", v); };
  auto non_negative = [](const char* key, double v) { BT_CHECK(v >= 0, key, " must be >= 0, got ", v); };
  BT_CHECK(!data.train.empty(),
           "data.train is empty; set it to a glob of token shards, e.g. "
           "data/jargon/tok/jargon_train_*.bin (make them with `blutrain tokenize`)");
  positive("train.steps", static_cast<double>(t.steps));
  positive("train.batch_size", static_cast<double>(t.batch_size));
  positive("train.micro_batch", static_cast<double>(t.micro_batch));
  positive("train.lr", t.lr);
  non_negative("train.min_lr", t.min_lr);
  BT_CHECK(t.min_lr <= t.lr, "train.min_lr (", t.min_lr, ") must not exceed train.lr (", t.lr, ")");
  non_negative("train.warmup_steps", static_cast<double>(t.warmup_steps));
  non_negative("train.weight_decay", t.weight_decay);
  BT_CHECK(t.beta1 >= 0 && t.beta1 < 1, "train.beta1 must be in [0, 1), got ", t.beta1);
  BT_CHECK(t.beta2 >= 0 && t.beta2 < 1, "train.beta2 must be in [0, 1), got ", t.beta2);
  positive("train.eps", t.eps);
  non_negative("train.grad_clip", t.grad_clip);
  BT_CHECK(t.nonfinite == "stop" || t.nonfinite == "skip", "train.nonfinite must be stop or skip, got '",
           t.nonfinite, "'");
  positive("train.max_skipped_steps", static_cast<double>(t.max_skipped_steps));
  try {
    if (t.device != "auto") parse_device(t.device);
  } catch (const Error& e) {
    BT_FAIL("train.device: ", e.what());
  }
  try {
    parse_precision(t.precision);
  } catch (const Error& e) {
    BT_FAIL("train.precision: ", e.what());
  }
  if (t.recompute != "auto") {
    try {
      parse_recompute(t.recompute);
    } catch (const Error& e) {
      BT_FAIL("train.recompute: ", e.what(), " (or auto)");
    }
  }
  BT_CHECK(t.compile == "auto" || t.compile == "true" || t.compile == "false", "train.compile must be auto, ",
           "true or false, got '", t.compile, "'");
  non_negative("train.eval_every", static_cast<double>(t.eval_every));
  positive("train.eval_batches", static_cast<double>(t.eval_batches));
  positive("train.log_every", static_cast<double>(t.log_every));
  non_negative("train.sample_tokens", static_cast<double>(t.sample_tokens));
  positive("train.sample_temperature", t.sample_temperature);
  non_negative("train.sample_top_k", static_cast<double>(t.sample_top_k));
  BT_CHECK(dist.strategy == "ddp" || dist.strategy == "zero1" || dist.strategy == "zero2" ||
               dist.strategy == "zero3",
           "dist.strategy must be ddp, zero1, zero2 or zero3, got '", dist.strategy, "'");
  positive("dist.bucket_mb", dist.bucket_mb);
  positive("dist.timeout_s", dist.timeout_s);
  non_negative("train.stop_at_step", static_cast<double>(t.stop_at_step));
  BT_CHECK(t.resume == "none" || t.resume == "auto" || !t.resume.empty(),
           "train.resume must be none, auto or a checkpoint directory");
  BT_CHECK(t.resume != "auto" || !checkpoint.dir.empty(),
           "train.resume=auto needs checkpoint.dir (where to look for the latest checkpoint)");
  non_negative("checkpoint.every", static_cast<double>(checkpoint.every));
  non_negative("checkpoint.keep_last", static_cast<double>(checkpoint.keep_last));
  non_negative("checkpoint.keep_every", static_cast<double>(checkpoint.keep_every));
  grad_accum(world);
}

}  // namespace bt::train
