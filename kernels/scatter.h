// Writes into strided destinations: the inverse of strided_copy, and the
// scatter that routes a max-reduction's gradient to its argmax positions.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/layout.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
/// dst[layout.offset_of(i)] = src[i] for i < prod(layout.shape); same dtype, any dtype.
void strided_scatter(DType dt, const void* src, void* dst, const StridedLayout& layout);
/// dx = 0, then dx[o, argmax[o, i], i] = dy[o, i]. Floating dtypes.
void argmax_scatter(DType dt, const void* dy, const int64_t* argmax, void* dx, int64_t outer, int64_t dim,
                    int64_t inner);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void strided_scatter(DType dt, const void* src, void* dst, const StridedLayout& layout, cudaStream_t stream);
void argmax_scatter(DType dt, const void* dy, const int64_t* argmax, void* dx, int64_t outer, int64_t dim,
                    int64_t inner, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
