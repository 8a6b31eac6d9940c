#include "runtime/dist/process_group.h"

namespace bt::dist {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

void ProcessGroup::check_tensor(const char* op, const Tensor& t, bool cuda) const {
  BT_CHECK(t.defined(), op, ": the tensor is undefined");
  BT_CHECK(t.is_cuda() == cuda, op, ": the ", backend(), " process group takes ", cuda ? "CUDA" : "CPU",
           " tensors, got one on ", t.device(), cuda ? "" : " (CUDA tensors go through the NCCL group)");
  BT_CHECK(t.is_contiguous(), op, ": the tensor of shape ", shape_str(t.shape()),
           " is not contiguous; pass a contiguous buffer");
}

void ProcessGroup::check_pair(const char* op, const Tensor& small, const Tensor& big, bool cuda) const {
  check_tensor(op, small, cuda);
  check_tensor(op, big, cuda);
  BT_CHECK(small.dtype() == big.dtype(), op, ": input and output dtypes differ (", small.dtype(), " vs ",
           big.dtype(), ")");
  BT_CHECK(big.numel() == small.numel() * size_, op, ": the full buffer must hold world size (", size_,
           ") x ", small.numel(), " = ", small.numel() * size_, " elements, got ", big.numel(),
           "; pad flat buffers to a multiple of the world size");
  BT_CHECK(
      !small.shares_storage(big) || is_rank_slot(small, big), op,
      ": the shard and the full buffer share storage, but the shard is not the full buffer's slot of rank ",
      rank_, "; pass separate buffers or exactly that slot (in place)");
}

bool ProcessGroup::is_rank_slot(const Tensor& small, const Tensor& big) const {
  return small.shares_storage(big) &&
         static_cast<const char*>(small.data_ptr()) ==
             static_cast<const char*>(big.data_ptr()) + static_cast<size_t>(rank_) * small.nbytes();
}

void ProcessGroup::check_reducible(const char* op, DType t, ReduceOp r) const {
  const bool floating = t == DType::F32 || t == DType::F64;
  BT_CHECK(floating || ((t == DType::I32 || t == DType::I64) && r == ReduceOp::Sum), op, ": the ", backend(),
           " process group reduces f32, f64 (sum, avg) and i32, i64 (sum), got ", t, " with ",
           reduce_op_name(r));
}

std::string ProcessGroup::describe(const char* op, int64_t seq) const {
  return step_ > 0 ? cat(op, " #", seq, " (step ", step_, ")") : cat(op, " #", seq);
}

std::string ProcessGroup::not_arrived(const std::vector<int64_t>& reached, int64_t seq) {
  std::string missing, last;
  for (size_t p = 0; p < reached.size(); ++p) {
    if (reached[p] < 0 || reached[p] >= seq) continue;
    missing += cat(missing.empty() ? "" : ", ", p);
    last += cat(last.empty() ? "" : ", ", "rank ", p, " at #", reached[p]);
  }
  if (missing.empty())
    return "ranks that did not arrive: none (every rank arrived; the transfer itself is stuck)";
  return cat("ranks that did not arrive: ", missing, " (last collective reached: ", last, ")");
}

std::string ProcessGroup::timeout_text(const std::string& what, const std::string& arrivals) const {
  return cat(what, " timed out after ", timeout().count() / 1000.0, " s on rank ", rank_, " of ", size_, ": ",
             arrivals,
             ". A rank has died, hangs, or skipped a collective; the job will be aborted (raise "
             "dist.timeout_s if the ranks are only slow)");
}

}  // namespace bt::dist
