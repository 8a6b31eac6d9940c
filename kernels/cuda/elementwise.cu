// CUDA broadcasting binary ops and unary ops (F32, BF16 computing in float).
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

template <BinaryOp kOp>
__device__ __forceinline__ float apply_binary(float a, float b) {
  if constexpr (kOp == BinaryOp::Add) return a + b;
  if constexpr (kOp == BinaryOp::Sub) return a - b;
  if constexpr (kOp == BinaryOp::Mul) return a * b;
  if constexpr (kOp == BinaryOp::Div) return a / b;
  if constexpr (kOp == BinaryOp::Pow) return powf(a, b);
  return 0.0f;
}

/// Fast path: a, b and out are all contiguous with the output's shape.
template <typename T, BinaryOp kOp>
__global__ void binary_contig_kernel(const T* a, const T* b, T* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    stf(out + i, apply_binary<kOp>(ldf(a + i), ldf(b + i)));
}

/// Vectorized fast path (16-byte packs), body only; the caller handles the tail.
template <typename T, BinaryOp kOp>
__global__ void binary_contig_vec_kernel(const T* a, const T* b, T* out, int64_t npacks) {
  constexpr int V = kVec16<T>;
  using P = Pack<T, V>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < npacks; i += stride) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    const P pb = reinterpret_cast<const P*>(b)[i];
    P po;
#pragma unroll
    for (int j = 0; j < V; ++j)
      po.v[j] = from_float<T>(apply_binary<kOp>(to_float(pa.v[j]), to_float(pb.v[j])));
    reinterpret_cast<P*>(out)[i] = po;
  }
}

/// General path: broadcasting / strided inputs through offset_of.
template <typename T, BinaryOp kOp, typename Idx>
__global__ void binary_strided_kernel(const T* a, StridedLayout la, const T* b, StridedLayout lb, T* out,
                                      int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = ldf(a + offset_of_t<Idx>(la, static_cast<Idx>(i)));
    const float y = ldf(b + offset_of_t<Idx>(lb, static_cast<Idx>(i)));
    stf(out + i, apply_binary<kOp>(x, y));
  }
}

template <typename T, BinaryOp kOp>
void launch_binary(const T* a, const StridedLayout& la_in, const T* b, const StridedLayout& lb_in, T* out,
                   int64_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  StridedLayout ls[2] = {la_in, lb_in};
  coalesce(ls, 2);
  if (is_contiguous(ls[0]) && is_contiguous(ls[1])) {
    constexpr int V = kVec16<T>;
    int64_t done = 0;
    // Packs are only used when no output element aliases a different input element.
    if (aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(out, 16) && n >= V) {
      const int64_t npacks = n / V;
      binary_contig_vec_kernel<T, kOp>
          <<<grid_stride_blocks(npacks, kThreads), kThreads, 0, stream>>>(a, b, out, npacks);
      BT_KERNEL_CHECK();
      done = npacks * V;
    }
    if (done < n) {
      binary_contig_kernel<T, kOp><<<grid_stride_blocks(n - done, kThreads), kThreads, 0, stream>>>(
          a + done, b + done, out + done, n - done);
      BT_KERNEL_CHECK();
    }
    return;
  }
  const unsigned blocks = grid_stride_blocks(n, kThreads, 4);
  if (n < (int64_t{1} << 31))
    binary_strided_kernel<T, kOp, uint32_t><<<blocks, kThreads, 0, stream>>>(a, ls[0], b, ls[1], out, n);
  else
    binary_strided_kernel<T, kOp, int64_t><<<blocks, kThreads, 0, stream>>>(a, ls[0], b, ls[1], out, n);
  BT_KERNEL_CHECK();
}

template <UnaryOp kOp>
__device__ __forceinline__ float apply_unary(float x, float s) {
  if constexpr (kOp == UnaryOp::Neg) return -x;
  if constexpr (kOp == UnaryOp::Exp) return expf(x);
  if constexpr (kOp == UnaryOp::Log) return logf(x);
  if constexpr (kOp == UnaryOp::Tanh) return tanhf(x);
  if constexpr (kOp == UnaryOp::Sqrt) return sqrtf(x);
  if constexpr (kOp == UnaryOp::PowScalar) return powf(x, s);
  if constexpr (kOp == UnaryOp::AddScalar) return x + s;
  if constexpr (kOp == UnaryOp::MulScalar) return x * s;
  return 0.0f;
}

template <typename T, UnaryOp kOp>
__global__ void unary_kernel(const T* a, T* out, int64_t n, float s) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    stf(out + i, apply_unary<kOp>(ldf(a + i), s));
}

