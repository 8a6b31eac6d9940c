#include "runtime/core/cuda_module.h"

#include "kernels/common/error.h"

#ifdef BT_CUDA
#include <mutex>

#include <cuda.h>

#include "kernels/common/cuda_check.h"
#endif

namespace bt {

#ifdef BT_CUDA
namespace {

// Note [Driver entry points]
// cuModuleLoadDataEx and friends live in libcuda, which exists only where a
// GPU driver is installed. Linking it would stop every BluTrain binary from
// starting on a machine without one (CI). The CUDA runtime, which the build
// links anyway, hands out the driver's entry points at run time instead; where
// there is no driver, the lookup fails and loading says so.
struct Driver {
  decltype(&::cuModuleLoadDataEx) load = nullptr;
  decltype(&::cuModuleGetFunction) function = nullptr;
  decltype(&::cuModuleUnload) unload = nullptr;
  decltype(&::cuLaunchKernel) launch = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  std::string unavailable;  // empty when every entry point was found
};

template <class F>
bool lookup(const char* name, F& out, std::string& why) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();  // no sticky error for the next CUDA call to find
    why = std::string("the CUDA driver's ") + name + " was not found (" +
          (e != cudaSuccess ? cudaGetErrorString(e) : "no such entry point in this driver") +
          "); GPU code made at run time needs an NVIDIA driver for CUDA 12 or later";
    return false;
  }
  out = reinterpret_cast<F>(fn);
  return true;
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string why;
    if (!(lookup("cuModuleLoadDataEx", d.load, why) && lookup("cuModuleGetFunction", d.function, why) &&
          lookup("cuModuleUnload", d.unload, why) && lookup("cuLaunchKernel", d.launch, why) &&
          lookup("cuGetErrorString", d.error_string, why)))
      d.unavailable = why;
  });
  return d;
}

std::string error_text(CUresult r) {
  const char* s = nullptr;
  if (driver().error_string && driver().error_string(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUDA driver error " + std::to_string(static_cast<int>(r));
}

}  // namespace

std::string cuda_modules_unavailable() { return driver().unavailable; }

int cuda_arch(const Device& device) {
  check_device_usable(device);
  BT_CHECK(device.is_cuda(), "cuda_arch: ", device, " is not a CUDA device");
  int major = 0, minor = 0;
  BT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
  BT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index));
  return major * 10 + minor;
}

std::shared_ptr<CudaModule> CudaModule::load(const Device& device, const std::string& image,
                                             const std::vector<std::string>& kernels,
                                             const std::string& what) {
  BT_CHECK(device.is_cuda(), what, ": GPU code cannot load on ", device);
  const Driver& d = driver();
  BT_CHECK(d.unavailable.empty(), what, ": ", d.unavailable);
  DeviceGuard guard(device);
  BT_CUDA_CHECK(cudaFree(nullptr));  // makes the device's primary context current
  std::shared_ptr<CudaModule> m(new CudaModule(device, what));
  std::string log(16384, '\0');
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(log.size()))};
  CUmodule mod = nullptr;
  const CUresult r = d.load(&mod, image.c_str(), 2, opts, values);
  if (r != CUDA_SUCCESS) {
    log.resize(log.find('\0') == std::string::npos ? log.size() : log.find('\0'));
    BT_FAIL(what, ": the CUDA driver did not load its code on ", device, ": ", error_text(r),
            log.empty() ? "" : "\n" + log);
  }
  m->module_ = mod;
  for (const std::string& k : kernels) {
    CUfunction f = nullptr;
    const CUresult fr = d.function(&f, mod, k.c_str());
    BT_CHECK(fr == CUDA_SUCCESS, what, ": no kernel '", k, "' in its loaded code (", error_text(fr), ")");
    m->kernels_.push_back(reinterpret_cast<void*>(f));
    m->names_.push_back(k);
  }
  return m;
}

CudaModule::~CudaModule() {
  if (module_) driver().unload(static_cast<CUmodule>(module_));  // a failure at exit is not worth a throw
}

void CudaModule::launch(size_t k, const Dims& dims, void** args, const Stream& stream) const {
  BT_ASSERT(k < kernels_.size());
  DeviceGuard guard(device_);  // the module's context is the device's primary context
  BT_CHECK(stream.device() == device_, what_, ": kernel '", names_[k], "' was loaded on ", device_,
           ", not on the stream's ", stream.device());
  const CUresult r = driver().launch(
      static_cast<CUfunction>(kernels_[k]), dims.grid[0], dims.grid[1], dims.grid[2], dims.block[0],
      dims.block[1], dims.block[2], dims.shared_bytes, static_cast<CUstream>(stream.handle()), args, nullptr);
  BT_CHECK(r == CUDA_SUCCESS, what_, ": launching kernel '", names_[k], "' (grid ", dims.grid[0], "x",
           dims.grid[1], "x", dims.grid[2], ", block ", dims.block[0], "x", dims.block[1], "x", dims.block[2],
           ") failed: ", error_text(r));
}
#else
std::string cuda_modules_unavailable() { return "this BluTrain was built without CUDA"; }

int cuda_arch(const Device& device) { BT_FAIL("cuda_arch: ", device, ": ", cuda_modules_unavailable()); }

std::shared_ptr<CudaModule> CudaModule::load(const Device&, const std::string&,
                                             const std::vector<std::string>&, const std::string& what) {
  BT_FAIL(what, ": ", cuda_modules_unavailable());
}

CudaModule::~CudaModule() = default;

void CudaModule::launch(size_t, const Dims&, void**, const Stream&) const {
  BT_FAIL(what_, ": ", cuda_modules_unavailable());
}
#endif

}  // namespace bt
