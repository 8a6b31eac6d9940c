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

std::string ProcessGroup::describe(const char* op, int64_t seq) const {
  return step_ > 0 ? cat(op, " #", seq, " (step ", step_, ")") : cat(op, " #", seq);
}

}  // namespace bt::dist
