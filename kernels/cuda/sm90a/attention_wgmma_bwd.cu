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
// are read. Given more scratch, the backward runs in one pass instead (Note
// [dQ in the dK/dV pass, summed in key order]).
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
// Blocks per SM of the one-pass backward (one warpgroup and the dQ writer warp, 64 x 64 tiles).
#ifndef BT_ATTN_WGMMA_ONEPASS_MINB
#define BT_ATTN_WGMMA_ONEPASS_MINB 2
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
        dkdv_scores_to_grads(st, dpt, lse_s + buf * BM, di_s + buf * BM, wk0, qq0, T, p.scale_log2, lane);
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
      dq_scores_to_grads(s, dp, lse2, dii, wq0, k0, T, p.scale_log2, lane);  // s becomes dS
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

// ------------------------------------------------------------------ one pass
// Note [dQ in the dK/dV pass, summed in key order]
// The two passes above each build S and dP: seven tile products where five
// do. Given the scratch (onepass_scratch), the backward instead runs Di in
// its own pass, then one dK/dV pass that also makes each tile's dQ part,
// dS K, from the dS^T it just built (staged in shared memory for the
// product). The parts of query tile i come from key tiles i, i - 1, .., 0,
// and the sum must come out the same every run, so they are added in that
// order through an f32 sum in the scratch. Block j (key tile j) walks its
// query tiles up from its diagonal; its compute warpgroup hands each part
// to a fifth warp through a double buffer in shared memory. That writer
// waits until tile i's turn counter says i - j parts are in, adds the part
// with one bulk reduction (block i stores its part: the sum needs no
// zeroing), waits for it and passes the turn on; block 0's writer reads the
// sum back and writes dQ.
//   Blocks are numbered from the last key tile down, and a block waits only
// on the block of the next key tile, which has a lower number and so was
// started before it (the GPU hands out blocks in order, as
// FlashAttention-3's deterministic backward also assumes): it is running or
// done. A wait of seconds would mean that broke; the block traps, an error,
// not a hang.
//   The bits: dK and dV are the two-pass kernel's (the same products, the
// same order); dQ is ((part_i + part_(i-1)) + ...) + part_0 in f32, where
// the dQ pass summed the key tiles in one accumulator. Grouped queries keep
// the two passes.
//   Measured on an H200 (bench/RESULTS.md, issue 18 step 16): 106-108
// TFLOP/s against the two passes' 190. Without the reductions (the turns
// still passed) it ran at 179, without the turns too at 175: the compute
// alone, at two blocks of five warps an SM and 168 registers with spills,
// is already slower than the two passes, and each tile's bulk reduction,
// waited for before the turn passes, serializes the writers.

/// Spins until *s == want (acquire, GPU scope); traps after seconds.
__device__ __forceinline__ void wait_turn(const int* s, int want) {
  for (uint32_t spins = 0;; ++spins) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(s) : "memory");
    if (v == want) return;
    if (spins > (1u << 26)) __trap();
    __nanosleep(64);
  }
}
__device__ __forceinline__ void pass_turn(int* s, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(s), "r"(v) : "memory");
}

/// Di = rowsum(dO * O) for every query row, a quad of lanes a row: the dQ
/// pass's row_stats arithmetic, so the same bits.
__global__ void __launch_bounds__(256) attn_bwd_di_wgmma_kernel(const AttnBwdParams<bf16_t> p) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 4;
  const int tq = threadIdx.x & 3;
  const bool ok = row < p.B * p.H * p.T;
  float acc = 0.0f;
  if (ok) {
    const int64_t bh = row / p.T, t = row % p.T, b = bh / p.H, h = bh % p.H;
    const bf16_t* o = p.o + b * p.so.b + h * p.so.h + t * p.so.t;
    const bf16_t* d = p.dout + b * p.sdo.b + h * p.sdo.h + t * p.sdo.t;
#pragma unroll
    for (int c = tq; c < kD / Ops::kChunk; c += 4)
      acc = Ops::dot_chunk(acc, o + c * Ops::kChunk, d + c * Ops::kChunk);
  }
  acc = quad_sum(acc);  // every lane takes part
  if (ok && tq == 0) p.di[row] = acc;
}

