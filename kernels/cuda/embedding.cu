// CUDA embedding lookup and its deterministic backward.
//
// Backward: the output is split into (column tile, row bucket) blocks; a block
// owns the columns of its tile for the table rows r with r % buckets == bucket.
// Every block scans all n indices in order, keeps those of its bucket (compacted
// in order through a warp ballot), and adds dout rows into a float accumulator
// in index order. Each output element is thus summed by one thread in index
// order: the result is bitwise reproducible, with no atomics. F32 (and BF16
// into an F32 dtable) accumulates in dtable itself; BF16 accumulates in scratch
// [num, dim] and converts at the end.
#include <climits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

/// out[i, c] = table[idx[i], c] for chunks of type U (raw bits); NaN bits
/// (all ones) for an index outside [0, num).
template <typename U>
__global__ void embed_fwd_kernel(const U* __restrict__ table, int64_t num, int64_t chunks,
                                 const int32_t* __restrict__ idx, int64_t n, U* __restrict__ out,
                                 U nan_bits) {
  const int64_t total = n * chunks;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / chunks, c = e - i * chunks;
    const int64_t r = idx[i];
    out[e] = (r >= 0 && r < num) ? table[r * chunks + c] : nan_bits;
  }
}

__global__ void count_bad_kernel(const int32_t* __restrict__ idx, int64_t n, int64_t num, int* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Every lane of a warp runs the same number of iterations (n is rounded up).
  const int64_t n_round = (n + 31) / 32 * 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_round; i += stride) {
    bool is_bad = false;
    if (i < n) {
      const int64_t r = idx[i];
      is_bad = r < 0 || r >= num;
    }
    const unsigned mask = __ballot_sync(0xffffffffu, is_bad);
    if ((threadIdx.x & 31) == 0 && mask != 0) atomicAdd(bad, __popc(mask));
  }
}

template <typename T>
__global__ void embed_bwd_kernel(const T* __restrict__ dout, const int32_t* __restrict__ idx, int64_t n,
                                 int64_t num, int64_t dim, int64_t buckets, float* __restrict__ acc) {
  extern __shared__ int32_t s_pos[];  // blockDim.x entries
  __shared__ int s_warp_count[32];
  const int64_t tile = blockIdx.x, bucket = blockIdx.y;
  const int64_t col = tile * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    bool match = false;
    if (i < n) {
      const int64_t r = idx[i];
      match = r >= 0 && r < num && r % buckets == bucket;
    }
    const unsigned mask = __ballot_sync(0xffffffffu, match);
    if (lane == 0) s_warp_count[warp] = __popc(mask);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < nwarps; ++w) {
      const int c = s_warp_count[w];
      if (w < warp) before += c;
      total += c;
    }
    if (match) s_pos[before + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(threadIdx.x);
    __syncthreads();
    if (col < dim) {
      for (int m = 0; m < total; ++m) {
        const int64_t ii = base + s_pos[m];
        const int64_t r = idx[ii];
        float* a = acc + r * dim + col;
        *a = *a + ldf(dout + ii * dim + col);
      }
    }
    __syncthreads();  // s_pos / s_warp_count are rewritten by the next stage
  }
}

template <typename T>
__global__ void f32_to_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    stf(out + i, in[i]);
}

void check_sizes(const char* what, int64_t num, int64_t dim, int64_t n) {
  BT_CHECK(num >= 0 && dim >= 0 && n >= 0, "cuda ", what, ": negative size (num ", num, ", dim ", dim, ", n ",
           n, ")");
}

}  // namespace

void count_out_of_range(const int32_t* idx, int64_t n, int64_t num, int* bad_count, cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda count_out_of_range: negative count ", n);
  BT_CHECK(bad_count != nullptr, "cuda count_out_of_range: null bad_count");
  BT_CUDA_CHECK(cudaMemsetAsync(bad_count, 0, sizeof(int), stream));
  if (n == 0) return;
  BT_CHECK(idx != nullptr, "cuda count_out_of_range: null indices");
  constexpr int kThreads = 256;
  count_bad_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(idx, n, num, bad_count);
  BT_KERNEL_CHECK();
}

