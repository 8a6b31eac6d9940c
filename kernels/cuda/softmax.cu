// CUDA row-wise softmax / log-softmax, forward and backward (float accumulation).
// One warp per row for cols <= 1024, one block of 512 threads per row otherwise.
// The forward keeps an online (max, sum) per thread, so x is read twice.
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/online_softmax.cuh"
#include "kernels/softmax.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

/// Combines across the block; all threads get the result.
__device__ __forceinline__ MaxSum block_combine(MaxSum v, float* sm, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_combine(v);
  if (lane == 0) {
    sm[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum t = lane < nwarps ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
    t = warp_combine(t);
    if (lane == 0) {
      sm[32] = t.m;
      ss[32] = t.s;
    }
  }
  __syncthreads();
  return MaxSum{sm[32], ss[32]};
}

/// kWarp: one warp per row (blockDim 256 = 8 rows); else one block per row.
template <typename T, bool kWarp>
__global__ void softmax_fwd_kernel(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  __shared__ float sm[33], ss[33];
  int64_t row;
  int tid, nthreads;
  if constexpr (kWarp) {
    row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    tid = threadIdx.x & 31;
    nthreads = 32;
    if (row >= rows) return;
  } else {
    row = blockIdx.x;
    tid = threadIdx.x;
    nthreads = blockDim.x;
  }
  const T* px = x + row * cols;
  T* py = y + row * cols;
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t j = tid; j < cols; j += nthreads) {
    const float v = ldf(px + j);
    if (v > st.m) {
      st.s = st.s * expf(st.m - v) + 1.0f;
      st.m = v;
    } else if (v != -INFINITY) {  // -inf adds 0 (and -inf - -inf would be NaN)
      st.s += expf(v - st.m);
    }
  }
  if constexpr (kWarp)
    st = warp_combine(st);
  else
    st = block_combine(st, sm, ss);
  if (log) {
    const float lse = st.m + logf(st.s);
    for (int64_t j = tid; j < cols; j += nthreads) stf(py + j, ldf(px + j) - lse);
  } else {
    const float inv = 1.0f / st.s;
    for (int64_t j = tid; j < cols; j += nthreads) stf(py + j, expf(ldf(px + j) - st.m) * inv);
  }
}

template <typename T, bool kWarp>
__global__ void softmax_bwd_kernel(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols, bool log) {
  __shared__ float sred[33];
  int64_t row;
  int tid, nthreads;
  if constexpr (kWarp) {
    row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    tid = threadIdx.x & 31;
    nthreads = 32;
    if (row >= rows) return;
  } else {
    row = blockIdx.x;
    tid = threadIdx.x;
    nthreads = blockDim.x;
  }
  const T* py = y + row * cols;
  const T* pdy = dy + row * cols;
  T* pdx = dx + row * cols;
  float acc = 0.0f;
  for (int64_t j = tid; j < cols; j += nthreads) acc += log ? ldf(pdy + j) : ldf(pdy + j) * ldf(py + j);
  if constexpr (kWarp)
    acc = warp_sum(acc);
  else
    acc = block_sum(acc, sred);
  for (int64_t j = tid; j < cols; j += nthreads) {
    const float yv = ldf(py + j), g = ldf(pdy + j);
    stf(pdx + j, log ? g - expf(yv) * acc : yv * (g - acc));
  }
}

void check_rows(const char* what, int64_t rows, int64_t cols) {
  BT_CHECK(rows >= 0 && cols >= 0, "cuda ", what, ": negative size (rows ", rows, ", cols ", cols, ")");
  BT_CHECK(rows < INT_MAX, "cuda ", what, ": too many rows (", rows, ")");
}

}  // namespace

void softmax_forward(DType dt, const void* x, void* y, int64_t rows, int64_t cols, bool log,
                     cudaStream_t stream) {
  check_rows("softmax_forward", rows, cols);
  dispatch_float(dt, "softmax_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows == 0 || cols == 0) return;
    BT_CHECK(x != nullptr && y != nullptr, "cuda softmax_forward: null buffer");
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (cols <= 1024)
      softmax_fwd_kernel<T, true>
          <<<static_cast<unsigned>(ceil_div(rows, 8)), 256, 0, stream>>>(px, py, rows, cols, log);
    else
      softmax_fwd_kernel<T, false><<<static_cast<unsigned>(rows), 512, 0, stream>>>(px, py, rows, cols, log);
    BT_KERNEL_CHECK();
  });
}

void softmax_backward(DType dt, const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, bool log,
                      cudaStream_t stream) {
  check_rows("softmax_backward", rows, cols);
  dispatch_float(dt, "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows == 0 || cols == 0) return;
    BT_CHECK(y != nullptr && dy != nullptr && dx != nullptr, "cuda softmax_backward: null buffer");
    const T* py = static_cast<const T*>(y);
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    if (cols <= 1024)
      softmax_bwd_kernel<T, true>
          <<<static_cast<unsigned>(ceil_div(rows, 8)), 256, 0, stream>>>(py, pdy, pdx, rows, cols, log);
    else
      softmax_bwd_kernel<T, false>
          <<<static_cast<unsigned>(rows), 512, 0, stream>>>(py, pdy, pdx, rows, cols, log);
    BT_KERNEL_CHECK();
  });
}

}  // namespace bt::kernels::cuda
