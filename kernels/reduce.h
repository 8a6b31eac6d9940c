// Reductions over one dimension of a contiguous buffer viewed as
// [outer, dim, inner] -> [outer, inner]. Accumulation is in float (F32/BF16)
// or double (F64). Supported dtypes: F32, F64 (CPU only), BF16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

enum class ReduceOp : uint8_t { Sum, Mean, Max };

namespace cpu {
/// For Max, `argmax` (nullable, [outer, inner]) receives the index along dim of
/// the first maximum. NaN propagates for Max.
void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax);
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
}  // namespace cuda
#endif
}  // namespace bt::kernels
