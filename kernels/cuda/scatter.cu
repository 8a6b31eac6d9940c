#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/scatter.h"

namespace bt::kernels::cuda {
namespace {

template <typename T>
__global__ void strided_scatter_kernel(const T* src, T* dst, StridedLayout layout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[layout.offset_of(i)] = src[i];
}

template <typename T>
__global__ void argmax_scatter_kernel(const T* dy, const int64_t* am, T* dx, int64_t outer, int64_t dim,
                                      int64_t inner) {
  const int64_t total = outer * dim * inner;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % inner;
    const int64_t j = (e / inner) % dim;
    const int64_t o = e / (inner * dim);
    dx[e] = am[o * inner + i] == j ? dy[o * inner + i] : T(0);
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

template <typename T>
void scatter_t(const void* src, void* dst, const StridedLayout& layout, int64_t n, cudaStream_t stream) {
  strided_scatter_kernel<T>
      <<<grid_for(n, 256), 256, 0, stream>>>(static_cast<const T*>(src), static_cast<T*>(dst), layout, n);
  BT_KERNEL_CHECK();
}

}  // namespace

void strided_scatter(DType dt, const void* src, void* dst, const StridedLayout& layout, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < layout.ndim; ++d) n *= layout.shape[d];
  if (n == 0) return;
  StridedLayout l = layout;
  detail::coalesce(&l, 1);
  if (int64_t rows, cols, pitch; detail::pitched_rows(l, &rows, &cols, &pitch)) {
    const size_t es = dtype_size(dt);
    BT_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(pitch) * es, src, static_cast<size_t>(cols) * es,
                                    static_cast<size_t>(cols) * es, static_cast<size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  switch (dtype_size(dt)) {
    case 1:
      return scatter_t<uint8_t>(src, dst, layout, n, stream);
    case 2:
      return scatter_t<uint16_t>(src, dst, layout, n, stream);
    case 4:
      return scatter_t<uint32_t>(src, dst, layout, n, stream);
    case 8:
      return scatter_t<uint64_t>(src, dst, layout, n, stream);
    default:
      BT_FAIL("strided_scatter: unsupported dtype ", dt);
  }
}

void argmax_scatter(DType dt, const void* dy, const int64_t* argmax, void* dx, int64_t outer, int64_t dim,
                    int64_t inner, cudaStream_t stream) {
  const int64_t total = outer * dim * inner;
  if (total == 0) return;
  switch (dt) {
    case DType::F32:
      argmax_scatter_kernel<float><<<grid_for(total, 256), 256, 0, stream>>>(
          static_cast<const float*>(dy), argmax, static_cast<float*>(dx), outer, dim, inner);
      break;
    case DType::BF16:  // bit copies: 0 is +0.0 in bf16
      argmax_scatter_kernel<uint16_t><<<grid_for(total, 256), 256, 0, stream>>>(
          static_cast<const uint16_t*>(dy), argmax, static_cast<uint16_t*>(dx), outer, dim, inner);
      break;
    default:
      BT_FAIL("argmax_scatter: unsupported dtype ", dt, " on CUDA (f32, bf16)");
  }
  BT_KERNEL_CHECK();
}

}  // namespace bt::kernels::cuda
