// CUDA LayerNorm over the last dim of [rows, cols], one warp per row.
//
// Fast path (cols % V == 0, V = 16 / sizeof(T), 16-byte aligned pointers, and the
// row fits in K <= 16 packs per lane): the row is loaded once with 16-byte loads
// and kept in registers; mean and variance are two exact passes over registers.
// Otherwise a scalar warp-per-row path reads the row three times.
//
// Parameters: w and b in the activations' dtype, or f32 under bf16 (each
// lane's V values are then two 16-byte loads); dw and db likewise.
// With a residual (Note [Residual into LayerNorm] in kernels/layernorm.h) the
// fast path loads x and r, writes s = x + r rounded and keeps s in the
// registers the plain forward loads x into; the scalar path writes s and
// The path is chosen on s, y, w and b as the plain forward chooses it on its
// x, y, w and b, so a recompute from s takes the same one. Where that is the
// scalar path, or x or r is misaligned, s is first written by its own pass
// and the plain forward reads it.
//
// Backward: dx per row as in the forward; dw/db are deterministic: warp w of
// W = min(rows, kMaxPartials) warps handles rows w, w + W, ... and keeps its
// partial sums (the fast path in shared memory: Note [LayerNorm backward
// partials in shared memory]). The fast path adds the 8 warps of a block in a
// fixed tree and writes one partial row per block to scratch[P][cols] (dw)
// and scratch[P][cols] (db), P = ceil(W / 8); the scalar path writes one per
// warp (P = W). A second kernel (one launch for dw and db) adds the P
// partials of each column in a fixed order. P depends only on rows and the
// path, so the result does not depend on the GPU either. (Per-block partials:
// 8x less scratch traffic than per-warp ones, whose write and re-read cost as
// much as the rest of the pass.) dsum, the column sums of dx as written (Note
// [A bias into the residual add]), is a third partial sum kept the same way.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/layernorm.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;
constexpr int64_t kMaxPartials = 2048;

template <typename T>
__device__ __forceinline__ void unpack(const Pack<T, kVec16<T>>& p, float* out) {
#pragma unroll
  for (int j = 0; j < kVec16<T>; ++j) out[j] = to_float(p.v[j]);
}

/// The V parameters of vector vi (elements vi * V ...) as floats, in 16-byte
/// loads of W (one for W = T, two for f32 parameters of bf16 activations);
/// all ones (or zeros) when p is null.
template <typename W, int V>
__device__ __forceinline__ void load_params(const W* p, int vi, float* out, float absent) {
  constexpr int PV = kVec16<W>;
  static_assert(V % PV == 0, "parameters no narrower than the activations");
  if (p == nullptr) {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = absent;
    return;
  }
  const Pack<W, PV>* pp = reinterpret_cast<const Pack<W, PV>*>(p) + static_cast<int64_t>(vi) * (V / PV);
#pragma unroll
  for (int q = 0; q < V / PV; ++q) {
    const Pack<W, PV> pk = pp[q];
#pragma unroll
    for (int j = 0; j < PV; ++j) out[q * PV + j] = to_float(pk.v[j]);
  }
}

