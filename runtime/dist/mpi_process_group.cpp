#include "runtime/dist/mpi_process_group.h"

#include <climits>
#include <functional>
#include <thread>

#include "runtime/dist/checks.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {
namespace {

int comm_rank(MPI_Comm c) {
  int r = 0;
  BT_MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}
int comm_size(MPI_Comm c) {
  int n = 0;
  BT_MPI_CHECK(MPI_Comm_size(c, &n));
  return n;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::BF16:
    case DType::F16:
    case DType::U16:
      return MPI_UINT16_T;  // moved, never reduced
    case DType::U8:
    case DType::Bool:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

int count_of(const char* op, int64_t n) {
  BT_CHECK(n <= INT_MAX, op, ": ", n, " elements is more than MPI's int count allows; split the buffer");
  return static_cast<int>(n);
}

}  // namespace

/// One nonblocking MPI collective; `finish` runs once it completes (the Avg
/// scaling, a copy out of a scratch buffer).
class MpiWork : public Work {
 public:
  /// `keep`: the tensors MPI reads or writes, held until the collective is
  /// done (the caller may drop its handles once the Work exists).
  MpiWork(MpiProcessGroup* pg, const char* op, int64_t seq, MPI_Request req, std::function<void()> finish,
          std::vector<Tensor> keep = {})
      : pg_(pg), op_(op), seq_(seq), req_(req), finish_(std::move(finish)), keep_(std::move(keep)) {}
  // A collective abandoned after a timeout is left alone: MPI forbids
  // cancelling or freeing the request of a nonblocking collective, and the
  // job is about to be aborted.
  ~MpiWork() override = default;

  bool done() override {
    if (done_) return true;
    int flag = 0;
    BT_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) {
      done_ = true;
      if (finish_) finish_();
      keep_.clear();
    }
    return done_;
  }

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + pg_->timeout();
    for (int spins = 0; !done(); ++spins) {
      pg_->poll_presence();
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) throw CollectiveTimeout(pg_->timeout_message(op_, seq_));
      // Spin briefly (collectives between ranks on one host finish in
      // microseconds), then sleep so a stuck peer does not burn a core.
      if (now - start < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  MpiProcessGroup* pg_;
  const char* op_;
  int64_t seq_;
  MPI_Request req_;
  std::function<void()> finish_;
  std::vector<Tensor> keep_;
  bool done_ = false;
};

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm) : ProcessGroup(comm_rank(comm), comm_size(comm)) {
  BT_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  BT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  BT_MPI_CHECK(MPI_Comm_dup(comm, &presence_));
  BT_MPI_CHECK(MPI_Comm_set_errhandler(presence_, MPI_ERRORS_RETURN));
  peer_seq_.assign(static_cast<size_t>(size_), 0);
  recv_buf_.assign(static_cast<size_t>(size_), 0);
  recv_req_.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) BT_MPI_CHECK(MPI_Irecv(&recv_buf_[p], 1, MPI_INT64_T, p, 0, presence_, &recv_req_[p]));
}

MpiProcessGroup::~MpiProcessGroup() {
  // No throwing here: errors while tearing down are ignored. After
  // MPI_Finalize nothing may be called; the memory goes with the process.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& r : recv_req_) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  for (Announce& a : sends_) {
    int flag = 0;
    MPI_Testall(static_cast<int>(a.reqs.size()), a.reqs.data(), &flag, MPI_STATUSES_IGNORE);
    if (flag) continue;
    // A dead peer never takes them: free the requests, keep the 8-byte buffer.
    for (MPI_Request& r : a.reqs)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    (void)a.seq.release();
  }
  MPI_Comm_free(&presence_);
  MPI_Comm_free(&comm_);
}

int64_t MpiProcessGroup::announce() {
  const int64_t seq = ++seq_;
  peer_seq_[rank_] = seq;
  if (size_ == 1) return seq;
  // Drop the announcements that have gone out, then announce this one.
  while (!sends_.empty()) {
    int flag = 0;
    BT_MPI_CHECK(MPI_Testall(static_cast<int>(sends_.front().reqs.size()), sends_.front().reqs.data(), &flag,
                             MPI_STATUSES_IGNORE));
    if (!flag) break;
    sends_.pop_front();
  }
  Announce a{std::make_unique<int64_t>(seq), {}};
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    a.reqs.push_back(MPI_REQUEST_NULL);
    BT_MPI_CHECK(MPI_Isend(a.seq.get(), 1, MPI_INT64_T, p, 0, presence_, &a.reqs.back()));
  }
  sends_.push_back(std::move(a));
  poll_presence();
  return seq;
}

