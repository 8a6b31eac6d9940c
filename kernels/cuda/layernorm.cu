// CUDA LayerNorm over the last dim of [rows, cols], one warp per row.
//
// Fast path (cols % V == 0, V = 16 / sizeof(T), 16-byte aligned pointers, and the
// row fits in K <= 16 packs per lane): the row is loaded once with 16-byte loads
// and kept in registers; mean and variance are two exact passes over registers.
// Otherwise a scalar warp-per-row path reads the row three times.
//
// Backward: dx per row as in the forward; dw/db are deterministic: warp w of
// W = min(rows, kMaxPartials) warps handles rows w, w + W, ... and writes its own
// partial sums to scratch[W][cols] (dw) and scratch[W][cols] (db); a second
// kernel adds the W partials of each column in a fixed order. W depends only on
// rows, so the result does not depend on the GPU either.
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

// ------------------------------------------------------------------ forward
/// R rows per warp, each held in registers as K raw 16-byte packs per lane (raw
/// packs halve the registers for bf16); all loads of the R rows are issued before
/// the first reduction, so a warp keeps R * K * 512 bytes in flight.
template <typename T, int K, int R>
__global__ void __launch_bounds__(kThreads)
    ln_fwd_fast_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                       T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                       int cols, float eps) {
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
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int vi = lane + k * 32;
      if (row0 + r < rows && vi < nvec) {
        raw[r][k] = px[vi];
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
  const P* pw = reinterpret_cast<const P*>(w);
  const P* pb = reinterpret_cast<const P*>(b);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int vi = lane + k * 32;
    if (vi < nvec) {
      float wv[V], bv[V];
      if (w) {
        unpack<T>(pw[vi], wv);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) wv[j] = 1.0f;
      }
      if (b) {
        unpack<T>(pb[vi], bv);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) bv[j] = 0.0f;
      }
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ln_fwd_generic_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
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

// ------------------------------------------------------------------ backward
/// Warp `gw` (global warp index) handles rows gw, gw + W, ...; dx is written per
/// row, and the warp's dw/db partials (registers) go to scratch row gw.
template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
    ln_bwd_fast_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                       const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                       float* __restrict__ pdw, float* __restrict__ pdb, int64_t rows, int cols,
                       int64_t nwarps) {
  constexpr int V = kVec16<T>;
  using P = Pack<T, V>;
  const int lane = threadIdx.x & 31;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (gw >= nwarps) return;
  const int nvec = cols / V;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const P* pw = reinterpret_cast<const P*>(w);
  float acc_w[K][V], acc_b[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) acc_w[k][j] = acc_b[k][j] = 0.0f;

  for (int64_t row = gw; row < rows; row += nwarps) {
    const P* px = reinterpret_cast<const P*>(x + row * cols);
    const P* pdy = reinterpret_cast<const P*>(dy + row * cols);
    const float mu = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int vi = lane + k * 32;
      if (vi < nvec) {
        float xv[V], gv[V], wv[V];
        unpack<T>(px[vi], xv);
        unpack<T>(pdy[vi], gv);
        if (w) {
          unpack<T>(pw[vi], wv);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) wv[j] = 1.0f;
        }
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float xh = (xv[j] - mu) * rs;
          // Rounded product (no FMA contraction), so that dx below subtracts
          // exactly the g that went into s1 (cols == 1 gives dx == 0 exactly).
          const float g = __fmul_rn(gv[j], wv[j]);
          s1 += g;
          s2 += g * xh;
          acc_w[k][j] += gv[j] * xh;
          acc_b[k][j] += gv[j];
        }
      }
    }
    s1 = warp_sum(s1) * inv_cols;
    s2 = warp_sum(s2) * inv_cols;
    if (dx == nullptr) continue;
    P* pdx = reinterpret_cast<P*>(dx + row * cols);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int vi = lane + k * 32;
      if (vi < nvec) {
        float xv[V], gv[V], wv[V];
        unpack<T>(px[vi], xv);
        unpack<T>(pdy[vi], gv);
        if (w) {
          unpack<T>(pw[vi], wv);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) wv[j] = 1.0f;
        }
        P out;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float xh = (xv[j] - mu) * rs;
          out.v[j] = from_float<T>(rs * (__fmul_rn(gv[j], wv[j]) - s1 - xh * s2));
        }
        pdx[vi] = out;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int vi = lane + k * 32;
    if (vi < nvec) {
      if (pdw) {
        float4* o = reinterpret_cast<float4*>(pdw + gw * cols + static_cast<int64_t>(vi) * V);
#pragma unroll
        for (int j = 0; j < V; j += 4)
          o[j / 4] = make_float4(acc_w[k][j], acc_w[k][j + 1], acc_w[k][j + 2], acc_w[k][j + 3]);
      }
      if (pdb) {
        float4* o = reinterpret_cast<float4*>(pdb + gw * cols + static_cast<int64_t>(vi) * V);
#pragma unroll
        for (int j = 0; j < V; j += 4)
          o[j / 4] = make_float4(acc_b[k][j], acc_b[k][j + 1], acc_b[k][j + 2], acc_b[k][j + 3]);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ln_bwd_generic_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                          const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                          float* __restrict__ pdw, float* __restrict__ pdb, int64_t rows, int64_t cols,
                          int64_t nwarps) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (gw >= nwarps) return;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  float* my_dw = pdw ? pdw + gw * cols : nullptr;
  float* my_db = pdb ? pdb + gw * cols : nullptr;
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
    for (int64_t j = lane; j < cols; j += 32) {
      const float xh = (ldf(px + j) - mu) * rs;
      const float g = __fmul_rn(ldf(pdy + j), w ? ldf(w + j) : 1.0f);
      stf(pdx + j, rs * (g - s1 - xh * s2));
    }
  }
}

