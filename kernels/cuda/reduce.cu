// CUDA reductions over the middle dim of [outer, dim, inner] (float accumulation).
//   inner == 1: one warp per output (dim <= 2048) or one block per output.
//   inner  > 1: a 32 x 8 block covers 32 adjacent outputs; the 8 rows of threads
//               split `dim` and are combined through shared memory. A short
//               dim (<= 64) over 8-byte packs: a thread per pack, in the
//               same order (Note [Sums over a short dim, 8 bytes a thread]).
// Split pass (Sum/Mean with scratch, when those grids would leave the GPU idle:
// few outputs, a long dim -- a full sum, a bias gradient over B*T rows): `dim`
// is cut into S chunks whose bounds depend only on the sizes; pass 1 writes one
// float partial per (output, chunk), pass 2 adds each output's S partials in
// chunk order. The result is deterministic and independent of the device.
// With inner > 1, pass 1 reads 16 bytes a thread where rows allow it (Note
// [Column sums 16 bytes a thread], kernels/cuda/column_sums.cuh).
// Max propagates NaN; argmax is the index of the first maximum (first NaN if any).
// Every kernel reads T and writes O: T, or float for a BF16 Sum/Mean into F32.
#include <algorithm>
#include <climits>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/reduce.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

struct MaxState {
  float v;
  int64_t i;
};

/// True when (v, i) should replace (bv, bi): NaN beats numbers, larger beats
/// smaller, and ties go to the lower index. Associative and commutative, so the
/// result does not depend on the reduction tree.
__device__ __forceinline__ bool max_better(float v, int64_t i, float bv, int64_t bi) {
  const bool vn = isnan(v), bn = isnan(bv);
  if (vn || bn) {
    if (vn && !bn) return true;
    if (!vn) return false;
    return i < bi;
  }
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void max_combine(MaxState& s, const MaxState& o) {
  if (max_better(o.v, o.i, s.v, s.i)) s = o;
}

__device__ __forceinline__ MaxState warp_max_state(MaxState s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxState t;
    t.v = __shfl_xor_sync(0xffffffffu, s.v, o);
    t.i = __shfl_xor_sync(0xffffffffu, s.i, o);
    max_combine(s, t);
  }
  return s;
}

template <typename O, ReduceOp kOp>
__device__ __forceinline__ void write_result(O* out, int64_t* argmax, int64_t o, float sum, MaxState ms,
                                             int64_t dim) {
  if constexpr (kOp == ReduceOp::Max) {
    stf(out + o, ms.v);
    if (argmax) argmax[o] = ms.i;
  } else if constexpr (kOp == ReduceOp::Mean) {
    stf(out + o, sum / static_cast<float>(dim));
  } else {
    stf(out + o, sum);
  }
}

/// inner == 1, one warp per output row; blockDim = 256 (8 rows per block).
template <typename T, typename O, ReduceOp kOp>
__global__ void reduce_rows_warp_kernel(const T* __restrict__ in, O* __restrict__ out, int64_t rows,
                                        int64_t dim, int64_t* __restrict__ argmax) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* p = in + row * dim;
  float sum = 0.0f;
  MaxState ms{-INFINITY, LLONG_MAX};
  for (int64_t j = lane; j < dim; j += 32) {
    const float x = ldf(p + j);
    if constexpr (kOp == ReduceOp::Max) {
      if (max_better(x, j, ms.v, ms.i)) ms = MaxState{x, j};
    } else {
      sum += x;
    }
  }
  if constexpr (kOp == ReduceOp::Max)
    ms = warp_max_state(ms);
  else
    sum = warp_sum(sum);
  if (lane == 0) write_result<O, kOp>(out, argmax, row, sum, ms, dim);
}

/// inner == 1, one block per output row (long rows).
template <typename T, typename O, ReduceOp kOp>
__global__ void reduce_rows_block_kernel(const T* __restrict__ in, O* __restrict__ out, int64_t dim,
                                         int64_t* __restrict__ argmax) {
  __shared__ float sv[33];
  __shared__ int64_t si[32];
  const int64_t row = blockIdx.x;
  const T* p = in + row * dim;
  float sum = 0.0f;
  MaxState ms{-INFINITY, LLONG_MAX};
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float x = ldf(p + j);
    if constexpr (kOp == ReduceOp::Max) {
      if (max_better(x, j, ms.v, ms.i)) ms = MaxState{x, j};
    } else {
      sum += x;
    }
  }
  if constexpr (kOp == ReduceOp::Max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    ms = warp_max_state(ms);
    if (lane == 0) {
      sv[warp] = ms.v;
      si[warp] = ms.i;
    }
    __syncthreads();
    if (warp == 0) {
      MaxState t = lane < nwarps ? MaxState{sv[lane], si[lane]} : MaxState{-INFINITY, LLONG_MAX};
      t = warp_max_state(t);
      if (lane == 0) write_result<O, kOp>(out, argmax, row, 0.0f, t, dim);
    }
  } else {
    sum = block_sum(sum, sv);
    if (threadIdx.x == 0) write_result<O, kOp>(out, argmax, row, sum, ms, dim);
  }
}

