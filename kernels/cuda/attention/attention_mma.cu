// Causal attention on the tensor cores, in the FlashAttention-2 form, with
// mma.sync + cp.async, written once over the operand type (Ops,
// kernels/cuda/attention/mma_ops.cuh):
//   BF16 (fp32 accumulation): mma.m16n8k16, ldmatrix;
//   F32 as TF32 (GemmMath::Tf32) or 3xTF32 (GemmMath::Tf32x3), when the
//   call's math asks for them (Note [Attention in fp32] in
//   kernels/attention.h; the precision policy's attention_math decides):
//   mma.m16n8k8, fp32 tiles, the operands rounded or split in registers
//   (Note [TF32 fragments by permuted k] in mma_ops.cuh).
// Dispatched from kernels/cuda/attention/attention.cu when attention_*_path()
// (kernels/attention.h) says the rows are 16-byte aligned and D is
// supported; the SIMT kernels there handle everything else.
//
// Shared-memory tiles. Every tile is [rows][D] elements, row-major, loaded
// with 16-byte cp.async (rows past T are zero-filled) and swizzled by 16-byte
// chunk as Ops::swz says, so the fragment loads are conflict-free. Below, a
// "k-step" is 16 wide (one bf16 mma, two tf32 ones) and an n-tile 8 columns.
//
// Warps own 16-row slabs ("m16"), so everything a warp needs for its softmax is
// in its own registers: no shared-memory reductions anywhere. (Below, the
// fragment loads are named as bf16 does them -- ldmatrix, .trans; the F32
// tiles load the same fragments with 16- and 4-byte loads.)
//
// Forward (one block = BM = 16 * MT * NW query rows of one (b, h); NW warps,
// each MT slabs of 16 rows): Q fragments (A operand, ldmatrix from the Q tile)
// stay in registers; K/V tiles of BN keys stream through a double buffer up to
// the last key the block can see. Per tile and warp:
//   S = Q K^T      A = Q (regs), B = K tile [key][d] (n-major: plain ldmatrix)
//   online softmax on S in base 2 (scale * log2 e folded in); a row's 16 x 8
//   accumulator fragment is spread over the 4 lanes of a quad (lanes 4g..4g+3
//   own rows g and g + 8), so row max / sum need two xor-shuffles
//   O += P V       A = P, converted in registers from the S accumulators
//                  (accumulator tiles 2k and 2k+1 are exactly the A fragment of
//                  k-step k), B = V tile [key][d] (k-major: ldmatrix.trans)
// then O / l is staged through the (no longer needed) Q tile and written with
// 16-byte stores, and lse = ln 2 * (m + log2 l).
//
// Backward (deterministic: every output element is written once by one thread,
// no atomics), two passes that each recompute P = exp2(S scale log2 e - lse log2 e):
//   dQ pass first, one block per BM = 16 * NW queries, warp = 16 queries. It
//   first computes Di = rowsum(dO * O) of its rows (16-byte loads, quad sums)
//   and writes it to the scratch, then walks the key tiles (BN keys, K/V
//   double-buffered) up to the diagonal:
//     S = Q K^T, dP = dO V^T (A = Q / dO from registers, B = K / V tiles, plain
//     ldmatrix), dS = P (dP - Di), dQ += dS K (A = dS from the accumulators,
//     B = K tile through .trans)
//   dK/dV pass, one block per BN = 16 * NW keys of a key/value head, warp =
//   16 keys; it walks the query tiles (BM rows; Q, dO, lse, Di double-buffered)
//   from the diagonal on, for each query head of the head's group in turn
//   (Note [Grouped-query attention]: query head h reads K/V head h / G):
//     S^T  = K Q^T    A = K (regs), B = Q tile (plain ldmatrix)
//     dP^T = V dO^T   A = V (regs), B = dO tile (plain ldmatrix)
//     P^T, dS^T = P^T (dP^T - Di)
//     dV += P^T dO    A = P^T from the S^T accumulators, B = dO tile (.trans)
//     dK += dS^T Q    A = dS^T from the dP^T accumulators, B = Q tile (.trans)
// Recomputing P in both passes costs 7 tile products instead of FA-2's 5, but
// keeps dQ free of atomics. dK and dQ are scaled by `scale` at the end.
// Exponentials are ex2.approx.ftz with the scale folded into one FFMA.
//
// Configurations (forward() and backward() below) were picked by timing
// variants on an H100 at B 16, H 12, T 1024, D 64. BF16: forward 8 warps x 16
// rows (BM 128), BN 64, 2 blocks/SM; dQ 4 warps (BM 64), BN 32; dK/dV 4 warps
// (BN 64), BM 64, with the register cap of 3 blocks/SM. F32: see the
// BT_ATTN_TF32_* defaults (a tuning run may override them with -D).
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/flash_backward.cuh"
#include "kernels/cuda/attention/flash_common.cuh"
#include "kernels/cuda/attention/mma_ops.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

