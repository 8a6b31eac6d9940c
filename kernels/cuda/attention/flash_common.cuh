// What the tensor-core FlashAttention kernels share (the mma.sync kernels of
// attention_mma.cu and the Hopper wgmma kernels of sm90a/): moving swizzled
// tiles between global and shared memory, and a warp's
// online softmax over its 16 query rows. The score and output tiles are
// accumulator fragments in the mma.m16n8 C layout -- lane (g, t) holds rows
// g and g + 8, columns 2 t and 2 t + 1 of each 8-column tile -- which is also
// the layout of each warp's 16 rows of a wgmma m64nN accumulator.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda::detail {

/// An int64 offset clamped to +-2^30: compared with a value below 2^8, it
/// gives the unclamped comparison's result (Note [The causal mask in tile
/// offsets]).
__device__ __forceinline__ int tile_offset(int64_t d) {
  constexpr int64_t kLim = int64_t{1} << 30;
  return static_cast<int>(d < -kLim ? -kLim : d > kLim ? kLim : d);
}

/// Async copy of rows [row0, row0 + ROWS) of a [T, D] slab with row stride `st`
/// into a swizzled tile; rows >= T become zeros. All NT threads take part:
/// thread x copies chunk x % C of rows x / C, x / C + NT / C, ... (C chunks a
/// row), so its source steps by a fixed stride and a row's bound is one
/// 32-bit compare. (Index math per chunk in int64 was about a sixth of the
/// wgmma dQ pass's loop in Nsight Compute's instruction counts.)
template <class Ops, int D, int ROWS, int NT>
__device__ __forceinline__ void load_tile(typename Ops::E* tile, const typename Ops::E* g, int64_t st,
                                          int64_t row0, int64_t T) {
  constexpr int kChunks = D / Ops::kChunk, kTotal = ROWS * kChunks, kStep = NT / kChunks;
  static_assert(kTotal % NT == 0 && NT % kChunks == 0, "tile chunks must divide evenly among the threads");
  const int r0 = static_cast<int>(threadIdx.x) / kChunks, c = static_cast<int>(threadIdx.x) % kChunks;
  // This thread's rows r0 + kStep it exist while kStep it < rows.
  const int rows = tile_offset(T - row0) - r0;
  const typename Ops::E* src = g + (row0 + r0) * st + c * Ops::kChunk;
#pragma unroll
  for (int it = 0; it < kTotal / NT; ++it) {
    const bool ok = it * kStep < rows;
    cp_async16(smem_u32(tile + Ops::template swz<D>(r0 + it * kStep, c)), ok ? src + it * kStep * st : g, ok);
  }
}

