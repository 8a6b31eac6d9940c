// CUDA GELU (tanh approximation), forward and backward; 16-byte packs when aligned.
#include "kernels/cuda/common.cuh"
#include "kernels/gelu.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

template <typename T>
__global__ void gelu_fwd_vec_kernel(const T* x, T* y, int64_t npacks) {
  constexpr int V = kVec16<T>;
  using P = Pack<T, V>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < npacks; i += stride) {
    const P px = reinterpret_cast<const P*>(x)[i];
    P py;
#pragma unroll
    for (int j = 0; j < V; ++j) py.v[j] = from_float<T>(gelu_tanh(to_float(px.v[j])));
    reinterpret_cast<P*>(y)[i] = py;
  }
}

template <typename T>
__global__ void gelu_fwd_kernel(const T* x, T* y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    stf(y + i, gelu_tanh(ldf(x + i)));
}

template <typename T>
__global__ void gelu_bwd_vec_kernel(const T* x, const T* dy, T* dx, int64_t npacks) {
  constexpr int V = kVec16<T>;
  using P = Pack<T, V>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < npacks; i += stride) {
    const P px = reinterpret_cast<const P*>(x)[i];
    const P pg = reinterpret_cast<const P*>(dy)[i];
    P pd;
#pragma unroll
    for (int j = 0; j < V; ++j)
      pd.v[j] = from_float<T>(to_float(pg.v[j]) * gelu_tanh_grad(to_float(px.v[j])));
    reinterpret_cast<P*>(dx)[i] = pd;
  }
}

template <typename T>
__global__ void gelu_bwd_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    stf(dx + i, ldf(dy + i) * gelu_tanh_grad(ldf(x + i)));
}

}  // namespace

void gelu_forward(DType dt, const void* x, void* y, int64_t n, cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda gelu_forward: negative element count ", n);
  dispatch_float(dt, "gelu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0) return;
    BT_CHECK(x != nullptr && y != nullptr, "cuda gelu_forward: null buffer");
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    constexpr int kThreads = 256, V = kVec16<T>;
    int64_t done = 0;
    if (aligned_to(px, 16) && aligned_to(py, 16) && n >= V) {
      const int64_t np = n / V;
      gelu_fwd_vec_kernel<T><<<grid_stride_blocks(np, kThreads), kThreads, 0, stream>>>(px, py, np);
      BT_KERNEL_CHECK();
      done = np * V;
    }
    if (done < n) {
      gelu_fwd_kernel<T>
          <<<grid_stride_blocks(n - done, kThreads), kThreads, 0, stream>>>(px + done, py + done, n - done);
      BT_KERNEL_CHECK();
    }
  });
}

void gelu_backward(DType dt, const void* x, const void* dy, void* dx, int64_t n, cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda gelu_backward: negative element count ", n);
  dispatch_float(dt, "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0) return;
    BT_CHECK(x != nullptr && dy != nullptr && dx != nullptr, "cuda gelu_backward: null buffer");
    const T* px = static_cast<const T*>(x);
    const T* pg = static_cast<const T*>(dy);
    T* pd = static_cast<T*>(dx);
    constexpr int kThreads = 256, V = kVec16<T>;
    int64_t done = 0;
    if (aligned_to(px, 16) && aligned_to(pg, 16) && aligned_to(pd, 16) && n >= V) {
      const int64_t np = n / V;
      gelu_bwd_vec_kernel<T><<<grid_stride_blocks(np, kThreads), kThreads, 0, stream>>>(px, pg, pd, np);
      BT_KERNEL_CHECK();
      done = np * V;
    }
    if (done < n) {
      gelu_bwd_kernel<T><<<grid_stride_blocks(n - done, kThreads), kThreads, 0, stream>>>(
          px + done, pg + done, pd + done, n - done);
      BT_KERNEL_CHECK();
    }
  });
}

}  // namespace bt::kernels::cuda
