// The 3xTF32 GEMM on CUDA (GemmMath::Tf32x3, Note [3xTF32] in kernels/gemm.h):
// split_x3_kernel writes three copies of each operand along K into the
// caller's scratch, A as [small | big | big] and B as [big | small | big]
// (TF32 parts, rounded with cvt.rna; both K-contiguous, Note [K-contiguous
// copies]), and one FAST_TF32 cuBLASLt product over 3K sums the three products
// with beta and the epilogue applied once. Note [One GEMM over 3K].
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

// Note [One GEMM over 3K]
// The three products could be three FAST_TF32 GEMMs on two copies of each
// operand (big, small), accumulating into C with beta = 1 after the first.
// One GEMM over [A_small A_big A_big] x [B_big; B_small; B_big] does the same
// tensor-core work in one launch, on three copies: its split writes |A| + |B|
// more floats, and it reads and writes C once instead of three times (two
// reads and two writes fewer). So it moves less when |A| + |B| < 4 |C|.
// Over one step of GPT-2 124M at 16384 tokens (12 layers, 4 linears each, and
// the LM head), counted from the sizes (not measured), it moves about 41 GB
// less -- the LM head's forward 13 GB (3.3G floats of logits against 51M of
// operands), the QKV and MLP-up projections' forward and the MLP-down
// projection's input gradient 7-9 GB each -- and about 15 GB more: the
// weight gradients (K = the tokens, C one weight matrix) 8 GB, the LM head's
// backward 6 GB (which runs in pieces either way). One path, not two.
//
// Scratch. Three copies of both operands of the LM head's backward would take
// ~10 GB; the split operands of one piece of the GEMM never take more than
// x3_scratch_floats() (512 MiB). A GEMM that needs more runs in pieces, cut along
// the one dimension that moves the fewest extra floats: batch items (free),
// rows of C (each extra piece reads B's copies again: 3 k n), columns (3 k m),
// or K (each piece after the first reads and writes C again, beta = 1: 2 m n;
// the epilogue runs on the last). Each operand is split once per piece of its
// own (a cut along rows splits B once).

constexpr size_t kX3ScratchMiB = 512;
/// kX3ScratchMiB in floats, or BT_X3_SCRATCH_MIB (read once; 16 to 65536) to
/// measure what the cap trades: fewer pieces against peak memory.
size_t x3_scratch_floats() {
  static const size_t floats =
      (static_cast<size_t>(env_int("BT_X3_SCRATCH_MIB", kX3ScratchMiB, 16, 65536,
                                   "the fp32x3 GEMM scratch cap in MiB")) << 20) / sizeof(float);
  return floats;
}
constexpr int64_t kX3Align = 64;  // floats: B's copies start 256 bytes aligned

int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// x rounded to TF32, to nearest with ties away from zero (tf32_bits: cvt.rna,
/// the rounding of round_to_tf32 in kernels/common/tf32.h on the host).
__device__ __forceinline__ float tf32_rna(float x) { return __uint_as_float(tf32_bits(x)); }

/// For each of `items` matrices of rows x cols (K along the columns) at src +
/// b * src_stride (ld), three copies along K at dst + b * dst_stride: each row
/// becomes [seg 0 | seg 1 | seg 2], segment s holding the small TF32 parts
/// when bit s of small_mask is set, else the big ones (Note [K-contiguous
/// copies]). The y blocks walk the rows, the x threads a row's columns:
/// coalesced on both sides, one division per row.
__global__ void split_x3_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                                float* __restrict__ dst, int64_t dst_stride, int64_t rows, int64_t cols,
                                int64_t items, unsigned small_mask) {
  for (int64_t row = blockIdx.y; row < items * rows; row += gridDim.y) {
    const int64_t b = row / rows, r = row % rows;
    const float* s = src + b * src_stride + r * ld;
    float* d = dst + b * dst_stride + r * 3 * cols;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float x = s[j];
      const float big = tf32_rna(x);
      const float small = isfinite(big) ? tf32_rna(x - big) : 0.0f;
      for (int seg = 0; seg < 3; ++seg) d[seg * cols + j] = (small_mask >> seg) & 1u ? small : big;
    }
  }
}

