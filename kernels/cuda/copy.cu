// CUDA copy / cast / fill / arange for every dtype of kernels/common/dtype.h.
//
// Casts go through one intermediate value: integers (and bool) as int64, floats
// as double. The rules are the CPU kernel's (kernels/cpu/copy.cpp), bit for bit:
//   * to a floating type: correctly rounded (RNE) from the exact source value;
//     double/int64 -> bf16/f16 go through a round-to-odd float (no double rounding);
//   * floating -> integer: truncate, saturate to the range, NaN -> 0;
//   * integer -> integer: two's-complement wrap;  to bool: x != 0 (NaN is true).
// bf16/f16 use the bit algorithms of kernels/common/dtype.h, so NaN payloads match.
#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/copy.h"
#include "kernels/cuda/common.cuh"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

// ------------------------------------------- conversions (host and device)
/// The float nearest d toward zero with its last bit set when inexact ("round
/// to odd"); rounding it again to <= 22 bits of precision is correctly rounded.
__host__ __device__ inline float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) == 0x7f800000u) {
    u = (u & 0x80000000u) | 0x7f7fffffu;  // +-FLT_MAX
  } else if ((static_cast<double>(f) < 0 ? -static_cast<double>(f) : static_cast<double>(f)) >
             (d < 0 ? -d : d)) {
    u -= 1u;  // nextafter toward zero (f is non-zero here)
  }
  return bits_f32(u | 1u);
}

__host__ __device__ inline float round_to_odd_float(int64_t x) {
  const uint64_t mag = x < 0 ? uint64_t{0} - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
  int shift = 0;
  while ((mag >> shift) >= (uint64_t{1} << 24)) ++shift;
  uint64_t m = mag >> shift;
  if (shift > 0 && (mag & ((uint64_t{1} << shift) - 1)) != 0) m |= 1u;  // sticky
  const float f = ldexpf(static_cast<float>(m), shift);                 // exact
  return x < 0 ? -f : f;
}

template <typename I>
__host__ __device__ inline I saturate_trunc(double d) {
  if (d != d) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<I>::max());
  if (d <= lo) return std::numeric_limits<I>::min();
  if (d >= hi) return std::numeric_limits<I>::max();
  return static_cast<I>(d);
}

struct Value {
  double f;
  int64_t i;
  bool is_int;
};

__device__ __forceinline__ Value load_value(DType dt, const void* base, int64_t off) {
  Value v{0.0, 0, false};
  switch (dt) {
    case DType::F32:
      v.f = static_cast<double>(static_cast<const float*>(base)[off]);
      break;
    case DType::F64:
      v.f = static_cast<const double*>(base)[off];
      break;
    case DType::BF16:
      v.f = static_cast<double>(dev_bf16_bits_to_float(static_cast<const uint16_t*>(base)[off]));
      break;
    case DType::F16:
      v.f = static_cast<double>(dev_f16_bits_to_float(static_cast<const uint16_t*>(base)[off]));
      break;
    case DType::I32:
      v.i = static_cast<const int32_t*>(base)[off];
      v.is_int = true;
      break;
    case DType::I64:
      v.i = static_cast<const int64_t*>(base)[off];
      v.is_int = true;
      break;
    case DType::U16:
      v.i = static_cast<const uint16_t*>(base)[off];
      v.is_int = true;
      break;
    case DType::U8:
      v.i = static_cast<const uint8_t*>(base)[off];
      v.is_int = true;
      break;
    case DType::Bool:
      v.i = static_cast<const uint8_t*>(base)[off] != 0;
      v.is_int = true;
      break;
  }
  return v;
}

/// For bf16/f16 targets: a float that rounds to the correctly rounded result.
__device__ __forceinline__ float value_to_odd_float(const Value& v) {
  return v.is_int ? round_to_odd_float(v.i) : round_to_odd_float(v.f);
}

template <typename I>
__device__ __forceinline__ I value_to_int(const Value& v) {
  return v.is_int ? static_cast<I>(v.i) : saturate_trunc<I>(v.f);
}

__device__ __forceinline__ void store_value(DType dt, void* base, int64_t i, const Value& v) {
  switch (dt) {
    case DType::F32:
      static_cast<float*>(base)[i] = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.f);
      break;
    case DType::F64:
      static_cast<double*>(base)[i] = v.is_int ? static_cast<double>(v.i) : v.f;
      break;
    case DType::BF16:
      static_cast<uint16_t*>(base)[i] = dev_float_to_bf16_bits(value_to_odd_float(v));
      break;
    case DType::F16:
      static_cast<uint16_t*>(base)[i] = dev_float_to_f16_bits(value_to_odd_float(v));
      break;
    case DType::I32:
      static_cast<int32_t*>(base)[i] = value_to_int<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(base)[i] = value_to_int<int64_t>(v);
      break;
    case DType::U16:
      static_cast<uint16_t*>(base)[i] = value_to_int<uint16_t>(v);
      break;
    case DType::U8:
      static_cast<uint8_t*>(base)[i] = value_to_int<uint8_t>(v);
      break;
    case DType::Bool:
      static_cast<uint8_t*>(base)[i] = v.is_int ? (v.i != 0 ? 1 : 0) : (v.f != 0.0 ? 1 : 0);
      break;
  }
}