/// Named barriers of the one-pass kernel (0 is __syncthreads'): the
/// compute warpgroup alone, and for each dQ part buffer "full" (compute ->
/// writer) and "empty" (writer -> compute).
constexpr int kBarCompute = 1, kBarFull = 2, kBarEmpty = 4, kOnePassThreads = 160;
__device__ __forceinline__ void named_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/// The dQ writer: warp 4 of a one-pass block. For each query tile qt = j ..
/// last it takes the compute warps' f32 part from part[(qt - j) & 1], waits
/// for the tile's turn and adds the part to the sum with one bulk reduction
/// (block qt stores it; block 0 writes dQ = scale (sum + part) instead), then
/// passes the turn on.
__device__ __forceinline__ void onepass_dq_writer(const AttnBwdParams<bf16_t>& p, float* dq_sum, int* turn,
                                                  const float* part, int64_t bh, int64_t j, int lane) {
  constexpr int BM = 64, D = kD, kTile = BM * D;
  const int64_t last = p.tiles - 1, steps = last - j + 1, T = p.T, b = bh / p.H, h = bh % p.H;
  for (int i = 0; i < 2 && i < steps; ++i) named_arrive(kBarEmpty + i, kOnePassThreads);
  for (int64_t s = 0; s < steps; ++s) {
    const int buf = static_cast<int>(s & 1);
    const int64_t qt = j + s;
    const int pos = static_cast<int>(s);
    const float* src = part + buf * kTile;
    int* tturn = turn + bh * p.tiles + qt;
    float* sum = dq_sum + (bh * p.tiles + qt) * kTile;
    named_sync(kBarFull + buf, kOnePassThreads);  // the part is in
    if (lane == 0 && pos > 0) wait_turn(tturn, pos);
    __syncwarp();
    if (j == 0) {  // the last part: dQ = scale (sum + part), bf16
      asm volatile("fence.proxy.async.global;\n" ::: "memory");
      bf16_t* dq = p.dq + b * p.sdq.b + h * p.sdq.h;
      for (int i = lane; i < kTile / 4; i += 32) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        float4 v = *reinterpret_cast<const float4*>(src + r * D + c);
        if (pos > 0) {
          const float4 t = __ldcg(reinterpret_cast<const float4*>(sum + r * D + c));
          v = make_float4(t.x + v.x, t.y + v.y, t.z + v.z, t.w + v.w);
        }
        const int64_t row = qt * BM + r;
        if (row < T) {
          uint2 o;
          o.x = pack_bf16(v.x * p.scale, v.y * p.scale);
          o.y = pack_bf16(v.z * p.scale, v.w * p.scale);
          *reinterpret_cast<uint2*>(dq + row * p.sdq.t + c) = o;
        }
      }
    } else if (lane == 0) {
      asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the acquire before the bulk copy
      if (pos == 0)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(sum),
                     "r"(smem_u32(src)), "r"(kTile * 4)
                     : "memory");
      else
        asm volatile(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(sum),
            "r"(smem_u32(src)), "r"(kTile * 4)
            : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
      asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the sum's writes before the release
      pass_turn(tturn, pos + 1);
    }
    __syncwarp();
    if (s + 2 < steps) named_arrive(kBarEmpty + buf, kOnePassThreads);  // the buffer is free again
  }
}

