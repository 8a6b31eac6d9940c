// An ordered queue of work on a device. CPU work is synchronous, so a CPU
// stream is a tag. A CUDA stream wraps cudaStream_t; the default-constructed
// CUDA stream is the legacy default stream of that device.
#pragma once

#include <cstdint>

#include "runtime/core/device.h"

namespace bt {

class Stream {
 public:
  Stream() = default;
  Stream(Device device, void* handle) : device_(device), handle_(handle) {}

  /// A new non-blocking CUDA stream on `device` (owned by the process; never
  /// destroyed); with `high_priority`, at the device's greatest priority (its
  /// kernels are scheduled before those of ordinary streams).
  static Stream create(Device device, bool high_priority = false);
  /// The stream that new work on `device` goes to (see StreamGuard).
  static Stream current(Device device);

  Device device() const { return device_; }
  /// cudaStream_t for CUDA streams; nullptr is the legacy default stream.
  void* handle() const { return handle_; }
  /// Opaque id, stable for the stream's lifetime (used as an allocator pool key).
  uintptr_t id() const { return reinterpret_cast<uintptr_t>(handle_); }
  void synchronize() const;
  bool operator==(const Stream& o) const { return device_ == o.device_ && handle_ == o.handle_; }
  bool operator!=(const Stream& o) const { return !(*this == o); }

 private:
  Device device_ = Device::cpu();
  void* handle_ = nullptr;
};

/// Makes `s` the current stream of its device for this thread, until scope exit.
class StreamGuard {
 public:
  explicit StreamGuard(Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

/// Makes `waiter` wait for all work queued so far on `producer` (a CUDA event).
void stream_wait(const Stream& waiter, const Stream& producer);

/// Synchronizes every CUDA device used by this process (no-op without CUDA).
void device_synchronize();

}  // namespace bt
