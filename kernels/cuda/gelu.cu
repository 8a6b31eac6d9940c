// CUDA GELU (tanh approximation), forward and backward; 16-byte packs when
// aligned. The MLP's backward pass in one (Note [The MLP's GELU backward in
// one pass]).
#include <climits>
#include <type_traits>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/gelu.h"
#include "kernels/reduce.h"

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

// Note [The MLP's GELU backward in one pass]
// In an MLP's backward, dPre = dH * gelu'(pre) is followed by the column sums
// of dPre (the first layer's bias gradient), and under selective recompute by
// h = gelu(pre) for the second layer's weight gradient (Note [Fused MLP
// backward], runtime/ops/nn/mlp.cpp). As three kernels they read pre twice
// and dPre once more; gelu_bwd_fused_kernel reads pre and dH once, writes
// dPre over dH and h, and sums the columns of the dPre it stores on the way
// (column_partials_vec). It evaluates tanh once for gelu and gelu' (without
// that sharing, two tanhf an element made the pass compute-bound: 153 us for
// GPT-2's 16384 x 3072 on an H200, 2.6 TB/s; 123 us with one). Each output
// has the bits of its separate kernel: dPre gelu_backward's, h gelu_forward's,
// the sums reduce_dim's over dPre with scratch -- the same expressions on the
// same values, and the same chunks and order. Layouts the 16-byte kernel does
// not take run those three kernels.
//   In bf16 the pass moves 8 bytes per tanh (f32 without h: 12), so the
// arithmetic is no longer hidden for free: a warp that waits for its four
// rows and then computes them issues no loads meanwhile. GPT-2's pass took
// 122.8 us on an H200 that way (3.3 TB/s). With the next four rows' loads
// issued before these are used (column_partials_vec's kPipe: 128 registers,
// two blocks an SM) it took 115.4 us on another H200 (on one card, the kernel
// benchmark: 3238 GB/s against 2981-3021). In f32 both forms take 144.5 us,
// so f32 keeps four blocks an SM. A cheaper tanh did not help: tanhf's
// formula for large arguments used for all (7 instructions instead of about
// 20) made the unpipelined pass slower (129.1 us), the pipelined one 120.7.
template <typename T, bool kH>
struct GeluGradRows {
  using P = Pack<T, kVec16<T>>;
  struct Raw {
    P x, g;
  };
  const T* pre;
  T* g;
  T* h;
  int64_t inner;
  __device__ Raw load(int64_t j, int64_t col) const {
    const int64_t i = j * inner + col;
    return {*reinterpret_cast<const P*>(pre + i), *reinterpret_cast<const P*>(g + i)};
  }
  __device__ P use(const Raw& r, int64_t j, int64_t col) const {
    P d, y;
#pragma unroll
    for (int v = 0; v < kVec16<T>; ++v) {
      const float x = to_float(r.x.v[v]), t = gelu_tanh_t(x);
      d.v[v] = from_float<T>(to_float(r.g.v[v]) * gelu_grad_from_t(x, t));
      if constexpr (kH) y.v[v] = from_float<T>(gelu_from_t(x, t));
    }
    const int64_t i = j * inner + col;
    *reinterpret_cast<P*>(g + i) = d;
    if constexpr (kH) *reinterpret_cast<P*>(h + i) = y;
    return d;
  }
};

/// kPipe: bf16, where the pass computes most per byte.
template <typename T>
inline constexpr bool kGeluPipe = std::is_same_v<T, bf16_t>;

template <typename T, bool kH>
__global__ void __launch_bounds__(256, kGeluPipe<T> ? 2 : 4)
    gelu_bwd_fused_kernel(const T* pre, T* g, T* h, float* partial, int64_t rows, int64_t cols,
                          int64_t chunk) {
  const int64_t it = blockIdx.x, c = blockIdx.y;
  column_partials_vec<T, kGeluPipe<T>>(GeluGradRows<T, kH>{pre, g, h, cols},
                                       partial ? partial + c * cols : nullptr, rows, cols, it, c, chunk);
}

}  // namespace

size_t gelu_backward_fused_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>(split_chunks(1, rows, cols) * cols);
}

void gelu_backward_fused(DType dt, const void* pre, void* g, void* h, float* bias_grad, int64_t rows,
                         int64_t cols, float* scratch, cudaStream_t stream) {
  BT_CHECK(rows >= 0 && cols >= 0, "cuda gelu_backward_fused: negative size ", rows, " x ", cols);
  BT_CHECK(dt == DType::F32 || dt == DType::BF16, "cuda gelu_backward_fused: F32 or BF16, got ",
           dtype_name(dt));
  if (rows == 0 || cols == 0) {
    if (bias_grad && cols > 0) BT_CUDA_CHECK(cudaMemsetAsync(bias_grad, 0, cols * sizeof(float), stream));
    return;
  }
  BT_CHECK(pre != nullptr && g != nullptr && (bias_grad == nullptr || scratch != nullptr),
           "cuda gelu_backward_fused: null buffer");
  const int64_t n = rows * cols, chunks = split_chunks(1, rows, cols);
  dispatch_float(dt, "gelu_backward_fused", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = kVec16<T>;
    T* pg = static_cast<T*>(g);
    T* ph = static_cast<T*>(h);
    const T* px = static_cast<const T*>(pre);
    if (cols % V != 0 || !aligned_to(px, 16) || !aligned_to(pg, 16) || (ph && !aligned_to(ph, 16))) {
      gelu_backward(dt, pre, g, g, n, stream);
      if (ph) gelu_forward(dt, pre, h, n, stream);
      if (bias_grad) reduce_dim(ReduceOp::Sum, dt, DType::F32, g, bias_grad, 1, rows, cols, scratch, stream);
      return;
    }
    const int64_t chunk = ceil_div(rows, chunks), tiles = ceil_div(cols, 32 * V);
    BT_CHECK(tiles < INT_MAX && chunks < 65536, "cuda gelu_backward_fused: too many columns");
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
    float* partial = bias_grad ? scratch : nullptr;
    if (ph)
      gelu_bwd_fused_kernel<T, true>
          <<<grid, dim3(32, 8), 0, stream>>>(px, pg, ph, partial, rows, cols, chunk);
    else
      gelu_bwd_fused_kernel<T, false>
          <<<grid, dim3(32, 8), 0, stream>>>(px, pg, nullptr, partial, rows, cols, chunk);
    BT_KERNEL_CHECK();
    if (bias_grad) {
      launch_reduce_partials<float, ReduceOp::Sum>(scratch, bias_grad, cols, chunks, rows, stream);
    }
  });
}

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
