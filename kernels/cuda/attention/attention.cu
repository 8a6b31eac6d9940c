// CUDA causal flash-style attention: dispatch, and the one-row-per-lane SIMT
// kernels (fp32 accumulation) that serve every case the two fast paths do not.
// attention_*_path (kernels/common/attention_path.cpp, host code in every
// build) picks the implementation:
//   - BF16 with D in {32, 64, 128} (forward) / {32, 64} (backward), or F32
//     with TF32 or 3xTF32 math and D in {32, 64}; a finite scale > 0 and
//     16-byte aligned rows: the tensor cores, kernels/cuda/attention/attention_mma.cu;
//   - F32 with D in {32, 64}, a finite scale and 16-byte aligned rows (and
//     strict math, or a scale <= 0): the register-tiled strict-fp32 kernels,
//     kernels/cuda/attention/attention_f32.cu.
// Both compute the backward's Di into the same scratch (the strict-fp32 one,
// given more scratch, passes its dS tiles through the rest: Note [dS through
// memory in fp32]).
//
// SIMT kernels:
// Layout of work: D is padded to DP in {16, 32, 64, 128} (padded dims are zero
// and never written). A row (query or key) is owned by TPR = DP / 16 adjacent
// lanes; lane `part` of the group owns dims part + TPR * c, c < 16. Dot products
// are 16 FMAs per lane plus a butterfly over the TPR lanes. A block of 128
// threads owns BR = 128 / TPR rows.
//
// Forward: per (b, h, query tile), stream K/V tiles of 32 keys through shared
// memory up to the last key the tile can see (fully masked tiles are skipped),
// online softmax in registers; writes O and lse = m + log(l).
// Backward (deterministic, every output written once):
//   1. Di = rowsum(dO * O)                       -> scratch [B, H, T]
//   2. per (b, hk, key tile):  dK, dV over the group's query heads in order,
//                              each over the query tiles that see the keys
//   3. per (b, h, query tile): dQ over the key tiles the queries see
// with P recomputed as exp(scale q.k - lse). Query head h reads key/value head
// hk = h / G (Note [Grouped-query attention] in kernels/attention.h).
#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/attention/attention_f32.cuh"
#include "kernels/cuda/attention/attention_mma.cuh"
#include "kernels/cuda/common.cuh"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 128;
constexpr int kTile = 32;  // keys (forward, dQ) or queries (dK/dV) per shared-memory tile
constexpr int kPerLane = 16;

struct Geo {
  int64_t B, H, T, D;
  int64_t Hkv, G;  // key/value heads, query heads per key/value head
};

Geo geo_of(const AttnShape& s) { return {s.B, s.H, s.T, s.D, s.kv_heads(), s.group()}; }

__device__ __forceinline__ int64_t off(const AttnStrides& s, int64_t b, int64_t h, int64_t t) {
  return b * s.b + h * s.h + t * s.t;
}

template <int TPR>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = 1; o < TPR; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Loads this lane's 16 dims of row t (zeros past D or for t >= T).
template <typename T, int TPR>
__device__ __forceinline__ void load_row(const T* base, const AttnStrides& s, int64_t b, int64_t h, int64_t t,
                                         const Geo& g, int part, float (&out)[kPerLane]) {
  const bool ok = t < g.T;
  const T* p = base + (ok ? off(s, b, h, t) : 0);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = part + TPR * c;
    out[c] = (ok && d < g.D) ? ldf(p + d) : 0.0f;
  }
}

template <typename T, int TPR>
__device__ __forceinline__ void store_row(T* base, const AttnStrides& s, int64_t b, int64_t h, int64_t t,
                                          const Geo& g, int part, const float (&v)[kPerLane], float mul) {
  if (t >= g.T) return;
  T* p = base + off(s, b, h, t);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = part + TPR * c;
    if (d < g.D) stf(p + d, v[c] * mul);
  }
}

/// Cooperative load of rows [t0, t0 + kTile) into tile[kTile][DP] (zeros past T or D).
template <typename T, int DP>
__device__ __forceinline__ void load_tile(float (*tile)[DP], const T* base, const AttnStrides& s, int64_t b,
                                          int64_t h, int64_t t0, const Geo& g) {
  for (int e = threadIdx.x; e < kTile * DP; e += kThreads) {
    const int j = e / DP, d = e % DP;
    const int64_t t = t0 + j;
    tile[j][d] = (t < g.T && d < g.D) ? ldf(base + off(s, b, h, t) + d) : 0.0f;
  }
}

