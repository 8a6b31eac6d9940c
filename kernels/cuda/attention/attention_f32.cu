// Causal attention in strict fp32 (FFMA only: no TF32, no tensor cores),
// register-tiled like a SIMT GEMM, in the FlashAttention-2 form. Dispatched
// from kernels/cuda/attention/attention.cu for F32 with D in {32, 64}, a finite scale and
// 16-byte aligned rows (attention_*_path, kernels/attention.h); the
// one-row-per-lane SIMT kernels there handle everything else.
//
// Thread layout (every kernel here). A block of NW warps owns BM = 2 NW RM
// "rows" (queries in the forward and the dQ pass, keys in the dK/dV pass) and
// streams tiles of BN = 16 RN "columns" (keys, or queries) through shared
// memory. Each half-warp is a row group: rg = 2 warp + lane / 16 (NRG = 2 NW
// groups), cg = lane % 16. Thread (rg, cg) owns
//   - the RM rows rg + NRG i (i < RM), so the two row groups of a warp read
//     adjacent rows: their float4 loads hit different banks;
//   - in every BM x BN score-like tile (S, dP, P, dS), the RN columns cg + 16 j
//     (j < RN): the 16 lanes of a row group read 16 consecutive rows of a
//     [BN][D + 4] tile, conflict-free (2 wavefronts for 256 bytes);
//   - in every BM x D output-like tile (O, dQ, dK, dV), the DC = D / 16
//     consecutive columns cg DC .. cg DC + DC - 1.
// All 16 threads of a row share its rows, so a row's max needs 4 xor-shuffles
// within the half-warp, and a score tile that one row group writes to shared
// memory ([BM][BN + 16], P or dS) is read back only by that same row group
// (the same warp): a __syncwarp suffices between them.
//
// Products (micro-kernels below; float4 loads from shared memory; the k loop
// unrolled KU times, the rest fully):
//   mm_nt: acc[RM][RN] += A[rows][k] B[cols][k] over k (both k-contiguous),
//          per 4 k: RN + RM LDS.128 for 4 RM RN FFMA (S = Q K^T, dP = dO V^T, ...)
//   mm_nn: acc[RM][DC] += A[rows][k] B[k][cg DC ..] over k (A = P or dS, B a
//          [rows][D] tile), per 4 k: RM LDS.128 + 4 vector loads for 4 RM DC FFMA
// Default configuration (D = 64): RM = 8, RN = 4, NW = 4, so BM = BN = 64,
// 128 threads, 32 score and 32 output accumulators per thread.
//
// Tiles arrive by 16-byte cp.async (rows past T zero-filled). Q (forward, dQ
// pass) or K (dK/dV pass) is multiplied by scale * log2(e) in shared memory
// once (each thread scales the chunks it copied), so scores come out in
// base-2 units and P = 2^(s - m) or 2^(s - lse log2 e) is one ex2.approx.
// Single-buffered K/V (or Q/dO) tiles, each re-filled as soon as the product
// that reads it is done, so it lands while the other operand's products run;
// 2-3 resident blocks per SM hide the rest.
//
// Forward, per (b, h, 64 queries), key tiles up to the diagonal (fully masked
// ones skipped, the diagonal one masked):
//   S = Q' K^T -> online softmax (row max by shuffles; per-thread partial row
//   sums, reduced once at the end) -> P to shared memory -> O += P V;
//   O / l written with float4 stores, lse = ln 2 (m + log2 l).
// Backward (deterministic, every output element written once, no atomics):
//   dQ pass, per (b, h, 64 queries): Di = rowsum(dO * O) of its rows (written
//   to the scratch for the next pass), then per key tile: dP = dO V^T,
//   S = Q' K^T, dS = P (dP - Di) to shared memory, dQ += dS K. dQ *= scale.
//   dK/dV pass, per (b, hk, 64 keys), query tiles from the diagonal, for each
//   query head of the key/value head's group in turn (Note [Grouped-query
//   attention] in kernels/attention.h; h reads K/V head h / G): S^T = K' Q^T,
//   dP^T = V dO^T, P^T and dS^T = P^T (dP^T - Di) to shared memory,
//   dK += dS^T Q, dV += P^T dO. dK *= scale.
// With room in the scratch, the dK/dV pass also stores its dS^T tiles and a
// dQ pass over them replaces the recomputing one (Note [dS through memory in
// fp32], below the kernels).
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/attention/attention_f32.cuh"
#include "kernels/cuda/attention/attention_tiled.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda::detail {
namespace {

template <int D_, int RM_, int RN_, int NW_, int KU_ = 1>
struct Cfg {
  static constexpr int D = D_, RM = RM_, RN = RN_, NW = NW_;
  static constexpr int KU = KU_;  // unroll of the k loops of the products (steps of 4)
  static constexpr int kThreads = 32 * NW;
  static constexpr int NRG = 2 * NW;   // row groups of 16 lanes
  static constexpr int BM = NRG * RM;  // rows owned by a block
  static constexpr int BN = 16 * RN;   // columns of a streamed tile
  static constexpr int DC = D / 16;    // output columns per thread
  // Row strides: [rows][D] tiles are float4-aligned and skewed by 4 banks a
  // row; [BM][BN] tiles put the two row groups of a warp 16 banks apart.
  static constexpr int LD = D + 4;
  static constexpr int LP = BN + 16;
  static_assert(D % 16 == 0 && (DC == 2 || DC == 4), "D must be 32 or 64");
  static_assert(BN % 32 == 0, "LP % 32 == 16 needs BN % 32 == 0");
};

using F32Fwd = AttnFwdParams<float>;
using F32Bwd = AttnBwdParams<float>;

/// The key/value heads (b, hk), numbered b Hkv + hk, that one dK/dV launch
/// (and the dQ launch after it) covers: [first, first + count). With `ds`,
/// the dK/dV pass stores its dS^T tiles there for the dQ pass (Note [dS
/// through memory in fp32]); a head's G query heads take G ds_head_floats
/// in order.
struct DsSpan {
  int64_t first, count;
  float* ds;
};

/// The dS tiles are kDsTile x kDsTile: a block's keys by a streamed tile's queries.
constexpr int kDsTile = 64;

/// Floats of one query head's dS tiles: the kDsTile-square tiles on and
/// below the diagonal (key tile <= query tile), nt (nt + 1) / 2 of them.
__host__ __device__ inline int64_t ds_head_floats(int64_t T) {
  const int64_t nt = (T + kDsTile - 1) / kDsTile;
  return nt * (nt + 1) / 2 * kDsTile * kDsTile;
}

/// The most scratch the dS tiles take (Note [dS through memory in fp32]).
constexpr size_t kDsMiB = 256;

/// Where the dS tiles start in the backward's scratch: after Di ([B, H, T]),
/// 256-byte aligned.
inline int64_t ds_offset_floats(const AttnShape& s) { return (s.B * s.H * s.T + 63) / 64 * 64; }

/// Where the tile of query tile qt and key tile kt <= qt starts in a head's dS tiles.
__device__ __forceinline__ int64_t ds_tile_offset(int64_t qt, int64_t kt) {
  return (qt * (qt + 1) / 2 + kt) * kDsTile * kDsTile;
}

/// Max / sum over the 16 lanes of a row group.
__device__ __forceinline__ float group16_max(float v) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float group16_sum(float v) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// N consecutive floats (N in {2, 4}; 8N-byte aligned) as one access.
template <int N>
__device__ __forceinline__ void ld_vec(const float* p, float (&v)[N]) {
  if constexpr (N == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    static_assert(N == 2, "vectors of 2 or 4 floats");
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x, v[1] = t.y;
  }
}
template <int N>
__device__ __forceinline__ void st_vec(float* p, const float (&v)[N], float mul) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0] * mul, v[1] * mul, v[2] * mul, v[3] * mul);
  } else {
    static_assert(N == 2, "vectors of 2 or 4 floats");
    *reinterpret_cast<float2*>(p) = make_float2(v[0] * mul, v[1] * mul);
  }
}