void MpiProcessGroup::poll_presence() {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    for (;;) {  // drain every announcement that has arrived from p
      int flag = 0;
      BT_MPI_CHECK(MPI_Test(&recv_req_[p], &flag, MPI_STATUS_IGNORE));
      if (!flag) break;
      peer_seq_[p] = recv_buf_[p];
      BT_MPI_CHECK(MPI_Irecv(&recv_buf_[p], 1, MPI_INT64_T, p, 0, presence_, &recv_req_[p]));
    }
  }
}

std::vector<int64_t> MpiProcessGroup::arrivals() {
  poll_presence();
  return peer_seq_;
}

std::string MpiProcessGroup::not_arrived(int64_t seq) {
  poll_presence();
  return ProcessGroup::not_arrived(peer_seq_, seq);
}

std::string MpiProcessGroup::timeout_message(const char* op, int64_t seq) {
  return timeout_text(describe(op, seq), not_arrived(seq));
}

std::shared_ptr<Work> MpiProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t, false);
  check_reducible("all_reduce", t.dtype(), op);
  const int n = count_of("all_reduce", t.numel());
  const int64_t seq = announce();
  MPI_Request req;
  BT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), n, mpi_type(t.dtype()), MPI_SUM, comm_, &req));
  std::function<void()> finish;
  if (op == ReduceOp::Avg && size_ > 1) finish = [t, s = size_] { Tensor(t).mul_(1.0 / s); };
  return std::make_shared<MpiWork>(this, "all_reduce", seq, req, std::move(finish), std::vector<Tensor>{t});
}

std::shared_ptr<Work> MpiProcessGroup::reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                            ReduceOp op) {
  check_pair("reduce_scatter", out, in, false);
  check_reducible("reduce_scatter", in.dtype(), op);
  const int n = count_of("reduce_scatter", out.numel());
  const int64_t seq = announce();
  // MPI's in-place form puts the result at the start of the buffer, not in
  // this rank's slot: reduce into scratch and copy when the slot is the output.
  const Tensor dst = out.shares_storage(in) ? empty_like(out) : out;
  MPI_Request req;
  BT_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), dst.data_ptr(), n, mpi_type(in.dtype()), MPI_SUM,
                                         comm_, &req));
  const double scale = op == ReduceOp::Avg ? 1.0 / size_ : 1.0;
  auto finish = [dst, out, scale] {
    Tensor o(out);
    if (!dst.shares_storage(out)) o.copy_(dst);
    if (scale != 1.0) o.mul_(scale);
  };
  return std::make_shared<MpiWork>(this, "reduce_scatter", seq, req, std::move(finish),
                                   std::vector<Tensor>{in, out, dst});
}

std::shared_ptr<Work> MpiProcessGroup::all_gather_async(const Tensor& in, const Tensor& out) {
  check_pair("all_gather", in, out, false);
  const int n = count_of("all_gather", in.numel());
  const MPI_Datatype ty = mpi_type(in.dtype());
  const int64_t seq = announce();
  MPI_Request req;
  if (is_rank_slot(in, out))
    BT_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out.data_ptr(), n, ty, comm_, &req));
  else
    BT_MPI_CHECK(MPI_Iallgather(in.data_ptr(), n, ty, out.data_ptr(), n, ty, comm_, &req));
  return std::make_shared<MpiWork>(this, "all_gather", seq, req, std::function<void()>{},
                                   std::vector<Tensor>{in, out});
}

std::shared_ptr<Work> MpiProcessGroup::broadcast_async(const Tensor& t, int root) {
  check_tensor("broadcast", t, false);
  BT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this group of ", size_);
  const int n = count_of("broadcast", t.numel());
  const int64_t seq = announce();
  MPI_Request req;
  BT_MPI_CHECK(MPI_Ibcast(t.data_ptr(), n, mpi_type(t.dtype()), root, comm_, &req));
  return std::make_shared<MpiWork>(this, "broadcast", seq, req, std::function<void()>{},
                                   std::vector<Tensor>{t});
}

void MpiProcessGroup::barrier() {
  const int64_t seq = announce();
  MPI_Request req;
  BT_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  MpiWork(this, "barrier", seq, req, {}).wait();
}

}  // namespace bt::dist