// F32 configurations at D = 64: <MT, NW, BN, blocks/SM> (forward), <NW, BN,
// blocks/SM> (dQ), <NW, BM, blocks/SM> (dK/dV).
#ifndef BT_ATTN_TF32_FWD64
#define BT_ATTN_TF32_FWD64 1, 4, 64, 2
#endif
#ifndef BT_ATTN_TF32_DQ64
#define BT_ATTN_TF32_DQ64 4, 32, 2
#endif
#ifndef BT_ATTN_TF32_DKDV64
#define BT_ATTN_TF32_DKDV64 4, 32, 2
#endif

namespace bt::kernels::cuda::detail {
namespace {

// ------------------------------------------------------------------ forward
template <class Ops, int D, int MT, int NW, int BN, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) attn_fwd_mma_kernel(const AttnFwdParams<typename Ops::E> p) {
  using E = typename Ops::E;
  constexpr int kThreads = NW * 32, BM = 16 * MT * NW, KS = D / 16, NTL = BN / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* qs = reinterpret_cast<E*>(smem_raw);  // [BM][D]
  E* ks = qs + BM * D;                     // [2][BN][D]
  E* vs = ks + 2 * BN * D;                 // [2][BN][D]

  const FwdBlock<E, BM, BN> blk(p);
  const int64_t bh = blk.bh, b = blk.b, h = blk.h, T = blk.T, q0 = blk.q0;
  const int nkt = blk.nkt;
  const E *kg = blk.kg, *vg = blk.vg;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  blk.template load_first<Ops, D, kThreads>(qs, ks, vs, p);

  const int wrow = warp * 16 * MT;
  const int64_t wq0 = q0 + wrow, wq_last = wq0 + 16 * MT - 1;
  typename Ops::A qf[MT][KS];
  float o[MT][DT][4];
  float m[MT][2], l[MT][2];
  zero(o);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    next_kv_tile<Ops, D, BN, kThreads>(ks, vs, kg, vg, p.sk.t, p.sv.t, kt, nkt, T);
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) Ops::template load_a<D>(qf[mt][kk], qs, wrow + mt * 16, kk, lane);
    }
    const E* kb = ks + (kt & 1) * BN * D;
    const E* vb = vs + (kt & 1) * BN * D;
    if (k0 <= wq_last && wq0 < T) {  // warp-uniform: some key of the tile is visible to the warp
      float s[MT][NTL][4];
      zero(s);
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        typename Ops::AOp qa[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) qa[mt] = Ops::prep(qf[mt][kk]);
#pragma unroll
        for (int np = 0; np < NTL / 2; ++np) {
          typename Ops::B bf;
          Ops::template load_b_nmajor<D>(bf, kb, np * 16, kk, lane);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Ops::template mma<0>(s[mt][2 * np], qa[mt], bf);
            Ops::template mma<1>(s[mt][2 * np + 1], qa[mt], bf);
          }
        }
      }
      if (k0 + BN - 1 > wq0 || k0 + BN > T) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mask_scores(s[mt], wq0 + mt * 16, k0, T, lane);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) softmax_update(s[mt], m[mt], l[mt], o[mt], p.scale_log2);
        // O += P V
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        typename Ops::AOp pa[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          typename Ops::A a;
          Ops::acc_to_a(a, s[mt][2 * kk], s[mt][2 * kk + 1]);
          pa[mt] = Ops::prep(a);
        }
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          typename Ops::B bf;
          Ops::template load_b_kmajor<D>(bf, vb, kk * 16, dp * 16, lane);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Ops::template mma<0>(o[mt][2 * dp], pa[mt], bf);
            Ops::template mma<1>(o[mt][2 * dp + 1], pa[mt], bf);
          }
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: O / l through this warp's rows of the Q tile (only this warp read them).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    finish_rows(o[mt], m[mt], l[mt], p.lse ? p.lse + bh * T : nullptr, wq0 + mt * 16, T, lane);
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) stage_acc<Ops, D>(qs, wrow + mt * 16, o[mt], 1.0f, lane);
  __syncwarp();
  store_rows<Ops, D, 16 * MT>(qs, wrow, p.o + b * p.so.b + h * p.so.h, p.so.t, wq0, T, lane);
}