/// out[c] = sum over p < nparts of part[p * cols + c], in a fixed order.
template <typename T>
__global__ void ln_partial_reduce_kernel(const float* __restrict__ part, int64_t nparts, int64_t cols,
                                         T* __restrict__ out) {
  __shared__ float s[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t p = threadIdx.y; p < nparts; p += 8) acc += part[p * cols + c];
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
/// above kMaxK, which keeps the backward's register-hungry variants out).
template <int kMaxK, typename F>
bool with_k(int k, F&& f) {
  if (k > kMaxK) return false;
  switch (k) {
    case 1:
      f(std::integral_constant<int, 1>{});
      return true;
    case 2:
      f(std::integral_constant<int, 2>{});
      return true;
    case 3:
      f(std::integral_constant<int, 3>{});
      return true;
    case 4:
      f(std::integral_constant<int, 4>{});
      return true;
    case 6:
      f(std::integral_constant<int, 6>{});
      return true;
    case 8:
      f(std::integral_constant<int, 8>{});
      return true;
    case 12:
      if constexpr (kMaxK >= 12) f(std::integral_constant<int, 12>{});
      return true;
    case 16:
      if constexpr (kMaxK >= 16) f(std::integral_constant<int, 16>{});
      return true;
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

}  // namespace

void layernorm_forward(DType dt, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  check_sizes("layernorm_forward", rows, cols);
  dispatch_float(dt, "layernorm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows == 0) return;
    BT_CHECK(cols > 0, "cuda layernorm_forward: cols must be positive");
    BT_CHECK(x != nullptr && y != nullptr, "cuda layernorm_forward: null x or y");
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    const T* pb = static_cast<const T*>(b);
    T* py = static_cast<T*>(y);
    constexpr int V = kVec16<T>;
    const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock));
    const bool vec_ok =
        cols % V == 0 && aligned_to(px, 16) && aligned_to(py, 16) && aligned_to(pw, 16) && aligned_to(pb, 16);
    const int k = vec_ok ? pick_k(ceil_div(cols / V, 32)) : 0;
    const bool launched = with_k<16>(k, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      // R = 1: measured on an H100 at 64/256 MiB, R = 2 (or a register cap for more
      // blocks per SM) gained <= 3% for f32 / bf16 at 768 cols and lost up to 10%
      // for bf16 at 1024 cols; R = 1 reached 0.88-0.98 of D2D copy bandwidth.
      constexpr int R = 1;
      const unsigned fast_blocks = static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock * R));
      ln_fwd_fast_kernel<T, K, R><<<fast_blocks, kThreads, 0, stream>>>(px, pw, pb, py, mean, rstd, rows,
                                                                        static_cast<int>(cols), eps);
    });
    if (!launched)
      ln_fwd_generic_kernel<T><<<blocks, kThreads, 0, stream>>>(px, pw, pb, py, mean, rstd, rows, cols, eps);
    BT_KERNEL_CHECK();
  });
}

