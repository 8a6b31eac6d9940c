// The causal attention backward on Hopper's warpgroup tensor cores (wgmma),
// BF16 with D = 64: the two passes of kernels/cuda/attention/attention_mma.cu
// (the dQ pass, which also writes Di, then the dK/dV pass; deterministic, no
// atomics) with their tile products moved from per-warp mma.sync to
// per-warpgroup wgmma (kernels/cuda/sm90a/wgmma.cuh). Built for sm_90a only;
// attention_backward_mma dispatches here on an sm_90 device when
// attention_backward_uses_wgmma (kernels/attention.h).
//
// A warpgroup owns 64 rows (queries in the dQ pass, keys in the dK/dV pass);
// its warp i owns rows 16 i .. 16 i + 15 of those, which is where the mma.sync
// kernels' warps kept theirs, so everything between the products -- P from
// the scores and lse, dS = P (dP - Di), the causal mask -- is those kernels'
// per-warp code on the same accumulator layout. The products:
//   dQ pass   S = Q K^T, dP = dO V^T   A = the group's Q / dO rows, B = the
//                                      K / V tile (shared memory, K-major)
//             dQ += dS K               A = dS from registers, B = the K tile
//                                      (N-major)
//   dK/dV     S^T = K Q^T, dP^T = V dO^T   A = the group's K / V rows, B =
//                                          the Q / dO tile (K-major)
//             dV += P^T dO, dK += dS^T Q   A = P^T / dS^T from registers,
//                                          B = the dO / Q tile (N-major)
// Every tile is 128-byte swizzled (load_tile's swizzle at D = 64 is wgmma's)
// and starts on a 1024-byte boundary. Tiles copied by cp.async are made
// visible to wgmma's async proxy by fence.proxy.async before the barrier.
// Each batch of wgmmas is committed and waited for before its accumulators
// are read.
#include <cstdint>

#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/flash_backward.cuh"
#include "kernels/cuda/attention/flash_common.cuh"
#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sm90a/wgmma.cuh"

// Configurations: <warpgroups per block, key tile, blocks per SM> (dQ) and
// <warpgroups per block, query tile, blocks per SM> (dK/dV). Timed on an H100
// at B 16, H 12, T 1024 (bench/RESULTS.md, issue 18 step 10): one warpgroup
// and three blocks per SM won both passes (190 TFLOP/s for the backward);
// two blocks per SM in either pass gave 172-186, two warpgroups sharing the
// tiles (one block per SM) 149-167, key tiles of 128 in the dQ pass 154-173.
// Issuing dV's product before computing dS^T (overlapping them) cost the
// dK/dV pass its registers at three blocks per SM: ptxas serialized the
// wgmmas, 181. A tuning run may override these with -D.
#ifndef BT_ATTN_WGMMA_DQ
#define BT_ATTN_WGMMA_DQ 1, 64, 3
#endif
#ifndef BT_ATTN_WGMMA_DKDV
#define BT_ATTN_WGMMA_DKDV 1, 64, 3
#endif