// ------------------------------------------------------------------ forward
/// R rows per warp, each held in registers as K raw 16-byte packs per lane (raw
/// packs halve the registers for bf16); all loads of the R rows are issued before
/// the first reduction, so a warp keeps R * K * 512 bytes in flight. With res,
/// the packs hold s = x + res (+ rb) (written to s) instead of x.
template <typename T, typename W, int K, int R>
__global__ void __launch_bounds__(kThreads)
    ln_fwd_fast_kernel(const T* __restrict__ x, const T* __restrict__ res, int64_t res_rows,
                       const W* __restrict__ rb, const W* __restrict__ w, const W* __restrict__ b,
                       T* __restrict__ s, T* __restrict__ y, float* __restrict__ mean,
                       float* __restrict__ rstd, int64_t rows, int cols, float eps) {
  constexpr int V = kVec16<T>;
  using P = Pack<T, V>;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= rows) return;
  const int nvec = cols / V;
  P raw[R][K];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const P* px = reinterpret_cast<const P*>(x + (row0 + r) * cols);
    const P* pr = res ? reinterpret_cast<const P*>(res + ((row0 + r) % res_rows) * cols) : nullptr;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int vi = lane + k * 32;
      if (row0 + r < rows && vi < nvec) {
        raw[r][k] = px[vi];
        if (res) {
          const P rv = pr[vi];
          if (rb) {
            float bv[V];
            load_params<W, V>(rb, vi, bv, 0.0f);
#pragma unroll
            for (int j = 0; j < V; ++j)
              raw[r][k].v[j] = from_float<T>(to_float(raw[r][k].v[j]) + (to_float(rv.v[j]) + bv[j]));
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j)
              raw[r][k].v[j] = from_float<T>(to_float(raw[r][k].v[j]) + to_float(rv.v[j]));
          }
          reinterpret_cast<P*>(s + (row0 + r) * cols)[vi] = raw[r][k];
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) raw[r][k].v[j] = from_float<T>(0.0f);
      }
    }
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  float mu[R], rs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) sum += to_float(raw[r][k].v[j]);
    mu[r] = warp_sum(sum) / static_cast<float>(cols);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (lane + k * 32 < nvec) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = to_float(raw[r][k].v[j]) - mu[r];
          sq += d * d;
        }
      }
    }
    rs[r] = 1.0f / sqrtf(warp_sum(sq) * inv_cols + eps);
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int vi = lane + k * 32;
    if (vi < nvec) {
      float wv[V], bv[V];
      load_params<W, V>(w, vi, wv, 1.0f);
      load_params<W, V>(b, vi, bv, 0.0f);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (row0 + r < rows) {
          P out;
#pragma unroll
          for (int j = 0; j < V; ++j)
            out.v[j] = from_float<T>((to_float(raw[r][k].v[j]) - mu[r]) * rs[r] * wv[j] + bv[j]);
          reinterpret_cast<P*>(y + (row0 + r) * cols)[vi] = out;
        }
      }
    }
  }
  if (lane < R && row0 + lane < rows) {
    // Lane r writes row r's statistics (compile-time indexing through a select chain).
    float m = mu[0], s = rs[0];
#pragma unroll
    for (int r = 1; r < R; ++r)
      if (lane == r) m = mu[r], s = rs[r];
    if (mean) mean[row0 + lane] = m;
    if (rstd) rstd[row0 + lane] = s;
  }
}

