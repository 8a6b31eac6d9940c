// MpiProcessGroup: the ProcessGroup for CPU tensors, on nonblocking MPI
// collectives over a duplicate of a communicator (MPI_ERRORS_RETURN).
//
// Note [Who did not arrive]: MPI cannot say which ranks a stuck collective is
// waiting for. So each rank, as it starts collective #k, sends k to every
// peer on a second duplicate communicator ("presence"; a few bytes, eager),
// and keeps one receive posted per peer. Waits drain those receives, so when
// a deadline passes the group knows the last collective each peer reached,
// and the error names the ranks still short of #k. MPI's non-overtaking rule
// keeps each peer's numbers in order.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include <mpi.h>

#include "runtime/dist/process_group.h"

namespace bt::dist {

class MpiWork;

class MpiProcessGroup : public ProcessGroup {
 public:
  /// A group over the ranks of `comm` (MPI must be initialized). The group
  /// must outlive its Work objects and be destroyed before MPI_Finalize.
  explicit MpiProcessGroup(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  std::string backend() const override { return "mpi"; }
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override;
  void barrier() override;

  /// The last collective each rank has announced (this rank's own included).
  std::vector<int64_t> arrivals();
  /// Takes the next sequence number and announces it to the peers; other
  /// groups (NCCL) use this group's announcements for their own collectives.
  int64_t announce();
  /// "ranks that did not arrive: 3 (last collective reached: rank 3 at #56)"
  /// for collective #seq.
  std::string not_arrived(int64_t seq);

 private:
  friend class MpiWork;
  void poll_presence();
  std::string timeout_message(const char* op, int64_t seq);

  MPI_Comm comm_ = MPI_COMM_NULL, presence_ = MPI_COMM_NULL;
  int64_t seq_ = 0;
  std::vector<int64_t> peer_seq_, recv_buf_;
  std::vector<MPI_Request> recv_req_;
  struct Announce {
    std::unique_ptr<int64_t> seq;
    std::vector<MPI_Request> reqs;
  };
  std::deque<Announce> sends_;
};

}  // namespace bt::dist
