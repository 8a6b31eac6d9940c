// How an F32 matrix product multiplies: the GEMMs' (kernels/gemm.h) and
// attention's (kernels/attention.h). BF16 and F64 products ignore it. The
// precision policy picks it (runtime/core/precision.h).
#pragma once

#include <cstdint>

namespace bt::kernels {

enum class GemmMath : uint8_t {
  Strict,  // fp32 operands as they are: SGEMM, or on sm_90 the FP64 tensor cores
           // (Note [Strict fp32 on the FP64 tensor cores] in kernels/gemm.h)
  Tf32,    // one TF32 tensor-core product (CUDA; the CPU computes Strict)
  Tf32x3,  // error-compensated TF32 (Note [3xTF32] in kernels/gemm.h)
};

}  // namespace bt::kernels