/// blockIdx.x -> (bh, tile); heavy_first orders the causal work largest first.
__device__ __forceinline__ void block_coords(int64_t bh_count, int64_t tiles, bool reverse, int64_t& bh,
                                             int64_t& tile) {
  const int64_t bid = blockIdx.x;
  bh = bid % bh_count;
  const int64_t r = bid / bh_count;
  tile = reverse ? tiles - 1 - r : r;
}

// ------------------------------------------------------------------ forward
template <typename T, int DP>
__global__ void __launch_bounds__(kThreads) attn_fwd_kernel(AttnForward a, Geo g, int64_t tiles) {
  constexpr int TPR = DP / kPerLane, BR = kThreads / TPR;
  __shared__ float ks[kTile][DP];
  __shared__ float vs[kTile][DP];
  int64_t bh, tile;
  block_coords(g.B * g.H, tiles, true, bh, tile);
  const int64_t b = bh / g.H, h = bh % g.H;
  const int row = threadIdx.x / TPR, part = threadIdx.x % TPR;
  const int64_t q0 = tile * BR, qi = q0 + row;
  float q[kPerLane], acc[kPerLane];
  load_row<T, TPR>(static_cast<const T*>(a.q), a.sq, b, h, qi, g, part, q);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    q[c] *= a.scale;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t kend = q0 + BR < g.T ? q0 + BR : g.T;  // keys >= kend are masked for the whole tile
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    load_tile<T, DP>(ks, static_cast<const T*>(a.k), a.sk, b, h / g.G, k0, g);
    load_tile<T, DP>(vs, static_cast<const T*>(a.v), a.sv, b, h / g.G, k0, g);
    __syncthreads();
    float s[kTile];
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      float part_dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) part_dot += q[c] * ks[j][part + TPR * c];
      const float sc = group_sum<TPR>(part_dot);
      const int64_t kj = k0 + j;
      s[j] = (kj <= qi && kj < g.T) ? sc : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    const float m_new = fmaxf(m, mt);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = expf(m - m_use);
    l *= corr;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[c] *= corr;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const float p = expf(s[j] - m_use);
      l += p;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) acc[c] += p * vs[j][part + TPR * c];
    }
    m = m_new;
  }
  if (qi < g.T) {
    store_row<T, TPR>(static_cast<T*>(a.o), a.so, b, h, qi, g, part, acc, 1.0f / l);
    if (part == 0 && a.lse) a.lse[bh * g.T + qi] = m + logf(l);
  }
}

// ------------------------------------------------------------------ backward
/// Di[bh * T + t] = sum_d dO * O; one warp per row.
template <typename T>
__global__ void attn_bwd_dot_kernel(AttnBackward a, Geo g, float* __restrict__ di) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= g.B * g.H * g.T) return;
  const int64_t t = row % g.T, bh = row / g.T, b = bh / g.H, h = bh % g.H;
  const T* po = static_cast<const T*>(a.o) + off(a.so, b, h, t);
  const T* pd = static_cast<const T*>(a.dout) + off(a.sdo, b, h, t);
  float acc = 0.0f;
  for (int64_t d = lane; d < g.D; d += 32) acc += ldf(po + d) * ldf(pd + d);
  acc = warp_sum(acc);
  if (lane == 0) di[row] = acc;
}

template <typename T, int DP>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_kernel(AttnBackward a, Geo g, int64_t tiles, const float* __restrict__ di) {
  constexpr int TPR = DP / kPerLane, BR = kThreads / TPR;
  __shared__ float qs[kTile][DP];
  __shared__ float dos[kTile][DP];
  __shared__ float lse_s[kTile], di_s[kTile];
  int64_t bhk, tile;
  block_coords(g.B * g.Hkv, tiles, false, bhk, tile);
  const int64_t b = bhk / g.Hkv, hk = bhk % g.Hkv;
  const int row = threadIdx.x / TPR, part = threadIdx.x % TPR;
  const int64_t k0 = tile * BR, kj = k0 + row;
  float k[kPerLane], v[kPerLane], dk[kPerLane], dv[kPerLane];
  load_row<T, TPR>(static_cast<const T*>(a.k), a.sk, b, hk, kj, g, part, k);
  load_row<T, TPR>(static_cast<const T*>(a.v), a.sv, b, hk, kj, g, part, v);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    k[c] *= a.scale;
    dk[c] = dv[c] = 0.0f;
  }
  // The group's query heads in order, summed into the same registers.
  for (int64_t h = hk * g.G; h < (hk + 1) * g.G; ++h) {
    const int64_t bh = b * g.H + h;
    const float* lse = a.lse + bh * g.T;
    const float* dib = di + bh * g.T;
    // Queries before k0 see none of these keys.
    for (int64_t q0 = k0; q0 < g.T; q0 += kTile) {
      __syncthreads();
      load_tile<T, DP>(qs, static_cast<const T*>(a.q), a.sq, b, h, q0, g);
      load_tile<T, DP>(dos, static_cast<const T*>(a.dout), a.sdo, b, h, q0, g);
      if (threadIdx.x < kTile) {
        const int64_t t = q0 + threadIdx.x;
        lse_s[threadIdx.x] = t < g.T ? lse[t] : 0.0f;
        di_s[threadIdx.x] = t < g.T ? dib[t] : 0.0f;
      }
      __syncthreads();
#pragma unroll 4
      for (int i = 0; i < kTile; ++i) {
        const int64_t qi = q0 + i;
        float ps = 0.0f, pd = 0.0f;
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          ps += qs[i][part + TPR * c] * k[c];
          pd += dos[i][part + TPR * c] * v[c];
        }
        const float sc = group_sum<TPR>(ps);
        const float dp = group_sum<TPR>(pd);
        const bool valid = qi >= kj && qi < g.T && kj < g.T;
        const float p = valid ? expf(sc - lse_s[i]) : 0.0f;
        const float ds = p * (dp - di_s[i]);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) {
          dv[c] += p * dos[i][part + TPR * c];
          dk[c] += ds * qs[i][part + TPR * c];
        }
      }
    }
  }
  store_row<T, TPR>(static_cast<T*>(a.dk), a.sdk, b, hk, kj, g, part, dk, a.scale);
  store_row<T, TPR>(static_cast<T*>(a.dv), a.sdv, b, hk, kj, g, part, dv, 1.0f);
}

