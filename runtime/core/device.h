// Where a tensor lives: the CPU or CUDA device i.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace bt {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

/// Parses "cpu", "cuda", "cuda:N"; throws bt::Error naming the bad value.
Device parse_device(std::string_view s);

/// True when BluTrain was built with CUDA and at least one device is visible.
bool cuda_available();
/// Number of visible CUDA devices (0 without CUDA).
int cuda_device_count();
/// Throws a clear bt::Error if `d` is a CUDA device that cannot be used here.
void check_device_usable(const Device& d);
/// Makes `d` this thread's current CUDA device from now on (no-op for CPU): a
/// rank of a distributed job selects its GPU this way, so that calls naming
/// the legacy default stream (handle nullptr) mean that GPU's.
void set_current_device(const Device& d);

}  // namespace bt

namespace bt {
/// Makes `d` the current CUDA device for the scope (no-op for CPU).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};
}  // namespace bt
