// The one mixed-dtype result the kernels write: bf16 data into an f32 output
// (GEMM, reductions, the embedding backward), for gradients of bf16 compute
// copies kept in f32 for their f32 masters (Note [Gradients in a wider dtype],
// runtime/autograd/engine.cpp).
#pragma once

#include "kernels/common/dtype.h"

namespace bt::kernels {

/// True when `out` is wider than `in` (BF16 into F32), false when they are the
/// same; throws bt::Error naming `who` for any other pair.
inline bool widens(DType in, DType out, const char* who) {
  if (in == out) return false;
  BT_CHECK(in == DType::BF16 && out == DType::F32, who, ": ", in, " into ", out,
           " is not supported (the one mixed pair is bf16 data into an f32 result)");
  return true;
}

}  // namespace bt::kernels