/// Converting gather: dst[i] = cast(src[layout.offset_of(i)]).
template <typename Idx, bool kContiguous>
__global__ void convert_kernel(DType src_dt, const void* __restrict__ src, StridedLayout layout, DType dst_dt,
                               void* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t off = kContiguous ? i : offset_of_t<Idx>(layout, static_cast<Idx>(i));
    store_value(dst_dt, dst, i, load_value(src_dt, src, off));
  }
}

/// Same-dtype gather of raw elements of type U (1, 2, 4 or 8 bytes).
template <typename U, typename Idx>
__global__ void gather_kernel(const U* __restrict__ src, StridedLayout layout, U* __restrict__ dst,
                              int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = src[offset_of_t<Idx>(layout, static_cast<Idx>(i))];
}

template <typename U>
void launch_gather(const void* src, const StridedLayout& l, void* dst, int64_t n, bool small,
                   cudaStream_t stream) {
  constexpr int kThreads = 256;
  const unsigned blocks = grid_stride_blocks(n, kThreads, 4);
  if (small)
    gather_kernel<U, uint32_t>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const U*>(src), l, static_cast<U*>(dst), n);
  else
    gather_kernel<U, int64_t>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const U*>(src), l, static_cast<U*>(dst), n);
  BT_KERNEL_CHECK();
}

/// Fills n elements of type U with `pattern`; 16-byte stores for the aligned body.
template <typename U>
__global__ void fill_kernel(U* __restrict__ dst, int64_t n, U pattern) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = pattern;
}
__global__ void fill16_kernel(uint4* __restrict__ dst, int64_t n16, uint4 pattern) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += stride)
    dst[i] = pattern;
}

template <typename U>
void launch_fill(void* dst, int64_t n, U pattern, cudaStream_t stream) {
  constexpr int kThreads = 256;
  unsigned char bytes[sizeof(U)];
  std::memcpy(bytes, &pattern, sizeof(U));
  bool uniform = true;
  for (size_t b = 1; b < sizeof(U); ++b) uniform = uniform && bytes[b] == bytes[0];
  if (uniform) {
    BT_CUDA_CHECK(cudaMemsetAsync(dst, bytes[0], static_cast<size_t>(n) * sizeof(U), stream));
    return;
  }
  int64_t done = 0;
  if (aligned_to(dst, 16) && n * static_cast<int64_t>(sizeof(U)) >= 16) {
    const int64_t per = 16 / static_cast<int64_t>(sizeof(U));
    const int64_t n16 = n / per;
    uint4 p16;
    unsigned char* pb = reinterpret_cast<unsigned char*>(&p16);
    for (int64_t j = 0; j < per; ++j) std::memcpy(pb + j * sizeof(U), &pattern, sizeof(U));
    fill16_kernel<<<grid_stride_blocks(n16, kThreads, 4), kThreads, 0, stream>>>(static_cast<uint4*>(dst),
                                                                                 n16, p16);
    BT_KERNEL_CHECK();
    done = n16 * per;
  }
  if (done < n) {
    fill_kernel<U><<<grid_stride_blocks(n - done, kThreads, 4), kThreads, 0, stream>>>(
        static_cast<U*>(dst) + done, n - done, pattern);
    BT_KERNEL_CHECK();
  }
}

__global__ void arange_kernel(DType dt, void* __restrict__ dst, int64_t n, double start, double step) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // Explicit rounding: no FMA contraction, like the host's -ffp-contract=off.
    const Value v{__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)), 0, false};
    store_value(dt, dst, i, v);
  }
}

void check_dtype(DType dt, const char* what) {
  BT_CHECK(dtype_size(dt) != 0, "cuda ", what, ": unknown dtype code ", static_cast<int>(dt));
}

/// What a one-row memset of `count` elements of `element_size` bytes writes:
/// value's low 8, 16 or 32 bits in each. One block.
__global__ void memset_node_kernel(void* __restrict__ dst, unsigned value, unsigned element_size,
                                   unsigned long long count) {
  for (unsigned long long i = threadIdx.x; i < count; i += blockDim.x) {
    if (element_size == 1)
      static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(value);
    else if (element_size == 2)
      static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(value);
    else
      static_cast<uint32_t*>(dst)[i] = value;
  }
}

}  // namespace

bool memset_kernel_node(const cudaMemsetParams& p, MemsetKernelNode* k) {
  const unsigned es = p.elementSize;
  if (p.height != 1 || p.width == 0 || (es != 1 && es != 2 && es != 4) ||
      p.width > kMemsetKernelMaxBytes / es)
    return false;
  k->dst = p.dst;
  k->value = p.value;
  k->element_size = es;
  k->count = p.width;
  k->args[0] = &k->dst;
  k->args[1] = &k->value;
  k->args[2] = &k->element_size;
  k->args[3] = &k->count;
  k->params = cudaKernelNodeParams{};
  k->params.func = reinterpret_cast<void*>(&memset_node_kernel);
  k->params.gridDim = dim3(1);
  k->params.blockDim = dim3(static_cast<unsigned>(std::min<size_t>(256, (p.width + 31) / 32 * 32)));
  k->params.kernelParams = k->args;
  return true;
}