// ------------------------------------------------------------------ backward: dK, dV
template <class Ops, int D, int NW, int BM, int MINB, bool GQA>
__global__ void __launch_bounds__(NW * 32, MINB)
    attn_bwd_dkdv_mma_kernel(const AttnBwdParams<typename Ops::E> p) {
  using E = typename Ops::E;
  constexpr int kThreads = NW * 32, BN = 16 * NW, KS = D / 16, NQ = BM / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* ks = reinterpret_cast<E*>(smem_raw);                     // [BN][D]
  E* vs = ks + BN * D;                                        // [BN][D]
  E* qs = vs + BN * D;                                        // [2][BM][D]
  E* dos = qs + 2 * BM * D;                                   // [2][BM][D]
  float* lse_s = reinterpret_cast<float*>(dos + 2 * BM * D);  // [2][BM]
  float* di_s = lse_s + 2 * BM;                               // [2][BM]

  DkdvBlock<Ops, D, BN, BM, kThreads, GQA> blk(p);
  blk.load_first(ks, vs, qs, dos, lse_s, di_s, p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wrow = warp * 16;
  const int64_t wk0 = blk.k0 + wrow, T = blk.T;
  typename Ops::A kf[KS], vf[KS];
  float dk[DT][4], dv[DT][4];
  zero(dk);
  zero(dv);

  for (int64_t gh = 0; gh < blk.G; ++gh)
    for (int64_t qt = blk.qt0; qt < blk.nqt; ++qt) {
      const int buf = blk.next(gh, qt, qs, dos, lse_s, di_s, p);
      __syncthreads();
      if (gh == 0 && qt == blk.qt0) {
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          Ops::template load_a<D>(kf[kk], ks, wrow, kk, lane);
          Ops::template load_a<D>(vf[kk], vs, wrow, kk, lane);
        }
      }
      const E* qb = qs + buf * BM * D;
      const E* dob = dos + buf * BM * D;
      const int64_t qq0 = qt * BM;
      if (qq0 + BM - 1 >= wk0 && wk0 < T) {  // warp-uniform: some query of the tile sees some key
        float st[NQ][4], dpt[NQ][4];
        zero(st);
        zero(dpt);
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          const auto& ka = Ops::prep(kf[kk]);
          const auto& va = Ops::prep(vf[kk]);
#pragma unroll
          for (int np = 0; np < NQ / 2; ++np) {
            typename Ops::B bf;
            Ops::template load_b_nmajor<D>(bf, qb, np * 16, kk, lane);
            Ops::template mma<0>(st[2 * np], ka, bf);
            Ops::template mma<1>(st[2 * np + 1], ka, bf);
            Ops::template load_b_nmajor<D>(bf, dob, np * 16, kk, lane);
            Ops::template mma<0>(dpt[2 * np], va, bf);
            Ops::template mma<1>(dpt[2 * np + 1], va, bf);
          }
        }
        dkdv_scores_to_grads<NQ, false>(st, dpt, lse_s + buf * BM, di_s + buf * BM, wk0, qq0, T, p.scale_log2,
                                        lane);
#pragma unroll
        for (int kk = 0; kk < NQ / 2; ++kk) {
          typename Ops::A pf, df;
          Ops::acc_to_a(pf, st[2 * kk], st[2 * kk + 1]);
          Ops::acc_to_a(df, dpt[2 * kk], dpt[2 * kk + 1]);
          const auto& pa = Ops::prep(pf);
          const auto& da = Ops::prep(df);
#pragma unroll
          for (int dp = 0; dp < DT / 2; ++dp) {
            typename Ops::B bf;
            Ops::template load_b_kmajor<D>(bf, dob, kk * 16, dp * 16, lane);
            Ops::template mma<0>(dv[2 * dp], pa, bf);
            Ops::template mma<1>(dv[2 * dp + 1], pa, bf);
            Ops::template load_b_kmajor<D>(bf, qb, kk * 16, dp * 16, lane);
            Ops::template mma<0>(dk[2 * dp], da, bf);
            Ops::template mma<1>(dk[2 * dp + 1], da, bf);
          }
        }
      }
      __syncthreads();
    }

  blk.store(ks, vs, wrow, wk0, dk, dv, p, lane);  // only this warp read its rows of K and V
}

