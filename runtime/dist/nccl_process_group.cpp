#include "runtime/dist/nccl_process_group.h"

#ifdef BT_NCCL

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"
#include "runtime/core/cuda_graph.h"
#include "runtime/dist/checks.h"
#include "runtime/dist/world.h"
#include "runtime/tensor/factory.h"
#include "runtime/tensor/storage.h"

namespace bt::dist {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
    case DType::U16:
      return ncclFloat16;  // U16 is moved, never reduced
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
    case DType::Bool:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(const char* op, DType t, ReduceOp r) {
  BT_CHECK(t != DType::U16 && t != DType::Bool && t != DType::U8, op, ": NCCL does not reduce ", t,
           " tensors");
  return r == ReduceOp::Sum ? ncclSum : ncclAvg;
}

}  // namespace

struct NcclProcessGroup::Pending {
  std::string op;
  int64_t seq = 0, step = 0;
  cudaEvent_t done_event = nullptr;  // destroyed with the last holder (Work or watchdog)
  std::chrono::steady_clock::time_point deadline;
  std::atomic<bool> done{false};
  ~Pending() {
    if (done_event) cudaEventDestroy(done_event);
  }
};

namespace {
/// cudaEventQuery without leaving cudaErrorNotReady as the thread's last error.
cudaError_t query(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();
  return r;
}
}  // namespace

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclProcessGroup::Pending> p, Device device) : p_(std::move(p)), device_(device) {}
  bool done() override {
    BT_CHECK(!capture_underway(), p_->op,
             ": Work::done() while a CUDA graph is captured; the collective runs when the graph is "
             "replayed (Note [Collectives in a CUDA graph])");
    if (p_->done) return true;
    const cudaError_t e = query(p_->done_event);
    if (e == cudaErrorNotReady) return false;
    BT_CUDA_CHECK(e);
    return true;
  }
  void wait() override {
    DeviceGuard g(device_);  // a null (legacy) stream handle means the current device's
    const Stream cur = Stream::current(device_);
    BT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(cur.handle()), p_->done_event, 0));
  }

 private:
  std::shared_ptr<NcclProcessGroup::Pending> p_;
  Device device_;
};

NcclProcessGroup::NcclProcessGroup(MPI_Comm comm, Device device) : ProcessGroup(0, 1), device_(device) {
  BT_CHECK(device.is_cuda(), "the NCCL process group needs a CUDA device, got ", device);
  presence_ = std::make_unique<MpiProcessGroup>(comm);
  rank_ = presence_->rank();
  size_ = presence_->size();
  ncclUniqueId id;
  if (rank_ == 0) BT_NCCL_CHECK(ncclGetUniqueId(&id));
  BT_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm));
  init(&id, device);
}