/// inner > 1: block (32, 8) covers outputs [o, it*32 .. it*32+31].
template <typename T, typename O, ReduceOp kOp>
__global__ void reduce_inner_kernel(const T* __restrict__ in, O* __restrict__ out, int64_t outer, int64_t dim,
                                    int64_t inner, int64_t inner_tiles, int64_t* __restrict__ argmax) {
  __shared__ float sv[8][33];
  __shared__ int64_t si[8][33];
  const int64_t o = static_cast<int64_t>(blockIdx.x) / inner_tiles;
  const int64_t it = static_cast<int64_t>(blockIdx.x) % inner_tiles;
  const int64_t col = it * 32 + threadIdx.x;
  const bool valid = o < outer && col < inner;
  float sum = 0.0f;
  MaxState ms{-INFINITY, LLONG_MAX};
  if (valid) {
    const T* p = in + o * dim * inner + col;
    for (int64_t j = threadIdx.y; j < dim; j += blockDim.y) {
      const float x = ldf(p + j * inner);
      if constexpr (kOp == ReduceOp::Max) {
        if (max_better(x, j, ms.v, ms.i)) ms = MaxState{x, j};
      } else {
        sum += x;
      }
    }
  }
  sv[threadIdx.y][threadIdx.x] = kOp == ReduceOp::Max ? ms.v : sum;
  si[threadIdx.y][threadIdx.x] = ms.i;
  __syncthreads();
  if (threadIdx.y == 0 && valid) {
    float s = 0.0f;
    MaxState m{-INFINITY, LLONG_MAX};
    for (int y = 0; y < static_cast<int>(blockDim.y); ++y) {
      if constexpr (kOp == ReduceOp::Max)
        max_combine(m, MaxState{sv[y][threadIdx.x], si[y][threadIdx.x]});
      else
        s += sv[y][threadIdx.x];
    }
    write_result<O, kOp>(out, argmax, o * inner + col, s, m, dim);
  }
}

// Note [Sums over a short dim, 8 bytes a thread]
// A sum over a short middle dim with a wide inner one -- GPT's position
// embedding gradient, 16 sequences of 1024 x 768 -- gives reduce_inner_kernel
// blocks of 32 columns whose 256 threads load 2 bytes each, once or twice:
// 40 us for 25 MB on an H200. reduce_inner_vec_kernel gives each thread 8
// bytes of adjacent columns and adds each column as that kernel does: eight
// partials, the y-th over rows y, y + 8, ... in order, then the eight in y
// order, zeros where y >= dim. So it gives the same bits, and eight rows'
// loads are in flight at a time.
template <typename T, typename O, ReduceOp kOp>
__global__ void __launch_bounds__(256, 2)
    reduce_inner_vec_kernel(const T* __restrict__ in, O* __restrict__ out, int64_t outer, int64_t dim,
                            int64_t inner) {
  constexpr int V = kVec8<T>;
  using P = Pack<T, V>;
  const int64_t packs = inner / V;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= outer * packs) return;
  const int64_t o = t / packs, col = (t - o * packs) * V;
  const T* p = in + o * dim * inner + col;
  float part[8][V];
#pragma unroll
  for (int y = 0; y < 8; ++y)
#pragma unroll
    for (int v = 0; v < V; ++v) part[y][v] = 0.0f;
  for (int64_t j0 = 0; j0 < dim; j0 += 8) {
    P x[8];
#pragma unroll
    for (int y = 0; y < 8; ++y)
      if (j0 + y < dim) x[y] = *reinterpret_cast<const P*>(p + (j0 + y) * inner);
#pragma unroll
    for (int y = 0; y < 8; ++y)
      if (j0 + y < dim)
#pragma unroll
        for (int v = 0; v < V; ++v) part[y][v] += to_float(x[y].v[v]);
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) s += part[y][v];
    write_result<O, kOp>(out, nullptr, o * inner + col + v, s, MaxState{}, dim);
  }
}

