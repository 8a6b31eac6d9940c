// kernels/sum_squares.h on CUDA. Pass 1 launches one block of 256 threads per
// chunk of kChunk elements; the inputs travel in the kernel's parameters, up
// to kPerLaunch buffers per launch, with each buffer's first block, so a block
// finds its buffer without a table in device memory (no copy to the GPU
// besides the launch's own). Pass 2, one block, adds the chunk sums in chunk order in double.
#include <algorithm>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/sum_squares.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;  // elements per block: 8 float4 loads per thread
constexpr int kPerLaunch = 64;

struct Batch {
  const void* data[kPerLaunch];
  int64_t n[kPerLaunch];
  int64_t first[kPerLaunch + 1];  // first block of each buffer; first[count] = blocks
  uint8_t bf16[kPerLaunch];
  int count;
};

__device__ __forceinline__ float squares_f32(const float* p, int64_t lo, int64_t hi) {
  float s = 0.0f;
  int64_t j = lo;
  if ((reinterpret_cast<uintptr_t>(p + lo) & 15) == 0) {
    const float4* v = reinterpret_cast<const float4*>(p + lo);
    const int64_t nv = (hi - lo) / 4;
    for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
      const float4 x = v[i];
      s += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    }
    j = lo + nv * 4;
  }
  for (int64_t i = j + threadIdx.x; i < hi; i += kThreads) s += p[i] * p[i];
  return s;
}

__device__ __forceinline__ float squares_bf16(const bf16_t* p, int64_t lo, int64_t hi) {
  float s = 0.0f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float x = to_float(p[i]);
    s += x * x;
  }
  return s;
}

__global__ void __launch_bounds__(kThreads)
    sum_squares_chunks_kernel(const Batch b, float* __restrict__ partial) {
  __shared__ float smem[33];
  const int64_t blk = blockIdx.x;
  int t = 0;
  while (t + 1 < b.count && b.first[t + 1] <= blk) ++t;
  const int64_t lo = (blk - b.first[t]) * kChunk, hi = min(b.n[t], lo + kChunk);
  const float s = b.bf16[t] ? squares_bf16(static_cast<const bf16_t*>(b.data[t]), lo, hi)
                            : squares_f32(static_cast<const float*>(b.data[t]), lo, hi);
  const float total = block_sum(s, smem);
  if (threadIdx.x == 0) partial[blk] = total;
}

__global__ void __launch_bounds__(1024)
    sum_partials_kernel(const float* __restrict__ partial, int64_t n, float* __restrict__ out) {
  __shared__ double sd[1024];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  sd[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) sd[threadIdx.x] += sd[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(sd[0]);
}

int64_t chunks_of(const SquaresInput& x) { return ceil_div(x.n, kChunk); }

__global__ void clip_scale_kernel(const void* sumsq, bool f64, double max_norm, float* out,
                                  const double* loss) {
  const double sq =
      f64 ? *static_cast<const double*>(sumsq) : static_cast<double>(*static_cast<const float*>(sumsq));
  const double norm = sqrt(sq);
  const double c = max_norm / (norm + 1e-6);
  out[0] = static_cast<float>(norm);
  const bool usable = isfinite(norm) && (loss == nullptr || isfinite(*loss));
  out[1] = !usable ? __int_as_float(0x7fc00000) : static_cast<float>(max_norm <= 0 || c >= 1.0 ? 1.0 : c);
}

}  // namespace

void clip_scale(const void* sumsq, DType dt, double max_norm, float* out, const double* loss,
                cudaStream_t stream) {
  BT_CHECK(dt == DType::F32 || dt == DType::F64,
           "cuda clip_scale: the sum of squares must be f32 or f64, got ", dt);
  clip_scale_kernel<<<1, 1, 0, stream>>>(sumsq, dt == DType::F64, max_norm, out, loss);
  BT_KERNEL_CHECK();
}

size_t sum_squares_scratch_floats(const SquaresInput* xs, int count) {
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) blocks += chunks_of(xs[i]);
  return static_cast<size_t>(std::max<int64_t>(blocks, 1));
}

void sum_squares(const SquaresInput* xs, int count, float* out, float* scratch, cudaStream_t stream) {
  BT_CHECK(count >= 0 && (count == 0 || xs != nullptr), "cuda sum_squares: bad input list");
  BT_CHECK(out != nullptr && scratch != nullptr, "cuda sum_squares: null output or scratch");
  int64_t done = 0;  // chunk sums written so far
  for (int i0 = 0; i0 < count; i0 += kPerLaunch) {
    Batch b{};
    b.count = std::min(kPerLaunch, count - i0);
    int64_t blocks = 0;
    for (int k = 0; k < b.count; ++k) {
      const SquaresInput& x = xs[i0 + k];
      BT_CHECK(x.n >= 0 && (x.n == 0 || x.data != nullptr), "cuda sum_squares: input ", i0 + k,
               " has a null buffer or a negative size");
      BT_CHECK(x.dt == DType::F32 || x.dt == DType::BF16, "cuda sum_squares: input ", i0 + k, " has dtype ",
               x.dt, " (supported: f32, bf16)");
      b.data[k] = x.data;
      b.n[k] = x.n;
      b.bf16[k] = x.dt == DType::BF16;
      b.first[k] = blocks;
      blocks += chunks_of(x);
    }
    b.first[b.count] = blocks;
    if (blocks == 0) continue;
    BT_CHECK(blocks < INT_MAX, "cuda sum_squares: too many elements");
    sum_squares_chunks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(b, scratch + done);
    BT_KERNEL_CHECK();
    done += blocks;
  }
  sum_partials_kernel<<<1, 1024, 0, stream>>>(scratch, done, out);
  BT_KERNEL_CHECK();
}

}  // namespace bt::kernels::cuda
