// CUDA random fills. Element i is philox::uniform_at / normal_at(seed, offset + i),
// the same host/device functions the CPU uses, so the results are bitwise equal
// (see Note [Portable RNG]). Nothing depends on the launch shape.
#include "kernels/common/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/random.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

/// Float -> storage with the host's rounding (bitwise equal to bt::bf16(float)).
template <typename T>
__device__ __forceinline__ void store_exact(T* p, float v);
template <>
__device__ __forceinline__ void store_exact<float>(float* p, float v) {
  *p = v;
}
template <>
__device__ __forceinline__ void store_exact<bf16_t>(bf16_t* p, float v) {
  *reinterpret_cast<uint16_t*>(p) = dev_float_to_bf16_bits(v);
}

template <typename T>
__global__ void uniform_kernel(T* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset, float lo,
                               float hi) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_exact(dst + i, philox::uniform_at(seed, offset + static_cast<uint64_t>(i), lo, hi));
}

template <typename T>
__global__ void normal_kernel(T* __restrict__ dst, int64_t n, uint64_t seed, uint64_t offset, float mean,
                              float std) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_exact(dst + i, philox::normal_at(seed, offset + static_cast<uint64_t>(i), mean, std));
}

}  // namespace

void fill_uniform(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi,
                  cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda fill_uniform: negative element count ", n);
  dispatch_float(dt, "fill_uniform", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0) return;
    BT_CHECK(dst != nullptr, "cuda fill_uniform: null buffer for ", n, " elements");
    constexpr int kThreads = 256;
    uniform_kernel<T><<<grid_stride_blocks(n, kThreads, 4), kThreads, 0, stream>>>(static_cast<T*>(dst), n,
                                                                                   seed, offset, lo, hi);
    BT_KERNEL_CHECK();
  });
}

void fill_normal(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float mean, float std,
                 cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda fill_normal: negative element count ", n);
  dispatch_float(dt, "fill_normal", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0) return;
    BT_CHECK(dst != nullptr, "cuda fill_normal: null buffer for ", n, " elements");
    constexpr int kThreads = 256;
    normal_kernel<T><<<grid_stride_blocks(n, kThreads, 4), kThreads, 0, stream>>>(static_cast<T*>(dst), n,
                                                                                  seed, offset, mean, std);
    BT_KERNEL_CHECK();
  });
}

}  // namespace bt::kernels::cuda
