// The causal attention forward on Hopper's warpgroup tensor cores (wgmma),
// BF16 with D = 64: the FlashAttention-2 forward of
// kernels/cuda/attention/attention_mma.cu with its two products moved from
// per-warp mma.sync to per-warpgroup wgmma (kernels/cuda/sm90a/wgmma.cuh).
// Built for sm_90a only; attention_forward_mma dispatches here on an sm_90
// device when attention_forward_uses_wgmma (kernels/attention.h).
//
// One block = NWG warpgroups = BM = 64 NWG query rows of one (b, h); warpgroup
// w owns rows 64 w .. 64 w + 63, its warp i rows 16 i .. 16 i + 15 of those.
// K/V tiles of BN keys stream through a double buffer of 128-byte-swizzled
// tiles (16-byte cp.async by every thread, as in attention_mma.cu, whose
// swizzle for D = 64 is wgmma's). Per key tile and warpgroup:
//   S = Q K^T    4 wgmma m64nBNk16, A = the group's 64 Q rows, B = K, both
//                from shared memory (K-major);
//   mask and online softmax per warp on S, which the accumulator layout
//   leaves exactly as the mma.sync kernel has it (flash_common.cuh);
//   O += P V     BN / 16 wgmma m64n64k16, A = P from registers (the
//                accumulators converted to bf16, as attention_mma.cu does),
//                B = V from shared memory, N-major.
// Each wgmma batch is committed and waited for before its accumulators are
// read; the other warpgroup's work and the next tile's copies overlap it.
// Shared memory written by cp.async is made visible to wgmma's (async) proxy
// by fence.proxy.async before the barrier. The epilogue is the mma.sync
// kernel's: O / l staged through the Q tile, 16-byte stores, lse.
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/flash_common.cuh"
#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sm90a/wgmma.cuh"

// Configuration: warpgroups per block, keys per tile, blocks per SM.
#ifndef BT_ATTN_WGMMA_FWD
#define BT_ATTN_WGMMA_FWD 2, 64, 2
#endif

namespace bt::kernels::cuda::detail {
namespace {

constexpr int kD = 64;

template <int NWG, int BN, int MINB>
__global__ void __launch_bounds__(NWG * 128, MINB) attn_fwd_wgmma_kernel(const AttnFwdParams<bf16_t> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Ops = Bf16Ops;
  constexpr int D = kD, kThreads = NWG * 128, BM = 64 * NWG, NTL = BN / 8, DT = D / 8;
  extern __shared__ unsigned char smem_raw[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(align_1024(smem_raw));  // [BM][D]
  bf16_t* ks = qs + BM * D;                                      // [2][BN][D]
  bf16_t* vs = ks + 2 * BN * D;                                  // [2][BN][D]

  const FwdBlock<bf16_t, BM, BN> blk(p);
  const int64_t bh = blk.bh, b = blk.b, h = blk.h, T = blk.T, q0 = blk.q0;
  const int nkt = blk.nkt;
  const bf16_t *kg = blk.kg, *vg = blk.vg;
  const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  blk.template load_first<Ops, D, kThreads>(qs, ks, vs, p);

  const int wrow = warp * 16;  // this warp's first row in the block
  const int64_t wq0 = q0 + wrow, gq0 = q0 + wg * 64, gq_last = gq0 + 63;
  const bf16_t* qgroup = qs + wg * 64 * D;
  float o[DT][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  zero(o);

  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    next_kv_tile<Ops, D, BN, kThreads>(ks, vs, kg, vg, p.sk.t, p.sv.t, kt, nkt, T);
    fence_proxy_async();
    __syncthreads();
    const bf16_t* kb = ks + (kt & 1) * BN * D;
    const bf16_t* vb = vs + (kt & 1) * BN * D;
    if (k0 <= gq_last && gq0 < T) {  // warpgroup-uniform: some key of the tile is visible to the group
      float s[NTL][4];
      wgmma_fence();
      wgmma_abt_d64<BN>(flat<BN>(s), qgroup, kb);
      wgmma_commit();
      wgmma_wait<0>();
      if (k0 + BN - 1 > wq0 || k0 + BN > T) mask_scores(s, wq0, k0, T, lane);
      softmax_update(s, m, l, o, p.scale_log2);
      uint32_t pa[BN / 16][4];
      acc_to_frags<BN>(pa, s);
      wgmma_fence();
      wgmma_ab_regs<BN>(flat<D>(o), pa, vb);
      wgmma_commit();
      wgmma_wait<0>();
    }
    __syncthreads();
  }

  // Epilogue: O / l through this warp's rows of the Q tile (every wgmma that read it is done).
  finish_rows(o, m, l, p.lse ? p.lse + bh * T : nullptr, wq0, T, lane);
  stage_acc<Ops, D>(qs, wrow, o, 1.0f, lane);
  __syncwarp();
  store_rows<Ops, D, 16>(qs, wrow, p.o + b * p.so.b + h * p.so.h, p.so.t, wq0, T, lane);
#else
  __trap();  // built for sm_90a only: never launched elsewhere (attention_wgmma_available)
#endif
}

template <int NWG, int BN, int MINB>
void launch_fwd_wgmma(const AttnForward& a, cudaStream_t stream) {
  constexpr int BM = 64 * NWG;
  AttnFwdParams<bf16_t> p = fwd_params<bf16_t>(a);
  p.tiles = ceil_div(p.T, BM);
  const size_t smem = static_cast<size_t>(BM + 4 * BN) * kD * sizeof(bf16_t) + kSwizzleAlign;
  launch(attn_fwd_wgmma_kernel<NWG, BN, MINB>, blocks_for(a.shape, a.shape.H, p.tiles, "attention_forward"),
         NWG * 128, smem, stream, p);
}

}  // namespace

void attention_forward_wgmma(const AttnForward& a, cudaStream_t stream) {
  BT_ASSERT(a.dt == DType::BF16 && a.shape.D == kD, "attention_forward_wgmma: BF16 with D = 64 only, got ",
            dtype_name(a.dt), " D ", a.shape.D);
  launch_fwd_wgmma<BT_ATTN_WGMMA_FWD>(a, stream);
}

}  // namespace bt::kernels::cuda::detail