void embedding_forward(DType dt, const void* table, int64_t num, int64_t dim, const int32_t* idx, int64_t n,
                       void* out, cudaStream_t stream) {
  check_sizes("embedding_forward", num, dim, n);
  dispatch_float(dt, "embedding_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0 || dim == 0) return;
    BT_CHECK(table != nullptr && idx != nullptr && out != nullptr, "cuda embedding_forward: null buffer");
    constexpr int kThreads = 256;
    const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(T));
    if (row_bytes % 16 == 0 && aligned_to(table, 16) && aligned_to(out, 16)) {
      const int64_t chunks = row_bytes / 16;
      const uint4 nan_bits = make_uint4(~0u, ~0u, ~0u, ~0u);
      embed_fwd_kernel<uint4><<<grid_stride_blocks(n * chunks, kThreads), kThreads, 0, stream>>>(
          static_cast<const uint4*>(table), num, chunks, idx, n, static_cast<uint4*>(out), nan_bits);
    } else {
      using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
      embed_fwd_kernel<U><<<grid_stride_blocks(n * dim, kThreads), kThreads, 0, stream>>>(
          static_cast<const U*>(table), num, dim, idx, n, static_cast<U*>(out), static_cast<U>(~U{0}));
    }
    BT_KERNEL_CHECK();
  });
}

size_t embedding_backward_scratch_floats(int64_t num, int64_t dim) {
  if (num <= 0 || dim <= 0) return 0;
  return static_cast<size_t>(num * dim);
}

void embedding_backward(DType dt, const void* dout, const int32_t* idx, int64_t n, int64_t num, int64_t dim,
                        void* dtable, float* scratch, cudaStream_t stream) {
  embedding_backward(dt, dt, dout, idx, n, num, dim, dtable, scratch, stream);
}

void embedding_backward(DType dt, DType out_dt, const void* dout, const int32_t* idx, int64_t n, int64_t num,
                        int64_t dim, void* dtable, float* scratch, cudaStream_t stream) {
  check_sizes("embedding_backward", num, dim, n);
  const bool wide = widens(dt, out_dt, "cuda embedding_backward");
  dispatch_float(dt, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (num == 0 || dim == 0) return;
    BT_CHECK(dtable != nullptr, "cuda embedding_backward: null dtable");
    const bool direct = std::is_same_v<T, float> || wide;  // dtable is the float accumulator
    float* acc = direct ? static_cast<float*>(dtable) : scratch;
    BT_CHECK(acc != nullptr,
             "cuda embedding_backward: null scratch (allocate embedding_backward_scratch_floats(", num, ", ",
             dim, ") floats)");
    const int64_t total = num * dim;
    BT_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(total) * sizeof(float), stream));
    if (n > 0) {
      BT_CHECK(dout != nullptr && idx != nullptr, "cuda embedding_backward: null dout or indices");
      const int threads = static_cast<int>(dim >= 256 ? 256 : ceil_div(dim, 32) * 32);
      const int64_t tiles = ceil_div(dim, threads);
      int64_t buckets = ceil_div(4 * static_cast<int64_t>(sm_count()), tiles);
      if (buckets > num) buckets = num;
      if (buckets > 65535) buckets = 65535;
      if (buckets < 1) buckets = 1;
      BT_CHECK(tiles < INT_MAX, "cuda embedding_backward: dim ", dim, " too large");
      embed_bwd_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(buckets)), threads,
                            threads * sizeof(int32_t), stream>>>(static_cast<const T*>(dout), idx, n, num,
                                                                 dim, buckets, acc);
      BT_KERNEL_CHECK();
    }
    if (!direct) {
      constexpr int kThreads = 256;
      f32_to_kernel<T>
          <<<grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(acc, static_cast<T*>(dtable), total);
      BT_KERNEL_CHECK();
    }
  });
}

}  // namespace bt::kernels::cuda