/// Async copy of rows [row0, row0 + ROWS) of a [T, D] slab (row stride `st`,
/// 16-byte aligned rows) into a [ROWS][LD] tile; rows >= T become zeros. All NT
/// threads take part; thread x copies the chunks x, x + NT, ...
template <int D, int LD, int ROWS, int NT>
__device__ __forceinline__ void load_rows(float* tile, const float* g, int64_t st, int64_t row0, int64_t T) {
  constexpr int kChunks = D / 4, kTotal = ROWS * kChunks;
  static_assert(kTotal % NT == 0, "tile chunks must divide evenly among the threads");
#pragma unroll
  for (int it = 0; it < kTotal / NT; ++it) {
    const int i = it * NT + static_cast<int>(threadIdx.x);
    const int r = i / kChunks, c = i % kChunks;
    const int64_t t = row0 + r;
    const bool ok = t < T;
    cp_async16(smem_u32(tile + r * LD + c * 4), g + (ok ? t * st + c * 4 : 0), ok);
  }
}

/// Multiplies the chunks this thread copied with load_rows by `mul` (after its
/// own cp.async.wait: a thread sees its own copies without a barrier).
template <int D, int LD, int ROWS, int NT>
__device__ __forceinline__ void scale_rows(float* tile, float mul) {
  constexpr int kChunks = D / 4, kTotal = ROWS * kChunks;
#pragma unroll
  for (int it = 0; it < kTotal / NT; ++it) {
    const int i = it * NT + static_cast<int>(threadIdx.x);
    float4* p = reinterpret_cast<float4*>(tile + (i / kChunks) * LD + (i % kChunks) * 4);
    float4 v = *p;
    v.x *= mul, v.y *= mul, v.z *= mul, v.w *= mul;
    *p = v;
  }
}

/// Async copy of floats [row0, row0 + N) of `src` (zeros past T).
template <int N, int NT>
__device__ __forceinline__ void load_floats(float* dst, const float* src, int64_t row0, int64_t T) {
  for (int i = threadIdx.x; i < N; i += NT) {
    const int64_t t = row0 + i;
    const bool ok = t < T;
    cp_async4(smem_u32(dst + i), src + (ok ? t : 0), ok);
  }
}

/// acc[i][j] += sum_k a[i NRG LDA + k] * b[16 j LDB + k] for k < K: rows
/// rg + NRG i of a k-contiguous tile times rows cg + 16 j of another (`a` and
/// `b` already point at rows rg and cg).
template <int RM, int RN, int K, int NRG, int LDA, int LDB, int KU>
__device__ __forceinline__ void mm_nt(float (&acc)[RM][RN], const float* a, const float* b) {
#pragma unroll KU
  for (int k = 0; k < K; k += 4) {
    float4 bv[RN];
#pragma unroll
    for (int j = 0; j < RN; ++j) bv[j] = *reinterpret_cast<const float4*>(b + j * 16 * LDB + k);
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const float4 av = *reinterpret_cast<const float4*>(a + i * NRG * LDA + k);
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        acc[i][j] = fmaf(av.x, bv[j].x, acc[i][j]);
        acc[i][j] = fmaf(av.y, bv[j].y, acc[i][j]);
        acc[i][j] = fmaf(av.z, bv[j].z, acc[i][j]);
        acc[i][j] = fmaf(av.w, bv[j].w, acc[i][j]);
      }
    }
  }
}

