// Copy, cast and fill kernels: gathers a strided view into a contiguous buffer
// (converting dtype on the way), fills with a constant, and writes ranges.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/layout.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
/// dst[i] = cast<dst_dt>(src[layout.offset_of(i)]) for i < prod(layout.shape).
void strided_copy(DType src_dt, const void* src, const StridedLayout& layout, DType dst_dt, void* dst);
/// dst[i] = value for i < n.
void fill(DType dt, void* dst, int64_t n, double value);
/// dst[i] = start + i * step.
void arange(DType dt, void* dst, int64_t n, double start, double step);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void strided_copy(DType src_dt, const void* src, const StridedLayout& layout, DType dst_dt, void* dst,
                  cudaStream_t stream);
void fill(DType dt, void* dst, int64_t n, double value, cudaStream_t stream);
void arange(DType dt, void* dst, int64_t n, double start, double step, cudaStream_t stream);

/// The largest memset, in bytes, that memset_kernel_node rewrites.
inline constexpr size_t kMemsetKernelMaxBytes = 4096;
/// A kernel node's parameters that write what a one-row memset writes (Note
/// [Small memsets as kernel nodes], runtime/core/cuda_graph.cpp). params
/// points into this object: keep it in place until the node is added.
struct MemsetKernelNode {
  cudaKernelNodeParams params{};
  void* dst = nullptr;
  unsigned value = 0, element_size = 0;
  unsigned long long count = 0;
  void* args[4] = {};
};
/// Fills `k` to write what `p` writes; false, leaving `k` as it was, unless
/// `p` is one row (height 1) of 1-, 2- or 4-byte elements, at most
/// kMemsetKernelMaxBytes in all.
bool memset_kernel_node(const cudaMemsetParams& p, MemsetKernelNode* k);
}  // namespace cuda
#endif
}  // namespace bt::kernels
