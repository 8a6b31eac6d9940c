// Counter-based random numbers (Philox-4x32-10). Element i of a fill with
// (seed, offset) depends only on (seed, offset + i), and the CPU and CUDA
// kernels produce bitwise-identical values. See Note [Portable RNG] in
// kernels/common/philox.h.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
void fill_uniform(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi);
void fill_normal(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void fill_uniform(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi,
                  cudaStream_t stream);
void fill_normal(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float mean, float std,
                 cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