/// Split pass 1: block (32, 8) sums rows [c*chunk, min(dim, (c+1)*chunk)) of 32
/// adjacent columns (inner == 1 is the single column case, then the 256 threads
/// stride the chunk). partial[(c * outer + o) * inner + col].
template <typename T>
__global__ void reduce_split_kernel(const T* __restrict__ in, float* __restrict__ partial, int64_t outer,
                                    int64_t dim, int64_t inner, int64_t inner_tiles, int64_t chunk) {
  __shared__ float sv[8][33];
  const int64_t o = static_cast<int64_t>(blockIdx.x) / inner_tiles;
  const int64_t it = static_cast<int64_t>(blockIdx.x) % inner_tiles;
  const int64_t c = blockIdx.y;
  const int64_t lo = c * chunk, hi = min(dim, lo + chunk);
  float sum = 0.0f;
  if (inner == 1) {
    const T* p = in + o * dim;
    const int t = threadIdx.y * 32 + threadIdx.x;
    for (int64_t j = lo + t; j < hi; j += 256) sum += ldf(p + j);
    sum = warp_sum(sum);
    if (threadIdx.x == 0) sv[threadIdx.y][0] = sum;
    __syncthreads();
    if (t == 0) {
      float s = 0.0f;
      for (int y = 0; y < 8; ++y) s += sv[y][0];
      partial[c * outer + o] = s;
    }
    return;
  }
  const int64_t col = it * 32 + threadIdx.x;
  if (col < inner) {
    const T* p = in + o * dim * inner + col;
    for (int64_t j = lo + threadIdx.y; j < hi; j += 8) sum += ldf(p + j * inner);
  }
  sv[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < inner) {
    float s = 0.0f;
    for (int y = 0; y < 8; ++y) s += sv[y][threadIdx.x];
    partial[(c * outer + o) * inner + col] = s;
  }
}

/// Split pass 1, 16 bytes a thread (Note [Column sums 16 bytes a thread] in
/// kernels/cuda/column_sums.cuh).
template <typename T>
__global__ void __launch_bounds__(256)
    reduce_split_vec_kernel(const T* __restrict__ in, float* __restrict__ partial, int64_t outer, int64_t dim,
                            int64_t inner, int64_t inner_tiles, int64_t chunk) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) / inner_tiles;
  const int64_t it = static_cast<int64_t>(blockIdx.x) % inner_tiles;
  const int64_t c = blockIdx.y;
  column_partials_vec<T>(PlainRows<T>{in + o * dim * inner, inner}, partial + (c * outer + o) * inner, dim,
                         inner, it, c, chunk);
}

template <typename T, typename O, ReduceOp kOp>
void launch_split(const T* in, O* out, int64_t outer, int64_t dim, int64_t inner, int64_t chunks,
                  float* scratch, cudaStream_t stream) {
  const int64_t chunk = ceil_div(dim, chunks);
  constexpr int V = 16 / sizeof(T);
  const bool vec = inner > 1 && inner % V == 0 && aligned_to(in, 16);
  const int64_t tiles = inner == 1 ? 1 : ceil_div(inner, vec ? 32 * V : 32);
  BT_CHECK(tiles * outer < INT_MAX && chunks < 65536, "cuda reduce_dim: too many outputs");
  const dim3 grid(static_cast<unsigned>(tiles * outer), static_cast<unsigned>(chunks));
  if (vec)
    reduce_split_vec_kernel<T>
        <<<grid, dim3(32, 8), 0, stream>>>(in, scratch, outer, dim, inner, tiles, chunk);
  else
    reduce_split_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(in, scratch, outer, dim, inner, tiles, chunk);
  BT_KERNEL_CHECK();
  const int64_t n = outer * inner;
  launch_reduce_partials<O, kOp>(scratch, out, n, chunks, dim, stream);
}

