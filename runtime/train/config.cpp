#include "runtime/train/config.h"

#include "kernels/common/error.h"
#include "runtime/core/device.h"
#include "runtime/core/precision.h"

namespace bt::train {

int64_t TrainConfig::grad_accum(int world) const {
  const int64_t per_step = train.micro_batch * world;
  BT_CHECK(train.batch_size % per_step == 0, "train.batch_size (", train.batch_size,
           ") must be a multiple of train.micro_batch (", train.micro_batch, ") x ranks (", world,
           ") = ", per_step, "; the step is split into micro-batches of that many sequences");
  return train.batch_size / per_step;
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