/// The double-buffered K/V tiles of a kernel walking key tiles of BN rows:
/// before tile kt, starts copying tile kt + 1 into the other buffers (ks, vs
/// hold [2][BN][D]) and waits for this thread's copies of tile kt. A barrier
/// must follow before any thread reads tile kt.
template <class Ops, int D, int BN, int NT>
__device__ __forceinline__ void next_kv_tile(typename Ops::E* ks, typename Ops::E* vs,
                                             const typename Ops::E* kg, const typename Ops::E* vg,
                                             int64_t kst, int64_t vst, int kt, int nkt, int64_t T) {
  if (kt + 1 < nkt) {
    const int nb = (kt + 1) & 1;
    const int64_t k1 = static_cast<int64_t>(kt + 1) * BN;
    load_tile<Ops, D, BN, NT>(ks + nb * BN * D, kg, kst, k1, T);
    load_tile<Ops, D, BN, NT>(vs + nb * BN * D, vg, vst, k1, T);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

/// Async copy of floats [row0, row0 + N) of `src` (zeros past T).
template <int N, int NT>
__device__ __forceinline__ void load_vec(float* dst, const float* src, int64_t row0, int64_t T) {
  const int rows = tile_offset(T - row0);
#pragma unroll
  for (int k = 0; k < (N + NT - 1) / NT; ++k) {
    const int i = k * NT + static_cast<int>(threadIdx.x);
    const bool ok = i < rows;
    if (N % NT == 0 || i < N) cp_async4(smem_u32(dst + i), ok ? src + row0 + i : src, ok);
  }
}

/// Writes a warp's 16 x D fp32 accumulators (times `mul`) into rows
/// r0..r0+15 of a swizzled tile.
template <class Ops, int D>
__device__ __forceinline__ void stage_acc(typename Ops::E* tile, int r0, const float (&acc)[D / 8][4],
                                          float mul, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int col = dt * 8 + 2 * t;
      Ops::store2(tile + Ops::template swz<D>(r0 + g + 8 * hf, col / Ops::kChunk) + col % Ops::kChunk,
                  acc[dt][2 * hf] * mul, acc[dt][2 * hf + 1] * mul);
    }
}

/// A warp copies rows r0..r0+ROWS-1 of a swizzled tile to global rows
/// grow0.. (those < T) with 16-byte stores.
template <class Ops, int D, int ROWS>
__device__ __forceinline__ void store_rows(const typename Ops::E* tile, int r0, typename Ops::E* g,
                                           int64_t st, int64_t grow0, int64_t T, int lane) {
  constexpr int kChunks = D / Ops::kChunk, kTotal = ROWS * kChunks;
  static_assert(kTotal % 32 == 0, "rows * chunks must be a multiple of the warp");
#pragma unroll
  for (int it = 0; it < kTotal / 32; ++it) {
    const int i = it * 32 + lane;
    const int r = i / kChunks, c = i % kChunks;
    const int64_t t = grow0 + r;
    if (t < T)
      *reinterpret_cast<uint4*>(g + t * st + c * Ops::kChunk) =
          *reinterpret_cast<const uint4*>(tile + Ops::template swz<D>(r0 + r, c));
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/// A forward block's work: BM query rows from q0 of one (b, h), and the nkt
/// key tiles of BN keys that some of them see (longest rows first across the
/// grid). Note [Grouped-query attention]: K/V head h / G.
template <class E, int BM, int BN>
struct FwdBlock {
  int64_t bh, b, h, T, q0;
  int nkt;
  const E* qg;
  const E* kg;
  const E* vg;

  __device__ __forceinline__ explicit FwdBlock(const AttnFwdParams<E>& p) {
    const int64_t bh_count = p.B * p.H, bid = blockIdx.x;
    bh = bid % bh_count;
    b = bh / p.H, h = bh % p.H, T = p.T;
    q0 = (p.tiles - 1 - bid / bh_count) * BM;
    qg = p.q + b * p.sq.b + h * p.sq.h;
    kg = p.k + b * p.sk.b + (h / p.G) * p.sk.h;
    vg = p.v + b * p.sv.b + (h / p.G) * p.sv.h;
    const int64_t kend = q0 + BM < T ? q0 + BM : T;  // keys >= kend are masked for the whole block
    nkt = static_cast<int>((kend + BN - 1) / BN);
  }
  /// Starts (and commits) the copies of the Q tile and the first K/V tiles.
  template <class Ops, int D, int NT>
  __device__ __forceinline__ void load_first(E* qs, E* ks, E* vs, const AttnFwdParams<E>& p) const {
    load_tile<Ops, D, BM, NT>(qs, qg, p.sq.t, q0, T);
    load_tile<Ops, D, BN, NT>(ks, kg, p.sk.t, 0, T);
    load_tile<Ops, D, BN, NT>(vs, vg, p.sv.t, 0, T);
    cp_async_commit();
  }
};

// Note [The causal mask in tile offsets]
// The mask compares 64-bit positions (a query's row, a key's column, T), but
// within one tile only their offsets matter: with rel = the tile's first
// column minus the warp's first row, and lim = T minus the tile's first
// column, column c of the tile is after row r of the warp when rel + c > r,
// and past the end when c >= lim. Both are clamped to +-2^30, which keeps
// every comparison's result (c and r are below 2^8), so an element costs two
// 32-bit compares against lane constants instead of 64-bit index math.
// Off the diagonal and the sequence's end neither compare fires, so the
// masked code is right for every tile; what differs is its cost. Left to
// itself, the compiler turns a mask under `if (need_mask)` into selects that
// every tile pays for: in the wgmma backward, the 64-bit compares were the
// most executed instruction (Nsight Compute, bench/RESULTS.md issue 18 step
// 18). So the wgmma backward branches explicitly between a masked and an
// unmasked copy of its arithmetic (kBranch below), which took it from 190 to
// 212-218 TFLOP/s on an H200. The mma.sync kernels run the masked copy on
// every tile: a second copy cost them registers (the bf16 dK/dV pass spilled
// 344 bytes instead of 60: 150 -> 139 TFLOP/s), while the 32-bit compares
// alone gave them 157.

/// Masks a warp's 16 x (8 NTL) score tile: rows row0 + g (+ 8), key columns
/// k0 + 8 nt + 2 t (+ 1); a key after its query, or past T, becomes -inf.
template <int NTL>
__device__ __forceinline__ void mask_scores(float (&s)[NTL][4], int64_t row0, int64_t k0, int64_t T,
                                            int lane) {
  const int g = lane >> 2, tq = lane & 3;
  const int rel = tile_offset(k0 - row0) - g, lim = tile_offset(T - k0);
#pragma unroll
  for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = nt * 8 + 2 * tq + (e & 1);
      if (rel + c > (e >> 1) * 8 || c >= lim) s[nt][e] = -INFINITY;
    }
}

/// One key tile's online softmax on a warp's 16 rows, in base 2 (scale > 0,
/// so the max of the raw scores gives the max of the scaled ones): the lane's
/// rows hf = 0, 1 are g + 8 hf; m is kept in scaled log2 units and
/// p = 2^(s scale log2 e - m), one FFMA. s becomes P; l and o are rescaled.
template <int NTL, int DT>
__device__ __forceinline__ void softmax_update(float (&s)[NTL][4], float (&m)[2], float (&l)[2],
                                               float (&o)[DT][4], float scale_log2) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NTL; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
    mx = quad_max(mx) * scale_log2;
    const float m_new = fmaxf(m[hf], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = fast_exp2(m[hf] - m_use);
    m[hf] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float pv = fast_exp2(fmaf(s[nt][2 * hf + j], scale_log2, -m_use));
        s[nt][2 * hf + j] = pv;
        sum += pv;
      }
    l[hf] = l[hf] * corr + sum;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][2 * hf] *= corr;
      o[dt][2 * hf + 1] *= corr;
    }
  }
}

/// The end of the forward for a warp's 16 rows from row0: O /= l, and lse =
/// ln 2 (m + log2 l) into lse_bh[row] (the (b, h) slab; skipped when null).
template <int DT>
__device__ __forceinline__ void finish_rows(float (&o)[DT][4], const float (&m)[2], const float (&l)[2],
                                            float* lse_bh, int64_t row0, int64_t T, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float lt = quad_sum(l[hf]);
    const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][2 * hf] *= inv;
      o[dt][2 * hf + 1] *= inv;
    }
    const int64_t row = row0 + g + 8 * hf;
    if (lse_bh && tq == 0 && row < T) lse_bh[row] = (m[hf] + log2f(lt)) * kLn2;
  }
}

}  // namespace bt::kernels::cuda::detail