/// acc[i][c] += sum_k a[i NRG LDA + k] * b[k LDB + c] for k < K, c < DC: rows
/// rg + NRG i of a score tile times columns cg DC .. of a [K][D] tile (`a` and
/// `b` already point at row rg and column cg DC).
template <int RM, int DC, int K, int NRG, int LDA, int LDB, int KU>
__device__ __forceinline__ void mm_nn(float (&acc)[RM][DC], const float* a, const float* b) {
#pragma unroll KU
  for (int k = 0; k < K; k += 4) {
    float bv[4][DC];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ld_vec<DC>(b + (k + kk) * LDB, bv[kk]);
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const float4 av = *reinterpret_cast<const float4*>(a + i * NRG * LDA + k);
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        acc[i][c] = fmaf(av.x, bv[0][c], acc[i][c]);
        acc[i][c] = fmaf(av.y, bv[1][c], acc[i][c]);
        acc[i][c] = fmaf(av.z, bv[2][c], acc[i][c]);
        acc[i][c] = fmaf(av.w, bv[3][c], acc[i][c]);
      }
    }
  }
}

// ------------------------------------------------------------------ forward
template <class C, int MINB>
__global__ void __launch_bounds__(C::kThreads, MINB) attn_fwd_f32_kernel(const F32Fwd p) {
  constexpr int D = C::D, RM = C::RM, RN = C::RN, NRG = C::NRG, BM = C::BM, BN = C::BN, DC = C::DC,
                LD = C::LD, LP = C::LP, NT = C::kThreads;
  extern __shared__ __align__(16) float smem_f32[];
  float* qs = smem_f32;      // [BM][LD], scaled by scale * log2 e
  float* ks = qs + BM * LD;  // [BN][LD]
  float* vs = ks + BN * LD;  // [BN][LD]
  float* ps = vs + BN * LD;  // [BM][LP]

  const int64_t bh_count = p.B * p.H, bid = blockIdx.x;
  const int64_t bh = bid % bh_count, tile = p.tiles - 1 - bid / bh_count;  // longest rows first
  const int64_t b = bh / p.H, h = bh % p.H, T = p.T;
  const int64_t q0 = tile * BM;
  const int lane = threadIdx.x & 31, rg = 2 * (threadIdx.x >> 5) + (lane >> 4), cg = lane & 15;
  const float* qg = p.q + b * p.sq.b + h * p.sq.h;
  const float* kg = p.k + b * p.sk.b + (h / p.G) * p.sk.h;  // Note [Grouped-query attention]
  const float* vg = p.v + b * p.sv.b + (h / p.G) * p.sv.h;

  const int64_t kend = q0 + BM < T ? q0 + BM : T;  // keys >= kend are masked for the whole block
  const int nkt = static_cast<int>((kend + BN - 1) / BN);
  load_rows<D, LD, BM, NT>(qs, qg, p.sq.t, q0, T);
  cp_async_commit();
  load_rows<D, LD, BN, NT>(ks, kg, p.sk.t, 0, T);
  cp_async_commit();
  load_rows<D, LD, BN, NT>(vs, vg, p.sv.t, 0, T);
  cp_async_commit();
  cp_async_wait<2>();
  scale_rows<D, LD, BM, NT>(qs, p.scale_log2);

  float o[RM][DC], m[RM], l[RM];
  zero(o);
#pragma unroll
  for (int i = 0; i < RM; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  const float* qa = qs + rg * LD;
  const float* kb = ks + cg * LD;
  float* pr = ps + rg * LP;
  const float* vb = vs + cg * DC;

  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    // In flight here: K(kt), and V(kt) only for kt = 0 (later V tiles are issued below).
    if (kt == 0) {
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // K(kt) visible; every warp is done with V(kt - 1)
    if (kt > 0) {
      load_rows<D, LD, BN, NT>(vs, vg, p.sv.t, k0, T);
      cp_async_commit();
    }
    float s[RM][RN];
    zero(s);
    mm_nt<RM, RN, D, NRG, LD, LD, C::KU>(s, qa, kb);
    __syncthreads();  // every warp is done with K(kt)
    if (kt + 1 < nkt) load_rows<D, LD, BN, NT>(ks, kg, p.sk.t, k0 + BN, T);
    cp_async_commit();

    if (k0 + BN - 1 > q0 || k0 + BN > T) {  // the diagonal tile, or the end of the sequence
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) {
          const int64_t row = q0 + rg + NRG * i, col = k0 + cg + 16 * j;
          if (col > row || col >= T) s[i][j] = -INFINITY;
        }
    }
    // Online softmax in base 2; l holds this thread's part of the row sum.
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      float mx = s[i][0];
#pragma unroll
      for (int j = 1; j < RN; ++j) mx = fmaxf(mx, s[i][j]);
      const float m_new = fmaxf(m[i], group16_max(mx));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = fast_exp2(m[i] - m_use);
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        const float pv = fast_exp2(s[i][j] - m_use);
        sum += pv;
        pr[i * NRG * LP + cg + 16 * j] = pv;
      }
      l[i] = fmaf(l[i], corr, sum);
#pragma unroll
      for (int c = 0; c < DC; ++c) o[i][c] *= corr;
    }
    cp_async_wait<1>();  // V(kt) (K(kt + 1) may still be in flight)
    __syncthreads();     // V(kt) visible to all; this warp's P visible to the warp
    mm_nn<RM, DC, BN, NRG, LP, LD, C::KU>(o, pr, vb);
  }

  float* og = p.o + b * p.so.b + h * p.so.h;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const float lt = group16_sum(l[i]);
    const int64_t row = q0 + rg + NRG * i;
    if (row < T) {
      st_vec<DC>(og + row * p.so.t + cg * DC, o[i], lt > 0.0f ? 1.0f / lt : 0.0f);
      if (p.lse && cg == 0) p.lse[bh * T + row] = (m[i] + log2f(lt)) * kLn2;
    }
  }
}