template <typename T, int DP>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_kernel(AttnBackward a, Geo g, int64_t tiles, const float* __restrict__ di) {
  constexpr int TPR = DP / kPerLane, BR = kThreads / TPR;
  __shared__ float ks[kTile][DP];
  __shared__ float vs[kTile][DP];
  int64_t bh, tile;
  block_coords(g.B * g.H, tiles, true, bh, tile);
  const int64_t b = bh / g.H, h = bh % g.H;
  const int row = threadIdx.x / TPR, part = threadIdx.x % TPR;
  const int64_t q0 = tile * BR, qi = q0 + row;
  float q[kPerLane], dout[kPerLane], dq[kPerLane];
  load_row<T, TPR>(static_cast<const T*>(a.q), a.sq, b, h, qi, g, part, q);
  load_row<T, TPR>(static_cast<const T*>(a.dout), a.sdo, b, h, qi, g, part, dout);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    q[c] *= a.scale;
    dq[c] = 0.0f;
  }
  const bool row_ok = qi < g.T;
  const float lse = row_ok ? a.lse[bh * g.T + qi] : 0.0f;
  const float dii = row_ok ? di[bh * g.T + qi] : 0.0f;
  const int64_t kend = q0 + BR < g.T ? q0 + BR : g.T;
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    load_tile<T, DP>(ks, static_cast<const T*>(a.k), a.sk, b, h / g.G, k0, g);
    load_tile<T, DP>(vs, static_cast<const T*>(a.v), a.sv, b, h / g.G, k0, g);
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      const int64_t kj = k0 + j;
      float ps = 0.0f, pd = 0.0f;
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        ps += q[c] * ks[j][part + TPR * c];
        pd += dout[c] * vs[j][part + TPR * c];
      }
      const float sc = group_sum<TPR>(ps);
      const float dp = group_sum<TPR>(pd);
      const bool valid = row_ok && kj <= qi && kj < g.T;
      const float p = valid ? expf(sc - lse) : 0.0f;
      const float ds = p * (dp - dii);
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) dq[c] += ds * ks[j][part + TPR * c];
    }
  }
  store_row<T, TPR>(static_cast<T*>(a.dq), a.sdq, b, h, qi, g, part, dq, a.scale);
}

// ------------------------------------------------------------------ dispatch
int padded_d(int64_t D) {
  if (D <= 16) return 16;
  if (D <= 32) return 32;
  if (D <= 64) return 64;
  return 128;
}

template <typename F>
void with_dp(int dp, F&& f) {
  switch (dp) {
    case 16:
      f(std::integral_constant<int, 16>{});
      return;
    case 32:
      f(std::integral_constant<int, 32>{});
      return;
    case 64:
      f(std::integral_constant<int, 64>{});
      return;
    default:
      f(std::integral_constant<int, 128>{});
      return;
  }
}

void check_shape(const AttnShape& s, const char* what) {
  check_attn_shape(s, what);
  BT_CHECK(s.D <= 128, "cuda ", what, ": head dim D = ", s.D,
           " is not supported on CUDA (D must be 1..128; 16, 32, 64 and 128 are the tuned sizes)");
}