template <typename T, typename W>
__global__ void __launch_bounds__(kThreads)
    ln_fwd_generic_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                          T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                          int64_t cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* px = x + row * cols;
  float sum = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) sum += ldf(px + j);
  const float mu = warp_sum(sum) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) {
    const float d = ldf(px + j) - mu;
    sq += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(cols) + eps);
  T* py = y + row * cols;
  for (int64_t j = lane; j < cols; j += 32) {
    const float wv = w ? ldf(w + j) : 1.0f, bv = b ? ldf(b + j) : 0.0f;
    stf(py + j, (ldf(px + j) - mu) * rs * wv + bv);
  }
  if (lane == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

/// s = x + res (res row i % res_rows) (+ rb, column i % cols), elementwise:
/// the residual's own pass where the fast forward cannot take it.
template <typename T, typename W>
__global__ void residual_add_kernel(const T* __restrict__ x, const T* __restrict__ res, int64_t res_rows,
                                    const W* __restrict__ rb, T* __restrict__ s, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols, rn = res_rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    stf(s + i, rb ? ldf(x + i) + (ldf(res + i % rn) + ldf(rb + i % cols)) : ldf(x + i) + ldf(res + i % rn));
}

// ------------------------------------------------------------------ backward
// Note [LayerNorm backward partials in shared memory]
// The fast backward's warps each walk rows gw, gw + W, ... (W = the number of
// warps, a function of rows only), and each keeps its running dw and db
// partial sums. Those 2 x V x K floats a lane (48 for 768 columns) used to
// live in registers, with the row's loads unpacked twice around the row's two
// sums: 103 registers at 768 bf16 columns, one row of x and dy in flight per
// warp, and dres read after the sums. The partials now live in shared
// memory, laid out float4-per-lane so that each lane's read-modify-write is
// conflict-free, and the registers hold the row itself: x, dy and dres as raw
// 16-byte packs, loaded once. Where K is small (the packs of two rows fit), the next row's
// packs are loaded before this row's sums, so two rows are in flight per warp.
// The arithmetic and its order are those of the register version (each
// warp's partial still adds its rows in order, and the block's 8 warps still
// add in the fixed tree 4..7 into 0..3, 2..3 into 0..1, 1 into 0), so the
// bits did not change (GPT-2's bf16 run gave the same last loss). Measured
// on an H200 against the register version in the same call: GPT-2 124M's
// shape (16384 x 768 bf16 with dres) 0.598x -> 0.834x the copy bandwidth,
// 256 MiB 0.539x -> 0.913x (f32: 0.704x -> 0.937x); 128 registers at 768
// bf16 columns, two blocks of 8 warps per SM.

/// Hides v's value from the optimizer (no instruction): what is computed from
/// it after this point is computed again, not kept in registers from before.
template <typename P>
__device__ __forceinline__ void opaque(P& p) {
  static_assert(sizeof(P) == 16, "a 16-byte pack");
  uint32_t* u = reinterpret_cast<uint32_t*>(&p);
  asm volatile("" : "+r"(u[0]), "+r"(u[1]), "+r"(u[2]), "+r"(u[3]));
}
template <typename W>
__device__ __forceinline__ const W* opaque_ptr(const W* p) {
  asm volatile("" : "+l"(p));
  return p;
}

/// The packs of one row a lane holds: x, dy and dres (unused without dres).
template <typename T, int K>
struct LnBwdRow {
  Pack<T, kVec16<T>> x[K], dy[K], dres[K];
  float mean, rstd;
};

template <typename T, int K>
__device__ __forceinline__ void load_ln_bwd_row(LnBwdRow<T, K>& r, const T* __restrict__ x,
                                                const T* __restrict__ dy, const T* __restrict__ dres,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int64_t row, int cols,
                                                int lane) {
  using P = Pack<T, kVec16<T>>;
  const int nvec = cols / kVec16<T>;
  const P* px = reinterpret_cast<const P*>(x + row * cols);
  const P* pdy = reinterpret_cast<const P*>(dy + row * cols);
  const P* pdr = dres ? reinterpret_cast<const P*>(dres + row * cols) : nullptr;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int vi = lane + k * 32;
    if (vi < nvec) {
      r.x[k] = px[vi];
      r.dy[k] = pdy[vi];
      if (pdr) r.dres[k] = pdr[vi];
    }
  }
  r.mean = mean[row];
  r.rstd = rstd[row];
}