// ------------------------------------------------------------------ backward: dQ (and Di)
template <class C, int MINB>
__global__ void __launch_bounds__(C::kThreads, MINB) attn_bwd_dq_f32_kernel(const F32Bwd p) {
  constexpr int D = C::D, RM = C::RM, RN = C::RN, NRG = C::NRG, BM = C::BM, BN = C::BN, DC = C::DC,
                LD = C::LD, LP = C::LP, NT = C::kThreads;
  extern __shared__ __align__(16) float smem_f32[];
  float* qs = smem_f32;          // [BM][LD], scaled by scale * log2 e
  float* dos = qs + BM * LD;     // [BM][LD]
  float* ks = dos + BM * LD;     // [BN][LD]
  float* vs = ks + BN * LD;      // [BN][LD]
  float* dss = vs + BN * LD;     // [BM][LP]
  float* lse_s = dss + BM * LP;  // [BM], times log2 e
  float* di_s = lse_s + BM;      // [BM]

  const int64_t bh_count = p.B * p.H, bid = blockIdx.x;
  const int64_t bh = bid % bh_count, tile = p.tiles - 1 - bid / bh_count;  // longest rows first
  const int64_t b = bh / p.H, h = bh % p.H, T = p.T;
  const int64_t q0 = tile * BM;
  const int lane = threadIdx.x & 31, rg = 2 * (threadIdx.x >> 5) + (lane >> 4), cg = lane & 15;
  const float* qg = p.q + b * p.sq.b + h * p.sq.h;
  const float* kg = p.k + b * p.sk.b + (h / p.G) * p.sk.h;  // Note [Grouped-query attention]
  const float* vg = p.v + b * p.sv.b + (h / p.G) * p.sv.h;
  const float* dog = p.dout + b * p.sdo.b + h * p.sdo.h;
  const float* og = p.o + b * p.so.b + h * p.so.h;

  const int64_t kend = q0 + BM < T ? q0 + BM : T;
  const int nkt = static_cast<int>((kend + BN - 1) / BN);
  load_rows<D, LD, BM, NT>(qs, qg, p.sq.t, q0, T);
  load_rows<D, LD, BM, NT>(dos, dog, p.sdo.t, q0, T);
  cp_async_commit();
  load_rows<D, LD, BN, NT>(vs, vg, p.sv.t, 0, T);
  cp_async_commit();
  load_rows<D, LD, BN, NT>(ks, kg, p.sk.t, 0, T);
  cp_async_commit();

  // Di = rowsum(dO * O) of this thread's rows (16 lanes a row), for this pass
  // (shared memory) and the dK/dV pass (scratch); lse likewise.
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int64_t row = q0 + rg + NRG * i;
    float acc = 0.0f;
    if (row < T) {
      float ov[DC], dv[DC];
      ld_vec<DC>(og + row * p.so.t + cg * DC, ov);
      ld_vec<DC>(dog + row * p.sdo.t + cg * DC, dv);
#pragma unroll
      for (int c = 0; c < DC; ++c) acc = fmaf(ov[c], dv[c], acc);
    }
    acc = group16_sum(acc);
    if (cg == 0) {
      di_s[rg + NRG * i] = acc;
      lse_s[rg + NRG * i] = row < T ? p.lse[bh * T + row] * kLog2e : 0.0f;
      if (row < T) p.di[bh * T + row] = acc;
    }
  }
  cp_async_wait<2>();
  scale_rows<D, LD, BM, NT>(qs, p.scale_log2);

  float dq[RM][DC];
  zero(dq);
  const float* qa = qs + rg * LD;
  const float* doa = dos + rg * LD;
  const float* kb = ks + cg * LD;
  const float* vb = vs + cg * LD;
  float* dsr = dss + rg * LP;
  const float* kn = ks + cg * DC;

  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BN;
    cp_async_wait<1>();  // in flight here: V(kt), K(kt); wait for V(kt)
    __syncthreads();     // V(kt) visible (and Q, dO, lse, Di on the first tile)
    float dp[RM][RN];
    zero(dp);
    mm_nt<RM, RN, D, NRG, LD, LD, C::KU>(dp, doa, vb);
    cp_async_wait<0>();  // K(kt)
    __syncthreads();     // K(kt) visible; every warp is done with V(kt)
    if (kt + 1 < nkt) load_rows<D, LD, BN, NT>(vs, vg, p.sv.t, k0 + BN, T);
    cp_async_commit();
    float s[RM][RN];
    zero(s);
    mm_nt<RM, RN, D, NRG, LD, LD, C::KU>(s, qa, kb);
    const bool need_mask = k0 + BN - 1 > q0 || k0 + BN > T;
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const float lse2 = lse_s[rg + NRG * i], dii = di_s[rg + NRG * i];
      const int64_t row = q0 + rg + NRG * i;
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        float pv = fast_exp2(s[i][j] - lse2);
        if (need_mask) {
          const int64_t col = k0 + cg + 16 * j;
          if (col > row || col >= T) pv = 0.0f;
        }
        dsr[i * NRG * LP + cg + 16 * j] = pv * (dp[i][j] - dii);
      }
    }
    __syncwarp();  // dS rows of this row group are read back by the same warp only
    mm_nn<RM, DC, BN, NRG, LP, LD, C::KU>(dq, dsr, kn);
    __syncthreads();  // every warp is done with K(kt) (and its dS)
    if (kt + 1 < nkt) load_rows<D, LD, BN, NT>(ks, kg, p.sk.t, k0 + BN, T);
    cp_async_commit();
  }

  float* dqg = p.dq + b * p.sdq.b + h * p.sdq.h;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int64_t row = q0 + rg + NRG * i;
    if (row < T) st_vec<DC>(dqg + row * p.sdq.t + cg * DC, dq[i], p.scale);
  }
}