/// The dK/dV pass with dQ (Note [dQ in the dK/dV pass, summed in key order]):
/// a warpgroup's 64 keys of one (b, h), query tiles of 64 from the diagonal
/// up, and a fifth warp that adds each tile's dQ part to its sum.
/// dq_sum: [B H][tiles][64][64] f32; turn: [B H][tiles], zero at the launch.
template <int MINB>
__global__ void __launch_bounds__(kOnePassThreads, MINB)
    attn_bwd_onepass_wgmma_kernel(const AttnBwdParams<bf16_t> p, float* dq_sum, int* turn) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = kD, BM = 64, BN = 64, NQ = BM / 8, DT = D / 8, kThreads = 128;
  extern __shared__ unsigned char smem_raw[];
  bf16_t* ks = reinterpret_cast<bf16_t*>(align_1024(smem_raw));  // [BN][D]
  bf16_t* vs = ks + BN * D;                                      // [BN][D]
  bf16_t* qs = vs + BN * D;                                      // [2][BM][D]
  bf16_t* dos = qs + 2 * BM * D;                                 // [2][BM][D]
  bf16_t* dst = dos + 2 * BM * D;                                // [BN][BM] dS^T
  float* lse_s = reinterpret_cast<float*>(dst + BN * BM);        // [2][BM]
  float* di_s = lse_s + 2 * BM;                                  // [2][BM]
  float* part = di_s + 2 * BM;                                   // [2][BM][D] f32: dQ parts, row-major

  const int64_t bh_count = p.B * p.H, bid = blockIdx.x, last = p.tiles - 1;
  const int64_t bh = bid % bh_count, j = last - bid / bh_count;  // key tile j: higher tiles start first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  if (warp == 4) {
    onepass_dq_writer(p, dq_sum, turn, part, bh, j, lane);
    return;
  }
  const int64_t b = bh / p.H, h = bh % p.H, T = p.T, k0 = j * BN;
  const bf16_t* qg = p.q + b * p.sq.b + h * p.sq.h;
  const bf16_t* dog = p.dout + b * p.sdo.b + h * p.sdo.h;
  const float* lse_g = p.lse + bh * T;
  const float* di_g = p.di + bh * T;
  const auto load_q = [&](int buf, int64_t qt) {
    load_tile<Ops, D, BM, kThreads>(qs + buf * BM * D, qg, p.sq.t, qt * BM, T);
    load_tile<Ops, D, BM, kThreads>(dos + buf * BM * D, dog, p.sdo.t, qt * BM, T);
    load_vec<BM, kThreads>(lse_s + buf * BM, lse_g, qt * BM, T);
    load_vec<BM, kThreads>(di_s + buf * BM, di_g, qt * BM, T);
  };
  load_tile<Ops, D, BN, kThreads>(ks, p.k + b * p.sk.b + h * p.sk.h, p.sk.t, k0, T);
  load_tile<Ops, D, BN, kThreads>(vs, p.v + b * p.sv.b + h * p.sv.h, p.sv.t, k0, T);
  load_q(0, j);
  cp_async_commit();

  const int wrow = warp * 16;
  const int64_t wk0 = k0 + wrow;
  float dk[DT][4], dv[DT][4];
  zero(dk);
  zero(dv);

  for (int64_t qt = j; qt <= last; ++qt) {
    const int buf = static_cast<int>((qt - j) & 1);
    if (qt < last) {
      load_q(buf ^ 1, qt + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();
    named_sync(kBarCompute, kThreads);
    const bf16_t* qb = qs + buf * BM * D;
    const bf16_t* dob = dos + buf * BM * D;
    const int64_t qq0 = qt * BM;
    float st[NQ][4], dpt[NQ][4];
    scores_and_dp<BM>(st, ks, qb, dpt, vs, dob);
    dkdv_scores_to_grads(st, dpt, lse_s + buf * BM, di_s + buf * BM, wk0, qq0, T, p.scale_log2, lane);
    uint32_t pa[BM / 16][4], da[BM / 16][4];
    acc_to_frags<BM>(pa, st);
    acc_to_frags<BM>(da, dpt);
    wgmma_fence();
    wgmma_ab_regs<BM>(flat<D>(dv), pa, dob);
    wgmma_ab_regs<BM>(flat<D>(dk), da, qb);
    wgmma_commit();
    stage_acc<Ops, BM>(dst, wrow, dpt, 1.0f, lane);  // dS^T: this warp's 16 keys, as in da
    fence_proxy_async();
    named_sync(kBarCompute, kThreads);  // every warp's rows of dS^T are in place
    wgmma_wait<0>();
    // pa and da were read by the wgmmas in flight until now: their registers
    // stay theirs until here.
    wgmma_keep(pa);
    wgmma_keep(da);
    float dq[DT][4];
    wgmma_fence();
    wgmma_atb_d64(flat<D>(dq), dst, ks);  // dQ part = dS K
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(dq);
    // Hand the part to the writer warp.
    float* out = part + buf * BM * D;
    named_sync(kBarEmpty + buf, kOnePassThreads);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        *reinterpret_cast<float2*>(out + (wrow + g + 8 * hf) * D + dt * 8 + 2 * tq) =
            make_float2(dq[dt][2 * hf], dq[dt][2 * hf + 1]);
    fence_proxy_async();  // for the bulk copy
    named_arrive(kBarFull + buf, kOnePassThreads);
    named_sync(kBarCompute, kThreads);  // every warp is done with dS^T and this step's tiles
  }

  // The epilogue of the dK/dV pass: stage through the K and V tiles.
  stage_acc<Ops, D>(ks, wrow, dk, p.scale, lane);
  stage_acc<Ops, D>(vs, wrow, dv, 1.0f, lane);
  __syncwarp();
  store_rows<Ops, D, 16>(ks, wrow, p.dk + b * p.sdk.b + h * p.sdk.h, p.sdk.t, wk0, T, lane);
  store_rows<Ops, D, 16>(vs, wrow, p.dv + b * p.sdv.b + h * p.sdv.h, p.sdv.t, wk0, T, lane);
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

void attention_backward_wgmma(const AttnBackward& a, float* scratch, size_t scratch_floats,
                              cudaStream_t stream) {
  BT_ASSERT(a.dt == DType::BF16 && a.shape.D == kD, "attention_backward_wgmma: BF16 with D = 64 only, got ",
            dtype_name(a.dt), " D ", a.shape.D);
  AttnBwdParams<bf16_t> p = bwd_params<bf16_t>(a, scratch);  // Di first in the scratch
  const OnePassScratch l = onepass_scratch(a.shape);
  if (l.total > 0 && scratch_floats >= l.total) {
    const int64_t rows = p.B * p.H * p.T;
    launch(attn_bwd_di_wgmma_kernel, static_cast<unsigned>(ceil_div(rows, 64)), 256, 0, stream, p);
    int* turn = reinterpret_cast<int*>(scratch + l.turn_offset);
    BT_CUDA_CHECK(cudaMemsetAsync(turn, 0, l.turns * sizeof(int), stream));
    p.tiles = ceil_div(p.T, 64);
    const size_t smem = static_cast<size_t>(2 * 64 + 4 * 64 + 64) * kD * sizeof(bf16_t) +
                        (4 * 64 + 2 * 64 * kD) * sizeof(float) + kSwizzleAlign;
    launch(attn_bwd_onepass_wgmma_kernel<BT_ATTN_WGMMA_ONEPASS_MINB>,
           blocks_for(a.shape, a.shape.H, p.tiles, "attention_backward"), kOnePassThreads, smem, stream, p,
           scratch + l.sum_offset, turn);
    return;
  }
  launch_dq<BT_ATTN_WGMMA_DQ>(p, a.shape, stream);  // first: it writes Di, which the dK/dV pass reads
  launch_dkdv<BT_ATTN_WGMMA_DKDV>(p, a.shape, stream);
}

}  // namespace bt::kernels::cuda::detail