/// Warp `gw` (global warp index) handles rows gw, gw + W, ...; dx (+ dres) is
/// written per row, and the block's dw/db (and dsum: pds not null) partial
/// rows go to scratch row blockIdx.x. Dynamic shared memory: (2 or 3) x
/// kWarpsPerBlock x K x 32 x V floats. Note [LayerNorm backward partials in
/// shared memory].
template <typename T, typename W, int K, bool kPrefetch>
__global__ void __launch_bounds__(kThreads)
    ln_bwd_fast_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                       const float* __restrict__ mean, const float* __restrict__ rstd,
                       const T* __restrict__ dres, T* __restrict__ dx, float* __restrict__ pdw,
                       float* __restrict__ pdb, float* __restrict__ pds, int64_t rows, int cols,
                       int64_t nwarps) {
  constexpr int V = kVec16<T>;
  constexpr int Q = V / 4;            // float4s per pack
  constexpr int kSlots = K * Q * 32;  // float4s per warp and sum
  using P = Pack<T, V>;
  extern __shared__ __align__(16) float4 ln_bwd_acc[];  // [dw, db, dsum][warp][k][q][lane]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nsums = pds ? 3 : 2;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  const int nvec = cols / V;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  // Slot (k, q) of warp w's sum: conflict-free float4 accesses across the lanes.
  auto slot = [&](int sum, int w_, int k, int q) -> float4& {
    return ln_bwd_acc[(sum * kWarpsPerBlock + w_) * kSlots + (k * Q + q) * 32 + lane];
  };
  for (int sum = 0; sum < nsums; ++sum)
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int q = 0; q < Q; ++q) slot(sum, warp, k, q) = make_float4(0.f, 0.f, 0.f, 0.f);

  LnBwdRow<T, K> cur, next;
  // Warps past nwarps (the last block's) take no rows but join the block's sums.
  const bool active = gw < nwarps && gw < rows;
  if (active) load_ln_bwd_row(cur, x, dy, dres, mean, rstd, gw, cols, lane);
  for (int64_t row = gw; active && row < rows; row += nwarps) {
    const bool more = row + nwarps < rows;
    if constexpr (kPrefetch) {
      if (more) load_ln_bwd_row(next, x, dy, dres, mean, rstd, row + nwarps, cols, lane);
    }
    const float mu = cur.mean, rs = cur.rstd;
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int vi = lane + k * 32;
      if (vi < nvec) {
        float xv[V], gv[V], wv[V];
        unpack<T>(cur.x[k], xv);
        unpack<T>(cur.dy[k], gv);
        load_params<W, V>(w, vi, wv, 1.0f);
#pragma unroll
        for (int q = 0; q < Q; ++q) {
          float4 aw = pdw ? slot(0, warp, k, q) : float4{}, ab = pdb ? slot(1, warp, k, q) : float4{};
          float* awf = &aw.x;
          float* abf = &ab.x;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int j = q * 4 + i;
            const float xh = (xv[j] - mu) * rs;
            // Rounded product (no FMA contraction), so that dx below subtracts
            // exactly the g that went into s1 (cols == 1 gives dx == 0 exactly).
            const float g = __fmul_rn(gv[j], wv[j]);
            s1 += g;
            s2 += g * xh;
            awf[i] += gv[j] * xh;
            abf[i] += gv[j];
          }
          if (pdw) slot(0, warp, k, q) = aw;
          if (pdb) slot(1, warp, k, q) = ab;
        }
      }
    }
    s1 = warp_sum(s1) * inv_cols;
    s2 = warp_sum(s2) * inv_cols;
    // The second pass converts the packs again and reloads w (from L1): kept
    // from the first pass, the unpacked floats took twice the registers.
    const W* w2 = opaque_ptr(w);
#pragma unroll
    for (int k = 0; k < K; ++k) opaque(cur.x[k]), opaque(cur.dy[k]), opaque(cur.dres[k]);
    if (dx != nullptr) {
      P* pdx = reinterpret_cast<P*>(dx + row * cols);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int vi = lane + k * 32;
        if (vi < nvec) {
          float xv[V], gv[V], wv[V], rv[V];
          unpack<T>(cur.x[k], xv);
          unpack<T>(cur.dy[k], gv);
          load_params<W, V>(w2, vi, wv, 1.0f);
          if (dres) unpack<T>(cur.dres[k], rv);
          P out;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float xh = (xv[j] - mu) * rs;
            const float v = rs * (__fmul_rn(gv[j], wv[j]) - s1 - xh * s2);
            // A rounded add (no FMA with the product): with f32 activations dx is
            // then the bits of the LayerNorm's dx and dres added by their own pass.
            out.v[j] = from_float<T>(dres ? __fadd_rn(v, rv[j]) : v);
          }
          pdx[vi] = out;
          if (pds) {  // dsum: the column sums of dx as written
#pragma unroll
            for (int q = 0; q < Q; ++q) {
              float4 a = slot(2, warp, k, q);
              a.x += to_float(out.v[4 * q]), a.y += to_float(out.v[4 * q + 1]);
              a.z += to_float(out.v[4 * q + 2]), a.w += to_float(out.v[4 * q + 3]);
              slot(2, warp, k, q) = a;
            }
          }
        }
      }
    }
    if (more) {
      if constexpr (kPrefetch)
        cur = next;
      else
        load_ln_bwd_row(cur, x, dy, dres, mean, rstd, row + nwarps, cols, lane);
    }
  }
  // The block's partial row: warps 4..7 add into 0..3, 2..3 into 0..1, 1 into 0
  // (a fixed tree), then warp 0 writes it.