// ------------------------------------------------------------------ backward: dK, dV
// Here the block's rows are BM keys and the streamed tiles are BN queries.
template <class C, int MINB, bool kStoreDs>
__global__ void __launch_bounds__(C::kThreads, MINB)
    attn_bwd_dkdv_f32_kernel(const F32Bwd p, const DsSpan span) {
  constexpr int D = C::D, RM = C::RM, RN = C::RN, NRG = C::NRG, BM = C::BM, BN = C::BN, DC = C::DC,
                LD = C::LD, LP = C::LP, NT = C::kThreads;
  extern __shared__ __align__(16) float smem_f32[];
  float* ks = smem_f32;           // [BM][LD], scaled by scale * log2 e
  float* vs = ks + BM * LD;       // [BM][LD]
  float* qs = vs + BM * LD;       // [BN][LD]
  float* dos = qs + BN * LD;      // [BN][LD]
  float* pts = dos + BN * LD;     // [BM][LP]  P^T
  float* dsts = pts + BM * LP;    // [BM][LP]  dS^T
  float* lse_s = dsts + BM * LP;  // [BN]
  float* di_s = lse_s + BN;       // [BN]

  const int64_t bid = blockIdx.x;
  const int64_t bhk = span.first + bid % span.count,
                tile = bid / span.count;  // first key tiles see the most queries
  const int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv, T = p.T;
  const int64_t k0 = tile * BM;
  const int lane = threadIdx.x & 31, rg = 2 * (threadIdx.x >> 5) + (lane >> 4), cg = lane & 15;
  const float* kg = p.k + b * p.sk.b + hk * p.sk.h;
  const float* vg = p.v + b * p.sv.b + hk * p.sv.h;

  // The loops walk the query tiles qt0 .. nqt - 1 of each query head of the
  // group in order (Note [Grouped-query attention]): dK and dV sum over them
  // in the same registers. Query tiles before qt0 see none of the keys.
  // qg, dog, lse_g, di_g point at the head of the next tile to load.
  const int64_t h0 = hk * p.G, bh0 = b * p.H + h0;
  const float* qg = p.q + b * p.sq.b + h0 * p.sq.h;
  const float* dog = p.dout + b * p.sdo.b + h0 * p.sdo.h;
  const float* lse_g = p.lse + bh0 * T;
  const float* di_g = p.di + bh0 * T;

  const int64_t qt0 = k0 / BN, nqt = (T + BN - 1) / BN;
  load_rows<D, LD, BM, NT>(ks, kg, p.sk.t, k0, T);
  load_rows<D, LD, BM, NT>(vs, vg, p.sv.t, k0, T);
  cp_async_commit();
  load_rows<D, LD, BN, NT>(qs, qg, p.sq.t, qt0 * BN, T);
  load_floats<BN, NT>(lse_s, lse_g, qt0 * BN, T);
  load_floats<BN, NT>(di_s, di_g, qt0 * BN, T);
  cp_async_commit();
  load_rows<D, LD, BN, NT>(dos, dog, p.sdo.t, qt0 * BN, T);
  cp_async_commit();
  cp_async_wait<2>();
  scale_rows<D, LD, BM, NT>(ks, p.scale_log2);

  float dk[RM][DC], dv[RM][DC];
  zero(dk);
  zero(dv);
  const float* ka = ks + rg * LD;
  const float* va = vs + rg * LD;
  const float* qb = qs + cg * LD;
  const float* dob = dos + cg * LD;
  float* ptr = pts + rg * LP;
  float* dstr = dsts + rg * LP;
  const float* qn = qs + cg * DC;
  const float* don = dos + cg * DC;

  for (int64_t gh = 0; gh < p.G; ++gh)
    for (int64_t qt = qt0; qt < nqt; ++qt) {
      const int64_t qq0 = qt * BN;
      // The next tile: qt + 1 of this head, or the next head's first (r1).
      const bool more = qt + 1 < nqt || gh + 1 < p.G, next_head = qt + 1 == nqt;
      const int64_t r1 = next_head ? qt0 * BN : qq0 + BN;
      cp_async_wait<1>();  // in flight here: Q(qt) (+ lse, Di), dO(qt); wait for Q(qt)
      __syncthreads();     // Q(qt), lse, Di visible (and K, V on the first tile)
      float st[RM][RN];
      zero(st);
      mm_nt<RM, RN, D, NRG, LD, LD, C::KU>(st, ka, qb);
      cp_async_wait<0>();  // dO(qt)
      __syncthreads();
      float dpt[RM][RN];
      zero(dpt);
      mm_nt<RM, RN, D, NRG, LD, LD, C::KU>(dpt, va, dob);
      const bool need_mask = qq0 < k0 + BM - 1 || qq0 + BN > T;
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        const float lse2 = lse_s[cg + 16 * j] * kLog2e, dij = di_s[cg + 16 * j];
        const int64_t qi = qq0 + cg + 16 * j;
#pragma unroll
        for (int i = 0; i < RM; ++i) {
          float pv = fast_exp2(st[i][j] - lse2);
          if (need_mask) {
            const int64_t key = k0 + rg + NRG * i;
            if (qi < key || qi >= T) pv = 0.0f;
          }
          ptr[i * NRG * LP + cg + 16 * j] = pv;
          dstr[i * NRG * LP + cg + 16 * j] = pv * (dpt[i][j] - dij);
        }
      }
      __syncwarp();              // P^T, dS^T rows of this row group are read back by the same warp only
      if constexpr (kStoreDs) {  // this row group's rows of the dS^T tile, 16 bytes a lane
        static_assert(BM == kDsTile && BN == kDsTile, "the dS tiles are the blocks' tiles");
        float* dst = span.ds + ((bhk - span.first) * p.G + gh) * ds_head_floats(T) + ds_tile_offset(qt, tile);
#pragma unroll
        for (int i = 0; i < RM; ++i)
          *reinterpret_cast<float4*>(dst + (rg + NRG * i) * kDsTile + 4 * cg) =
              *reinterpret_cast<const float4*>(dstr + i * NRG * LP + 4 * cg);
      }
      mm_nn<RM, DC, BN, NRG, LP, LD, C::KU>(dk, dstr, qn);
      __syncthreads();  // every warp is done with Q(qt), lse, Di
      if (more) {
        if (next_head) qg += p.sq.h, lse_g += T, di_g += T;
        load_rows<D, LD, BN, NT>(qs, qg, p.sq.t, r1, T);
        load_floats<BN, NT>(lse_s, lse_g, r1, T);
        load_floats<BN, NT>(di_s, di_g, r1, T);
      }
      cp_async_commit();
      mm_nn<RM, DC, BN, NRG, LP, LD, C::KU>(dv, ptr, don);
      __syncthreads();  // every warp is done with dO(qt)
      if (more) {
        if (next_head) dog += p.sdo.h;
        load_rows<D, LD, BN, NT>(dos, dog, p.sdo.t, r1, T);
      }
      cp_async_commit();
    }

  float* dkg = p.dk + b * p.sdk.b + hk * p.sdk.h;
  float* dvg = p.dv + b * p.sdv.b + hk * p.sdv.h;
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int64_t key = k0 + rg + NRG * i;
    if (key < T) {
      st_vec<DC>(dkg + key * p.sdk.t + cg * DC, dk[i], p.scale);
      st_vec<DC>(dvg + key * p.sdv.t + cg * DC, dv[i], 1.0f);
    }
  }
}

