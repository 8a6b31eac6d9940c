// GPU code made at run time (the compiler's PTX, compiler/cuda_codegen.h),
// loaded and launched through the CUDA driver API: cuModuleLoadDataEx,
// cuModuleGetFunction, cuLaunchKernel. The driver's entry points are looked
// up through the CUDA runtime (cudaGetDriverEntryPointByVersion), so nothing
// links libcuda and a build without a GPU driver still starts; there, loading
// says why it cannot.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace bt {

/// Empty when this process can load GPU code (a CUDA build and a driver);
/// else a sentence saying why not.
std::string cuda_modules_unavailable();

/// The compute capability of `device` as major * 10 + minor (90 for an H100).
int cuda_arch(const Device& device);

/// One code image loaded on one device, and the kernels looked up in it.
/// Unloaded when the last handle goes.
class CudaModule {
 public:
  /// Loads `image` (PTX text or a cubin) on `device` and looks up `kernels`
  /// by name. Throws bt::Error naming `what`, with the driver's JIT log, when
  /// the image does not load or a kernel is missing.
  static std::shared_ptr<CudaModule> load(const Device& device, const std::string& image,
                                          const std::vector<std::string>& kernels, const std::string& what);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  struct Dims {
    std::array<unsigned, 3> grid{1, 1, 1};
    std::array<unsigned, 3> block{1, 1, 1};
    unsigned shared_bytes = 0;  // dynamic shared memory
  };
  /// Queues kernel `k` (its index in load()'s list) on `stream`; `args[i]`
  /// points at the i-th kernel parameter's value, as cuLaunchKernel takes them.
  void launch(size_t k, const Dims& dims, void** args, const Stream& stream) const;

  const Device& device() const { return device_; }

 private:
  CudaModule(Device device, std::string what) : device_(device), what_(std::move(what)) {}
  Device device_;
  std::string what_;
  void* module_ = nullptr;      // CUmodule
  std::vector<void*> kernels_;  // CUfunction
  std::vector<std::string> names_;
};

}  // namespace bt
