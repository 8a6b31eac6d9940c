// Broadcasting binary ops and unary ops. Outputs are contiguous. Supported
// dtypes: F32, F64 (CPU only) and BF16 (computes in float).
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/layout.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Pow };
/// Unary ops. `scalar` is the exponent for PowScalar, the addend for AddScalar
/// and the factor for MulScalar; other ops ignore it.
enum class UnaryOp : uint8_t { Neg, Exp, Log, Tanh, Sqrt, PowScalar, AddScalar, MulScalar };

namespace cpu {
/// out[i] = op(a[la.offset_of(i)], b[lb.offset_of(i)]), i < prod(la.shape).
/// la and lb have the output's shape (broadcast dims have stride 0). `out` may
/// alias a or b only when that input is contiguous with the output's shape.
void binary(BinaryOp op, DType dt, const void* a, const StridedLayout& la, const void* b,
            const StridedLayout& lb, void* out);
/// out[i] = op(a[i]) over contiguous buffers; out may alias a.
void unary(UnaryOp op, DType dt, const void* a, void* out, int64_t n, double scalar);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void binary(BinaryOp op, DType dt, const void* a, const StridedLayout& la, const void* b,
            const StridedLayout& lb, void* out, cudaStream_t stream);
void unary(UnaryOp op, DType dt, const void* a, void* out, int64_t n, double scalar, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