// ------------------------------------------------------------------ backward through dS in memory
// Note [dS through memory in fp32]
// The recomputing backward above multiplies seven products where the
// backward needs five: its dQ pass recomputes S = Q K^T and dP = dO V^T to
// rebuild the dS that the dK/dV pass also builds. In strict fp32 the
// products are FFMA work, so the second dS costs more than moving the first
// through memory. This backward runs three passes:
//   Di = rowsum(dO * O), 16 lanes a row (the same sum as the dQ pass's);
//   the dK/dV pass, which also stores each 64 x 64 dS^T tile it computes
//     (keys by queries, 16 bytes a lane from the tile in shared memory);
//   the dQ pass, dQ = dS K summed over the key tiles in order (Note [The
//     dQ pass as a GEMM over dS^T]).
// It is deterministic but not the recomputing backward's bits: its dS comes
// from S^T = K' Q^T (K scaled) where the dQ pass had S = Q' K^T (Q scaled).
// The tiles take ds_head_floats(T) floats a query head, about 2 T^2 bytes
// (2.2 MB at T = 1024): the backward's scratch holds the tiles of as many
// key/value heads (each with its G query heads) as fit, at most kDsMiB, and
// the passes run span by span. When one head's tiles do not fit (T above
// about 11K at G = 1), the recomputing backward runs.

/// Di = rowsum(dO * O) for every query row, 16 lanes a row (DC floats a lane:
/// the dQ pass's arithmetic).
template <int DC>
__global__ void __launch_bounds__(256) attn_bwd_di_f32_kernel(const F32Bwd p) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 16;
  const int cg = threadIdx.x & 15;
  const int64_t rows = p.B * p.H * p.T, bh = row / p.T, t = row % p.T, b = bh / p.H, h = bh % p.H;
  float acc = 0.0f;
  if (row < rows) {
    float ov[DC], dv[DC];
    ld_vec<DC>(p.o + b * p.so.b + h * p.so.h + t * p.so.t + cg * DC, ov);
    ld_vec<DC>(p.dout + b * p.sdo.b + h * p.sdo.h + t * p.sdo.t + cg * DC, dv);
#pragma unroll
    for (int c = 0; c < DC; ++c) acc = fmaf(ov[c], dv[c], acc);
  }
  acc = group16_sum(acc);  // every lane takes part: rows past the end add zeros
  if (row < rows && cg == 0) p.di[row] = acc;
}