#pragma unroll
  for (int half = kWarpsPerBlock / 2; half >= 1; half /= 2) {
    __syncthreads();
    if (warp < half)
      for (int sum = 0; sum < nsums; ++sum)
#pragma unroll
        for (int k = 0; k < K; ++k)
#pragma unroll
          for (int q = 0; q < Q; ++q) {
            float4& a = slot(sum, warp, k, q);
            const float4 b = slot(sum, warp + half, k, q);
            a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
          }
  }
  if (warp != 0) return;
  for (int sum = 0; sum < nsums; ++sum) {
    float* out = sum == 0 ? pdw : sum == 1 ? pdb : pds;
    if (out == nullptr) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int vi = lane + k * 32;
      if (vi < nvec) {
        float4* o = reinterpret_cast<float4*>(out + static_cast<int64_t>(blockIdx.x) * cols +
                                              static_cast<int64_t>(vi) * V);
#pragma unroll
        for (int q = 0; q < Q; ++q) o[q] = slot(sum, 0, k, q);
      }
    }
  }
}

/// The dynamic shared memory of ln_bwd_fast_kernel<T, *, K> keeping `sums` partial sums.
template <typename T>
size_t ln_bwd_smem_bytes(int k, int sums) {
  return static_cast<size_t>(sums * kWarpsPerBlock * k * 32 * kVec16<T>) * sizeof(float);
}

template <typename T, typename W>
__global__ void __launch_bounds__(kThreads)
    ln_bwd_generic_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                          const float* __restrict__ mean, const float* __restrict__ rstd,
                          const T* __restrict__ dres, T* __restrict__ dx, float* __restrict__ pdw,
                          float* __restrict__ pdb, float* __restrict__ pds, int64_t rows, int64_t cols,
                          int64_t nwarps) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (gw >= nwarps) return;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  float* my_dw = pdw ? pdw + gw * cols : nullptr;
  float* my_db = pdb ? pdb + gw * cols : nullptr;
  float* my_ds = pds ? pds + gw * cols : nullptr;
  for (int64_t row = gw; row < rows; row += nwarps) {
    const bool first = row == gw;
    const T* px = x + row * cols;
    const T* pdy = dy + row * cols;
    const float mu = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = lane; j < cols; j += 32) {
      const float xh = (ldf(px + j) - mu) * rs;
      const float gy = ldf(pdy + j);
      const float g = __fmul_rn(gy, w ? ldf(w + j) : 1.0f);  // rounded: see the fast kernel
      s1 += g;
      s2 += g * xh;
      // Each lane owns columns j of this warp's partial rows: no races.
      if (my_dw) my_dw[j] = first ? gy * xh : my_dw[j] + gy * xh;
      if (my_db) my_db[j] = first ? gy : my_db[j] + gy;
    }
    s1 = warp_sum(s1) * inv_cols;
    s2 = warp_sum(s2) * inv_cols;
    if (dx == nullptr) continue;
    T* pdx = dx + row * cols;
    const T* pdr = dres ? dres + row * cols : nullptr;
    for (int64_t j = lane; j < cols; j += 32) {
      const float xh = (ldf(px + j) - mu) * rs;
      const float g = __fmul_rn(ldf(pdy + j), w ? ldf(w + j) : 1.0f);
      const float v = rs * (g - s1 - xh * s2);
      stf(pdx + j, pdr ? __fadd_rn(v, ldf(pdr + j)) : v);  // rounded: see the fast kernel
      if (my_ds) my_ds[j] = first ? ldf(pdx + j) : my_ds[j] + ldf(pdx + j);
    }
  }
}