NcclProcessGroup::NcclProcessGroup(TcpStore& store, int rank, int size, Device device)
    : ProcessGroup(rank, size), device_(device) {
  BT_CHECK(device.is_cuda(), "the NCCL process group needs a CUDA device, got ", device);
  ncclUniqueId id;
  if (rank_ == 0) {
    BT_NCCL_CHECK(ncclGetUniqueId(&id));
    store.set("nccl/unique_id", std::string(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    const std::string v = store.get("nccl/unique_id");
    BT_CHECK(v.size() == sizeof id, "rendezvous: the NCCL unique id from rank 0 has ", v.size(),
             " bytes, not ", sizeof id, " (ranks built against different NCCL versions?)");
    std::memcpy(&id, v.data(), sizeof id);
  }
  init(&id, device);
}

void NcclProcessGroup::init(const void* unique_id, Device device) {
  set_current_device(device);  // this rank's GPU (Note [NCCL deadlines] in the header)
  DeviceGuard g(device);
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof id);
  BT_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  stream_ = Stream::create(device, /*high_priority=*/true);  // Note [NCCL stream priority]
  watchdog_ = std::thread([this] { watchdog(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (comm_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_.handle()));
    ncclCommDestroy(comm_);
  }
  pending_.clear();
  presence_.reset();
}

std::shared_ptr<NcclProcessGroup::Pending> NcclProcessGroup::track(std::string op, cudaStream_t s) {
  auto p = std::make_shared<Pending>();
  p->op = std::move(op);
  p->step = step_;
  {
    std::lock_guard<std::mutex> lk(mu_);
    p->seq = presence_ ? presence_->announce() : ++seq_;
  }
  BT_CUDA_CHECK(cudaEventCreateWithFlags(&p->done_event, cudaEventDisableTiming));
  BT_CUDA_CHECK(cudaEventRecord(p->done_event, s));
  if (capture_underway()) return p;  // Note [Collectives in a CUDA graph]: the replay is watched
  p->deadline = std::chrono::steady_clock::now() + timeout_;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back(p);
  }
  cv_.notify_all();
  return p;
}

template <class F>
std::shared_ptr<Work> NcclProcessGroup::run(const char* op, std::initializer_list<Tensor> tensors,
                                            F&& launch) {
  DeviceGuard g(device_);
  const Stream cur = Stream::current(device_);
  stream_wait(stream_, cur);  // the inputs are ready
  for (const Tensor& t : tensors) {
    Storage& s = *t.impl()->storage;
    if (s.allocator) s.allocator->record_stream(s.data, stream_);
  }
  const auto s = static_cast<cudaStream_t>(stream_.handle());
  launch(s);
  return std::make_shared<NcclWork>(track(op, s), device_);
}

void NcclProcessGroup::watch(const std::string& what) {
  BT_CHECK(!capture_underway(), "watch(", what, "): called while a CUDA graph is captured");
  DeviceGuard g(device_);
  (void)track(what, static_cast<cudaStream_t>(Stream::current(device_).handle()));
}

void NcclProcessGroup::watchdog() {
  cudaSetDevice(device_.index);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(100));
    while (!pending_.empty()) {
      const std::shared_ptr<Pending> p = pending_.front();
      const cudaError_t e = query(p->done_event);
      if (e == cudaSuccess) {
        p->done = true;
        pending_.pop_front();
        continue;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const bool late = std::chrono::steady_clock::now() >= p->deadline;
      if (!late && async == ncclSuccess && (e == cudaErrorNotReady)) break;
      // A deadline passed, NCCL failed, or the device did: report and end the job.
      const std::string what =
          cat(p->step > 0 ? cat(p->op, " #", p->seq, " (step ", p->step, ")") : cat(p->op, " #", p->seq),
              late                   ? cat(" timed out after ", timeout_.count() / 1000.0, " s")
              : async != ncclSuccess ? cat(" failed: NCCL ", ncclGetErrorString(async))
                                     : cat(" failed: CUDA ", cudaGetErrorString(e)),
              " on rank ", rank_, " of ", size_, ": ",
              presence_ ? presence_->not_arrived(p->seq)
                        : std::string("which ranks did not arrive is not known without MPI"),
              ". The NCCL communicator is aborted and the job ends (raise dist.timeout_s if "
              "the ranks are only slow)");
      std::fprintf(stderr, "blutrain: error on rank %d of %d: %s\n", rank_, size_, what.c_str());
      std::fflush(stderr);
      ncclCommAbort(comm_);
      comm_ = nullptr;
      abort_world(1);
    }
  }
}

std::shared_ptr<Work> NcclProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t, true);
  const ncclRedOp_t r = nccl_op("all_reduce", t.dtype(), op);
  return run("all_reduce", {t}, [&](cudaStream_t s) {
    BT_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                nccl_type(t.dtype()), r, comm_, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                             ReduceOp op) {
  check_pair("reduce_scatter", out, in, true);
  const ncclRedOp_t r = nccl_op("reduce_scatter", in.dtype(), op);
  return run("reduce_scatter", {in, out}, [&](cudaStream_t s) {
    BT_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                    nccl_type(in.dtype()), r, comm_, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::all_gather_async(const Tensor& in, const Tensor& out) {
  check_pair("all_gather", in, out, true);
  return run("all_gather", {in, out}, [&](cudaStream_t s) {
    BT_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                                nccl_type(in.dtype()), comm_, s));
  });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast_async(const Tensor& t, int root) {
  check_tensor("broadcast", t, true);
  BT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this group of ", size_);
  return run("broadcast", {t}, [&](cudaStream_t s) {
    BT_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                nccl_type(t.dtype()), root, comm_, s));
  });
}

void NcclProcessGroup::barrier() {
  Tensor one = ones({1}, TensorOptions{}.with_device(device_));
  all_reduce_async(one, ReduceOp::Sum)->wait();
  Stream::current(device_).synchronize();  // the watchdog keeps the deadline
}

}  // namespace bt::dist

#endif  // BT_NCCL