// ------------------------------------------------------------------ backward: dQ
template <class Ops, int D, int NW, int BN, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB)
    attn_bwd_dq_mma_kernel(const AttnBwdParams<typename Ops::E> p) {
  using E = typename Ops::E;
  constexpr int kThreads = NW * 32, BM = 16 * NW, KS = D / 16, NTL = BN / 8, DT = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* qs = reinterpret_cast<E*>(smem_raw);  // [BM][D]
  E* dos = qs + BM * D;                    // [BM][D]
  E* ks = dos + BM * D;                    // [2][BN][D]
  E* vs = ks + 2 * BN * D;                 // [2][BN][D]

  const DqBlock<Ops, D, BM, BN, kThreads> blk(p);
  blk.load_first(qs, dos, ks, vs, p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wrow = warp * 16;
  const int64_t wq0 = blk.q0 + wrow, T = blk.T;
  float lse2[2], dii[2];
  blk.row_stats(lse2, dii, wq0, p, lane);
  typename Ops::A qf[KS], dof[KS];
  float dq[DT][4];
  zero(dq);

  for (int kt = 0; kt < blk.nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    next_kv_tile<Ops, D, BN, kThreads>(ks, vs, blk.kg, blk.vg, p.sk.t, p.sv.t, kt, blk.nkt, T);
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        Ops::template load_a<D>(qf[kk], qs, wrow, kk, lane);
        Ops::template load_a<D>(dof[kk], dos, wrow, kk, lane);
      }
    }
    const E* kb = ks + (kt & 1) * BN * D;
    const E* vb = vs + (kt & 1) * BN * D;
    if (k0 <= wq0 + 15 && wq0 < T) {
      float s[NTL][4], dp[NTL][4];
      zero(s);
      zero(dp);
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const auto& qa = Ops::prep(qf[kk]);
        const auto& da = Ops::prep(dof[kk]);
#pragma unroll
        for (int np = 0; np < NTL / 2; ++np) {
          typename Ops::B bf;
          Ops::template load_b_nmajor<D>(bf, kb, np * 16, kk, lane);
          Ops::template mma<0>(s[2 * np], qa, bf);
          Ops::template mma<1>(s[2 * np + 1], qa, bf);
          Ops::template load_b_nmajor<D>(bf, vb, np * 16, kk, lane);
          Ops::template mma<0>(dp[2 * np], da, bf);
          Ops::template mma<1>(dp[2 * np + 1], da, bf);
        }
      }
      dq_scores_to_grads<NTL, false>(s, dp, lse2, dii, wq0, k0, T, p.scale_log2, lane);  // s becomes dS
#pragma unroll
      for (int kk = 0; kk < NTL / 2; ++kk) {
        typename Ops::A df;
        Ops::acc_to_a(df, s[2 * kk], s[2 * kk + 1]);
        const auto& da = Ops::prep(df);
#pragma unroll
        for (int dd = 0; dd < DT / 2; ++dd) {
          typename Ops::B bf;
          Ops::template load_b_kmajor<D>(bf, kb, kk * 16, dd * 16, lane);
          Ops::template mma<0>(dq[2 * dd], da, bf);
          Ops::template mma<1>(dq[2 * dd + 1], da, bf);
        }
      }
    }
    __syncthreads();
  }

  blk.store(qs, wrow, dq, p, lane);  // only this warp read its rows of Q
}

