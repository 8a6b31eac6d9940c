// The 3xTF32 GEMM on CUDA (GemmMath::Tf32x3, Note [3xTF32] in kernels/gemm.h):
// the split kernels write two or three copies of each operand along K into
// the caller's scratch (TF32 parts, rounded with cvt.rna; K-contiguous, Note
// [K-contiguous copies]), and FAST_TF32 cuBLASLt products over them sum the
// three products, with beta and the epilogue applied once (Note [Two copies
// or three]).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

#include "kernels/common/env.h"
#include "kernels/common/tf32.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemm_internal.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

// Note [Two copies or three]
// The three products of Note [3xTF32] run on copies of the operands, written
// by the split into scratch, in one of two ways:
//   three copies, [A_small A_big A_big] x [B_big; B_small; B_big]: one GEMM
//     over 3K, which reads and writes C once;
//   two copies, [A_small A_big] x [B_big; B_small]: one GEMM over 2K (the
//     small products), then A_big B_big over K (A's second copy, B's first)
//     with beta = 1 and the epilogue, which reads and writes C once more.
// Both sum the small products first. The tensor-core work is the same; two
// copies write |A| + |B| floats fewer and move 2 |C| more, so a GEMM takes two
// when |A| + |B| > 2 |C| (A and B counted once per batch item they have).
// In GPT-2 124M at 16384 tokens that is every weight gradient (C one weight
// matrix, K the tokens), the input gradients of the QKV and MLP-up
// projections (dY wider than C) and the LM head's backward; the forward
// products and the other input gradients keep three. Counted from the sizes,
// two copies where they win move about 16 GB a step less than three
// throughout: 11 GB in the layers, 5.5 GB in the LM head's backward.
//
// Scratch. Three copies of both operands of the LM head's backward would take
// ~10 GB; the copies of one piece of the GEMM never take more than
// x3_scratch_floats() (512 MiB). A GEMM that needs more runs in pieces, cut along
// the one dimension that moves the fewest extra floats: batch items (free),
// rows of C (each extra piece reads B's c copies again: c k n), columns
// (c k m), or K (each piece after the first reads and writes C again in each
// of its products, beta = 1: 2 m n over 3K, 4 m n as two products; the
// epilogue runs on the last). Each operand is split once per piece of its own
// (a cut along rows splits B once).

constexpr size_t kX3ScratchMiB = 512;
/// kX3ScratchMiB in floats, or BT_X3_SCRATCH_MIB (read once; 16 to 65536) to
/// measure what the cap trades: fewer pieces against peak memory.
size_t x3_scratch_floats() {
  static const size_t floats = (static_cast<size_t>(env_int("BT_X3_SCRATCH_MIB", kX3ScratchMiB, 16, 65536,
                                                            "the fp32x3 GEMM scratch cap in MiB"))
                                << 20) /
                               sizeof(float);
  return floats;
}
constexpr int64_t kX3Align = 64;  // floats: B's copies start 256 bytes aligned

int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// x rounded to TF32, to nearest with ties away from zero (tf32_bits: cvt.rna,
/// the rounding of round_to_tf32 in kernels/common/tf32.h on the host).
__device__ __forceinline__ float tf32_rna(float x) { return __uint_as_float(tf32_bits(x)); }

/// x's TF32 parts: big = x rounded to TF32, small = the rest rounded to TF32
/// (0 where big is not finite).
struct Tf32Parts {
  float big, small;
};
__device__ __forceinline__ Tf32Parts tf32_parts(float x) {
  const float big = tf32_rna(x);
  return {big, isfinite(big) ? tf32_rna(x - big) : 0.0f};
}

/// For each of `items` matrices of rows x cols (K along the columns) at src +
/// b * src_stride (ld), `segs` copies along K at dst + b * segs rows cols: each
/// row becomes [seg 0 | seg 1 (| seg 2)], segment s holding the small TF32
/// parts when bit s of small_mask is set, else the big ones (Note
/// [K-contiguous copies]). The y blocks walk the rows, the x threads a row's columns:
/// coalesced on both sides, one division per row. The path of any alignment;
/// split_x3_vec_kernel is the usual one (Note [Splitting at copy bandwidth]).
__global__ void split_x3_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                                float* __restrict__ dst, int64_t rows, int64_t cols, int64_t items, int segs,
                                unsigned small_mask) {
  for (int64_t row = blockIdx.y; row < items * rows; row += gridDim.y) {
    const int64_t b = row / rows, r = row % rows;
    const float* s = src + b * src_stride + r * ld;
    float* d = dst + (b * rows + r) * segs * cols;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const Tf32Parts x = tf32_parts(s[j]);
      for (int seg = 0; seg < segs; ++seg) d[seg * cols + j] = (small_mask >> seg) & 1u ? x.small : x.big;
    }
  }
}