size_t layernorm_backward_scratch_floats(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>(2 * num_partials(rows) * cols);
}

void layernorm_backward(DType dt, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                        float* scratch, cudaStream_t stream) {
  check_sizes("layernorm_backward", rows, cols);
  dispatch_float(dt, "layernorm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (cols == 0) return;
    T* pdw_out = static_cast<T*>(dw);
    T* pdb_out = static_cast<T*>(db);
    if (rows == 0) {
      // No rows: the weight gradients are zero.
      if (pdw_out) BT_CUDA_CHECK(cudaMemsetAsync(pdw_out, 0, static_cast<size_t>(cols) * sizeof(T), stream));
      if (pdb_out) BT_CUDA_CHECK(cudaMemsetAsync(pdb_out, 0, static_cast<size_t>(cols) * sizeof(T), stream));
      return;
    }
    BT_CHECK(dy != nullptr && x != nullptr && mean != nullptr && rstd != nullptr,
             "cuda layernorm_backward: dy, x, mean and rstd must be non-null");
    if (dx == nullptr && pdw_out == nullptr && pdb_out == nullptr) return;
    const bool need_partials = pdw_out != nullptr || pdb_out != nullptr;
    BT_CHECK(!need_partials || scratch != nullptr,
             "cuda layernorm_backward: dw/db requested but scratch is null ",
             "(allocate layernorm_backward_scratch_floats(rows, cols) floats)");
    BT_CHECK(!need_partials || aligned_to(scratch, 16),
             "cuda layernorm_backward: scratch must be 16-byte aligned");
    const int64_t nparts = num_partials(rows);
    float* part_w = pdw_out ? scratch : nullptr;
    float* part_b = pdb_out ? scratch + nparts * cols : nullptr;
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    T* pdx = static_cast<T*>(dx);
    constexpr int V = kVec16<T>;
    const unsigned blocks = static_cast<unsigned>(ceil_div(nparts, kWarpsPerBlock));
    const bool vec_ok = cols % V == 0 && aligned_to(pdy, 16) && aligned_to(px, 16) && aligned_to(pw, 16) &&
                        aligned_to(pdx, 16);
    const int k = vec_ok ? pick_k(ceil_div(cols / V, 32)) : 0;
    // K <= 8: the lane keeps 2 * K * V float accumulators in registers.
    const bool launched = with_k<8>(k, [&](auto kc) {
      ln_bwd_fast_kernel<T, decltype(kc)::value><<<blocks, kThreads, 0, stream>>>(
          pdy, px, pw, mean, rstd, pdx, part_w, part_b, rows, static_cast<int>(cols), nparts);
    });
    if (!launched)
      ln_bwd_generic_kernel<T>
          <<<blocks, kThreads, 0, stream>>>(pdy, px, pw, mean, rstd, pdx, part_w, part_b, rows, cols, nparts);
    BT_KERNEL_CHECK();
    const unsigned rblocks = static_cast<unsigned>(ceil_div(cols, 32));
    if (pdw_out) {
      ln_partial_reduce_kernel<T><<<rblocks, dim3(32, 8), 0, stream>>>(part_w, nparts, cols, pdw_out);
      BT_KERNEL_CHECK();
    }
    if (pdb_out) {
      ln_partial_reduce_kernel<T><<<rblocks, dim3(32, 8), 0, stream>>>(part_b, nparts, cols, pdb_out);
      BT_KERNEL_CHECK();
    }
  });
}

}  // namespace bt::kernels::cuda
