#include <cstdio>

#include "launcher/commands.h"
#include "runtime/bt.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::launcher {

const char* version() { return "0.1.0"; }

int run_info(int, char**) {
  std::printf("blutrain %s\n", version());
#ifdef BT_CUDA
  std::printf("  CUDA backend: built (runtime %d)\n", CUDART_VERSION);
#else
  std::printf("  CUDA backend: not built (no nvcc at configure time)\n");
#endif
  std::printf("  CUDA devices: %d\n", cuda_device_count());
#ifdef BT_CUDA
  for (int i = 0; i < cuda_device_count(); ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess)
      std::printf("    cuda:%d %s, %.1f GiB, sm_%d%d\n", i, p.name, p.totalGlobalMem / 1073741824.0, p.major,
                  p.minor);
  }
#endif
  std::printf("  precision policy: %s\n", std::string(precision_name(precision())).c_str());
  return 0;
}

}  // namespace bt::launcher
