// ProcessGroup: the collectives every distributed strategy is written against,
// with backends chosen by the tensors' device and how the job started: for CPU
// tensors MPI (mpirun, srun) or TCP (torchrun-style variables), for CUDA
// tensors NCCL (see mpi_process_group.h, tcp_process_group.h,
// nccl_process_group.h).
//
// Every operation is asynchronous and returns a Work; the synchronous forms
// wait on it. Rules shared by the backends:
//   - tensors are contiguous, on the group's device kind, and every rank passes
//     the same dtype and numel (checked locally; a mismatch across ranks is the
//     caller's bug and shows up as a timeout or garbage, as in MPI and NCCL);
//   - ranks issue collectives in the same order; each gets a sequence number
//     (1, 2, ...), used in error messages;
//   - every wait has a deadline (timeout(), default 300 s). A collective that
//     misses it throws CollectiveTimeout naming the collective, its sequence
//     number, the training step (set_step) and the ranks that had not reached
//     it. The caller (the CLI) then aborts the job, so nothing hangs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "runtime/tensor/tensor.h"

namespace bt::dist {

enum class ReduceOp { Sum, Avg };
const char* reduce_op_name(ReduceOp op);

/// A collective that did not complete within the group's timeout.
class CollectiveTimeout : public Error {
 public:
  explicit CollectiveTimeout(const std::string& msg) : Error(msg) {}
};

/// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  /// CPU: blocks until the result is in place. CUDA: orders the caller's
  /// current stream after the collective (the host does not block). Throws
  /// CollectiveTimeout past the deadline; may be called again after that.
  virtual void wait() = 0;
  /// True when the result is in place (never blocks).
  virtual bool done() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "mpi", "tcp" or "nccl".
  virtual std::string backend() const = 0;

  /// In place: t = op over ranks of t.
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  /// out (numel n) = op over ranks of in[rank*n, (rank+1)*n); in has size()*n elements.
  /// out may be in's own slot of this rank (in place); otherwise they must not overlap.
  virtual std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  /// out (numel size()*n) = concatenation over ranks of in (numel n). in may be
  /// out's slot of this rank (in place); otherwise they must not overlap.
  virtual std::shared_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) = 0;
  /// t = root's t on every rank.
  virtual std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) = 0;
  /// Returns when every rank has called barrier() (or throws CollectiveTimeout).
  virtual void barrier() = 0;

  /// Why this group's collectives cannot be recorded into a CUDA graph, or ""
  /// when they can (Note [Collectives in a CUDA graph], nccl_process_group.h).
  virtual std::string graph_blocker() const { return "it runs its collectives on the host"; }
  /// Puts a deadline on the work queued so far on the caller's current stream,
  /// the collectives of a replayed CUDA graph among it, which no Work watches:
  /// past timeout() the job ends with a message naming `what`. A group whose
  /// collectives block the host (graph_blocker() not empty) does nothing.
  virtual void watch(const std::string& what) { (void)what; }

  void all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
    reduce_scatter_async(in, out, op)->wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }

  /// The training step named in error messages (0: not training).
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  /// Shape/dtype/device checks shared by the backends; `op` names the collective.
  void check_tensor(const char* op, const Tensor& t, bool cuda) const;
  void check_pair(const char* op, const Tensor& small, const Tensor& big, bool cuda) const;
  /// The CPU backends reduce f32, f64 (sum, avg) and i32, i64 (sum); other dtypes are only moved.
  void check_reducible(const char* op, DType t, ReduceOp r) const;
  /// True when `small` is exactly `big`'s slot of this rank (an in-place gather/scatter).
  bool is_rank_slot(const Tensor& small, const Tensor& big) const;
  /// "all_reduce #7 (step 3)": how errors name a collective.
  std::string describe(const char* op, int64_t seq) const;
  /// "ranks that did not arrive: 3 (last collective reached: rank 3 at #56)" for
  /// collective #seq, given the last collective each rank reached (< 0: unknown).
  static std::string not_arrived(const std::vector<int64_t>& reached, int64_t seq);
  /// The message of a CollectiveTimeout: `what` (describe()) timed out on this rank, then `arrivals`.
  std::string timeout_text(const std::string& what, const std::string& arrivals) const;

  int rank_, size_;
  int64_t step_ = 0;
  std::chrono::milliseconds timeout_{300'000};
};

}  // namespace bt::dist