/// One block per (b, head, tile) of `heads` heads.
unsigned grid_for(const Geo& g, int64_t heads, int64_t tiles, const char* what) {
  const int64_t blocks = g.B * heads * tiles;
  BT_CHECK(blocks < INT_MAX, "cuda ", what, ": too many blocks (B*H = ", g.B * heads, ", tiles ", tiles, ")");
  return static_cast<unsigned>(blocks);
}

}  // namespace

void attention_forward(const AttnForward& a, cudaStream_t stream) {
  check_shape(a.shape, "attention_forward");
  dispatch_float(a.dt, "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Geo g = geo_of(a.shape);
    if (g.B * g.H * g.T == 0) return;
    BT_CHECK(a.q && a.k && a.v && a.o, "cuda attention_forward: null q, k, v or o");
    BT_CHECK(g.D >= 1, "cuda attention_forward: head dim D must be at least 1");
    switch (attention_forward_path(a)) {
      case AttnPath::TensorCore:
        detail::attention_forward_mma(a, stream);
        return;
      case AttnPath::F32Tiled:
        detail::attention_forward_f32(a, stream);
        return;
      case AttnPath::Simt:
        break;
    }
    with_dp(padded_d(g.D), [&](auto dpc) {
      constexpr int DP = decltype(dpc)::value;
      constexpr int BR = kThreads / (DP / kPerLane);
      const int64_t tiles = ceil_div(g.T, BR);
      attn_fwd_kernel<T, DP>
          <<<grid_for(g, g.H, tiles, "attention_forward"), kThreads, 0, stream>>>(a, g, tiles);
      BT_KERNEL_CHECK();
    });
  });
}

size_t attention_backward_scratch_floats(const AttnShape& s) {
  if (s.B <= 0 || s.H <= 0 || s.T <= 0) return 0;
  return static_cast<size_t>(s.B * s.H * s.T);
}

size_t attention_backward_scratch_floats(const AttnBackward& a) {
  const size_t least = attention_backward_scratch_floats(a.shape);
  if (least == 0 || attention_backward_path(a) != AttnPath::F32Tiled) return least;
  return std::max(least, detail::attention_backward_f32_scratch_floats(a.shape));
}

void attention_backward(const AttnBackward& a, float* scratch, cudaStream_t stream, size_t scratch_floats) {
  check_shape(a.shape, "attention_backward");
  dispatch_float(a.dt, "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Geo g = geo_of(a.shape);
    if (g.B * g.H * g.T == 0) return;
    BT_CHECK(g.D >= 1, "cuda attention_backward: head dim D must be at least 1");
    BT_CHECK(a.q && a.k && a.v && a.o && a.dout && a.lse && a.dq && a.dk && a.dv,
             "cuda attention_backward: null input or output buffer");
    BT_CHECK(scratch != nullptr,
             "cuda attention_backward: null scratch (allocate attention_backward_scratch_floats "
             "floats)");
    const int64_t rows = g.B * g.H * g.T;
    BT_CHECK(ceil_div(rows, 8) < INT_MAX, "cuda attention_backward: too many rows");
    const size_t least = attention_backward_scratch_floats(a.shape);
    BT_CHECK(scratch_floats == 0 || scratch_floats >= least, "cuda attention_backward: ", scratch_floats,
             " floats of scratch, fewer than the ", least, " it needs (attention_backward_scratch_floats)");
    switch (attention_backward_path(a)) {
      case AttnPath::TensorCore:
        detail::attention_backward_mma(a, scratch, stream);  // computes Di itself
        return;
      case AttnPath::F32Tiled:
        detail::attention_backward_f32(a, scratch, scratch_floats == 0 ? least : scratch_floats,
                                       stream);  // computes Di itself
        return;
      case AttnPath::Simt:
        break;
    }
    attn_bwd_dot_kernel<T><<<static_cast<unsigned>(ceil_div(rows, 8)), 256, 0, stream>>>(a, g, scratch);
    BT_KERNEL_CHECK();
    with_dp(padded_d(g.D), [&](auto dpc) {
      constexpr int DP = decltype(dpc)::value;
      constexpr int BR = kThreads / (DP / kPerLane);
      const int64_t tiles = ceil_div(g.T, BR);
      attn_bwd_dkdv_kernel<T, DP>
          <<<grid_for(g, g.Hkv, tiles, "attention_backward"), kThreads, 0, stream>>>(a, g, tiles, scratch);
      BT_KERNEL_CHECK();
      attn_bwd_dq_kernel<T, DP>
          <<<grid_for(g, g.H, tiles, "attention_backward"), kThreads, 0, stream>>>(a, g, tiles, scratch);
      BT_KERNEL_CHECK();
    });
  });
}

}  // namespace bt::kernels::cuda
