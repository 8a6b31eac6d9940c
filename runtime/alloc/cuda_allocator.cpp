// cuda_allocator(i): one CachingPool per CUDA device (policy in caching_pool.h)
// over a backing allocator made of cudaMalloc/cudaFree and pooled CUDA events.
//
// Streams: the pool's stream key is Stream::id() (the cudaStream_t; 0 is the
// device's legacy default stream). A CPU stream passed to allocate() means
// "the current stream of this device" (Stream::current). record_stream() with a
// CPU stream does nothing (CPU work is synchronous); a stream of another CUDA
// device is an error, since the event would have to live on that device.
//
// Lifetime: each device's allocator is created on first use and intentionally
// never destroyed, so tensors freed during static destruction, after the CUDA
// runtime may already be shutting down, never reach a destroyed pool. The
// driver reclaims the memory at process exit.

#include <mutex>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/alloc/caching_pool.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#ifdef BT_CUDA
#include "kernels/common/cuda_check.h"
#endif

namespace bt {

#ifdef BT_CUDA
namespace {

constexpr int kMaxDevices = 64;

/// cudaMalloc/cudaFree and cudaEvent_t for one device. Called only with the
/// pool's mutex held, so the event free-list needs no lock of its own.
class CudaBacking final : public BackingAllocator {
 public:
  explicit CudaBacking(int device) : device_(device) {}

  void* raw_alloc(size_t bytes) override {
    DeviceGuard g(Device::cuda(device_));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky, but clear it so later checks do not see it
      return nullptr;
    }
    BT_CUDA_CHECK(e);
    return p;
  }

  void raw_free(void* p) override {
    DeviceGuard g(Device::cuda(device_));
    BT_CUDA_CHECK(cudaFree(p));
  }

  uint64_t record_event(uintptr_t stream) override {
    DeviceGuard g(Device::cuda(device_));
    cudaEvent_t ev = nullptr;
    if (!free_events_.empty()) {
      ev = free_events_.back();
      free_events_.pop_back();
    } else {
      BT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    const cudaError_t e = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      free_events_.push_back(ev);
      BT_CUDA_CHECK(e);
    }
    return reinterpret_cast<uint64_t>(ev);
  }

  bool event_done(uint64_t ev) override {
    const cudaError_t e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(ev));
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    BT_CUDA_CHECK(e);
    return true;
  }

  void release_event(uint64_t ev) override { free_events_.push_back(reinterpret_cast<cudaEvent_t>(ev)); }

  void synchronize() override {
    DeviceGuard g(Device::cuda(device_));
    BT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  std::string name() const override { return Device::cuda(device_).str(); }

  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    DeviceGuard g(Device::cuda(device_));
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return true;
  }

 private:
  int device_;
  std::vector<cudaEvent_t> free_events_;  // recorded-and-completed events, for reuse
};

class CudaDeviceAllocator final : public Allocator {
 public:
  explicit CudaDeviceAllocator(int device) : device_(device), backing_(device), pool_(backing_) {}

  void* allocate(size_t nbytes, const Stream& stream) override {
    return pool_.allocate(nbytes, stream_key(stream));
  }
  void deallocate(void* ptr) override { pool_.deallocate(ptr); }
  void record_stream(void* ptr, const Stream& stream) override {
    if (stream.device().is_cpu()) return;  // CPU work is synchronous
    check_same_device(stream, "record_stream");
    pool_.record_stream(ptr, stream.id());
  }
  CachingPool& pool() { return pool_; }

 private:
  uintptr_t stream_key(const Stream& s) const {
    if (s.device().is_cpu()) return Stream::current(Device::cuda(device_)).id();
    check_same_device(s, "allocate");
    return s.id();
  }
  void check_same_device(const Stream& s, const char* what) const {
    BT_CHECK(s.device().index == device_, what, ": memory of the cuda:", device_,
             " allocator cannot be ordered on a stream of ", s.device(), "; use a stream of cuda:", device_,
             " (and stream_wait() to order the two devices' work)");
  }

  int device_;
  CudaBacking backing_;
  CachingPool pool_;  // after backing_, which it refers to
};

CudaDeviceAllocator& device_allocator(int index) {
  check_device_usable(Device::cuda(index));
  BT_CHECK(index < kMaxDevices, "cuda:", index, " is beyond the ", kMaxDevices, " devices BluTrain supports");
  // Trivially destructible statics: nothing here is torn down at exit.
  static std::once_flag once[kMaxDevices];
  static CudaDeviceAllocator* allocators[kMaxDevices];
  std::call_once(once[index], [index] { allocators[index] = new CudaDeviceAllocator(index); });
  return *allocators[index];
}

}  // namespace

Allocator& cuda_allocator(int index) { return device_allocator(index); }
AllocatorStats cuda_memory_stats(int index) { return device_allocator(index).pool().stats(); }
void cuda_reset_peak_stats(int index) { device_allocator(index).pool().reset_peak(); }
void cuda_empty_cache(int index) { device_allocator(index).pool().empty_cache(); }

#else  // !BT_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what, int index) {
  check_device_usable(Device::cuda(index));  // throws its "built without CUDA" message
  BT_FAIL(what, "(", index, "): this BluTrain was built without CUDA; use device cpu");
}
}  // namespace

Allocator& cuda_allocator(int index) { no_cuda("cuda_allocator", index); }
AllocatorStats cuda_memory_stats(int index) { no_cuda("cuda_memory_stats", index); }
void cuda_reset_peak_stats(int index) { no_cuda("cuda_reset_peak_stats", index); }
void cuda_empty_cache(int index) { no_cuda("cuda_empty_cache", index); }

#endif  // BT_CUDA

}  // namespace bt