// Note [Splitting at copy bandwidth]
// The split moves 12 or 16 bytes an element (one float in, two or three out),
// about a fifth of an fp32x3 step on GPT-2, so it has to run near the copy's
// bandwidth. The usual layouts (src 16-byte aligned; its leading dimension,
// item stride and the dimensions packed multiples of 4 floats) take the
// vector kernels, which load each thread's 16-byte packs before storing any
// (several loads in flight a thread) and store 16 bytes at a time. The
// transposing one goes through a 128 (K) x 64 tile in shared memory, rows
// padded to 65 floats: the float4 loads land as four scalar stores, two lanes
// a bank, and each thread reads four rows of one column (four lanes a bank) to
// store them as one float4 of a copy. Its blocks walk K first, so those
// running at once write neighbouring stretches of the same copy rows. Any
// other layout takes the scalar kernels, which write the same copies
// (CudaGemm.Tf32x3SplitIsTheSameAtAnyAlignment). On an H200, over the split
// kernels of one GPT-2 step (ncu, bench/RESULTS.md step 13), the K-contiguous
// copies went from 2.6 to 3.3 TB/s and the transposing ones from 2.5 to 2.7.

constexpr int kVecThreads = 256, kVecUnroll = 4;

/// split_x3_kernel for 16-byte packs: `total4` packs of `cols4` a row, rows
/// numbered across the items. Note [Splitting at copy bandwidth].
__global__ void __launch_bounds__(kVecThreads)
    split_x3_vec_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                        float* __restrict__ dst, uint32_t rows, uint32_t cols4, uint32_t total4, int segs,
                        unsigned small_mask) {
  float4 v[kVecUnroll];
  uint32_t at[kVecUnroll];
  const uint32_t first = blockIdx.x * (kVecThreads * kVecUnroll) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kVecUnroll; ++u) {
    at[u] = first + u * kVecThreads;
    if (at[u] < total4) {
      const uint32_t row = at[u] / cols4, c4 = at[u] - row * cols4;
      const uint32_t b = row / rows, r = row - b * rows;
      v[u] = *reinterpret_cast<const float4*>(src + b * src_stride + r * ld + 4 * int64_t{c4});
    }
  }
#pragma unroll
  for (int u = 0; u < kVecUnroll; ++u) {
    if (at[u] >= total4) continue;
    const uint32_t row = at[u] / cols4, c4 = at[u] - row * cols4;
    const Tf32Parts x = tf32_parts(v[u].x), y = tf32_parts(v[u].y), z = tf32_parts(v[u].z),
                    w = tf32_parts(v[u].w);
    const float4 big{x.big, y.big, z.big, w.big}, small{x.small, y.small, z.small, w.small};
    float4* d = reinterpret_cast<float4*>(dst) + int64_t{row} * segs * cols4 + c4;
    for (int seg = 0; seg < segs; ++seg) d[seg * cols4] = (small_mask >> seg) & 1u ? small : big;
  }
}

/// The transposing variant, for an operand stored with K along its rows (an A
/// read transposed, a B read as it is): src is rows (K) x cols, and dst gets
/// cols rows of [seg 0 | seg 1 (| seg 2)] with K contiguous, the layout
/// split_x3_kernel gives a K-along-columns operand. 32 x 32 tiles go through
/// shared memory so that both the reads and the writes are coalesced; item b
/// is blockIdx.z. Note [K-contiguous copies]. The path of any alignment;
/// split_x3_t_vec_kernel is the usual one.
__global__ void split_x3_t_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                                  float* __restrict__ dst, int64_t rows, int64_t cols, int segs,
                                  unsigned small_mask) {
  __shared__ float big_t[32][33], small_t[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  const float* s = src + static_cast<int64_t>(blockIdx.z) * src_stride;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    const Tf32Parts x = tf32_parts(r < rows && c < cols ? s[r * ld + c] : 0.0f);
    big_t[i][threadIdx.x] = x.big;
    small_t[i][threadIdx.x] = x.small;
  }
  __syncthreads();
  float* d = dst + static_cast<int64_t>(blockIdx.z) * segs * rows * cols;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c >= cols || r >= rows) continue;
    const float big = big_t[threadIdx.x][i], small = small_t[threadIdx.x][i];
    for (int seg = 0; seg < segs; ++seg)
      d[c * segs * rows + seg * rows + r] = (small_mask >> seg) & 1u ? small : big;
  }
}

