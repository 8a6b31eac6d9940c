// The causal attention backward on Hopper's warpgroup tensor cores (wgmma),
// BF16 with D = 64, deterministic (no atomics), in three passes: Di =
// rowsum(dO * O); the dK/dV pass, which also writes its dS^T tiles (Note
// [dS through memory]); the dQ pass, dQ = dS K from those tiles. Its tile products are
// the mma.sync kernels' (kernels/cuda/attention/attention_mma.cu) moved from
// per-warp mma.sync to per-warpgroup wgmma (kernels/cuda/sm90a/wgmma.cuh).
// Built for sm_90a only; attention_backward_mma dispatches here on an sm_90
// device when attention_backward_uses_wgmma (kernels/attention.h).
//
// A warpgroup owns 64 rows (keys in the dK/dV pass, queries in the dQ pass);
// its warp i owns rows 16 i .. 16 i + 15 of those, which is where the
// mma.sync kernels' warps kept theirs, so everything between the products --
// P from the scores and lse, dS = P (dP - Di), the causal mask -- is those
// kernels' per-warp code on the same accumulator layout. The products:
//   dK/dV     S^T = K Q^T, dP^T = V dO^T   A = the group's K / V rows, B =
//                                          the Q / dO tile (K-major)
//             dV += P^T dO, dK += dS^T Q   A = P^T / dS^T from registers,
//                                          B = the dO / Q tile (N-major)
//   dQ        dQ += dS K               A = dS from registers (the dK/dV
//                                      pass's dS^T tiles, transposed by
//                                      ldmatrix.trans), B = the K tile
//                                      (N-major)
// Every tile is 128-byte swizzled (load_tile's swizzle at D = 64 is wgmma's)
// and starts on a 1024-byte boundary. Tiles copied by cp.async are made
// visible to wgmma's async proxy by fence.proxy.async before the barrier.
// Each batch of wgmmas is committed and waited for before its accumulators
// are read.
//
// Note [dS through memory]
// The dQ pass used to recompute what the dK/dV pass had: S = Q K^T and
// dP = dO V^T (two of its three products) and dS from them, to add dS K --
// on an H200, 1.87 ms of a bf16 GPT-2 124M step against 2.25 ms for the
// dK/dV pass (ncu, bench/RESULTS.md). FlashAttention-2 and -3 instead add
// each key tile's dS K into dQ from the dK/dV pass with float atomics, in an
// order that changes from run to run. Here the dK/dV pass writes each dS^T
// tile (64 keys x 64 queries, bf16: the very registers its dK product reads,
// four 16-byte stores a thread, evict-first) to scratch, and the dQ pass sums
// dS K over a query tile's key tiles in key order: one product per tile, the
// same bits every run. The dQ pass needs dS, not dS^T, as its A operand: it
// puts each tile into shared memory in the dK/dV pass's layout and takes its
// own fragments out with ldmatrix.trans. (Transposing in the dK/dV pass
// instead, through shared memory and a barrier, cost that register-bound
// pass 0.50 ms a step, 2.90 ms against 2.40 ms without any dS store; storing
// its registers as they are costs it 0.22 ms: ncu, GPT-2 124M, H200. The dQ
// pass is memory-bound and has the room.) The dS tiles of the old dQ pass and the
// dK/dV pass's dS^T tiles held the same bits, so the results did not change.
// Scratch: B H x (nt (nt + 1) / 2) tiles of 8 KiB, nt = ceil(T / 64) --
// 214 MB at B 16, H 12, T 1024 -- held only for the call
// (attention_backward_scratch_floats). Di = rowsum(dO * O), which the dQ
// pass used to compute first, is now its own small pass.
// Measured (bench/RESULTS.md, issue 18 step 12): on an H200 the backward's
// kernels went from 4.12 to 3.81 ms a GPT-2 124M step; on an H100, whose
// bandwidth pays more for the 214 MB written and read a layer, the backward
// fell from 190 to 175 TFLOP/s (bt_kernel_bench) and the step by 0.25%.
#include <cstdint>

#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/flash_backward.cuh"
#include "kernels/cuda/attention/flash_common.cuh"
#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sm90a/wgmma.cuh"