template <typename T, UnaryOp kOp>
__global__ void unary_vec_kernel(const T* a, T* out, int64_t npacks, float s) {
  constexpr int V = kVec16<T>;
  using P = Pack<T, V>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < npacks; i += stride) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    P po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = from_float<T>(apply_unary<kOp>(to_float(pa.v[j]), s));
    reinterpret_cast<P*>(out)[i] = po;
  }
}

template <typename T, UnaryOp kOp>
void launch_unary(const T* a, T* out, int64_t n, float s, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr int V = kVec16<T>;
  int64_t done = 0;
  if (aligned_to(a, 16) && aligned_to(out, 16) && n >= V) {
    const int64_t npacks = n / V;
    unary_vec_kernel<T, kOp>
        <<<grid_stride_blocks(npacks, kThreads), kThreads, 0, stream>>>(a, out, npacks, s);
    BT_KERNEL_CHECK();
    done = npacks * V;
  }
  if (done < n) {
    unary_kernel<T, kOp>
        <<<grid_stride_blocks(n - done, kThreads), kThreads, 0, stream>>>(a + done, out + done, n - done, s);
    BT_KERNEL_CHECK();
  }
}

}  // namespace

void binary(BinaryOp op, DType dt, const void* a, const StridedLayout& la, const void* b,
            const StridedLayout& lb, void* out, cudaStream_t stream) {
  check_layout(la, "binary", "layout of a");
  check_layout(lb, "binary", "layout of b");
  BT_CHECK(la.ndim == lb.ndim, "cuda binary: a has ", la.ndim, " dims but b has ", lb.ndim,
           " (both layouts must have the output's shape)");
  for (int d = 0; d < la.ndim; ++d)
    BT_CHECK(la.shape[d] == lb.shape[d], "cuda binary: dim ", d, " is ", la.shape[d], " in a but ",
             lb.shape[d], " in b (both layouts must have the output's shape)");
  dispatch_float(dt, "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = numel(la);
    if (n == 0) return;
    BT_CHECK(a != nullptr && b != nullptr && out != nullptr, "cuda binary: null buffer");
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    switch (op) {
      case BinaryOp::Add:
        launch_binary<T, BinaryOp::Add>(pa, la, pb, lb, po, n, stream);
        return;
      case BinaryOp::Sub:
        launch_binary<T, BinaryOp::Sub>(pa, la, pb, lb, po, n, stream);
        return;
      case BinaryOp::Mul:
        launch_binary<T, BinaryOp::Mul>(pa, la, pb, lb, po, n, stream);
        return;
      case BinaryOp::Div:
        launch_binary<T, BinaryOp::Div>(pa, la, pb, lb, po, n, stream);
        return;
      case BinaryOp::Pow:
        launch_binary<T, BinaryOp::Pow>(pa, la, pb, lb, po, n, stream);
        return;
    }
    BT_FAIL("cuda binary: unknown op ", static_cast<int>(op));
  });
}

void unary(UnaryOp op, DType dt, const void* a, void* out, int64_t n, double scalar, cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda unary: negative element count ", n);
  dispatch_float(dt, "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0) return;
    BT_CHECK(a != nullptr && out != nullptr, "cuda unary: null buffer");
    const T* pa = static_cast<const T*>(a);
    T* po = static_cast<T*>(out);
    const float s = static_cast<float>(scalar);
    switch (op) {
      case UnaryOp::Neg:
        launch_unary<T, UnaryOp::Neg>(pa, po, n, s, stream);
        return;
      case UnaryOp::Exp:
        launch_unary<T, UnaryOp::Exp>(pa, po, n, s, stream);
        return;
      case UnaryOp::Log:
        launch_unary<T, UnaryOp::Log>(pa, po, n, s, stream);
        return;
      case UnaryOp::Tanh:
        launch_unary<T, UnaryOp::Tanh>(pa, po, n, s, stream);
        return;
      case UnaryOp::Sqrt:
        launch_unary<T, UnaryOp::Sqrt>(pa, po, n, s, stream);
        return;
      case UnaryOp::PowScalar:
        launch_unary<T, UnaryOp::PowScalar>(pa, po, n, s, stream);
        return;
      case UnaryOp::AddScalar:
        launch_unary<T, UnaryOp::AddScalar>(pa, po, n, s, stream);
        return;
      case UnaryOp::MulScalar:
        launch_unary<T, UnaryOp::MulScalar>(pa, po, n, s, stream);
        return;
    }
    BT_FAIL("cuda unary: unknown op ", static_cast<int>(op));
  });
}

}  // namespace bt::kernels::cuda