constexpr int kTileK = 128, kTileC = 64;

/// split_x3_t_kernel in tiles of kTileK rows (K) x kTileC columns of 16-byte
/// packs: rows and cols multiples of 4. blockIdx.x walks K, so that the
/// blocks running at once fill the copies' rows in order. Note [Splitting at
/// copy bandwidth].
__global__ void __launch_bounds__(kVecThreads)
    split_x3_t_vec_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                          float* __restrict__ dst, int64_t rows, int64_t cols, int segs,
                          unsigned small_mask) {
  __shared__ float tile[kTileK][kTileC + 1];
  constexpr int kInPacks = kTileC / 4, kOutPacks = kTileK / 4;  // packs of a tile row, of a copy's row
  constexpr int kSteps = kTileK * kTileC / 4 / kVecThreads;     // 8 packs a thread
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileK,
                c0 = static_cast<int64_t>(blockIdx.y) * kTileC;
  const float* s = src + static_cast<int64_t>(blockIdx.z) * src_stride;
  {
    const int p = threadIdx.x % kInPacks, i0 = threadIdx.x / kInPacks;
    float4 v[kSteps];
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      const int64_t r = r0 + i0 + t * (kVecThreads / kInPacks), c = c0 + 4 * p;
      v[t] = r < rows && c < cols ? *reinterpret_cast<const float4*>(s + r * ld + c) : float4{0, 0, 0, 0};
    }
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      float* row = tile[i0 + t * (kVecThreads / kInPacks)] + 4 * p;
      row[0] = v[t].x, row[1] = v[t].y, row[2] = v[t].z, row[3] = v[t].w;
    }
  }
  __syncthreads();
  float* d = dst + static_cast<int64_t>(blockIdx.z) * segs * rows * cols;
  const int p = threadIdx.x % kOutPacks, j0 = threadIdx.x / kOutPacks;
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
    const int j = j0 + t * (kVecThreads / kOutPacks);  // the tile's column: a row of the copies
    const int64_t c = c0 + j, r = r0 + 4 * p;
    if (c >= cols || r >= rows) continue;
    const Tf32Parts x = tf32_parts(tile[4 * p][j]), y = tf32_parts(tile[4 * p + 1][j]),
                    z = tf32_parts(tile[4 * p + 2][j]), w = tf32_parts(tile[4 * p + 3][j]);
    const float4 big{x.big, y.big, z.big, w.big}, small{x.small, y.small, z.small, w.small};
    float* out = d + c * segs * rows + r;
    for (int seg = 0; seg < segs; ++seg)
      *reinterpret_cast<float4*>(out + seg * rows) = (small_mask >> seg) & 1u ? small : big;
  }
}

unsigned mask_of(const bool small[3]) {
  return (small[0] ? 1u : 0u) | (small[1] ? 2u : 0u) | (small[2] ? 4u : 0u);
}

/// 2 or 3: how many copies of each operand the split writes (Note [Two
/// copies or three]); BT_X3_COPIES=2 or 3 (read once) forces one, to measure
/// what the rule trades.
int x3_copies(const GemmArgs& a) {
  static const int forced = static_cast<int>(
      env_int("BT_X3_COPIES", 0, 0, 3, "the fp32x3 GEMM's copies of each operand (0: chosen)"));
  if (forced == 2 || forced == 3) return forced;
  const int64_t items_a = a.stride_a == 0 ? 1 : a.batch, items_b = a.stride_b == 0 ? 1 : a.batch;
  const double operands =
      static_cast<double>(a.k) * (static_cast<double>(a.m) * items_a + static_cast<double>(a.n) * items_b);
  return operands > 2.0 * static_cast<double>(a.batch) * a.m * a.n ? 2 : 3;
}