/// The transposing variant, for an operand stored with K along its rows (an A
/// read transposed, a B read as it is): src is rows (K) x cols, and dst gets
/// cols rows of [seg 0 | seg 1 | seg 2] with K contiguous, the layout
/// split_x3_kernel gives a K-along-columns operand. 32 x 32 tiles go through
/// shared memory so that both the reads and the writes are coalesced; item b
/// is blockIdx.z. Note [K-contiguous copies].
__global__ void split_x3_t_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                                  float* __restrict__ dst, int64_t dst_stride, int64_t rows, int64_t cols,
                                  unsigned small_mask) {
  __shared__ float big_t[32][33], small_t[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  const float* s = src + static_cast<int64_t>(blockIdx.z) * src_stride;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    const float x = r < rows && c < cols ? s[r * ld + c] : 0.0f;
    const float big = tf32_rna(x);
    big_t[i][threadIdx.x] = big;
    small_t[i][threadIdx.x] = isfinite(big) ? tf32_rna(x - big) : 0.0f;
  }
  __syncthreads();
  float* d = dst + static_cast<int64_t>(blockIdx.z) * dst_stride;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c >= cols || r >= rows) continue;
    const float big = big_t[threadIdx.x][i], small = small_t[threadIdx.x][i];
    for (int seg = 0; seg < 3; ++seg)
      d[c * 3 * rows + seg * rows + r] = (small_mask >> seg) & 1u ? small : big;
  }
}

unsigned mask_of(const bool small[3]) {
  return (small[0] ? 1u : 0u) | (small[1] ? 2u : 0u) | (small[2] ? 4u : 0u);
}

/// Floats of scratch for one piece: A's three copies (padded for alignment), then B's.
int64_t x3_floats(const GemmArgs& a, const GemmPieces& p) {
  const int64_t items_a = a.stride_a == 0 ? 1 : p.batch, items_b = a.stride_b == 0 ? 1 : p.batch;
  return round_up(3 * p.k * p.m * items_a, kX3Align) + 3 * p.k * p.n * items_b;
}

/// The pieces that fit `floats` of scratch (Note [One GEMM over 3K]).
GemmPieces x3_pieces(const GemmArgs& a, int64_t floats) {
  const GemmPieces whole{a.batch, a.m, a.n, a.k};
  if (x3_floats(a, whole) <= floats) return whole;
  // Batch items: the most that fit (the pad is at most kX3Align - 1).
  const int64_t fixed = (a.stride_a == 0 ? 3 * a.k * a.m : 0) + (a.stride_b == 0 ? 3 * a.k * a.n : 0);
  const int64_t per_item = (a.stride_a == 0 ? 0 : 3 * a.k * a.m) + (a.stride_b == 0 ? 0 : 3 * a.k * a.n);
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
  if (const int64_t most = room / (3 * a.k) - a.n; most >= 1) {
    const auto [mc, n] = piece(a.m, most);
    consider({1, mc, a.n, a.k}, n, 3.0 * a.k * a.n);
  }
  if (const int64_t most = room / (3 * a.k) - a.m; most >= 1) {
    const auto [nc, n] = piece(a.n, most);
    consider({1, a.m, nc, a.k}, n, 3.0 * a.k * a.m);
  }
  if (const int64_t most = room / (3 * (a.m + a.n)); most >= 1) {
    const auto [kc, n] = piece(a.k, most);
    consider({1, a.m, a.n, kc}, n, 2.0 * a.m * a.n);
  }
  BT_CHECK(best.batch > 0, "cuda gemm: fp32x3 needs at least ", 3 * (a.m + a.n) + kX3Align,
           " floats of scratch for m=", a.m, " n=", a.n, "; got ", floats);
  return best;
}

// Note [K-contiguous copies]
// The split copies of both operands are written with K contiguous -- A as
// m rows of 3K, B as n rows of 3K (the product reads it transposed) --
// whatever layout the caller's operands have: the TF32 tensor-core GEMM runs
// fastest on that layout. Copying each operand as it lay made GPT-2's weight
// gradient (A = dY^T, B = X, K = 16384) run at 1.03x strict SGEMM on an H100
// against 2.34x for the forward's K-contiguous operands (bt_kernel_bench's
// GPT-2 MLP rows); the split pass moves the same bytes either way, the
// transposing one through shared-memory tiles.

}  // namespace

