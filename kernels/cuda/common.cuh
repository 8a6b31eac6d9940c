// Internal helpers shared by the CUDA kernels: dtype dispatch, float
// load/store for the storage types, bit-exact host-matching conversions,
// vector packs, warp/block reductions and launch-size helpers.
// Not a public header: include it only from kernels/cuda/*.cu.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "kernels/common/layout.h"

namespace bt::kernels::cuda::detail {

using bf16_t = __nv_bfloat16;

/// A type tag passed to the generic lambdas of the dispatchers.
template <typename T>
struct Tag {
  using type = T;
};

/// Calls f(Tag<T>{}) with T = float for F32 and __nv_bfloat16 for BF16; any other
/// dtype throws bt::Error naming the kernel.
template <typename F>
void dispatch_float(DType dt, const char* kernel, F&& f) {
  switch (dt) {
    case DType::F32:
      f(Tag<float>{});
      return;
    case DType::BF16:
      f(Tag<bf16_t>{});
      return;
    default:
      BT_FAIL("cuda ", kernel, ": dtype ", dt,
              " is not supported on CUDA (supported: f32, bf16; f64 is CPU-only)");
  }
}

// ---------------------------------------------------------------- float I/O
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16_t x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
__device__ __forceinline__ float ldf(const T* p) {
  return to_float(*p);
}
template <typename T>
__device__ __forceinline__ void stf(T* p, float v) {
  *p = from_float<T>(v);
}

// ------------------------------------------- host-matching bit conversions
// Same algorithms as the host helpers in kernels/common/dtype.h, so that casts
// (including NaN payloads) are bitwise identical on both devices.
__host__ __device__ __forceinline__ uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}
__host__ __device__ __forceinline__ float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

__device__ __forceinline__ uint16_t dev_float_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float dev_bf16_bits_to_float(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}
__device__ __forceinline__ uint16_t dev_float_to_f16_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {
    const float a = bits_f32(absx);
    const float scaled = __fmul_rn(a, 16777216.0f);
    const float r = rintf(scaled);  // round to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t m = absx + 0xfffu + ((absx >> 13) & 1u);
  m -= (112u << 23);
  return static_cast<uint16_t>(sign | (m >> 13));
}
__device__ __forceinline__ float dev_f16_bits_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    out = f32_bits(ldexpf(static_cast<float>(man), -24)) | sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  }
  return bits_f32(out);
}

/// Sets every float of a register array of any rank to 0, unrolled (the
/// accumulators of the attention kernels' tile products).
template <typename A>
__device__ __forceinline__ void zero(A& x) {
  if constexpr (std::is_array_v<A>) {
#pragma unroll
    for (auto& e : x) zero(e);
  } else {
    x = 0.0f;
  }
}

/// 2^x in one MUFU.EX2. Results below 2^-126 flush to zero: far below what
/// changes a softmax sum that is at least 1, or a bf16 operand of attention's
/// tile products, the uses it has (attention, bf16 cross-entropy).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------- GELU (tanh)
inline constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluK1 = 0.044715f;

// gelu and gelu' share t = tanh(u): a pass that needs both computes t once
// and gives the bits of the two functions (Note [The MLP's GELU backward in
// one pass], kernels/cuda/gelu.cu).
/// t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3)
__device__ __forceinline__ float gelu_tanh_t(float x) { return tanhf(kGeluK0 * (x + kGeluK1 * x * x * x)); }
/// gelu(x) from t = gelu_tanh_t(x)
__device__ __forceinline__ float gelu_from_t(float x, float t) { return 0.5f * x * (1.0f + t); }
/// d gelu(x) / dx from t = gelu_tanh_t(x)
__device__ __forceinline__ float gelu_grad_from_t(float x, float t) {
  const float du = kGeluK0 * (1.0f + 3.0f * kGeluK1 * (x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
__device__ __forceinline__ float gelu_tanh(float x) { return gelu_from_t(x, gelu_tanh_t(x)); }
/// d gelu(x) / dx
__device__ __forceinline__ float gelu_tanh_grad(float x) { return gelu_grad_from_t(x, gelu_tanh_t(x)); }

// ---------------------------------------------------------------- vectors
/// N elements of T loaded/stored as one aligned access (16 bytes for the fast paths).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));
template <typename T>
inline constexpr int kVec8 = static_cast<int>(8 / sizeof(T));

inline bool aligned_to(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// ---------------------------------------------------------------- reductions
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// s + the column of `rows` partials p[0], p[stride], ... added in order, with
/// eight loads in flight: one L2 round trip for every eight terms instead of
/// one a term (the split passes' second halves are that latency and nothing
/// else).
__device__ __forceinline__ float add_in_order(float s, const float* __restrict__ p, int64_t rows,
                                              int64_t stride) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = p[(r + k) * stride];
#pragma unroll
    for (int k = 0; k < 8; ++k) s += v[k];
  }
  for (; r < rows; ++r) s += p[r * stride];
  return s;
}

/// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread
/// gets the result. `smem` holds >= 33 floats. Contains __syncthreads().
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nwarps ? smem[lane] : 0.0f;
    t = warp_sum(t);
    if (lane == 0) smem[32] = t;
  }
  __syncthreads();
  return smem[32];
}

