#include "runtime/dist/ddp.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {

DataParallel::DataParallel(std::vector<Tensor> params, std::shared_ptr<ProcessGroup> pg, double bucket_mb)
    : params_(std::move(params)), pg_(std::move(pg)) {
  BT_CHECK(!params_.empty(), "DataParallel: no parameters");
  BT_CHECK(bucket_mb > 0, "dist.bucket_mb must be > 0, got ", bucket_mb);
  const Device dev = params_[0].device();
  int64_t total = 0;
  for (const Tensor& p : params_) {
    BT_CHECK(p.dtype() == DType::F32 && p.device() == dev && p.requires_grad() && p.is_leaf(),
             "DataParallel: parameters must be f32 leaves that require grad, all on ", dev);
    total += p.numel();
  }
  flat_grad_ = zeros({total}, TensorOptions{}.with_device(dev));

  // Reverse order: the last parameter's gradient sits at offset 0 (Note [DDP buckets]).
  const auto cap = static_cast<int64_t>(bucket_mb * (1 << 20) / sizeof(float));
  int64_t off = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    if (buckets_.empty() || (buckets_.back().end - buckets_.back().begin >= cap)) {
      buckets_.push_back(Bucket{off, off, 0, 0, nullptr});
    }
    Bucket& b = buckets_.back();
    p.set_grad(flat_grad_.narrow(0, off, p.numel()).view(p.shape()));
    off += p.numel();
    b.end = off;
    ++b.size;
    const size_t idx = buckets_.size() - 1;
    p.register_grad_ready_hook([this, idx](const Tensor&) { on_grad_ready(idx); });
  }
  for (Bucket& b : buckets_) b.pending = b.size;
}

void DataParallel::broadcast_parameters() {
  NoGradGuard ng;
  for (const Tensor& p : params_) pg_->broadcast(p, 0);
}

void DataParallel::on_grad_ready(size_t bucket) {
  if (!sync_) return;
  Bucket& b = buckets_[bucket];
  BT_ASSERT(b.pending > 0, "a gradient became ready twice in one backward");
  if (--b.pending == 0) launch(b);
}

void DataParallel::launch(Bucket& b) {
  b.work = pg_->all_reduce_async(flat_grad_.narrow(0, b.begin, b.end - b.begin), ReduceOp::Avg);
}

void DataParallel::finish() {
  for (Bucket& b : buckets_) {
    if (!b.work) launch(b);  // some parameters got no gradient this step
  }
  for (Bucket& b : buckets_) {
    b.work->wait();
    b.work.reset();
    b.pending = b.size;
  }
}

void DataParallel::zero_grad() {
  NoGradGuard ng;
  flat_grad_.zero_();
}

}  // namespace bt::dist
