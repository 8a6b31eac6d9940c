// CUDA reductions over the middle dim of [outer, dim, inner] (float accumulation).
//   inner == 1: one warp per output (dim <= 2048) or one block per output.
//   inner  > 1: a 32 x 8 block covers 32 adjacent outputs; the 8 rows of threads
//               split `dim` and are combined through shared memory.
// Max propagates NaN; argmax is the index of the first maximum (first NaN if any).
#include <climits>

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

template <typename T, ReduceOp kOp>
__device__ __forceinline__ void write_result(T* out, int64_t* argmax, int64_t o, float sum, MaxState ms,
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
template <typename T, ReduceOp kOp>
__global__ void reduce_rows_warp_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows,
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
  if (lane == 0) write_result<T, kOp>(out, argmax, row, sum, ms, dim);
}

/// inner == 1, one block per output row (long rows).
template <typename T, ReduceOp kOp>
__global__ void reduce_rows_block_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t dim,
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
      if (lane == 0) write_result<T, kOp>(out, argmax, row, 0.0f, t, dim);
    }
  } else {
    sum = block_sum(sum, sv);
    if (threadIdx.x == 0) write_result<T, kOp>(out, argmax, row, sum, ms, dim);
  }
}

/// inner > 1: block (32, 8) covers outputs [o, it*32 .. it*32+31].
template <typename T, ReduceOp kOp>
__global__ void reduce_inner_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t outer, int64_t dim,
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
    write_result<T, kOp>(out, argmax, o * inner + col, s, m, dim);
  }
}

template <typename T, ReduceOp kOp>
void launch_reduce(const T* in, T* out, int64_t outer, int64_t dim, int64_t inner, int64_t* argmax,
                   cudaStream_t stream) {
  if (inner == 1) {
    if (dim <= 2048) {
      const int64_t blocks = ceil_div(outer, 8);
      BT_CHECK(blocks < INT_MAX, "cuda reduce_dim: too many rows (", outer, ")");
      reduce_rows_warp_kernel<T, kOp>
          <<<static_cast<unsigned>(blocks), 256, 0, stream>>>(in, out, outer, dim, argmax);
    } else {
      BT_CHECK(outer < INT_MAX, "cuda reduce_dim: too many rows (", outer, ")");
      reduce_rows_block_kernel<T, kOp>
          <<<static_cast<unsigned>(outer), 512, 0, stream>>>(in, out, dim, argmax);
    }
  } else {
    const int64_t tiles = ceil_div(inner, 32);
    const int64_t blocks = tiles * outer;
    BT_CHECK(blocks < INT_MAX, "cuda reduce_dim: too many outputs (", outer, " x ", inner, ")");
    reduce_inner_kernel<T, kOp><<<static_cast<unsigned>(blocks), dim3(32, 8), 0, stream>>>(
        in, out, outer, dim, inner, tiles, argmax);
  }
  BT_KERNEL_CHECK();
}

}  // namespace

void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax, cudaStream_t stream) {
  BT_CHECK(outer >= 0 && dim >= 0 && inner >= 0, "cuda reduce_dim: negative size (outer ", outer, ", dim ",
           dim, ", inner ", inner, ")");
  BT_CHECK(!(op == ReduceOp::Max && dim == 0 && outer * inner > 0),
           "cuda reduce_dim: max over an empty dimension has no value");
  dispatch_float(dt, "reduce_dim", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (outer == 0 || inner == 0) return;
    BT_CHECK(out != nullptr && (in != nullptr || dim == 0), "cuda reduce_dim: null buffer");
    const T* pin = static_cast<const T*>(in);
    T* pout = static_cast<T*>(out);
    switch (op) {
      case ReduceOp::Sum:
        launch_reduce<T, ReduceOp::Sum>(pin, pout, outer, dim, inner, nullptr, stream);
        return;
      case ReduceOp::Mean:
        launch_reduce<T, ReduceOp::Mean>(pin, pout, outer, dim, inner, nullptr, stream);
        return;
      case ReduceOp::Max:
        launch_reduce<T, ReduceOp::Max>(pin, pout, outer, dim, inner, argmax, stream);
        return;
    }
    BT_FAIL("cuda reduce_dim: unknown op ", static_cast<int>(op));
  });
}

}  // namespace bt::kernels::cuda