/// Max over the whole block; same contract as block_sum.
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nwarps ? smem[lane] : -INFINITY;
    t = warp_max(t);
    if (lane == 0) smem[32] = t;
  }
  __syncthreads();
  return smem[32];
}

// ---------------------------------------------------------------- launches
/// The current device's attribute A, asked of the driver once per device
/// (devices past the 64th are asked every time).
template <cudaDeviceAttr A>
int cached_device_attr() {
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  BT_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cacheable = dev >= 0 && dev < 64;
  int v = cacheable ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    BT_CUDA_CHECK(cudaDeviceGetAttribute(&v, A, dev));
    if (cacheable && v > 0) cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

/// Multiprocessor count of the current device.
inline int sm_count() {
  const int n = cached_device_attr<cudaDevAttrMultiProcessorCount>();
  return n > 0 ? n : 1;
}

/// The most dynamic shared memory a block of the current device can take
/// (the opt-in limit).
inline size_t smem_optin_bytes() {
  return static_cast<size_t>(cached_device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>());
}

/// Lets `kernel` launch with `smem` bytes of dynamic shared memory: past the
/// default 48 KiB a kernel has to opt in.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t smem) {
  if (smem > 48 * 1024)
    BT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

/// Blocks for a grid-stride loop over `n` work items with `threads` per block,
/// capped at `waves` times the number of blocks the device holds at once.
inline unsigned grid_stride_blocks(int64_t n, int threads, int waves = 2) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t per_sm = threads >= 2048 ? 1 : 2048 / threads;
  const int64_t cap = static_cast<int64_t>(sm_count()) * per_sm * waves;
  int64_t b = need < cap ? need : cap;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// True when `l` is the row-major contiguous layout of its shape.
inline bool is_contiguous(const StridedLayout& l) {
  int64_t expect = 1;
  for (int d = l.ndim - 1; d >= 0; --d) {
    if (l.shape[d] != 1 && l.strides[d] != expect) return false;
    expect *= l.shape[d];
  }
  return true;
}

inline int64_t numel(const StridedLayout& l) {
  int64_t n = 1;
  for (int d = 0; d < l.ndim; ++d) n *= l.shape[d];
  return n;
}

/// Whether coalesced layout `l` is rows of contiguous elements: [rows, cols]
/// with strides [pitch, 1], pitch >= cols (a slice of a wider row-major
/// buffer). Such copies go to cudaMemcpy2DAsync, near copy bandwidth, where
/// the element-wise gather and scatter kernels index every element.
inline bool pitched_rows(const StridedLayout& l, int64_t* rows, int64_t* cols, int64_t* pitch) {
  if (l.ndim != 2 || l.strides[1] != 1 || l.strides[0] < l.shape[1]) return false;
  *rows = l.shape[0];
  *cols = l.shape[1];
  *pitch = l.strides[0];
  return true;
}

/// Drops size-1 dims and merges adjacent dims that are contiguous with each
/// other in every one of `ls` (all with the same shape), so offset_of() does less
/// index arithmetic. Element order and offsets are unchanged.
inline void coalesce(StridedLayout* ls, int count) {
  const int nd = ls[0].ndim;
  StridedLayout out[4];
  for (int j = 0; j < count; ++j) out[j] = StridedLayout{};
  int o = 0;
  for (int d = 0; d < nd; ++d) {
    if (ls[0].shape[d] == 1) continue;
    bool merge = o > 0;
    for (int j = 0; j < count && merge; ++j)
      merge = out[j].strides[o - 1] == ls[j].strides[d] * ls[j].shape[d];
    if (merge) {
      for (int j = 0; j < count; ++j) {
        out[j].shape[o - 1] *= ls[j].shape[d];
        out[j].strides[o - 1] = ls[j].strides[d];
      }
    } else {
      for (int j = 0; j < count; ++j) {
        out[j].shape[o] = ls[j].shape[d];
        out[j].strides[o] = ls[j].strides[d];
      }
      ++o;
    }
  }
  for (int j = 0; j < count; ++j) {
    out[j].ndim = o;
    ls[j] = out[j];
  }
}

/// offset_of with 32-bit index math when the caller knows every linear index
/// and dim size fits (Idx = uint32_t), else 64-bit (Idx = int64_t).
template <typename Idx>
__device__ __forceinline__ int64_t offset_of_t(const StridedLayout& l, Idx linear) {
  int64_t off = 0;
#pragma unroll 1
  for (int d = l.ndim - 1; d >= 0; --d) {
    const Idx s = static_cast<Idx>(l.shape[d]);
    const Idx q = linear / s;
    off += static_cast<int64_t>(linear - q * s) * l.strides[d];
    linear = q;
  }
  return off;
}

inline void check_layout(const StridedLayout& l, const char* kernel, const char* name) {
  BT_CHECK(l.ndim >= 0 && l.ndim <= kMaxDims, "cuda ", kernel, ": ", name, " has ndim ", l.ndim,
           " (must be 0..", kMaxDims, ")");
  for (int d = 0; d < l.ndim; ++d)
    BT_CHECK(l.shape[d] >= 0, "cuda ", kernel, ": ", name, " has negative size ", l.shape[d], " in dim ", d);
}

}  // namespace bt::kernels::cuda::detail