/// Floats of scratch for one piece: A's copies (padded for alignment), then B's.
int64_t x3_floats(const GemmArgs& a, const GemmPieces& p) {
  const int64_t c = x3_copies(a);
  const int64_t items_a = a.stride_a == 0 ? 1 : p.batch, items_b = a.stride_b == 0 ? 1 : p.batch;
  return round_up(c * p.k * p.m * items_a, kX3Align) + c * p.k * p.n * items_b;
}

/// The pieces that fit `floats` of scratch (Note [Two copies or three]).
GemmPieces x3_pieces(const GemmArgs& a, int64_t floats) {
  const GemmPieces whole{a.batch, a.m, a.n, a.k};
  if (x3_floats(a, whole) <= floats) return whole;
  const int64_t c = x3_copies(a);
  // Batch items: the most that fit (the pad is at most kX3Align - 1).
  const int64_t fixed = (a.stride_a == 0 ? c * a.k * a.m : 0) + (a.stride_b == 0 ? c * a.k * a.n : 0);
  const int64_t per_item = (a.stride_a == 0 ? 0 : c * a.k * a.m) + (a.stride_b == 0 ? 0 : c * a.k * a.n);
  if (per_item > 0 && fixed + per_item + kX3Align <= floats)
    return {std::min(a.batch, (floats - kX3Align - fixed) / per_item), a.m, a.n, a.k};
  // One item at a time, cut along m, n or k: the fewest extra floats moved.
  const int64_t room = floats - kX3Align;
  GemmPieces best{0, 0, 0, 0};
  double best_cost = 0;
  auto consider = [&](GemmPieces p, int64_t pieces, double extra) {
    if (p.m < 1 || p.n < 1 || p.k < 1 || x3_floats(a, p) > floats) return;
    const double cost = static_cast<double>(pieces - 1) * extra;
    if (best.batch == 0 || cost < best_cost) best = p, best_cost = cost;
  };
  const auto piece = [](int64_t dim, int64_t most) {  // equal pieces of at most `most`
    const int64_t n = ceil_div(dim, std::max<int64_t>(most, 1));
    return std::pair<int64_t, int64_t>{ceil_div(dim, n), n};
  };
  if (const int64_t most = room / (c * a.k) - a.n; most >= 1) {
    const auto [mc, n] = piece(a.m, most);
    consider({1, mc, a.n, a.k}, n, static_cast<double>(c) * a.k * a.n);
  }
  if (const int64_t most = room / (c * a.k) - a.m; most >= 1) {
    const auto [nc, n] = piece(a.n, most);
    consider({1, a.m, nc, a.k}, n, static_cast<double>(c) * a.k * a.m);
  }
  if (const int64_t most = room / (c * (a.m + a.n)); most >= 1) {
    const auto [kc, n] = piece(a.k, most);
    // Each piece's products read and write C again: once over 3K, twice as two.
    consider({1, a.m, a.n, kc}, n, 2.0 * (c == 2 ? 2 : 1) * a.m * a.n);
  }
  BT_CHECK(best.batch > 0, "cuda gemm: fp32x3 needs at least ", c * (a.m + a.n) + kX3Align,
           " floats of scratch for m=", a.m, " n=", a.n, "; got ", floats);
  return best;
}

// Note [K-contiguous copies]
// The split copies of both operands are written with K contiguous -- A as
// m rows of 3K (or 2K), B as n rows of 3K (the product reads it transposed) --
// whatever layout the caller's operands have: the TF32 tensor-core GEMM runs
// fastest on that layout. Copying each operand as it lay made GPT-2's weight
// gradient (A = dY^T, B = X, K = 16384) run at 1.03x strict SGEMM on an H100
// against 2.34x for the forward's K-contiguous operands (bt_kernel_bench's
// GPT-2 MLP rows); the split pass moves the same bytes either way, the
// transposing one through shared-memory tiles.

}  // namespace

