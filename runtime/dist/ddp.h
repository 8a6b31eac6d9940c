// DataParallel (dist.strategy: ddp): every rank holds all parameters and
// optimizer state; gradients are averaged over ranks, bucket by bucket, while
// backward is still running.
//
// Note [DDP buckets]: the gradients of all parameters live in one flat f32
// buffer (each parameter's .grad is a view of it, so autograd accumulates in
// place), laid out in *reverse* parameter order: backward produces gradients
// roughly last-parameter-first, so the buffer fills from its start. A bucket
// is a contiguous range of about dist.bucket_mb. When the last gradient of a
// bucket is final (a grad-ready hook), the bucket's all_reduce(avg) starts at
// once and overlaps the rest of backward; finish() waits for all of them and
// launches any bucket whose parameters got no gradient. With gradient
// accumulation only the last micro-step communicates (set_sync(false) before
// the others): the buffer then holds the sum over micro-steps, and one average
// over ranks gives what one process with the whole global batch computes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/dist/process_group.h"
#include "runtime/tensor/tensor.h"

namespace bt::dist {

class DataParallel {
 public:
  /// `params`: the model's parameters in forward order, all on one device,
  /// all f32 leaves with requires_grad. Replaces their .grad with views of
  /// the flat buffer (zeroed).
  DataParallel(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> pg, double bucket_mb = 25.0);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Copies rank 0's parameters to every rank (start of training).
  void broadcast_parameters();
  /// Whether the next backward's gradients are averaged (false: accumulate locally).
  void set_sync(bool sync) { sync_ = sync; }
  /// After the last micro-step's backward: waits until every bucket is averaged.
  void finish();
  /// Zeroes the flat gradient buffer (every parameter's .grad).
  void zero_grad();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  const Tensor& flat_grad() const { return flat_grad_; }
  ProcessGroup& group() { return *pg_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // range of flat_grad_
    int pending = 0, size = 0;   // gradients not yet final this backward / parameters
    std::shared_ptr<Work> work;
  };
  void on_grad_ready(size_t bucket);
  void launch(Bucket& b);

  std::vector<Tensor> params_;
  std::shared_ptr<ProcessGroup> pg_;
  Tensor flat_grad_;
  std::vector<Bucket> buckets_;
  bool sync_ = true;
};

}  // namespace bt::dist