/// out[c] = sum over p < nparts of part[p * cols + c], in a fixed order; for
/// dw (blockIdx.y 0: part_w into out_w), db (1) and dsum (2) in one launch,
/// each skipped where its output is null.
template <typename T>
__global__ void ln_partial_reduce_kernel(const float* __restrict__ part_w, const float* __restrict__ part_b,
                                         const float* __restrict__ part_s, int64_t nparts, int64_t cols,
                                         T* __restrict__ out_w, T* __restrict__ out_b,
                                         T* __restrict__ out_s) {
  const float* part = blockIdx.y == 0 ? part_w : blockIdx.y == 1 ? part_b : part_s;
  T* out = blockIdx.y == 0 ? out_w : blockIdx.y == 1 ? out_b : out_s;
  if (out == nullptr) return;
  __shared__ float s[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < cols && threadIdx.y < nparts)
    acc = add_in_order(0.0f, part + threadIdx.y * cols + c, (nparts - threadIdx.y + 7) / 8, 8 * cols);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += s[y][threadIdx.x];
    stf(out + c, t);
  }
}

/// Smallest supported pack count per lane >= need (0 when the row is too long).
int pick_k(int64_t need) {
  constexpr int ks[] = {1, 2, 3, 4, 6, 8, 12, 16};
  for (int k : ks)
    if (need <= k) return k;
  return 0;
}

/// Calls f(integral_constant<K>) for a supported K; false for k == 0 (or a K
/// above kMaxK, which keeps the backward's register-hungry variants out), or
/// when f returns false.
template <int kMaxK, typename F>
bool with_k(int k, F&& f) {
  auto call = [&](auto kc) {
    if constexpr (decltype(kc)::value > kMaxK) {
      return false;
    } else if constexpr (std::is_same_v<decltype(f(kc)), bool>) {
      return f(kc);
    } else {
      f(kc);
      return true;
    }
  };
  switch (k) {
    case 1:
      return call(std::integral_constant<int, 1>{});
    case 2:
      return call(std::integral_constant<int, 2>{});
    case 3:
      return call(std::integral_constant<int, 3>{});
    case 4:
      return call(std::integral_constant<int, 4>{});
    case 6:
      return call(std::integral_constant<int, 6>{});
    case 8:
      return call(std::integral_constant<int, 8>{});
    case 12:
      return call(std::integral_constant<int, 12>{});
    case 16:
      return call(std::integral_constant<int, 16>{});
    default:
      return false;
  }
}

void check_sizes(const char* what, int64_t rows, int64_t cols) {
  BT_CHECK(rows >= 0 && cols >= 0, "cuda ", what, ": negative size (rows ", rows, ", cols ", cols, ")");
  BT_CHECK(cols < INT_MAX, "cuda ", what, ": cols ", cols, " is too large");
  BT_CHECK(ceil_div(rows, kWarpsPerBlock) < INT_MAX, "cuda ", what, ": too many rows (", rows, ")");
}

int64_t num_partials(int64_t rows) { return rows < kMaxPartials ? rows : kMaxPartials; }

/// Calls f(Tag<T>, Tag<W>, Tag<G>) with the types of the activations, the
/// parameters and their gradients.
template <typename F>
void dispatch_ln(LnTypes t, const char* kernel, F&& f) {
  check_ln_types(t, kernel);
  dispatch_float(t.x, kernel, [&](auto tt) {
    auto with_w = [&](auto wt) {
      if (t.g == DType::F32)
        f(tt, wt, Tag<float>{});
      else
        f(tt, wt, tt);
    };
    if (t.w == DType::F32)
      with_w(Tag<float>{});
    else
      with_w(tt);
  });
}

