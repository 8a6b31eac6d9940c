// The causal attention forward on Hopper, BF16 with D = 64: the
// FlashAttention-2 forward of kernels/cuda/attention/attention_mma.cu with its
// two products on the warpgroup tensor cores (wgmma, kernels/cuda/sm90a/
// wgmma.cuh) and its tiles brought by the copy engine (TMA,
// kernels/cuda/sm90a/tma.cuh) under warp specialization. Built for sm_90a
// only; attention_forward_mma dispatches here on an sm_90 device when
// attention_forward_uses_wgmma (kernels/attention.h).
//
// One block = kConsumers warpgroups of 64 query rows of one (b, h) (BM rows),
// plus one producer warp. Warpgroup w owns rows 64 w .. 64 w + 63, its warp i
// rows 16 i .. 16 i + 15 of those. The producer's lane 0 copies the Q tile and
// then each K tile of BN keys into a ring of kStages slots, its lane 1 each V
// tile into another ring; a slot's "full" barrier completes when its bytes
// have landed, its "empty" barrier when every consumer warp has released it
// (Note [Producer and consumers of the forward's rings]). Per key tile and
// warpgroup:
//   S = Q K^T    4 wgmma m64nBNk16, A = the group's 64 Q rows, B = K, both
//                from shared memory (K-major); K's slot is released;
//   mask and online softmax per warp on S, which the accumulator layout
//   leaves exactly as the mma.sync kernel has it (flash_common.cuh);
//   O += P V     BN / 16 wgmma m64n64k16, A = P from registers (the
//                accumulators converted to bf16), B = V from shared memory,
//                N-major; V's slot is released.
// Each wgmma batch is committed and waited for before its accumulators are
// read: the other three warpgroups of the SM (two blocks a multiprocessor)
// overlap it. The epilogue is the mma.sync kernel's: O / l staged through
// the group's Q rows, 16-byte stores, lse.
//
// Note [Producer and consumers of the forward's rings]
// Slot s of a ring holds tiles s, s + kStages, ...; round r = kt / kStages.
// The producer waits for round r - 1's release (parity (r & 1) ^ 1 of the
// empty barrier; round 0 passes at once), announces the tile's bytes on the
// full barrier and starts the copy; a consumer warp waits for parity r & 1 of
// the full barrier, and releases the slot (one arrival per warp, after its
// own wait for the wgmma that read the slot: the four warps' arrivals together
// say the warpgroup's product is done) on the empty barrier, which expects
// 4 kConsumers arrivals. A warpgroup whose rows end before the block's last
// key tile still releases every tile the producer loads, each after waiting
// for it to be full: an early release could otherwise count toward the
// round before (its arrival would complete a phase the slower warpgroups had
// not released). K and V have rings and producers of their own, so that the
// next K tile's copy never waits for the slower release of a V slot.
//
// Measured against other layouts of the same kernel (bench/RESULTS.md issue
// 18 step 23): three or four consumer warpgroups in one block a
// multiprocessor, key tiles of 128, three or four stages, and FlashAttention-3's
// overlap of a tile's softmax with the previous tile's P V (two score tiles
// in registers) were all slower.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/flash_common.cuh"
#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sm90a/tma.cuh"
#include "kernels/cuda/sm90a/tma_map.h"
#include "kernels/cuda/sm90a/wgmma.cuh"