namespace gemm_detail {

/// The 3xTF32 GEMM, piece by piece: split the operands' pieces into scratch
/// (each only when it changes), then one FAST_TF32 product over 3K.
void gemm_x3(const GemmArgs& a, const GemmPieces& p, float* scratch, cudaStream_t stream) {
  float* a3 = scratch;
  float* b3 = scratch + round_up(3 * p.k * p.m * (a.stride_a == 0 ? 1 : p.batch), kX3Align);
  const float* A = static_cast<const float*>(a.a);
  const float* B = static_cast<const float*>(a.b);
  constexpr int kThreads = 256;
  // An operand with K along its columns.
  auto split = [&](const float* src, int64_t ld, int64_t src_stride, float* dst, int64_t rows, int64_t cols,
                   int64_t items, const bool small[3]) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(cols, kThreads), 65535)),
                    static_cast<unsigned>(std::min<int64_t>(items * rows, 65535)));
    split_x3_kernel<<<grid, kThreads, 0, stream>>>(src, ld, src_stride, dst, 3 * rows * cols, rows, cols,
                                                   items, mask_of(small));
    BT_KERNEL_CHECK();
  };
  // An operand with K along its rows (rows = K): transposed into K-contiguous copies.
  auto split_t = [&](const float* src, int64_t ld, int64_t src_stride, float* dst, int64_t rows, int64_t cols,
                     int64_t items, const bool small[3]) {
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), static_cast<unsigned>(ceil_div(rows, 32)),
                    static_cast<unsigned>(items));
    BT_CHECK(grid.y <= 65535 && grid.z <= 65535, "cuda gemm: fp32x3 piece too large to split (", rows, " x ",
             cols, " x ", items, ")");
    split_x3_t_kernel<<<grid, dim3(32, 8), 0, stream>>>(src, ld, src_stride, dst, 3 * rows * cols, rows, cols,
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
          s.m = mc, s.n = nc, s.k = 3 * kc;
          s.batch = bc;
          // Note [K-contiguous copies]: A' is [m, 3K], B' is [n, 3K] read transposed.
          s.trans_a = false, s.trans_b = true;
          s.a = a3, s.lda = 3 * kc, s.stride_a = a.stride_a == 0 ? 0 : 3 * kc * mc;
          s.b = b3, s.ldb = 3 * kc, s.stride_b = a.stride_b == 0 ? 0 : 3 * kc * nc;
          const int64_t c_off = b0 * a.stride_c + i0 * a.ldc + j0;
          s.c = static_cast<float*>(a.c) + c_off;
          if (k0 > 0) s.beta = 1.0f;  // C holds the earlier pieces of K
          if (k0 + kc < a.k) {
            s.epilogue = Epilogue::None;  // the epilogue applies to the whole sum
            s.bias = nullptr, s.pre_gelu = nullptr, s.gelu_in = nullptr;
          } else {
            if (s.bias) s.bias = static_cast<const float*>(a.bias) + j0;
            if (s.pre_gelu) s.pre_gelu = static_cast<float*>(a.pre_gelu) + c_off;
            if (s.gelu_in) s.gelu_in = static_cast<const float*>(a.gelu_in) + i0 * a.ld_gelu_in + j0;
            if (s.epilogue == Epilogue::DGeluBgrad) s.epilogue = Epilogue::DGelu;  // summed by gemm()
          }
          if (bc <= 1) s.stride_a = s.stride_b = s.stride_c = 0;
          product(s, stream);
        }
      }
    }
  }
}

}  // namespace gemm_detail

size_t gemm_scratch_floats(const GemmArgs& a) {
  if (a.dtype != DType::F32 || a.math != GemmMath::Tf32x3 || a.batch <= 0 || a.m <= 0 || a.n <= 0 || a.k <= 0)
    return 0;
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