namespace gemm_detail {

/// The 3xTF32 GEMM, piece by piece: split the operands' pieces into scratch
/// (each only when it changes), then the products: one FAST_TF32 product over
/// 3K, or with two copies one over 2K and one over K (Note [Two copies or three]).
void gemm_x3(const GemmArgs& a, const GemmPieces& p, float* scratch, cudaStream_t stream) {
  const int segs = x3_copies(a);
  float* a3 = scratch;
  float* b3 = scratch + round_up(segs * p.k * p.m * (a.stride_a == 0 ? 1 : p.batch), kX3Align);
  const float* A = static_cast<const float*>(a.a);
  const float* B = static_cast<const float*>(a.b);
  constexpr int kThreads = 256;
  // The vector kernels' condition (Note [Splitting at copy bandwidth]): src
  // 16-byte aligned, its leading dimension and item stride multiples of 4
  // floats, and the dimensions the kernel packs too (the copies are aligned:
  // kX3Align, and rows of 2 or 3 x multiples of 4).
  auto packs = [](const float* src, int64_t ld, int64_t src_stride, int64_t items) {
    return aligned_to(src, 16) && ld % 4 == 0 && (items == 1 || src_stride % 4 == 0);
  };
  // An operand with K along its columns.
  auto split = [&](const float* src, int64_t ld, int64_t src_stride, float* dst, int64_t rows, int64_t cols,
                   int64_t items, const bool small[3]) {
    if (const int64_t total4 = items * rows * cols / 4;
        packs(src, ld, src_stride, items) && cols % 4 == 0 && total4 < (int64_t{1} << 31)) {
      const auto blocks = static_cast<unsigned>(ceil_div(total4, kVecThreads * kVecUnroll));
      split_x3_vec_kernel<<<blocks, kVecThreads, 0, stream>>>(
          src, ld, src_stride, dst, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols / 4),
          static_cast<uint32_t>(total4), segs, mask_of(small));
      BT_KERNEL_CHECK();
      return;
    }
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(cols, kThreads), 65535)),
                    static_cast<unsigned>(std::min<int64_t>(items * rows, 65535)));
    split_x3_kernel<<<grid, kThreads, 0, stream>>>(src, ld, src_stride, dst, rows, cols, items, segs,
                                                   mask_of(small));
    BT_KERNEL_CHECK();
  };
  // An operand with K along its rows (rows = K): transposed into K-contiguous copies.
  auto split_t = [&](const float* src, int64_t ld, int64_t src_stride, float* dst, int64_t rows, int64_t cols,
                     int64_t items, const bool small[3]) {
    BT_CHECK(ceil_div(rows, 32) <= 65535 && ceil_div(cols, kTileC) <= 65535 && items <= 65535,
             "cuda gemm: fp32x3 piece too large to split (", rows, " x ", cols, " x ", items, ")");
    if (packs(src, ld, src_stride, items) && rows % 4 == 0 && cols % 4 == 0) {
      const dim3 grid(static_cast<unsigned>(ceil_div(rows, kTileK)),
                      static_cast<unsigned>(ceil_div(cols, kTileC)), static_cast<unsigned>(items));
      split_x3_t_vec_kernel<<<grid, kVecThreads, 0, stream>>>(src, ld, src_stride, dst, rows, cols, segs,
                                                              mask_of(small));
      BT_KERNEL_CHECK();
      return;
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), static_cast<unsigned>(ceil_div(rows, 32)),
                    static_cast<unsigned>(items));
    split_x3_t_kernel<<<grid, dim3(32, 8), 0, stream>>>(src, ld, src_stride, dst, rows, cols, segs,
                                                        mask_of(small));
    BT_KERNEL_CHECK();
  };
  // Which piece of each operand scratch holds now: (batch item, row or column, k).
  std::array<int64_t, 3> split_a{-1, -1, -1}, split_b{-1, -1, -1};
  for (int64_t b0 = 0; b0 < a.batch; b0 += p.batch) {
    const int64_t bc = std::min(p.batch, a.batch - b0);
    const int64_t items_a = a.stride_a == 0 ? 1 : bc, items_b = a.stride_b == 0 ? 1 : bc;
    for (int64_t i0 = 0; i0 < a.m; i0 += p.m) {
      const int64_t mc = std::min(p.m, a.m - i0);
      for (int64_t j0 = 0; j0 < a.n; j0 += p.n) {
        const int64_t nc = std::min(p.n, a.n - j0);
        for (int64_t k0 = 0; k0 < a.k; k0 += p.k) {
          const int64_t kc = std::min(p.k, a.k - k0);
          if (const std::array<int64_t, 3> at{a.stride_a == 0 ? 0 : b0, i0, k0}; at != split_a) {
            const float* src = A + b0 * a.stride_a + (a.trans_a ? k0 * a.lda + i0 : i0 * a.lda + k0);
            if (a.trans_a)
              split_t(src, a.lda, a.stride_a, a3, kc, mc, items_a, kX3SmallA);
            else
              split(src, a.lda, a.stride_a, a3, mc, kc, items_a, kX3SmallA);
            split_a = at;
          }
          if (const std::array<int64_t, 3> at{a.stride_b == 0 ? 0 : b0, j0, k0}; at != split_b) {
            const float* src = B + b0 * a.stride_b + (a.trans_b ? j0 * a.ldb + k0 : k0 * a.ldb + j0);
            if (a.trans_b)
              split(src, a.ldb, a.stride_b, b3, nc, kc, items_b, kX3SmallB);
            else
              split_t(src, a.ldb, a.stride_b, b3, kc, nc, items_b, kX3SmallB);
            split_b = at;
          }
          GemmArgs s = a;
          s.math = GemmMath::Tf32;
          s.bias_grad = nullptr;  // summed from the caller's A by gemm()
          s.m = mc, s.n = nc, s.k = segs * kc;
          s.batch = bc;
          // Note [K-contiguous copies]: A' is [m, segs K], B' is [n, segs K] read transposed.
          s.trans_a = false, s.trans_b = true;
          s.a = a3, s.lda = segs * kc, s.stride_a = a.stride_a == 0 ? 0 : segs * kc * mc;
          s.b = b3, s.ldb = segs * kc, s.stride_b = a.stride_b == 0 ? 0 : segs * kc * nc;
          const int64_t c_off = b0 * a.stride_c + i0 * a.ldc + j0;
          s.c = static_cast<float*>(a.c) + c_off;
          if (k0 > 0) s.beta = 1.0f;  // C holds the earlier pieces of K
          if (bc <= 1) s.stride_a = s.stride_b = s.stride_c = 0;
          GemmArgs last = s;  // the product the epilogue goes with
          if (segs == 2) {    // [small | big] x [big | small] over 2K, then big x big over K
            s.epilogue = Epilogue::None;
            s.bias = nullptr, s.pre_gelu = nullptr, s.gelu_in = nullptr;
            product(s, stream);
            last.k = kc;
            last.a = a3 + kc;  // A's big copy; B's is its first
            last.beta = 1.0f;
          }
          if (k0 + kc < a.k) {
            last.epilogue = Epilogue::None;  // the epilogue applies to the whole sum
            last.bias = nullptr, last.pre_gelu = nullptr, last.gelu_in = nullptr;
          } else {
            if (last.bias) last.bias = static_cast<const float*>(a.bias) + j0;
            if (last.pre_gelu) last.pre_gelu = static_cast<float*>(a.pre_gelu) + c_off;
            if (last.gelu_in) last.gelu_in = static_cast<const float*>(a.gelu_in) + i0 * a.ld_gelu_in + j0;
            if (last.epilogue == Epilogue::DGeluBgrad) last.epilogue = Epilogue::DGelu;  // summed by gemm()
          }
          product(last, stream);
        }
      }
    }
  }
}

}  // namespace gemm_detail