// ------------------------------------------------------------------ host side
template <class Ops, int D, int MT, int NW, int BN, int MINB>
void launch_fwd(const AttnForward& a, cudaStream_t stream) {
  using E = typename Ops::E;
  constexpr int BM = 16 * MT * NW;
  AttnFwdParams<E> p = fwd_params<E>(a);
  p.tiles = ceil_div(p.T, BM);
  const size_t smem = static_cast<size_t>(BM + 4 * BN) * D * sizeof(E);
  launch(attn_fwd_mma_kernel<Ops, D, MT, NW, BN, MINB>,
         blocks_for(a.shape, a.shape.H, p.tiles, "attention_forward"), NW * 32, smem, stream, p);
}

/// dK/dV pass: blocks of 16 * NW keys, query tiles of BM rows.
template <class Ops, int D, int NW, int BM, int MINB>
void launch_dkdv(const AttnBwdParams<typename Ops::E>& p0, const AttnShape& s, cudaStream_t stream) {
  using E = typename Ops::E;
  AttnBwdParams<E> p = p0;
  p.tiles = ceil_div(p.T, 16 * NW);
  const size_t smem = static_cast<size_t>(2 * 16 * NW + 4 * BM) * D * sizeof(E) + 4 * BM * sizeof(float);
  const unsigned blocks = blocks_for(s, p.Hkv, p.tiles, "attention_backward");
  if (p.G > 1)
    launch(attn_bwd_dkdv_mma_kernel<Ops, D, NW, BM, MINB, true>, blocks, NW * 32, smem, stream, p);
  else  // MHA: the loop over a group's query heads compiled away
    launch(attn_bwd_dkdv_mma_kernel<Ops, D, NW, BM, MINB, false>, blocks, NW * 32, smem, stream, p);
}

/// dQ pass: blocks of 16 * NW queries, key tiles of BN rows.
template <class Ops, int D, int NW, int BN, int MINB>
void launch_dq(const AttnBwdParams<typename Ops::E>& p0, const AttnShape& s, cudaStream_t stream) {
  using E = typename Ops::E;
  AttnBwdParams<E> p = p0;
  p.tiles = ceil_div(p.T, 16 * NW);
  const size_t smem = static_cast<size_t>(2 * 16 * NW + 4 * BN) * D * sizeof(E);
  launch(attn_bwd_dq_mma_kernel<Ops, D, NW, BN, MINB>, blocks_for(s, s.H, p.tiles, "attention_backward"),
         NW * 32, smem, stream, p);
}

// Configurations: <D, MT, NW, BN, blocks per SM> (forward), <D, NW, BN or
// BM, blocks per SM> (dQ, dK/dV).
template <class Ops>
void forward(const AttnForward& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<Ops, Bf16Ops>) {
    switch (a.shape.D) {
      case 32:
        return launch_fwd<Ops, 32, 1, 8, 64, 2>(a, stream);
      case 64:
        return launch_fwd<Ops, 64, 1, 8, 64, 2>(a, stream);
      case 128:
        return launch_fwd<Ops, 128, 1, 4, 64, 1>(a, stream);
    }
  } else {
    switch (a.shape.D) {
      case 32:
        return launch_fwd<Ops, 32, 1, 4, 64, 2>(a, stream);
      case 64:
        return launch_fwd<Ops, 64, BT_ATTN_TF32_FWD64>(a, stream);
    }
  }
  BT_ASSERT(false, "attention_forward_mma: unsupported D ", a.shape.D, " for ", dtype_name(a.dt));
}

