#include "runtime/core/device.h"

#include <charconv>

#include "kernels/common/error.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    int i = -1;
    auto rest = s.substr(5);
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), i);
    if (ec == std::errc() && p == rest.data() + rest.size() && i >= 0) return Device::cuda(i);
  }
  BT_FAIL("unknown device '", s, "'; use cpu, cuda or cuda:N");
}

int cuda_device_count() {
#ifdef BT_CUDA
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return c;
  }();
  return n;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

void check_device_usable(const Device& d) {
  if (d.is_cpu()) return;
#ifndef BT_CUDA
  BT_FAIL("device ", d,
          " requested but this BluTrain was built without CUDA; use device cpu or rebuild with nvcc");
#else
  const int n = cuda_device_count();
  BT_CHECK(n > 0, "device ", d, " requested but no CUDA device is visible; use device cpu");
  BT_CHECK(d.index >= 0 && d.index < n, "device ", d, " does not exist: ", n,
           " CUDA device(s) visible (cuda:0..cuda:", n - 1, ")");
#endif
}

}  // namespace bt

namespace bt {
void set_current_device(const Device& d) {
#ifdef BT_CUDA
  if (!d.is_cuda()) return;
  check_device_usable(d);
  if (cudaSetDevice(d.index) != cudaSuccess) BT_FAIL("cannot select CUDA device ", d);
#endif
}

DeviceGuard::DeviceGuard(const Device& d) {
#ifdef BT_CUDA
  if (!d.is_cuda()) return;
  check_device_usable(d);
  cudaGetDevice(&prev_);
  if (prev_ != d.index) {
    if (cudaSetDevice(d.index) != cudaSuccess) BT_FAIL("cannot select CUDA device ", d);
  } else {
    prev_ = -1;
  }
#endif
}
DeviceGuard::~DeviceGuard() {
#ifdef BT_CUDA
  if (prev_ >= 0) cudaSetDevice(prev_);
#endif
}
}  // namespace bt
