// Embedding lookup: out[i, :] = table[idx[i], :], and its backward
// dtable[idx[i], :] += dout[i, :], into a zeroed dtable or, with accumulate,
// each row's sum onto the gradient it already holds. Dtypes: F32, F64 on CPU, BF16 (summed in
// float, rounded once). The `out_dt` overloads of the
// backward also write an F32 dtable from BF16 dout, the gradient of a bf16
// table cast from an f32 master (kernels/common/widen.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/widen.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {
namespace cpu {
/// Throws bt::Error naming the position of an index outside [0, num).
void embedding_forward(DType dt, const void* table, int64_t num, int64_t dim, const int32_t* idx, int64_t n,
                       void* out);
/// dtable is zeroed and then accumulated into, each row in index order;
/// with accumulate, each named row's sum (rounded to dtable's dtype) is added
/// onto what dtable holds, and the other rows are left as they are.
void embedding_backward(DType dt, const void* dout, const int32_t* idx, int64_t n, int64_t num, int64_t dim,
                        void* dtable, bool accumulate = false);
/// The same with dtable of dtype out_dt: dt, or F32 for BF16 dout.
void embedding_backward(DType dt, DType out_dt, const void* dout, const int32_t* idx, int64_t n, int64_t num,
                        int64_t dim, void* dtable, bool accumulate = false);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
/// Counts indices outside [0, num) into *bad_count (a device int, zeroed first).
void count_out_of_range(const int32_t* idx, int64_t n, int64_t num, int* bad_count, cudaStream_t stream);
void embedding_forward(DType dt, const void* table, int64_t num, int64_t dim, const int32_t* idx, int64_t n,
                       void* out, cudaStream_t stream);
/// Scratch floats embedding_backward needs for n indices into num rows.
size_t embedding_backward_scratch_floats(int64_t n, int64_t num);
/// Deterministic: each output row is summed in index order (Note [The
/// embedding backward by sorted runs], kernels/cuda/embedding.cu). dtable, of
/// dtype out_dt (dt, or F32 for BF16 dout), is overwritten, or with
/// accumulate each named row's sum is added onto it, as on the CPU: rows no
/// index names are then left as they are. Indices outside [0, num) add
/// nothing.
void embedding_backward(DType dt, DType out_dt, const void* dout, const int32_t* idx, int64_t n, int64_t num,
                        int64_t dim, void* dtable, bool accumulate, float* scratch, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