/// The forward with (res not null) or without the residual add.
void forward(const char* kernel, LnTypes t, const void* x, const void* res, int64_t res_rows, const void* rb,
             const void* w, const void* b, void* s, void* y, float* mean, float* rstd, int64_t rows,
             int64_t cols, float eps, cudaStream_t stream) {
  check_sizes(kernel, rows, cols);
  dispatch_ln(t, kernel, [&](auto tt, auto wt, auto) {
    using T = typename decltype(tt)::type;
    using W = typename decltype(wt)::type;
    if (rows == 0) return;
    BT_CHECK(cols > 0, "cuda ", kernel, ": cols must be positive");
    BT_CHECK(x != nullptr && y != nullptr, "cuda ", kernel, ": null x or y");
    BT_CHECK(res == nullptr || (s != nullptr && res_rows > 0 && rows % res_rows == 0), "cuda ", kernel,
             ": the residual needs s, and its rows (", res_rows, ") must divide the rows (", rows, ")");
    const T* px = static_cast<const T*>(x);
    const T* pr = static_cast<const T*>(res);
    const W* prb = static_cast<const W*>(rb);
    const W* pw = static_cast<const W*>(w);
    const W* pb = static_cast<const W*>(b);
    T* ps = static_cast<T*>(s);
    T* py = static_cast<T*>(y);
    constexpr int V = kVec16<T>;
    // The path of the LayerNorm of what it normalizes (x, or s), as the plain forward picks it.
    const T* ln_in = pr ? ps : px;
    const bool vec_ok = cols % V == 0 && aligned_to(ln_in, 16) && aligned_to(py, 16) && aligned_to(pw, 16) &&
                        aligned_to(pb, 16);
    const int k = vec_ok ? pick_k(ceil_div(cols / V, 32)) : 0;
    if (pr && (k == 0 || !aligned_to(px, 16) || !aligned_to(pr, 16) || !aligned_to(prb, 16))) {
      // s by its own pass; the LayerNorm below is then the plain one on s.
      const int64_t n = rows * cols;
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, int64_t{256}), 65535));
      residual_add_kernel<T, W><<<grid, 256, 0, stream>>>(px, pr, res_rows, prb, ps, rows, cols);
      BT_KERNEL_CHECK();
      px = ps;
      pr = nullptr;
      prb = nullptr;
    }
    const bool launched = with_k<16>(k, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      // R = 1: measured on an H100 at 64/256 MiB, R = 2 (or a register cap for more
      // blocks per SM) gained <= 3% for f32 / bf16 at 768 cols and lost up to 10%
      // for bf16 at 1024 cols; R = 1 reached 0.88-0.98 of D2D copy bandwidth.
      constexpr int R = 1;
      const unsigned fast_blocks = static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock * R));
      ln_fwd_fast_kernel<T, W, K, R><<<fast_blocks, kThreads, 0, stream>>>(
          px, pr, res_rows, prb, pw, pb, ps, py, mean, rstd, rows, static_cast<int>(cols), eps);
    });
    if (!launched) {
      const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock));
      ln_fwd_generic_kernel<T, W>
          <<<blocks, kThreads, 0, stream>>>(px, pw, pb, py, mean, rstd, rows, cols, eps);
    }
    BT_KERNEL_CHECK();
  });
}

}  // namespace

void layernorm_forward(LnTypes t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  forward("layernorm_forward", t, x, nullptr, 1, nullptr, w, b, nullptr, y, mean, rstd, rows, cols, eps,
          stream);
}

void add_layernorm_forward(LnTypes t, const void* x, const void* r, int64_t r_rows, const void* w,
                           const void* b, void* s, void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, float eps, cudaStream_t stream, const void* rb) {
  BT_CHECK(rows == 0 || r != nullptr, "cuda add_layernorm_forward: null residual");
  forward("add_layernorm_forward", t, x, r, r_rows, rb, w, b, s, y, mean, rstd, rows, cols, eps, stream);
}

size_t layernorm_backward_scratch_floats(int64_t rows, int64_t cols, bool dsum) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>((dsum ? 3 : 2) * num_partials(rows) * cols);
}

