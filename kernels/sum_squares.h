// The sum of the squares of many buffers in one pass: the inner loop of the
// global gradient norm, which before this ran a multiply and two reductions
// per gradient (about six launches for each of GPT-2's 148 tensors).
//
// Deterministic: every buffer is cut into chunks whose bounds depend only on
// its size, each chunk is summed by one block in a fixed order, and the chunk
// sums are added in chunk order (in double). The result depends on neither
// the device nor the launch timing. CUDA only: the CPU path composes the
// existing mul and sum ops (runtime/ops/reduce.h).
//
// clip_scale turns the sum into the clipping factor on the device, so an
// optimizer step needs no host read of the norm (Note [Step scalars] in
// runtime/optim/adamw.h): the CPU and CUDA versions compute the same doubles.
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

/// From a global sum of squares (one F32 or F64 value): out[0] = the norm,
/// sqrt(sum) in double rounded to float; out[1] = the clipping factor
/// min(1, max_norm / (norm + 1e-6)) in double rounded to float, or 1 when
/// max_norm <= 0 (clipping off). As runtime/optim/clip.h's clip_coefficient.
/// The factor is NaN when the norm is not finite, or when `loss` (optional,
/// one double) is not: AdamW then leaves its state alone (Note [Non-finite
/// steps] in runtime/train/trainer.cpp).
namespace cpu {
void clip_scale(const void* sumsq, DType dt, double max_norm, float* out, const double* loss = nullptr);
}  // namespace cpu

#ifdef BT_CUDA
namespace cuda {
void clip_scale(const void* sumsq, DType dt, double max_norm, float* out, const double* loss,
                cudaStream_t stream);
/// Floats of scratch that sum_squares needs for these inputs (one per chunk).
size_t sum_squares_scratch_floats(const SquaresInput* xs, int count);
/// out[0] (one device float) = sum over i < count, j < xs[i].n of xs[i][j]^2,
/// accumulated in float within a chunk and in double across chunks.
void sum_squares(const SquaresInput* xs, int count, float* out, float* scratch, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
