// NcclProcessGroup: the ProcessGroup for CUDA tensors (built when NCCL is
// found, BT_NCCL). Rank 0 creates the NCCL unique id and MPI broadcasts it.
//
// Collectives run on the group's own stream, ordered after the work already
// queued on the caller's current stream; Work::wait() orders the caller's
// current stream after the collective (the host does not block), and the
// tensors are recorded on the group's stream so the caching allocator does
// not reuse their memory early.
//
// Note [NCCL deadlines]: a stuck NCCL kernel blocks whichever host call next
// synchronizes, so deadlines are kept by a watchdog thread: it polls each
// collective's end event, and past dist timeout it prints the collective, its
// number, the step and the ranks that had not reached it (each collective is
// announced over MPI, as in Note [Who did not arrive]), aborts the NCCL
// communicator and ends the job (dist::abort_world).
//
// Note [Collectives in a CUDA graph]: collectives issued while a CUDA graph
// is captured (capture_underway(), the Trainer's whole-step graphs) are
// recorded like kernels: the group's stream joins the capture through the
// event that orders it after the caller's, and Work::wait() joins it back.
// Nothing runs then, so the watchdog does not poll them (querying an event a
// capture recorded is an error) and Work::done() refuses to answer. Each
// replay of the graph gets one deadline instead: watch() records an event
// after it, announced like a collective (one announcement a replay, so the
// ranks that did not arrive are named by replay), and the watchdog keeps it
// as it keeps a collective's. The caching allocator keeps the memory of
// collectives freed during the capture out of circulation (Note [Allocation
// under capture] in runtime/alloc/caching_pool.cpp), so replays own it.
//
// Note [NCCL stream priority]: the group's stream has the device's greatest
// priority, so a collective launched during backward (DDP buckets, ZeRO-3
// gathers and reduce-scatters) gets SMs ahead of the compute kernels queued
// after it instead of waiting behind them. On 4 x H200 (gpt2-124m bf16,
// micro-batch 16) it moved ddp's weak-scaling efficiency from 0.938-0.939 to
// 0.944 with 25 MiB buckets and zero3's from 0.973 to 0.988
// (scripts/gpu-dist ddp-tune and scaling, bench/RESULTS.md).
#pragma once

#ifdef BT_NCCL

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include <mpi.h>
#include <nccl.h>

#include "runtime/core/stream.h"
#include "runtime/dist/mpi_process_group.h"
#include "runtime/dist/tcp_store.h"

namespace bt::dist {

class NcclWork;

class NcclProcessGroup : public ProcessGroup {
 public:
  /// A group over the ranks of `comm`, each using `device` (cuda:local_rank).
  NcclProcessGroup(MPI_Comm comm, Device device);
  /// The same, bootstrapped through a rendezvous store (no MPI): rank 0 posts
  /// the unique id. Deadline errors then cannot say which ranks are missing.
  NcclProcessGroup(TcpStore& store, int rank, int size, Device device);
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  std::string backend() const override { return "nccl"; }
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) override;
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override;
  void barrier() override;
  std::string graph_blocker() const override { return ""; }
  void watch(const std::string& what) override;

 private:
  friend class NcclWork;
  struct Pending;
  /// Announces the collective, orders the group's stream after the caller's,
  /// records `tensors` on it, runs `launch`, and returns its Work.
  template <class F>
  std::shared_ptr<Work> run(const char* op, std::initializer_list<Tensor> tensors, F&& launch);
  /// A Pending for `op`, announced, its end event recorded on `s`, and (unless
  /// a capture is under way) handed to the watchdog with its deadline.
  std::shared_ptr<Pending> track(std::string op, cudaStream_t s);
  void watchdog();
  void init(const void* unique_id, Device device);  // after rank_/size_ and the id are known

  Device device_;
  Stream stream_;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<MpiProcessGroup> presence_;  // announcements (Note [Who did not arrive]); null without MPI
  int64_t seq_ = 0;                            // the sequence numbers without MPI
  std::mutex mu_;                              // guards presence_, pending_, stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> pending_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace bt::dist

#endif  // BT_NCCL
