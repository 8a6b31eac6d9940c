// Column sums in split form, shared by the reductions (kernels/cuda/reduce.cu)
// and the passes that sum the columns of what they write (the MLP's fused GELU
// backward, kernels/cuda/gelu.cu): `dim` rows are cut into chunks whose bounds
// depend only on the sizes (split_chunks); pass 1 writes one float partial per
// (column, chunk), pass 2 adds each column's partials in chunk order. A pass
// that sums the values it writes, through column_partials_vec, gives the bits
// reduce_dim gives on what it wrote (Note [Column sums 16 bytes a thread]).
#pragma once

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/reduce.h"

namespace bt::kernels::cuda::detail {

constexpr int64_t kSplitBlocks = 512;  // blocks the split pass aims for
constexpr int64_t kMinChunk = 4096;    // rows per chunk at least (inner == 1)
constexpr int64_t kMinColChunk = 256;  // rows per chunk at least (inner > 1)
constexpr int64_t kColTile = 256;      // columns per block, counted for the split (inner > 1)

/// Chunks for the split pass, or 1 when the one-pass grid is wide enough.
/// Sizes only: the scalar and 16-byte kernels cut `dim` alike.
inline int64_t split_chunks(int64_t outer, int64_t dim, int64_t inner) {
  const int64_t blocks = inner == 1 ? outer : ceil_div(inner, kColTile) * outer;
  const int64_t min_chunk = inner == 1 ? kMinChunk : kMinColChunk;
  if (blocks >= kSplitBlocks / 2 || dim < 2 * min_chunk) return 1;
  return std::min(ceil_div(kSplitBlocks, blocks), ceil_div(dim, min_chunk));
}

/// The rows of a plain [dim, inner] input, 16 bytes at a time: what
/// column_partials_vec sums for a reduction.
template <typename T>
struct PlainRows {
  using Raw = Pack<T, kVec16<T>>;
  const T* p;
  int64_t inner;
  __device__ Raw load(int64_t j, int64_t col) const {
    return *reinterpret_cast<const Raw*>(p + j * inner + col);
  }
  __device__ Raw use(const Raw& r, int64_t, int64_t) const { return r; }
};

// Note [Column sums 16 bytes a thread]
// A bias gradient sums 16384 rows of up to 3072 columns. Split pass 1 with a
// thread per column reads 64 bytes of a bf16 row per warp, 2 bytes a load:
// 47 us for the 100 MB of GPT-2's fc bias gradient on an H100 (2.1 TB/s).
// column_partials_vec gives each thread V = 16 / sizeof(T) adjacent columns,
// read as one 16-byte load per row (a warp reads 512 contiguous bytes of a
// bf16 row), 4 rows in flight. Each column's sum keeps the scalar kernel's
// order -- thread row y adds rows lo + y, lo + y + 8, ... of the chunk, then
// the 8 partials in y order -- and the chunk bounds do not depend on which
// kernel runs (split_chunks), so both give the same bits and an unaligned
// input changes nothing but the speed.
//   `rows` says what a row's pack is: rows.load(j, col) issues the loads of
// row j at columns col .. col + V - 1 (four rows' loads are issued before
// any is used), and rows.use(raw, j, col) returns the pack to add, writing
// whatever the pass writes. A pass that returns the very packs it stores
// sums the values a later reduce_dim over its output would.
//   With kPipe, the loads of the next four rows are issued before these four
// are used, so a pass whose use() computes (the GELU backward's tanh) keeps
// its loads in flight while it computes: 128 registers, two blocks an SM
// (Note [The MLP's GELU backward in one pass]). The rows are still added in
// the same order.
/// Block (32, 8) over columns [it * 32 V, (it + 1) * 32 V) and rows
/// [c * chunk, min(dim, (c + 1) * chunk)); writes partial[col] for its columns
/// (partial points at the (chunk, outer) row of the scratch), or nothing when
/// partial is null.
template <typename T, bool kPipe = false, class Rows>
__device__ __forceinline__ void column_partials_vec(const Rows& rows, float* __restrict__ partial,
                                                    int64_t dim, int64_t inner, int64_t it, int64_t c,
                                                    int64_t chunk) {
  constexpr int V = kVec16<T>, G = 4;  // G rows in flight
  using P = Pack<T, V>;
  using Raw = typename Rows::Raw;
  __shared__ float sv[8][32 * V + 1];
  const int64_t lo = c * chunk, hi = min(dim, lo + chunk);
  const int64_t col = (it * 32 + threadIdx.x) * V;  // this thread's first column
  float sum[V];
#pragma unroll
  for (int v = 0; v < V; ++v) sum[v] = 0.0f;
  if (col < inner) {
    auto add = [&](const P& x) {
#pragma unroll
      for (int v = 0; v < V; ++v) sum[v] += to_float(x.v[v]);
    };
    int64_t j = lo + threadIdx.y;
    if constexpr (kPipe) {
      if (j + 8 * (G - 1) < hi) {
        Raw cur[G];
#pragma unroll
        for (int g = 0; g < G; ++g) cur[g] = rows.load(j + 8 * g, col);
        for (;;) {  // cur holds rows j, j + 8, ...; the next G rows load while they are used
          const int64_t jn = j + 8 * G;
          const bool more = jn + 8 * (G - 1) < hi;
          Raw next[G];
          if (more) {
#pragma unroll
            for (int g = 0; g < G; ++g) next[g] = rows.load(jn + 8 * g, col);
          }
#pragma unroll
          for (int g = 0; g < G; ++g) add(rows.use(cur[g], j + 8 * g, col));
          j = jn;
          if (!more) break;
#pragma unroll
          for (int g = 0; g < G; ++g) cur[g] = next[g];
        }
      }
    } else {
      for (; j + 8 * (G - 1) < hi; j += 8 * G) {  // G rows in flight, added in row order
        Raw r[G];
#pragma unroll
        for (int g = 0; g < G; ++g) r[g] = rows.load(j + 8 * g, col);
#pragma unroll
        for (int g = 0; g < G; ++g) add(rows.use(r[g], j + 8 * g, col));
      }
    }
    for (; j < hi; j += 8) add(rows.use(rows.load(j, col), j, col));
  }
  if (partial == nullptr) return;  // block-uniform
#pragma unroll
  for (int v = 0; v < V; ++v) sv[threadIdx.y][threadIdx.x * V + v] = sum[v];
  __syncthreads();
  // 256 threads combine the block's 32 V columns, each in y order.
  for (int k = threadIdx.y * 32 + threadIdx.x; k < 32 * V; k += 256) {
    const int64_t cc = it * 32 * V + k;
    if (cc >= inner) continue;
    float s = 0.0f;
    for (int y = 0; y < 8; ++y) s += sv[y][k];
    partial[cc] = s;
  }
}

/// Split pass 2: out[i] = sum over chunks c (in order) of partial[c * n + i].
template <typename O, ReduceOp kOp>
__global__ void reduce_partials_kernel(const float* __restrict__ partial, O* __restrict__ out, int64_t n,
                                       int64_t chunks, int64_t dim) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = add_in_order(0.0f, partial + i, chunks, n);
  stf(out + i, kOp == ReduceOp::Mean ? s / static_cast<float>(dim) : s);
}

/// Split pass 2 over n outputs. Blocks of 64 threads: the pass is L2 latency,
/// so it spreads over as many SMs as it can.
template <typename O, ReduceOp kOp>
void launch_reduce_partials(const float* partial, O* out, int64_t n, int64_t chunks, int64_t dim,
                            cudaStream_t stream) {
  constexpr int kThreads = 64;
  reduce_partials_kernel<O, kOp>
      <<<static_cast<unsigned>(ceil_div(n, kThreads)), kThreads, 0, stream>>>(partial, out, n, chunks, dim);
  BT_KERNEL_CHECK();
}

}  // namespace bt::kernels::cuda::detail
