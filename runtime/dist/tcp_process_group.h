// TcpProcessGroup: the ProcessGroup for CPU tensors of a job started without
// MPI (torchrun-style variables, as Kubernetes Indexed Jobs start ranks):
// plain TCP connections in a star through rank 0, which reduces in rank
// order, so every rank ends with the same bytes (Note [TCP process group] in
// tcp_process_group.cpp). CUDA tensors of such a job go through NCCL.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/dist/process_group.h"

namespace bt::dist {

class TcpStore;
class TcpStar;
struct TcpOp;

class TcpProcessGroup : public ProcessGroup {
 public:
  /// Connects the `size` ranks of a rendezvous: rank 0 listens on a free port
  /// of every interface and posts store.host():port in `store`; the others
  /// connect to it. Every rank creates its groups in the same order. Throws
  /// bt::Error naming the ranks that did not connect within store.timeout().
  /// The group must outlive its Work objects.
  TcpProcessGroup(TcpStore& store, int rank, int size);
  ~TcpProcessGroup() override;
  TcpProcessGroup(const TcpProcessGroup&) = delete;
  TcpProcessGroup& operator=(const TcpProcessGroup&) = delete;

  std::string backend() const override { return "tcp"; }
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override;
  void barrier() override;

 private:
  friend class TcpWork;
  std::shared_ptr<Work> issue(std::shared_ptr<TcpOp> op, const char* name);
  void work_loop();  // the worker thread: runs the queued collectives in order
  /// Blocks until `op` is done (throws its error, or CollectiveTimeout past the deadline).
  void await(TcpOp& op);
  /// True once `op` is done (throws its error).
  bool finished(TcpOp& op);
  std::string timeout_message(const TcpOp& op) const;  // mu_ held
  void fail_queued(const std::string& why);            // mu_ held

  int64_t seq_ = 0;  // the caller's thread only
  std::unique_ptr<TcpStar> star_;
  std::thread worker_;
  mutable std::mutex mu_;  // guards what follows, and each TcpOp's state
  std::condition_variable cv_;
  std::deque<std::shared_ptr<TcpOp>> queue_;
  std::vector<std::shared_ptr<TcpOp>> graveyard_;  // finished; freed on the caller's thread
  std::vector<int64_t> reached_;  // the last collective each rank reached, as far as known (-1: unknown)
  std::string broken_;            // the error that ended the group
  bool stopping_ = false;
};

}  // namespace bt::dist