void layernorm_backward(LnTypes t, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                        float* scratch, cudaStream_t stream, const void* dres, void* dsum) {
  check_sizes("layernorm_backward", rows, cols);
  dispatch_ln(t, "layernorm_backward", [&](auto tt, auto wt, auto gt) {
    using T = typename decltype(tt)::type;
    using W = typename decltype(wt)::type;
    using G = typename decltype(gt)::type;
    if (cols == 0) return;
    G* pdw_out = static_cast<G*>(dw);
    G* pdb_out = static_cast<G*>(db);
    G* pds_out = static_cast<G*>(dsum);
    BT_CHECK(pds_out == nullptr || dx != nullptr,
             "cuda layernorm_backward: dsum sums dx, which must not be null");
    if (rows == 0) {
      // No rows: the weight gradients are zero.
      for (G* out : {pdw_out, pdb_out, pds_out})
        if (out) BT_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(cols) * sizeof(G), stream));
      return;
    }
    BT_CHECK(dy != nullptr && x != nullptr && mean != nullptr && rstd != nullptr,
             "cuda layernorm_backward: dy, x, mean and rstd must be non-null");
    if (dx == nullptr && pdw_out == nullptr && pdb_out == nullptr) return;
    const bool need_partials = pdw_out != nullptr || pdb_out != nullptr || pds_out != nullptr;
    BT_CHECK(!need_partials || scratch != nullptr,
             "cuda layernorm_backward: dw/db requested but scratch is null ",
             "(allocate layernorm_backward_scratch_floats(rows, cols, dsum != nullptr) floats)");
    BT_CHECK(!need_partials || aligned_to(scratch, 16),
             "cuda layernorm_backward: scratch must be 16-byte aligned");
    const int64_t nparts = num_partials(rows);
    float* part_w = pdw_out ? scratch : nullptr;
    float* part_b = pdb_out ? scratch + nparts * cols : nullptr;
    float* part_s = pds_out ? scratch + 2 * nparts * cols : nullptr;
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const W* pw = static_cast<const W*>(w);
    const T* pdr = static_cast<const T*>(dres);
    T* pdx = static_cast<T*>(dx);
    constexpr int V = kVec16<T>;
    const unsigned blocks = static_cast<unsigned>(ceil_div(nparts, kWarpsPerBlock));
    const bool vec_ok = cols % V == 0 && aligned_to(pdy, 16) && aligned_to(px, 16) && aligned_to(pw, 16) &&
                        aligned_to(pdx, 16) && aligned_to(pdr, 16);
    const int k = vec_ok ? pick_k(ceil_div(cols / V, 32)) : 0;
    // K <= 8, and the partials fit the block's shared memory (Note [LayerNorm
    // backward partials in shared memory]); else the generic kernel.
    const bool launched = with_k<8>(k, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      const size_t smem = ln_bwd_smem_bytes<T>(K, pds_out ? 3 : 2);
      if (smem > smem_optin_bytes()) return false;
      // Two rows' packs in flight where they fit the registers (3 tensors x K packs x 4 registers each).
      auto kernel = ln_bwd_fast_kernel<T, W, K, (K <= 4)>;
      allow_smem(kernel, smem);
      kernel<<<blocks, kThreads, smem, stream>>>(pdy, px, pw, mean, rstd, pdr, pdx, part_w, part_b, part_s,
                                                 rows, static_cast<int>(cols), nparts);
      return true;
    });
    if (!launched)
      ln_bwd_generic_kernel<T, W><<<blocks, kThreads, 0, stream>>>(pdy, px, pw, mean, rstd, pdr, pdx, part_w,
                                                                   part_b, part_s, rows, cols, nparts);
    BT_KERNEL_CHECK();
    const int64_t prows = launched ? static_cast<int64_t>(blocks) : nparts;  // partial rows written
    if (need_partials) {
      const dim3 rgrid(static_cast<unsigned>(ceil_div(cols, 32)), pds_out ? 3 : 2);
      ln_partial_reduce_kernel<G>
          <<<rgrid, dim3(32, 8), 0, stream>>>(part_w, part_b, part_s, prows, cols, pdw_out, pdb_out, pds_out);
      BT_KERNEL_CHECK();
    }
  });
}

}  // namespace bt::kernels::cuda