size_t gemm_scratch_floats(const GemmArgs& a) {
  if (a.dtype != DType::F32 || a.batch <= 0 || a.m <= 0 || a.n <= 0 || a.k <= 0) return 0;
  if (a.math != GemmMath::Tf32x3) return gemm_uses_dmma(a) ? gemm_detail::dmma_scratch_floats(a) : 0;
  GemmArgs g = a;
  if (g.batch <= 1) g.stride_a = g.stride_b = g.stride_c = 0;
  return static_cast<size_t>(x3_floats(g, x3_pieces(g, static_cast<int64_t>(x3_scratch_floats()))));
}

GemmPieces gemm_x3_pieces(const GemmArgs& a, size_t scratch_floats) {
  GemmArgs g = a;
  if (g.batch <= 1) g.stride_a = g.stride_b = g.stride_c = 0;
  BT_CHECK(g.batch > 0 && g.m > 0 && g.n > 0 && g.k > 0, "cuda gemm_x3_pieces: an empty GEMM has no pieces");
  // At least what the GEMM asks for: its own pieces, not a cut to fit exactly that.
  const bool enough = scratch_floats == 0 || scratch_floats >= gemm_scratch_floats(g);
  return x3_pieces(g, static_cast<int64_t>(enough ? x3_scratch_floats() : scratch_floats));
}

}  // namespace bt::kernels::cuda
