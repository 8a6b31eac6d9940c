#include "runtime/core/stream.h"

#include <array>
#include <mutex>
#include <vector>

#include "kernels/common/error.h"
#ifdef BT_CUDA
#include "kernels/common/cuda_check.h"
#endif

namespace bt {
namespace {
constexpr int kMaxDevices = 64;
thread_local std::array<void*, kMaxDevices> t_current{};  // nullptr = legacy default stream
}  // namespace

Stream Stream::create(Device device, bool high_priority) {
  if (device.is_cpu()) return Stream(device, nullptr);
#ifdef BT_CUDA
  check_device_usable(device);
  int prev = 0;
  BT_CUDA_CHECK(cudaGetDevice(&prev));
  BT_CUDA_CHECK(cudaSetDevice(device.index));
  cudaStream_t s = nullptr;
  int lowest = 0, highest = 0;
  BT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  BT_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? highest : lowest));
  BT_CUDA_CHECK(cudaSetDevice(prev));
  return Stream(device, s);
#else
  (void)high_priority;
  check_device_usable(device);
  return Stream();
#endif
}

Stream Stream::current(Device device) {
  if (device.is_cpu()) return Stream(device, nullptr);
  BT_ASSERT(device.index >= 0 && device.index < kMaxDevices);
  return Stream(device, t_current[device.index]);
}

void Stream::synchronize() const {
  if (device_.is_cpu()) return;
#ifdef BT_CUDA
  BT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
#endif
}

StreamGuard::StreamGuard(Stream s) : prev_(Stream::current(s.device())) {
  if (s.device().is_cuda()) t_current[s.device().index] = s.handle();
}

StreamGuard::~StreamGuard() {
  if (prev_.device().is_cuda()) t_current[prev_.device().index] = prev_.handle();
}

void stream_wait(const Stream& waiter, const Stream& producer) {
  if (waiter.device().is_cpu() || producer.device().is_cpu() || waiter == producer) return;
#ifdef BT_CUDA
  cudaEvent_t ev;
  BT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  BT_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(producer.handle())));
  BT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter.handle()), ev, 0));
  BT_CUDA_CHECK(cudaEventDestroy(ev));
#endif
}

void device_synchronize() {
#ifdef BT_CUDA
  const int n = cuda_device_count();
  int prev = 0;
  if (n == 0) return;
  BT_CUDA_CHECK(cudaGetDevice(&prev));
  for (int i = 0; i < n; ++i) {
    BT_CUDA_CHECK(cudaSetDevice(i));
    BT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  BT_CUDA_CHECK(cudaSetDevice(prev));
#endif
}

}  // namespace bt