// Note [The dQ pass as a GEMM over dS^T]
// dQ(64 queries x D) = sum over key tiles kt of dS(queries x keys) K(kt) is a
// plain GEMM whose A operand is stored transposed: the dK/dV pass writes
// dS^T tiles, keys by queries. Read as an outer product over k (the keys),
// both operands are rows of what is stored: dS^T row k holds the 64 queries'
// values, K row k the D columns. So each tile goes to shared memory as it
// lies, by 16-byte cp.async, double-buffered with K's tile, with one barrier
// pair a tile. Thread (qg, cg) owns queries 8 qg .. 8 qg + 7 and columns
// DC cg ..: per key, two float4 loads of dS^T (one wavefront: the warp's two
// row groups read two 32-byte runs) and one of K for 8 DC FFMAs. Each dQ
// element is the same fmaf chain as before -- keys in order within a tile,
// tiles in order -- so the bits did not change.
//   The form it replaces loaded each dS^T tile into registers (32 of them)
// and transposed it into shared memory for the row-major product of the
// other passes: 184 registers, two blocks an SM, 46% of the FMA pipe's
// cycles and 482 us a layer at B 16, H 12, T 1024, D 64 on an H200. This
// one: 141 registers, three blocks an SM, 64.5% and 359 us.
/// The dQ pass over the dK/dV pass's dS tiles, per (query head of the span,
/// 64 queries): dQ = scale sum over key tiles of dS K, as an outer-product
/// GEMM straight from the stored dS^T tiles (Note [The dQ pass as a GEMM over
/// dS^T]).
template <class C, int MINB>
__global__ void __launch_bounds__(C::kThreads, MINB)
    attn_bwd_dq_from_ds_f32_kernel(const F32Bwd p, const DsSpan span) {
  constexpr int D = C::D, BM = C::BM, BN = C::BN, DC = C::DC, LD = C::LD, NT = C::kThreads;
  constexpr int RQ = BM * D / DC / NT;  // queries a thread owns (8: 64 queries by 16 column groups)
  static_assert(BM == kDsTile && BN == kDsTile && RQ == 8 && NT == 128, "64 x 64 dS tiles, 128 threads");
  constexpr int kTile = kDsTile * kDsTile;
  extern __shared__ __align__(16) float smem_f32[];
  float* dss = smem_f32;        // [2][BN keys][BM queries]: dS^T(kt) and dS^T(kt + 1)
  float* ks = dss + 2 * kTile;  // [2][BN][LD]: K(kt) and K(kt + 1)

  const int64_t heads = span.count * p.G, bid = blockIdx.x;
  const int64_t local = bid % heads, tile = p.tiles - 1 - bid / heads;  // longest rows first
  const int64_t bhk = span.first + local / p.G, b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const int64_t h = hk * p.G + local % p.G, T = p.T, q0 = tile * BM;
  const int qg = threadIdx.x >> 4, cg = threadIdx.x & 15;  // queries RQ qg .., columns DC cg ..
  const float* kg = p.k + b * p.sk.b + hk * p.sk.h;
  const float* dsg = span.ds + local * ds_head_floats(T) + ds_tile_offset(tile, 0);

  const int64_t kend = q0 + BM < T ? q0 + BM : T;
  const int nkt = static_cast<int>((kend + BN - 1) / BN);
  auto fetch = [&](int kt) {  // dS^T(kt) and K(kt) into buffer kt & 1
    float* d = dss + (kt & 1) * kTile;
    const float* g = dsg + static_cast<int64_t>(kt) * kTile;
#pragma unroll
    for (int u = 0; u < kTile / 4 / NT; ++u) {
      const int i = u * NT + static_cast<int>(threadIdx.x);
      cp_async16(smem_u32(d + 4 * i), g + 4 * i, true);
    }
    load_rows<D, LD, BN, NT>(ks + (kt & 1) * BN * LD, kg, p.sk.t, static_cast<int64_t>(kt) * BN, T);
    cp_async_commit();
  };
  fetch(0);
  float dq[RQ][DC];
  zero(dq);
  for (int kt = 0; kt < nkt; ++kt) {
    if (kt + 1 < nkt) {
      fetch(kt + 1);
      cp_async_wait<1>();  // tile kt; tile kt + 1 may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt visible
    const float* a = dss + (kt & 1) * kTile + RQ * qg;
    const float* bk = ks + (kt & 1) * BN * LD + DC * cg;
#pragma unroll 8
    for (int k = 0; k < BN; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(a + k * BM),
                   a1 = *reinterpret_cast<const float4*>(a + k * BM + 4);
      const float av[RQ] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      float bv[DC];
      ld_vec<DC>(bk + k * LD, bv);
#pragma unroll
      for (int i = 0; i < RQ; ++i)
#pragma unroll
        for (int c = 0; c < DC; ++c) dq[i][c] = fmaf(av[i], bv[c], dq[i][c]);
    }
    __syncthreads();  // every warp is done with buffer kt & 1 before fetch(kt + 2) refills it
  }

  float* dqg = p.dq + b * p.sdq.b + h * p.sdq.h;
#pragma unroll
  for (int i = 0; i < RQ; ++i) {
    const int64_t row = q0 + RQ * qg + i;
    if (row < T) st_vec<DC>(dqg + row * p.sdq.t + cg * DC, dq[i], p.scale);
  }
}

// ------------------------------------------------------------------ host side
template <class C, int MINB>
void launch_fwd(const AttnForward& a, cudaStream_t stream) {
  F32Fwd p = fwd_params<float>(a);
  p.tiles = ceil_div(p.T, C::BM);
  // Q, K, V, P (the kernel's shared-memory layout)
  constexpr size_t smem = sizeof(float) * (C::BM * C::LD + 2 * C::BN * C::LD + C::BM * C::LP);
  launch(attn_fwd_f32_kernel<C, MINB>, blocks_for(a.shape, a.shape.H, p.tiles, "attention_forward"),
         C::kThreads, smem, stream, p);
}

template <class C, int MINB>
void launch_dq(F32Bwd p, const AttnShape& s, cudaStream_t stream) {
  p.tiles = ceil_div(p.T, C::BM);
  // Q, dO, K, V, dS, lse, Di
  constexpr size_t smem = sizeof(float) * (2 * C::BM * C::LD + 2 * C::BN * C::LD + C::BM * C::LP + 2 * C::BM);
  launch(attn_bwd_dq_f32_kernel<C, MINB>, blocks_for(s, s.H, p.tiles, "attention_backward"), C::kThreads,
         smem, stream, p);
}

/// Blocks for `tiles` tiles of each of `heads` heads, checked.
unsigned span_blocks(int64_t heads, int64_t tiles) {
  BT_CHECK(heads * tiles > 0 && heads * tiles < INT_MAX, "cuda attention_backward: too many blocks (", heads,
           " heads of ", tiles, " tiles)");
  return static_cast<unsigned>(heads * tiles);
}

/// The dK/dV pass over the key/value heads of `span` (storing its dS^T tiles when span.ds is set).
template <class C, int MINB>
void launch_dkdv(F32Bwd p, const DsSpan& span, cudaStream_t stream) {
  p.tiles = ceil_div(p.T, C::BM);
  // K, V, Q, dO, P^T, dS^T, lse, Di
  constexpr size_t smem =
      sizeof(float) * (2 * C::BM * C::LD + 2 * C::BN * C::LD + 2 * C::BM * C::LP + 2 * C::BN);
  const unsigned blocks = span_blocks(span.count, p.tiles);
  if (span.ds)
    launch(attn_bwd_dkdv_f32_kernel<C, MINB, true>, blocks, C::kThreads, smem, stream, p, span);
  else
    launch(attn_bwd_dkdv_f32_kernel<C, MINB, false>, blocks, C::kThreads, smem, stream, p, span);
}

template <class C>
void launch_di(const F32Bwd& p, cudaStream_t stream) {
  const int64_t threads = p.B * p.H * p.T * 16;
  BT_CHECK(threads / 256 < INT_MAX, "cuda attention_backward: too many rows");
  launch(attn_bwd_di_f32_kernel<C::DC>, static_cast<unsigned>(ceil_div(threads, 256)), 256, 0, stream, p);
}

/// Blocks of the dQ pass over dS per SM: its shared memory holds three.
constexpr int kDqFromDsBlocks = 3;

template <class C>
void launch_dq_from_ds(F32Bwd p, const DsSpan& span, cudaStream_t stream) {
  p.tiles = ceil_div(p.T, C::BM);
  constexpr size_t smem = sizeof(float) * 2 * (kDsTile * kDsTile + C::BN * C::LD);  // dS^T, K; twice
  launch(attn_bwd_dq_from_ds_f32_kernel<C, kDqFromDsBlocks>, span_blocks(span.count * p.G, p.tiles),
         C::kThreads, smem, stream, p, span);
}

/// The backward of configuration C: through dS in memory, span by span, when
/// the scratch after Di holds one key/value head's tiles, else recomputing.
template <class C, int MINB>
void run_backward(const AttnBackward& a, float* scratch, size_t scratch_floats, cudaStream_t stream) {
  const F32Bwd p = bwd_params<float>(a, scratch);
  const int64_t heads = p.B * p.Hkv, per_head = p.G * ds_head_floats(p.T);
  const int64_t di = ds_offset_floats(a.shape);
  const int64_t fit =
      static_cast<int64_t>(scratch_floats) > di ? (static_cast<int64_t>(scratch_floats) - di) / per_head : 0;
  if (fit < 1) {  // The dQ pass goes first: it also writes Di, which the dK/dV pass reads.
    launch_dq<C, MINB>(p, a.shape, stream);
    launch_dkdv<C, MINB>(p, {0, heads, nullptr}, stream);
    return;
  }
  launch_di<C>(p, stream);
  for (int64_t first = 0; first < heads; first += fit) {
    const DsSpan span{first, std::min(fit, heads - first), scratch + di};
    launch_dkdv<C, MINB>(p, span, stream);
    launch_dq_from_ds<C>(p, span, stream);
  }
}

// Configurations <D, RM, RN, NW, KU> and resident blocks per SM, picked by
// timing variants on an H100 at B 16, H 12, T 1024, D 64 (fused qkv); these
// asking for more blocks spill registers. Also measured and not faster: 256
// threads with RM = 4; RN = 2; and skipping the masked column groups of the
// diagonal tile warp by warp (the block then waits at its barriers for the
// warp whose rows see the whole tile).
using Fwd64 = Cfg<64, 8, 4, 4, 4>;
constexpr int kFwd64Blocks = 2;
using Bwd64 = Cfg<64, 8, 4, 4, 4>;  // both passes, 2 blocks per SM
using Fwd32 = Cfg<32, 8, 4, 4, 1>;
constexpr int kFwd32Blocks = 3;
using Bwd32 = Cfg<32, 8, 4, 4, 2>;

}  // namespace

