// What the tensor-core attention backward kernels share (the mma.sync ones of
// attention_mma.cu and the Hopper wgmma ones of sm90a/attention_wgmma_bwd.cu):
// which rows a block owns, the tiles it walks and their double buffers, Di,
// and the per-warp arithmetic between the tile products -- P from the scores
// and lse, dS = P (dP - Di), the causal mask -- on a warp's 16 rows of
// accumulators in the mma.m16n8 C layout (lane (g, t): rows g and g + 8,
// columns 2 t and 2 t + 1 of each 8-column tile), which is also the layout of
// each warp's 16 rows of a wgmma accumulator. The products themselves, and
// the warps or warpgroups that issue them, are the kernels' own.
#pragma once

#include <cstdint>

#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/attention/flash_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda::detail {

/// A dK/dV block: BN keys from k0 of key/value head hk of batch b, and the
/// query tiles of BM rows that see them -- qt0 .. nqt - 1 of each query head
/// of the head's group in turn (Note [Grouped-query attention]), summed in
/// the same registers. Without GQA (G = 1, Hkv = H) the head loop folds away.
/// Shared memory: K and V tiles [BN][D], then double-buffered Q and dO tiles
/// [2][BM][D] and lse and Di rows [2][BM].
template <class Ops, int D, int BN, int BM, int NT, bool GQA>
struct DkdvBlock {
  using E = typename Ops::E;
  int64_t G, b, hk, T, k0, qt0, nqt;
  // The head of the next query tile to load.
  const E* qg;
  const E* dog;
  const float* lse_g;
  const float* di_g;

  __device__ __forceinline__ explicit DkdvBlock(const AttnBwdParams<E>& p) {
    G = GQA ? p.G : 1;
    const int64_t Hkv = GQA ? p.Hkv : p.H;
    const int64_t bhk_count = p.B * Hkv, bid = blockIdx.x;
    const int64_t bhk = bid % bhk_count, tile = bid / bhk_count;  // first key tiles see the most queries
    b = bhk / Hkv, hk = bhk % Hkv, T = p.T;
    k0 = tile * BN;
    const int64_t h0 = hk * G, bh0 = b * p.H + h0;
    qg = p.q + b * p.sq.b + h0 * p.sq.h;
    dog = p.dout + b * p.sdo.b + h0 * p.sdo.h;
    lse_g = p.lse + bh0 * T;
    di_g = p.di + bh0 * T;
    qt0 = k0 / BM, nqt = (T + BM - 1) / BM;  // query tiles before qt0 see none of the keys
  }
  /// Starts (and commits) the copies of the K/V tiles and the first query tile.
  __device__ __forceinline__ void load_first(E* ks, E* vs, E* qs, E* dos, float* lse_s, float* di_s,
                                             const AttnBwdParams<E>& p) const {
    load_tile<Ops, D, BN, NT>(ks, p.k + b * p.sk.b + hk * p.sk.h, p.sk.t, k0, T);
    load_tile<Ops, D, BN, NT>(vs, p.v + b * p.sv.b + hk * p.sv.h, p.sv.t, k0, T);
    load_tile<Ops, D, BM, NT>(qs, qg, p.sq.t, qt0 * BM, T);
    load_tile<Ops, D, BM, NT>(dos, dog, p.sdo.t, qt0 * BM, T);
    load_vec<BM, NT>(lse_s, lse_g, qt0 * BM, T);
    load_vec<BM, NT>(di_s, di_g, qt0 * BM, T);
    cp_async_commit();
  }
  /// Before query tile qt of group head gh: starts copying the next tile into
  /// the other buffers and waits for this thread's copies of this one; returns
  /// this tile's buffer. A barrier must follow before any thread reads it.
  __device__ __forceinline__ int next(int64_t gh, int64_t qt, E* qs, E* dos, float* lse_s, float* di_s,
                                      const AttnBwdParams<E>& p) {
    const int buf = static_cast<int>((gh * (nqt - qt0) + qt - qt0) & 1);
    if (qt + 1 < nqt || gh + 1 < G) {
      const int nb = buf ^ 1;
      const bool next_head = qt + 1 == nqt;  // the next tile is the next head's first
      if (next_head) qg += p.sq.h, dog += p.sdo.h, lse_g += T, di_g += T;
      const int64_t r1 = (next_head ? qt0 : qt + 1) * BM;
      load_tile<Ops, D, BM, NT>(qs + nb * BM * D, qg, p.sq.t, r1, T);
      load_tile<Ops, D, BM, NT>(dos + nb * BM * D, dog, p.sdo.t, r1, T);
      load_vec<BM, NT>(lse_s + nb * BM, lse_g, r1, T);
      load_vec<BM, NT>(di_s + nb * BM, di_g, r1, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    return buf;
  }
  /// The epilogue: a warp's 16 rows r0.. of dK (times scale) and dV (keys
  /// wk0..), staged through its rows of the K and V tiles, which nothing reads
  /// any more.
  __device__ __forceinline__ void store(E* ks, E* vs, int r0, int64_t wk0, const float (&dk)[D / 8][4],
                                        const float (&dv)[D / 8][4], const AttnBwdParams<E>& p,
                                        int lane) const {
    stage_acc<Ops, D>(ks, r0, dk, p.scale, lane);
    stage_acc<Ops, D>(vs, r0, dv, 1.0f, lane);
    __syncwarp();
    store_rows<Ops, D, 16>(ks, r0, p.dk + b * p.sdk.b + hk * p.sdk.h, p.sdk.t, wk0, T, lane);
    store_rows<Ops, D, 16>(vs, r0, p.dv + b * p.sdv.b + hk * p.sdv.h, p.sdv.t, wk0, T, lane);
  }
};

/// dkdv_scores_to_grads with the causal mask (kMask) or without; rel and lim
/// are the tile's offsets (Note [The causal mask in tile offsets]): query ql
/// of the tile is before key r of the warp when rel + ql < r.
template <int NQ, bool kMask>
__device__ __forceinline__ void dkdv_grads_tile(float (&st)[NQ][4], float (&dpt)[NQ][4], const float* lb,
                                                const float* db, int rel, int lim, float scale_log2,
                                                int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt) {
    const float2 l2 = *reinterpret_cast<const float2*>(lb + nt * 8 + 2 * tq);
    const float2 d2 = *reinterpret_cast<const float2*>(db + nt * 8 + 2 * tq);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int ql = nt * 8 + 2 * tq + j;
      const float lq = (j ? l2.y : l2.x) * kLog2e, dq = j ? d2.y : d2.x;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int e = 2 * hf + j;
        float pv = fast_exp2(fmaf(st[nt][e], scale_log2, -lq));
        if constexpr (kMask) {
          if (rel + ql < g + 8 * hf || ql >= lim) pv = 0.0f;
        }
        st[nt][e] = pv;
        dpt[nt][e] = pv * (dpt[nt][e] - dq);
      }
    }
  }
}