void strided_copy(DType src_dt, const void* src, const StridedLayout& layout, DType dst_dt, void* dst,
                  cudaStream_t stream) {
  check_dtype(src_dt, "strided_copy");
  check_dtype(dst_dt, "strided_copy");
  check_layout(layout, "strided_copy", "source layout");
  const int64_t n = numel(layout);
  if (n == 0) return;
  BT_CHECK(src != nullptr && dst != nullptr, "cuda strided_copy: null buffer for ", n, " elements");
  StridedLayout l = layout;
  coalesce(&l, 1);
  const bool contiguous = is_contiguous(l);
  // 32-bit index math is exact when every linear index fits.
  const bool small = n < (int64_t{1} << 31);
  if (src_dt == dst_dt) {
    const size_t es = dtype_size(src_dt);
    if (contiguous) {
      BT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * es, cudaMemcpyDeviceToDevice, stream));
      return;
    }
    if (int64_t rows, cols, pitch; pitched_rows(l, &rows, &cols, &pitch)) {
      BT_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(cols) * es, src,
                                      static_cast<size_t>(pitch) * es, static_cast<size_t>(cols) * es,
                                      static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
      return;
    }
    switch (es) {
      case 1:
        launch_gather<uint8_t>(src, l, dst, n, small, stream);
        return;
      case 2:
        launch_gather<uint16_t>(src, l, dst, n, small, stream);
        return;
      case 4:
        launch_gather<uint32_t>(src, l, dst, n, small, stream);
        return;
      case 8:
        launch_gather<uint64_t>(src, l, dst, n, small, stream);
        return;
      default:
        BT_ASSERT(false, "element size ", es);
    }
  }
  constexpr int kThreads = 256;
  const unsigned blocks = grid_stride_blocks(n, kThreads, 4);
  if (contiguous)
    convert_kernel<int64_t, true><<<blocks, kThreads, 0, stream>>>(src_dt, src, l, dst_dt, dst, n);
  else if (small)
    convert_kernel<uint32_t, false><<<blocks, kThreads, 0, stream>>>(src_dt, src, l, dst_dt, dst, n);
  else
    convert_kernel<int64_t, false><<<blocks, kThreads, 0, stream>>>(src_dt, src, l, dst_dt, dst, n);
  BT_KERNEL_CHECK();
}

void fill(DType dt, void* dst, int64_t n, double value, cudaStream_t stream) {
  check_dtype(dt, "fill");
  BT_CHECK(n >= 0, "cuda fill: negative element count ", n);
  if (n == 0) return;
  BT_CHECK(dst != nullptr, "cuda fill: null buffer for ", n, " elements");
  switch (dt) {
    case DType::F32:
      launch_fill<uint32_t>(dst, n, f32_bits(static_cast<float>(value)), stream);
      return;
    case DType::F64: {
      uint64_t bits;
      std::memcpy(&bits, &value, 8);
      launch_fill<uint64_t>(dst, n, bits, stream);
      return;
    }
    case DType::BF16:
      launch_fill<uint16_t>(dst, n, float_to_bf16_bits(round_to_odd_float(value)), stream);
      return;
    case DType::F16:
      launch_fill<uint16_t>(dst, n, float_to_f16_bits(round_to_odd_float(value)), stream);
      return;
    case DType::I32:
      launch_fill<uint32_t>(dst, n, static_cast<uint32_t>(saturate_trunc<int32_t>(value)), stream);
      return;
    case DType::I64:
      launch_fill<uint64_t>(dst, n, static_cast<uint64_t>(saturate_trunc<int64_t>(value)), stream);
      return;
    case DType::U16:
      launch_fill<uint16_t>(dst, n, saturate_trunc<uint16_t>(value), stream);
      return;
    case DType::U8:
      launch_fill<uint8_t>(dst, n, saturate_trunc<uint8_t>(value), stream);
      return;
    case DType::Bool:
      launch_fill<uint8_t>(dst, n, static_cast<uint8_t>(value != 0.0 ? 1 : 0), stream);
      return;
  }
  BT_FAIL("cuda fill: unsupported dtype ", dt);
}

void arange(DType dt, void* dst, int64_t n, double start, double step, cudaStream_t stream) {
  check_dtype(dt, "arange");
  BT_CHECK(n >= 0, "cuda arange: negative element count ", n);
  if (n == 0) return;
  BT_CHECK(dst != nullptr, "cuda arange: null buffer for ", n, " elements");
  constexpr int kThreads = 256;
  arange_kernel<<<grid_stride_blocks(n, kThreads, 4), kThreads, 0, stream>>>(dt, dst, n, start, step);
  BT_KERNEL_CHECK();
}

}  // namespace bt::kernels::cuda