namespace bt::kernels::cuda::detail {
namespace {

using Ops = Bf16Ops;
constexpr int kD = 64;

/// Both passes' first products over D = 64, issued together and waited for:
/// s = A_s B_s^T and dp = A_p B_p^T, A a warpgroup's 64 rows, B a tile of N
/// rows (S or S^T, dP or dP^T).
template <int N>
__device__ __forceinline__ void scores_and_dp(float (&s)[N / 8][4], const bf16_t* as, const bf16_t* bs,
                                              float (&dp)[N / 8][4], const bf16_t* ap, const bf16_t* bp) {
  wgmma_fence();
  wgmma_abt_d64<N>(flat<N>(s), as, bs);
  wgmma_abt_d64<N>(flat<N>(dp), ap, bp);
  wgmma_commit();
  wgmma_wait<0>();
}

// ------------------------------------------------------------------ dK, dV
template <int NWG, int BM, int MINB, bool GQA>
__global__ void __launch_bounds__(NWG * 128, MINB) attn_bwd_dkdv_wgmma_kernel(const AttnBwdParams<bf16_t> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD, kThreads = NWG * 128, BN = 64 * NWG, NQ = BM / 8, DT = D / 8;
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
  const int64_t wk0 = blk.k0 + wrow, gk0 = blk.k0 + wg * 64, T = blk.T;
  const bf16_t* kgroup = ks + wg * 64 * D;
  const bf16_t* vgroup = vs + wg * 64 * D;
  float dk[DT][4], dv[DT][4];
  zero(dk);
  zero(dv);

  for (int64_t gh = 0; gh < blk.G; ++gh)
    for (int64_t qt = blk.qt0; qt < blk.nqt; ++qt) {
      const int buf = blk.next(gh, qt, qs, dos, lse_s, di_s, p);
      fence_proxy_async();
      __syncthreads();
      const bf16_t* qb = qs + buf * BM * D;
      const bf16_t* dob = dos + buf * BM * D;
      const int64_t qq0 = qt * BM;
      if (qq0 + BM - 1 >= gk0 && gk0 < T) {  // warpgroup-uniform: some query of the tile sees some key
        float st[NQ][4], dpt[NQ][4];
        scores_and_dp<BM>(st, kgroup, qb, dpt, vgroup, dob);
        dkdv_scores_to_grads<NQ, true>(st, dpt, lse_s + buf * BM, di_s + buf * BM, wk0, qq0, T, p.scale_log2,
                                       lane);
        uint32_t pa[BM / 16][4], da[BM / 16][4];
        acc_to_frags<BM>(pa, st);
        acc_to_frags<BM>(da, dpt);
        wgmma_fence();
        wgmma_ab_regs<BM>(flat<D>(dv), pa, dob);
        wgmma_ab_regs<BM>(flat<D>(dk), da, qb);
        wgmma_commit();
        wgmma_wait<0>();
      }
      __syncthreads();
    }

  blk.store(ks, vs, wrow, wk0, dk, dv, p, lane);  // every wgmma is done
#else
  __trap();  // built for sm_90a only: never launched elsewhere (attention_wgmma_available)
#endif
}

// ------------------------------------------------------------------ dQ
template <int NWG, int BN, int MINB>
__global__ void __launch_bounds__(NWG * 128, MINB) attn_bwd_dq_wgmma_kernel(const AttnBwdParams<bf16_t> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD, kThreads = NWG * 128, BM = 64 * NWG, NTL = BN / 8, DT = D / 8;
  extern __shared__ unsigned char smem_raw[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(align_1024(smem_raw));  // [BM][D]
  bf16_t* dos = qs + BM * D;                                     // [BM][D]
  bf16_t* ks = dos + BM * D;                                     // [2][BN][D]
  bf16_t* vs = ks + 2 * BN * D;                                  // [2][BN][D]

  const DqBlock<Ops, D, BM, BN, kThreads> blk(p);
  blk.load_first(qs, dos, ks, vs, p);
  const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wrow = warp * 16;
  const int64_t wq0 = blk.q0 + wrow, gq0 = blk.q0 + wg * 64, T = blk.T;
  float lse2[2], dii[2];
  blk.row_stats(lse2, dii, wq0, p, lane);
  const bf16_t* qgroup = qs + wg * 64 * D;
  const bf16_t* dogroup = dos + wg * 64 * D;
  float dq[DT][4];
  zero(dq);

  for (int kt = 0; kt < blk.nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    next_kv_tile<Ops, D, BN, kThreads>(ks, vs, blk.kg, blk.vg, p.sk.t, p.sv.t, kt, blk.nkt, T);
    fence_proxy_async();
    __syncthreads();
    const bf16_t* kb = ks + (kt & 1) * BN * D;
    const bf16_t* vb = vs + (kt & 1) * BN * D;
    if (k0 <= gq0 + 63 && gq0 < T) {  // warpgroup-uniform: some key of the tile is visible to the group
      float s[NTL][4], dp[NTL][4];
      scores_and_dp<BN>(s, qgroup, kb, dp, dogroup, vb);
      dq_scores_to_grads<NTL, true>(s, dp, lse2, dii, wq0, k0, T, p.scale_log2, lane);  // s becomes dS
      uint32_t da[BN / 16][4];
      acc_to_frags<BN>(da, s);
      wgmma_fence();
      wgmma_ab_regs<BN>(flat<D>(dq), da, kb);
      wgmma_commit();
      wgmma_wait<0>();
    }
    __syncthreads();
  }

  blk.store(qs, wrow, dq, p, lane);  // every wgmma is done
#else
  __trap();
#endif
}

// ------------------------------------------------------------------ host side
/// dQ pass: blocks of NWG warpgroups (64 NWG queries), key tiles of BN rows.
template <int NWG, int BN, int MINB>
void launch_dq(AttnBwdParams<bf16_t> p, const AttnShape& s, cudaStream_t stream) {
  constexpr int BM = 64 * NWG;
  p.tiles = ceil_div(p.T, BM);
  const size_t smem = static_cast<size_t>(2 * BM + 4 * BN) * kD * sizeof(bf16_t) + kSwizzleAlign;
  launch(attn_bwd_dq_wgmma_kernel<NWG, BN, MINB>, blocks_for(s, s.H, p.tiles, "attention_backward"),
         NWG * 128, smem, stream, p);
}

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

}  // namespace

void attention_backward_wgmma(const AttnBackward& a, float* di, cudaStream_t stream) {
  BT_ASSERT(a.dt == DType::BF16 && a.shape.D == kD, "attention_backward_wgmma: BF16 with D = 64 only, got ",
            dtype_name(a.dt), " D ", a.shape.D);
  const AttnBwdParams<bf16_t> p = bwd_params<bf16_t>(a, di);
  launch_dq<BT_ATTN_WGMMA_DQ>(p, a.shape, stream);  // first: it writes Di, which the dK/dV pass reads
  launch_dkdv<BT_ATTN_WGMMA_DKDV>(p, a.shape, stream);
}

}  // namespace bt::kernels::cuda::detail