void attention_forward_f32(const AttnForward& a, cudaStream_t stream) {
  switch (a.shape.D) {
    case 32:
      launch_fwd<Fwd32, kFwd32Blocks>(a, stream);
      return;
    case 64:
      launch_fwd<Fwd64, kFwd64Blocks>(a, stream);
      return;
    default:
      BT_ASSERT(false, "attention_forward_f32: unsupported D ", a.shape.D);
  }
}

size_t attention_backward_f32_scratch_floats(const AttnShape& s) {
  const int64_t di = ds_offset_floats(s), heads = s.B * s.kv_heads(),
                per_head = s.group() * ds_head_floats(s.T);
  const int64_t most = static_cast<int64_t>(kDsMiB << 20) / static_cast<int64_t>(sizeof(float));
  if (heads <= 0 || per_head <= 0 || per_head > most) return 0;
  return static_cast<size_t>(di + std::min(heads, most / per_head) * per_head);
}

void attention_backward_f32(const AttnBackward& a, float* scratch, size_t scratch_floats,
                            cudaStream_t stream) {
  switch (a.shape.D) {
    case 32:
      run_backward<Bwd32, 2>(a, scratch, scratch_floats, stream);
      return;
    case 64:
      run_backward<Bwd64, 2>(a, scratch, scratch_floats, stream);
      return;
    default:
      BT_ASSERT(false, "attention_backward_f32: unsupported D ", a.shape.D);
  }
}

}  // namespace bt::kernels::cuda::detail