/// The dK/dV pass's arithmetic on a warp's 16 keys from wk0 against the BM =
/// 8 NQ queries of a tile from qq0 (lse and Di of those queries in lb, db):
/// S^T becomes P^T, dP^T becomes dS^T = P^T (dP^T - Di). kBranch: only the
/// tiles that need the mask run the masked code; else every tile does (Note
/// [The causal mask in tile offsets]).
template <int NQ, bool kBranch>
__device__ __forceinline__ void dkdv_scores_to_grads(float (&st)[NQ][4], float (&dpt)[NQ][4], const float* lb,
                                                     const float* db, int64_t wk0, int64_t qq0, int64_t T,
                                                     float scale_log2, int lane) {
  const int rel = tile_offset(qq0 - wk0), lim = tile_offset(T - qq0);
  if (!kBranch || qq0 < wk0 + 15 || qq0 + 8 * NQ > T) {
    dkdv_grads_tile<NQ, true>(st, dpt, lb, db, rel, lim, scale_log2, lane);
  } else {
    dkdv_grads_tile<NQ, false>(st, dpt, lb, db, 0, 0, scale_log2, lane);
  }
}

/// A dQ block: BM query rows from q0 of one (b, h), and the nkt key tiles of
/// BN keys that some of them see (longest rows first across the grid).
/// Shared memory: Q and dO tiles [BM][D], then double-buffered K and V tiles
/// [2][BN][D].
template <class Ops, int D, int BM, int BN, int NT>
struct DqBlock {
  using E = typename Ops::E;
  int64_t bh, b, h, T, q0;
  int nkt;
  const E* kg;
  const E* vg;