// Configurations: <warpgroups per block, query tile, blocks per SM> (dK/dV)
// and <key tile, blocks per SM> (dQ). Timed on an H100 at B 16, H 12, T 1024
// (bench/RESULTS.md, issue 18 step 10): one warpgroup and three blocks per SM
// won the dK/dV pass; two blocks per SM gave 172-186 TFLOP/s for the
// backward against 190, two warpgroups sharing the tiles (one block per SM)
// 149-167. Issuing dV's product before computing dS^T (overlapping them) cost
// the dK/dV pass its registers at three blocks per SM: ptxas serialized the
// wgmmas. The dS tiles are 64 x 64: both passes take 64-row tiles, the
// dK/dV pass one warpgroup a block. The dQ pass runs three blocks per SM:
// its ring of three tiles' dS fragments takes 156 registers (capped at 128
// for four blocks, ptxas spilled 248 bytes). A tuning run may override these
// with -D.
#ifndef BT_ATTN_WGMMA_DKDV
#define BT_ATTN_WGMMA_DKDV 1, 64, 3
#endif
#ifndef BT_ATTN_WGMMA_DQ
#define BT_ATTN_WGMMA_DQ 64, 3
#endif

namespace bt::kernels::cuda::detail {
namespace {

using Ops = Bf16Ops;
constexpr int kD = 64;
constexpr int kTile = 64;  // queries and keys of a dS tile (Note [dS through memory])

/// The 16-byte pieces of a dS^T tile: for each warp w of the dK/dV pass's
/// warpgroup (keys 16 w ..), k-step j (queries 16 j ..) and lane, the four
/// registers of that lane's A fragment of the dK product, 512 pieces in all.
__device__ __forceinline__ int tile_frag_index(int w, int j, int lane) { return (w * 4 + j) * 32 + lane; }

/// The dS^T tile of query tile qt and key tile kt <= qt of (batch item,
/// query head) bh: tiles of a query tile in key order, query tiles in order.
__device__ __forceinline__ uint4* ds_tile(const AttnBwdParams<bf16_t>& p, int64_t bh, int64_t qt,
                                          int64_t kt) {
  const int64_t nt = (p.T + kTile - 1) / kTile;
  return p.ds + (bh * (nt * (nt + 1) / 2) + qt * (qt + 1) / 2 + kt) * (kTile * kTile / 8);
}

/// A warp's 16 rows r0.. of A fragments (K columns: fragment k-step kk in
/// f[kk], the register-A layout) into a swizzled tile of rows of 64 bf16.
template <int K>
__device__ __forceinline__ void stage_frags(bf16_t* tile, int r0, const uint32_t (&f)[K / 16][4], int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // i: row g (+ 8 when odd), columns 16 kk + 2 t (+ 8 when i >= 2)
      const int row = r0 + g + 8 * (i & 1), col = 16 * kk + 8 * (i >> 1) + 2 * t;
      *reinterpret_cast<uint32_t*>(tile + Ops::swz<K>(row, col / 8) + col % 8) = f[kk][i];
    }
}

// ------------------------------------------------------------------ Di
/// Di = rowsum(dO * O) of 64 queries of one (b, h) per block (the dQ pass's
/// row order), for the dK/dV pass.
__global__ void __launch_bounds__(128) attn_bwd_di_kernel(const AttnBwdParams<bf16_t> p) {
  const DqBlock<Ops, kD, 64, kTile, 128> blk(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float lse2[2], dii[2];
  blk.row_stats(lse2, dii, blk.q0 + warp * 16, p, lane);
}

// ------------------------------------------------------------------ dK, dV
template <int NWG, int BM, int MINB, bool GQA>
__global__ void __launch_bounds__(NWG * 128, MINB) attn_bwd_dkdv_wgmma_kernel(const AttnBwdParams<bf16_t> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD, kThreads = NWG * 128, BN = 64 * NWG, NQ = BM / 8, DT = D / 8;
  static_assert(NWG == 1 && BM == kTile, "the dS store: one warpgroup per block, 64 x 64 tiles");
  extern __shared__ unsigned char smem_raw[];
  bf16_t* ks = reinterpret_cast<bf16_t*>(align_1024(smem_raw));  // [BN][D]
  bf16_t* vs = ks + BN * D;                                      // [BN][D]
  bf16_t* qs = vs + BN * D;                                      // [2][BM][D]
  bf16_t* dos = qs + 2 * BM * D;                                 // [2][BM][D]
  float* lse_s = reinterpret_cast<float*>(dos + 2 * BM * D);     // [2][BM]
  float* di_s = lse_s + 2 * BM;                                  // [2][BM]

  DkdvBlock<Ops, D, BN, BM, kThreads, GQA> blk(p);
  blk.load_first(ks, vs, qs, dos, lse_s, di_s, p);
  const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wrow = warp * 16;
  const int64_t wk0 = blk.k0 + wrow, gk0 = blk.k0 + wg * 64, T = blk.T, kt = blk.k0 / kTile;
  const bf16_t* kgroup = ks + wg * 64 * D;
  const bf16_t* vgroup = vs + wg * 64 * D;
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  for (int64_t gh = 0; gh < blk.G; ++gh)
    for (int64_t qt = blk.qt0; qt < blk.nqt; ++qt) {
      const int buf = blk.next(gh, qt, qs, dos, lse_s, di_s, p);
      fence_proxy_async();
      __syncthreads();
      const bf16_t* qb = qs + buf * BM * D;
      const bf16_t* dob = dos + buf * BM * D;
      const int64_t qq0 = qt * BM;
      // Block-uniform (one warpgroup): qt >= qt0 = kt, so some query of the tile sees some key.
      float st[NQ][4], dpt[NQ][4];
      wgmma_fence();
      wgmma_abt_d64<BM>(flat<BM>(st), kgroup, qb);
      wgmma_abt_d64<BM>(flat<BM>(dpt), vgroup, dob);
      wgmma_commit();
      wgmma_wait<0>();
      dkdv_scores_to_grads(st, dpt, lse_s + buf * BM, di_s + buf * BM, wk0, qq0, T, p.scale_log2, lane);
      uint32_t pa[BM / 16][4], da[BM / 16][4];
      acc_to_frags<BM>(pa, st);
      acc_to_frags<BM>(da, dpt);
      {
        // dS^T as the dK product reads it (da), before that product is issued
        // (no register of an in-flight wgmma is touched): four 16-byte stores,
        // evict-first, since only the dQ pass reads them (Note [dS through memory]).
        uint4* tile = ds_tile(p, blk.b * p.H + blk.hk * blk.G + gh, qt, kt);
#pragma unroll
        for (int j = 0; j < BM / 16; ++j)
          __stcs(tile + tile_frag_index(warp, j, lane), make_uint4(da[j][0], da[j][1], da[j][2], da[j][3]));
      }
      wgmma_fence();
      wgmma_ab_regs<BM>(flat<D>(dv), pa, dob);
      wgmma_ab_regs<BM>(flat<D>(dk), da, qb);
      wgmma_commit();
      wgmma_wait<0>();
      __syncthreads();
    }

  blk.store(ks, vs, wrow, wk0, dk, dv, p, lane);  // every wgmma is done
#else
  __trap();  // built for sm_90a only: never launched elsewhere (attention_wgmma_available)
#endif
}

// ------------------------------------------------------------------ dQ
/// dQ of 64 queries of one (b, h) per block: the sum over its key tiles, in
/// order, of dS K, dS from the dK/dV pass's tiles (Note [dS through memory]).
template <int BN, int MINB>
__global__ void __launch_bounds__(128, MINB) attn_bwd_dq_wgmma_kernel(const AttnBwdParams<bf16_t> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD, kThreads = 128, BM = kTile, DT = D / 8, KS = BN / 16;
  constexpr int kAhead = 2;  // dS tiles in flight ahead of the one being multiplied
  static_assert(BN == kTile, "key tiles of the dS tiles' width");
  extern __shared__ unsigned char smem_raw[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(align_1024(smem_raw));  // [BM][D]: dQ on its way out
  bf16_t* ks = qs + BM * D;                                      // [2][BN][D]
  bf16_t* dst_s = ks + 2 * BN * D;                               // [BN][BM]: a dS^T tile, transposed here

  const DqBlock<Ops, D, BM, BN, kThreads> blk(p);
  load_tile<Ops, D, BN, kThreads>(ks, blk.kg, p.sk.t, 0, blk.T);
  cp_async_commit();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wrow = warp * 16;
  // This lane's fragments of the query tile's dS tiles, read once each
  // (evict-first), kAhead + 1 tiles in registers: ring slot kt % (kAhead + 1).
  const uint4* frags = ds_tile(p, blk.bh, blk.q0 / kTile, 0) + tile_frag_index(warp, 0, lane);
  uint4 ring[kAhead + 1][KS];
  auto fetch = [&](int kt, uint4(&dst)[KS]) {
#pragma unroll
    for (int j = 0; j < KS; ++j) dst[j] = __ldcs(frags + kt * (BN * BM / 8) + j * 32);
  };
#pragma unroll
  for (int a = 0; a < kAhead; ++a)
    if (a < blk.nkt) fetch(a, ring[a]);
  float dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[dt][e] = 0.0f;

  // Unrolled by the ring's length, so that every ring index is a constant.
  for (int kt0 = 0; kt0 < blk.nkt; kt0 += kAhead + 1) {
#pragma unroll
    for (int r = 0; r <= kAhead; ++r) {
      const int kt = kt0 + r;
      if (kt >= blk.nkt) break;
      if (kt + kAhead < blk.nkt) fetch(kt + kAhead, ring[(r + kAhead) % (kAhead + 1)]);
      if (kt + 1 < blk.nkt) {
        load_tile<Ops, D, BN, kThreads>(ks + ((kt + 1) & 1) * BN * D, blk.kg, p.sk.t,
                                        static_cast<int64_t>(kt + 1) * BN, blk.T);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      // The tile holds dS^T in the dK/dV pass's A layout (warp w: keys 16 w ..):
      // each warp puts its rows into dst_s, then takes the A fragments of its
      // 16 queries' rows of dS with ldmatrix.trans.
      uint32_t da[KS][4];
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        const uint4 f = ring[r][j];
        da[j][0] = f.x, da[j][1] = f.y, da[j][2] = f.z, da[j][3] = f.w;
      }
      stage_frags<BM>(dst_s, wrow, da, lane);
      fence_proxy_async();
      __syncthreads();
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        const int key = 16 * j + (lane & 7) + ((lane >> 4) & 1) * 8;
        ldmatrix_x4_trans(da[j], smem_u32(dst_s + Ops::swz<BM>(key, 2 * warp + ((lane >> 3) & 1))));
      }
      wgmma_fence();
      wgmma_ab_regs<BN>(flat<D>(dq), da, ks + (kt & 1) * BN * D);
      wgmma_commit();
      wgmma_wait<0>();
      __syncthreads();
    }
  }

  blk.store(qs, wrow, dq, p, lane);  // every wgmma is done
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ host side
/// dK/dV pass: blocks of NWG warpgroups (64 NWG keys), query tiles of BM rows.
template <int NWG, int BM, int MINB>
void launch_dkdv(AttnBwdParams<bf16_t> p, const AttnShape& s, cudaStream_t stream) {
  constexpr int BN = 64 * NWG;
  p.tiles = ceil_div(p.T, BN);
  const size_t smem =
      static_cast<size_t>(2 * BN + 4 * BM) * kD * sizeof(bf16_t) + 4 * BM * sizeof(float) + kSwizzleAlign;
  const unsigned blocks = blocks_for(s, p.Hkv, p.tiles, "attention_backward");
  if (p.G > 1)
    launch(attn_bwd_dkdv_wgmma_kernel<NWG, BM, MINB, true>, blocks, NWG * 128, smem, stream, p);
  else
    launch(attn_bwd_dkdv_wgmma_kernel<NWG, BM, MINB, false>, blocks, NWG * 128, smem, stream, p);
}

/// Di, then (after the dK/dV pass) the dQ pass: blocks of 64 queries, key tiles of BN rows.
void launch_di(AttnBwdParams<bf16_t> p, const AttnShape& s, cudaStream_t stream) {
  p.tiles = ceil_div(p.T, kTile);
  launch(attn_bwd_di_kernel, blocks_for(s, s.H, p.tiles, "attention_backward"), 128, 0, stream, p);
}
template <int BN, int MINB>
void launch_dq(AttnBwdParams<bf16_t> p, const AttnShape& s, cudaStream_t stream) {
  p.tiles = ceil_div(p.T, kTile);
  const size_t smem = static_cast<size_t>(kTile + 2 * BN) * kD * sizeof(bf16_t) +
                      static_cast<size_t>(BN * kTile) * sizeof(bf16_t) + kSwizzleAlign;
  launch(attn_bwd_dq_wgmma_kernel<BN, MINB>, blocks_for(s, s.H, p.tiles, "attention_backward"), 128, smem,
         stream, p);
}

}  // namespace

void attention_backward_wgmma(const AttnBackward& a, float* scratch, cudaStream_t stream) {
  BT_ASSERT(a.dt == DType::BF16 && a.shape.D == kD, "attention_backward_wgmma: BF16 with D = 64 only, got ",
            dtype_name(a.dt), " D ", a.shape.D);
  AttnBwdParams<bf16_t> p = bwd_params<bf16_t>(a, scratch);
  p.ds = reinterpret_cast<uint4*>(scratch + wgmma_ds_offset_floats(a.shape));
  launch_di(p, a.shape, stream);                        // Di, which the dK/dV pass reads
  launch_dkdv<BT_ATTN_WGMMA_DKDV>(p, a.shape, stream);  // dK, dV and the dS tiles
  launch_dq<BT_ATTN_WGMMA_DQ>(p, a.shape, stream);
}

}  // namespace bt::kernels::cuda::detail
