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
}  // namespace cuda
#endif
}  // namespace bt::kernels