namespace bt::kernels::cuda::detail {
namespace {

constexpr int kD = 64;
constexpr int kConsumers = 2, BM = 64 * kConsumers, BN = 64, kStages = 2, kBlocksPerSm = 2;
constexpr int kThreads = kConsumers * 128 + 32;  // the consumer warpgroups, then the producer warp
constexpr int kTileBytes = BN * kD * 2;
constexpr size_t kSmem = static_cast<size_t>(BM + 2 * kStages * BN) * kD * sizeof(bf16_t) +
                         (1 + 4 * kStages) * sizeof(uint64_t) + kSwizzleAlign;

struct FwdWgmmaParams {
  CUtensorMap tq, tk, tv;  // boxes of 64 rows (Q) and BN rows (K, V): tma_map_bf16_rows64
  AttnFwdParams<bf16_t> a;
};

__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    attn_fwd_wgmma_kernel(const __grid_constant__ FwdWgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD, S = kStages, NTL = BN / 8, DT = D / 8;
  extern __shared__ unsigned char smem_raw[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(align_1024(smem_raw));  // [BM][D]
  bf16_t* ks = qs + BM * D;                                      // [S][BN][D]
  bf16_t* vs = ks + S * BN * D;                                  // [S][BN][D]
  uint64_t* q_full = reinterpret_cast<uint64_t*>(vs + S * BN * D);
  uint64_t *k_full = q_full + 1, *k_empty = k_full + S, *v_full = k_empty + S, *v_empty = v_full + S;

  const FwdBlock<bf16_t, BM, BN> blk(p.a);
  const int64_t T = blk.T, q0 = blk.q0;
  const int nkt = blk.nkt;
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(k_empty + s, 4 * kConsumers);  // a release per consumer warp
      mbar_init(v_empty + s, 4 * kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x >= kConsumers * 128) {  // the producer warp: lane 0 copies Q and K, lane 1 V
    const int lane = threadIdx.x & 31;
    if (lane < 2) {
      const int b = static_cast<int>(blk.b), h = static_cast<int>(blk.h);
      const int hk = static_cast<int>(blk.h / p.a.G);
      const CUtensorMap* map = lane == 0 ? &p.tk : &p.tv;
      bf16_t* ring = lane == 0 ? ks : vs;
      uint64_t* full = lane == 0 ? k_full : v_full;
      uint64_t* empty = lane == 0 ? k_empty : v_empty;
      tma_prefetch_map(map);
      if (lane == 0) {
        mbar_expect_tx(q_full, BM * D * 2);
        for (int w = 0; w < kConsumers; ++w)
          tma_load_4d(qs + w * 64 * D, &p.tq, q_full, 0, static_cast<int>(q0) + 64 * w, h, b);
      }
      for (int kt = 0; kt < nkt; ++kt) {
        const int s = kt % S;
        mbar_wait(empty + s, ((kt / S) & 1) ^ 1);
        mbar_expect_tx(full + s, kTileBytes);
        tma_load_4d(ring + s * BN * D, map, full + s, 0, kt * BN, hk, b);
      }
    }
    return;
  }

  const int cw = threadIdx.x >> 7, wl = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int64_t gq0 = q0 + 64 * cw, wq0 = gq0 + 16 * wl;
  // The key tiles this warpgroup's rows see; the producer loads the block's nkt.
  const int n = gq0 < T ? static_cast<int>(((gq0 + 64 < T ? gq0 + 64 : T) + BN - 1) / BN) : 0;
  const bf16_t* qgroup = qs + cw * 64 * D;
  const auto release = [&](uint64_t* bar) {
    if (lane == 0) mbar_arrive(bar);
  };
  float o[DT][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t pa[BN / 16][4];
  zero(o);
  mbar_wait(q_full, 0);
  for (int kt = 0; kt < n; ++kt) {
    const int sk = kt % S;
    float s[NTL][4];
    mbar_wait(k_full + sk, (kt / S) & 1);
    wgmma_fence();
    wgmma_abt_d64<BN>(flat<BN>(s), qgroup, ks + sk * BN * D);
    wgmma_commit();
    wgmma_wait<0>();
    pin_regs(s);
    release(k_empty + sk);
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    if (k0 + BN - 1 > wq0 || k0 + BN > T) mask_scores(s, wq0, k0, T, lane);
    softmax_update(s, m, l, o, p.a.scale_log2);
    acc_to_frags<BN>(pa, s);
    mbar_wait(v_full + sk, (kt / S) & 1);
    pin_regs(o);  // the rescale and P's conversion stay before the fence
    pin_regs(pa);
    wgmma_fence();
    wgmma_ab_regs<BN>(flat<D>(o), pa, vs + sk * BN * D);
    wgmma_commit();
    wgmma_wait<0>();
    pin_regs(o);
    release(v_empty + sk);
  }
  // Tiles past this warpgroup's last key: released as they arrive, so that
  // every phase of the rings counts all the consumer warps.
  for (int kt = n; kt < nkt; ++kt) {
    mbar_wait(k_full + kt % S, (kt / S) & 1);
    release(k_empty + kt % S);
    mbar_wait(v_full + kt % S, (kt / S) & 1);
    release(v_empty + kt % S);
  }

  // Epilogue: O / l through this warp's rows of its Q tile (the products that read it are done).
  const int wrow = cw * 64 + wl * 16;
  finish_rows(o, m, l, p.a.lse ? p.a.lse + blk.bh * T : nullptr, wq0, T, lane);
  stage_acc<Bf16Ops, D>(qs, wrow, o, 1.0f, lane);
  __syncwarp();
  store_rows<Bf16Ops, D, 16>(qs, wrow, p.a.o + blk.b * p.a.so.b + blk.h * p.a.so.h, p.a.so.t, wq0, T, lane);
#else
  __trap();  // built for sm_90a only: never launched elsewhere (attention_wgmma_available)
#endif
}

}  // namespace

void attention_forward_wgmma(const AttnForward& a, cudaStream_t stream) {
  const AttnShape& s = a.shape;
  BT_ASSERT(a.dt == DType::BF16 && s.D == kD, "attention_forward_wgmma: BF16 with D = 64 only, got ",
            dtype_name(a.dt), " D ", s.D);
  BT_ASSERT(s.T < (int64_t{1} << 30), "attention_forward_wgmma: T = ", s.T,
            " is past the copy engine's row coordinates (attention_forward_uses_wgmma)");
  FwdWgmmaParams p;
  p.a = fwd_params<bf16_t>(a);
  p.a.tiles = ceil_div(p.a.T, BM);
  p.tq = tma_map_bf16_rows64(a.q, s.B, s.H, s.T, a.sq, 64);
  p.tk = tma_map_bf16_rows64(a.k, s.B, s.kv_heads(), s.T, a.sk, BN);
  p.tv = tma_map_bf16_rows64(a.v, s.B, s.kv_heads(), s.T, a.sv, BN);
  launch(attn_fwd_wgmma_kernel, blocks_for(s, s.H, p.a.tiles, "attention_forward"), kThreads, kSmem, stream,
         p);
}

}  // namespace bt::kernels::cuda::detail
