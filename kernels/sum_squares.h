// The sum of the squares of many buffers in one pass: the inner loop of the
// global gradient norm, which before this ran a multiply and two reductions
// per gradient (about six launches for each of GPT-2's 148 tensors).
//
// Deterministic: every buffer is cut into chunks whose bounds depend only on
// its size, each chunk is summed by one block in a fixed order, and the chunk
// sums are added in chunk order (in double). The result depends on neither
// the device nor the launch timing. CUDA only: the CPU path composes the
// existing mul and sum ops (runtime/ops/reduce.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

/// One contiguous buffer of `n` elements of `dt` (F32 or BF16).
struct SquaresInput {
  DType dt = DType::F32;
  const void* data = nullptr;
  int64_t n = 0;
};

#ifdef BT_CUDA
namespace cuda {
/// Floats of scratch that sum_squares needs for these inputs (one per chunk).
size_t sum_squares_scratch_floats(const SquaresInput* xs, int count);
/// out[0] (one device float) = sum over i < count, j < xs[i].n of xs[i][j]^2,
/// accumulated in float within a chunk and in double across chunks.
void sum_squares(const SquaresInput* xs, int count, float* out, float* scratch, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