template <class Ops>
void backward(const AttnBackward& a, float* di, cudaStream_t stream) {
  // The dQ pass goes first: it also writes Di, which the dK/dV pass reads.
  const AttnBwdParams<typename Ops::E> p = bwd_params<typename Ops::E>(a, di);
  if constexpr (std::is_same_v<Ops, Bf16Ops>) {
    switch (a.shape.D) {
      case 32:
        launch_dq<Ops, 32, 4, 32, 1>(p, a.shape, stream);
        return launch_dkdv<Ops, 32, 4, 64, 1>(p, a.shape, stream);
      case 64:
        launch_dq<Ops, 64, 4, 32, 1>(p, a.shape, stream);
        return launch_dkdv<Ops, 64, 4, 64, 3>(p, a.shape, stream);  // 3 blocks/SM beat no spills
    }
  } else {
    switch (a.shape.D) {
      case 32:
        launch_dq<Ops, 32, 4, 32, 2>(p, a.shape, stream);
        return launch_dkdv<Ops, 32, 4, 32, 2>(p, a.shape, stream);
      case 64:
        launch_dq<Ops, 64, BT_ATTN_TF32_DQ64>(p, a.shape, stream);
        return launch_dkdv<Ops, 64, BT_ATTN_TF32_DKDV64>(p, a.shape, stream);
    }
  }
  BT_ASSERT(false, "attention_backward_mma: unsupported D ", a.shape.D, " for ", dtype_name(a.dt));
}

}  // namespace

void attention_forward_mma(const AttnForward& a, cudaStream_t stream) {
#ifdef BT_SM90A
  if (attention_forward_uses_wgmma(a)) return attention_forward_wgmma(a, stream);
#endif
  if (a.dt == DType::BF16) return forward<Bf16Ops>(a, stream);
  if (a.math == GemmMath::Tf32x3) return forward<Tf32Ops<true>>(a, stream);
  forward<Tf32Ops<false>>(a, stream);
}

void attention_backward_mma(const AttnBackward& a, float* di, cudaStream_t stream) {
#ifdef BT_SM90A
  if (attention_backward_uses_wgmma(a)) return attention_backward_wgmma(a, di, stream);
#endif
  if (a.dt == DType::BF16) return backward<Bf16Ops>(a, di, stream);
  if (a.math == GemmMath::Tf32x3) return backward<Tf32Ops<true>>(a, di, stream);
  backward<Tf32Ops<false>>(a, di, stream);
}

}  // namespace bt::kernels::cuda::detail

namespace bt::kernels::cuda {
namespace {

// On by default (measured on an H100: 246 TFLOP/s forward against the
// mma.sync kernels' 205, bench/RESULTS.md, and 260-273 on an H200 since the
// forward's copies moved to the copy engine, issue 18's step 23; the
// backward: step 10 there); BT_ATTENTION_WGMMA=0 at start turns both off,
// set_attention_wgmma changes it.
std::atomic<bool> g_wgmma_on{[] {
  const char* v = std::getenv("BT_ATTENTION_WGMMA");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};

}  // namespace

bool attention_wgmma_available() {
#ifdef BT_SM90A
  int dev = 0, major = 0, minor = 0;
  BT_CUDA_CHECK(cudaGetDevice(&dev));
  BT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  BT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;  // sm_90a code runs on compute capability 9.0 alone
#else
  return false;
#endif
}

bool attention_forward_uses_wgmma(const AttnForward& a) {
  // The Hopper forward's tiles come through the copy engine: 32-bit row
  // coordinates, and a positive stride for every dimension that steps.
  const AttnShape& s = a.shape;
  const auto copyable = [&](const AttnStrides& st, int64_t heads) {
    return (s.B == 1 || st.b > 0) && (heads == 1 || st.h > 0) && (s.T == 1 || st.t > 0);
  };
  return g_wgmma_on.load() && a.dt == DType::BF16 && s.D == 64 && s.T < (int64_t{1} << 30) &&
         copyable(a.sq, s.H) && copyable(a.sk, s.kv_heads()) && copyable(a.sv, s.kv_heads()) &&
         attention_forward_path(a) == AttnPath::TensorCore && attention_wgmma_available();
}

bool attention_backward_uses_wgmma(const AttnBackward& a) {
  return g_wgmma_on.load() && a.dt == DType::BF16 && a.shape.D == 64 &&
         attention_backward_path(a) == AttnPath::TensorCore && attention_wgmma_available();
}

bool attention_wgmma_enabled() { return g_wgmma_on.load(); }
void set_attention_wgmma(bool on) { g_wgmma_on.store(on); }

}  // namespace bt::kernels::cuda