template <typename T, typename O, ReduceOp kOp>
void launch_reduce(const T* in, O* out, int64_t outer, int64_t dim, int64_t inner, int64_t* argmax,
                   cudaStream_t stream) {
  if constexpr (kOp != ReduceOp::Max) {  // Note [Sums over a short dim, 8 bytes a thread]
    if (inner > 1 && dim <= 64 && inner % kVec8<T> == 0 && aligned_to(in, 8)) {
      const int64_t blocks = ceil_div(outer * (inner / kVec8<T>), 256);
      BT_CHECK(blocks < INT_MAX, "cuda reduce_dim: too many outputs (", outer, " x ", inner, ")");
      reduce_inner_vec_kernel<T, O, kOp>
          <<<static_cast<unsigned>(blocks), 256, 0, stream>>>(in, out, outer, dim, inner);
      BT_KERNEL_CHECK();
      return;
    }
  }
  if (inner == 1) {
    if (dim <= 2048) {
      const int64_t blocks = ceil_div(outer, 8);
      BT_CHECK(blocks < INT_MAX, "cuda reduce_dim: too many rows (", outer, ")");
      reduce_rows_warp_kernel<T, O, kOp>
          <<<static_cast<unsigned>(blocks), 256, 0, stream>>>(in, out, outer, dim, argmax);
    } else {
      BT_CHECK(outer < INT_MAX, "cuda reduce_dim: too many rows (", outer, ")");
      reduce_rows_block_kernel<T, O, kOp>
          <<<static_cast<unsigned>(outer), 512, 0, stream>>>(in, out, dim, argmax);
    }
  } else {
    const int64_t tiles = ceil_div(inner, 32);
    const int64_t blocks = tiles * outer;
    BT_CHECK(blocks < INT_MAX, "cuda reduce_dim: too many outputs (", outer, " x ", inner, ")");
    reduce_inner_kernel<T, O, kOp><<<static_cast<unsigned>(blocks), dim3(32, 8), 0, stream>>>(
        in, out, outer, dim, inner, tiles, argmax);
  }
  BT_KERNEL_CHECK();
}

void check_reduce(ReduceOp op, int64_t outer, int64_t dim, int64_t inner) {
  BT_CHECK(outer >= 0 && dim >= 0 && inner >= 0, "cuda reduce_dim: negative size (outer ", outer, ", dim ",
           dim, ", inner ", inner, ")");
  BT_CHECK(!(op == ReduceOp::Max && dim == 0 && outer * inner > 0),
           "cuda reduce_dim: max over an empty dimension has no value");
}

/// Reads T, writes O (T, or float for a bf16 sum into f32).
template <typename T, typename O>
void run_reduce(ReduceOp op, const T* pin, O* pout, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax, float* scratch, cudaStream_t stream) {
  if (outer == 0 || inner == 0) return;
  BT_CHECK(pout != nullptr && (pin != nullptr || dim == 0), "cuda reduce_dim: null buffer");
  if (scratch != nullptr && op != ReduceOp::Max) {
    if (const int64_t chunks = split_chunks(outer, dim, inner); chunks > 1) {
      if (op == ReduceOp::Sum)
        launch_split<T, O, ReduceOp::Sum>(pin, pout, outer, dim, inner, chunks, scratch, stream);
      else
        launch_split<T, O, ReduceOp::Mean>(pin, pout, outer, dim, inner, chunks, scratch, stream);
      return;
    }
  }
  switch (op) {
    case ReduceOp::Sum:
      launch_reduce<T, O, ReduceOp::Sum>(pin, pout, outer, dim, inner, nullptr, stream);
      return;
    case ReduceOp::Mean:
      launch_reduce<T, O, ReduceOp::Mean>(pin, pout, outer, dim, inner, nullptr, stream);
      return;
    case ReduceOp::Max:
      launch_reduce<T, O, ReduceOp::Max>(pin, pout, outer, dim, inner, argmax, stream);
      return;
  }
  BT_FAIL("cuda reduce_dim: unknown op ", static_cast<int>(op));
}

}  // namespace

size_t reduce_dim_scratch_floats(ReduceOp op, int64_t outer, int64_t dim, int64_t inner) {
  if (op == ReduceOp::Max || outer <= 0 || inner <= 0) return 0;
  const int64_t chunks = split_chunks(outer, dim, inner);
  return chunks > 1 ? static_cast<size_t>(chunks * outer * inner) : 0;
}

void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax, cudaStream_t stream) {
  reduce_dim(op, dt, in, out, outer, dim, inner, argmax, nullptr, stream);
}

void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax, float* scratch, cudaStream_t stream) {
  check_reduce(op, outer, dim, inner);
  dispatch_float(dt, "reduce_dim", [&](auto tag) {
    using T = typename decltype(tag)::type;
    run_reduce(op, static_cast<const T*>(in), static_cast<T*>(out), outer, dim, inner, argmax, scratch,
               stream);
  });
}

void reduce_dim(ReduceOp op, DType dt, DType out_dt, const void* in, void* out, int64_t outer, int64_t dim,
                int64_t inner, float* scratch, cudaStream_t stream) {
  if (!reduce_widens(op, dt, out_dt, "cuda reduce_dim")) {
    reduce_dim(op, dt, in, out, outer, dim, inner, nullptr, scratch, stream);
    return;
  }
  check_reduce(op, outer, dim, inner);
  run_reduce(op, static_cast<const bf16_t*>(in), static_cast<float*>(out), outer, dim, inner, nullptr,
             scratch, stream);
}

}  // namespace bt::kernels::cuda
