// Reductions over one dimension of a contiguous buffer viewed as
// [outer, dim, inner] -> [outer, inner]. Accumulation is in float (F32/BF16)
// or double (F64). Supported dtypes: F32, F64 (CPU only), BF16. The output has
// the input's dtype, except in the `out_dt` overloads, which also sum or
// average a BF16 input into an F32 output (a bias gradient of bf16
// activations, kept in f32 for its f32 master: Note [Gradients in a wider
// dtype], runtime/autograd/engine.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/widen.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

enum class ReduceOp : uint8_t { Sum, Mean, Max };

/// True when `out_dt` differs from `dt` (a BF16 input into an F32 output);
/// throws bt::Error naming `who` for any other pair, or for Max.
inline bool reduce_widens(ReduceOp op, DType dt, DType out_dt, const char* who) {
  if (!widens(dt, out_dt, who)) return false;
  BT_CHECK(op != ReduceOp::Max, who, ": max keeps the input's dtype (asked for ", out_dt, " from ", dt, ")");
  return true;
}

namespace cpu {
/// For Max, `argmax` (nullable, [outer, inner]) receives the index along dim of
/// the first maximum. NaN propagates for Max.
void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax);
/// Sum or Mean into an output of dtype out_dt: dt, or F32 for a BF16 input.
void reduce_dim(ReduceOp op, DType dt, DType out_dt, const void* in, void* out, int64_t outer, int64_t dim,
                int64_t inner);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
/// One pass; slow when few outputs share a long dim (use the scratch overload).
void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax, cudaStream_t stream);
/// Floats of scratch that lets reduce_dim split a long dim over many blocks
/// (Sum/Mean with few outputs); 0 when it would not split.
size_t reduce_dim_scratch_floats(ReduceOp op, int64_t outer, int64_t dim, int64_t inner);
/// As above; with `scratch` of reduce_dim_scratch_floats() floats (may be null
/// when that is 0) a long dim is reduced in two deterministic passes.
void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax, float* scratch, cudaStream_t stream);
/// Sum or Mean into an output of dtype out_dt: dt, or F32 for a BF16 input.
void reduce_dim(ReduceOp op, DType dt, DType out_dt, const void* in, void* out, int64_t outer, int64_t dim,
                int64_t inner, float* scratch, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