  __device__ __forceinline__ explicit DqBlock(const AttnBwdParams<E>& p) {
    const int64_t bh_count = p.B * p.H, bid = blockIdx.x;
    bh = bid % bh_count;
    b = bh / p.H, h = bh % p.H, T = p.T;
    q0 = (p.tiles - 1 - bid / bh_count) * BM;
    kg = p.k + b * p.sk.b + (h / p.G) * p.sk.h;  // Note [Grouped-query attention]
    vg = p.v + b * p.sv.b + (h / p.G) * p.sv.h;
    const int64_t kend = q0 + BM < T ? q0 + BM : T;
    nkt = static_cast<int>((kend + BN - 1) / BN);
  }
  /// Starts (and commits) the copies of the Q and dO tiles and the first K/V tiles.
  __device__ __forceinline__ void load_first(E* qs, E* dos, E* ks, E* vs, const AttnBwdParams<E>& p) const {
    load_tile<Ops, D, BM, NT>(qs, p.q + b * p.sq.b + h * p.sq.h, p.sq.t, q0, T);
    load_tile<Ops, D, BM, NT>(dos, p.dout + b * p.sdo.b + h * p.sdo.h, p.sdo.t, q0, T);
    load_tile<Ops, D, BN, NT>(ks, kg, p.sk.t, 0, T);
    load_tile<Ops, D, BN, NT>(vs, vg, p.sv.t, 0, T);
    cp_async_commit();
  }
  /// Di = rowsum(dO * O) and lse log2 e of this lane's rows wq0 + g (+ 8)
  /// (lane t of the quad takes the 16-byte chunks t, t + 4, ...), kept in
  /// registers; Di is also written to the scratch for the dK/dV pass.
  __device__ __forceinline__ void row_stats(float (&lse2)[2], float (&dii)[2], int64_t wq0,
                                            const AttnBwdParams<E>& p, int lane) const {
    const int g = lane >> 2, tq = lane & 3;
    const E* og = p.o + b * p.so.b + h * p.so.h;
    const E* dog = p.dout + b * p.sdo.b + h * p.sdo.h;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t r = wq0 + g + 8 * hf;
      const bool ok = r < T;
      float acc = 0.0f;
      if (ok) {
#pragma unroll
        for (int c = tq; c < D / Ops::kChunk; c += 4)
          acc = Ops::dot_chunk(acc, og + r * p.so.t + c * Ops::kChunk, dog + r * p.sdo.t + c * Ops::kChunk);
      }
      dii[hf] = quad_sum(acc);
      lse2[hf] = ok ? p.lse[bh * T + r] * kLog2e : 0.0f;
      if (ok && tq == 0) p.di[bh * T + r] = dii[hf];
    }
  }
  /// The epilogue: a warp's 16 rows of dQ (times scale) from r0, staged
  /// through its rows of the Q tile, which nothing reads any more.
  __device__ __forceinline__ void store(E* qs, int r0, const float (&dq)[D / 8][4], const AttnBwdParams<E>& p,
                                        int lane) const {
    stage_acc<Ops, D>(qs, r0, dq, p.scale, lane);
    __syncwarp();
    store_rows<Ops, D, 16>(qs, r0, p.dq + b * p.sdq.b + h * p.sdq.h, p.sdq.t, q0 + r0, T, lane);
  }
};

/// dq_scores_to_grads with the causal mask (kMask) or without; rel and lim
/// are the tile's offsets (Note [The causal mask in tile offsets]): key c of
/// the tile is after query r of the warp when rel + c > r.
template <int NTL, bool kMask>
__device__ __forceinline__ void dq_grads_tile(float (&s)[NTL][4], const float (&dp)[NTL][4],
                                              const float (&lse2)[2], const float (&dii)[2], int rel, int lim,
                                              float scale_log2, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NTL; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int hf = e >> 1;
      float pv = fast_exp2(fmaf(s[nt][e], scale_log2, -lse2[hf]));
      if constexpr (kMask) {
        const int c = nt * 8 + 2 * tq + (e & 1);
        if (rel + c > g + 8 * hf || c >= lim) pv = 0.0f;
      }
      s[nt][e] = pv * (dp[nt][e] - dii[hf]);
    }
}

/// The dQ pass's arithmetic on a warp's 16 queries from wq0 against the BN =
/// 8 NTL keys of a tile from k0: S becomes dS = P (dP - Di). kBranch as in
/// dkdv_scores_to_grads.
template <int NTL, bool kBranch>
__device__ __forceinline__ void dq_scores_to_grads(float (&s)[NTL][4], const float (&dp)[NTL][4],
                                                   const float (&lse2)[2], const float (&dii)[2], int64_t wq0,
                                                   int64_t k0, int64_t T, float scale_log2, int lane) {
  const int rel = tile_offset(k0 - wq0), lim = tile_offset(T - k0);
  if (!kBranch || k0 + 8 * NTL - 1 > wq0 || k0 + 8 * NTL > T) {
    dq_grads_tile<NTL, true>(s, dp, lse2, dii, rel, lim, scale_log2, lane);
  } else {
    dq_grads_tile<NTL, false>(s, dp, lse2, dii, 0, 0, scale_log2, lane);
  }
}

}  // namespace bt::kernels::cuda::detail
