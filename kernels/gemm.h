// The linear-algebra layer: row-major (batched) GEMM with optional bias and
// GELU epilogues. OpenBLAS on CPU, cuBLASLt on CUDA.
//
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]   (then + bias, then GELU)
//
// op(X) is X or X^T (trans flags). All matrices are row-major with leading
// dimensions lda/ldb/ldc in elements. A, B, C and bias share `dtype`
// (F32, F64 on CPU only, BF16); accumulation is always in fp32 (fp64 for F64).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

enum class Epilogue : uint8_t {
  None,
  Bias,      // C += bias[n] broadcast over rows (requires beta == 0)
  Gelu,      // C = gelu(C)
  BiasGelu,  // C = gelu(C + bias)
};

struct GemmArgs {
  DType dtype = DType::F32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch items
  Epilogue epilogue = Epilogue::None;
  const void* bias = nullptr;  // [n], same dtype as C
  /// For Gelu/BiasGelu: if non-null, receives the pre-activation values
  /// (same shape/ld as C) for the backward pass.
  void* pre_gelu = nullptr;
  /// F32 only: allow TF32 tensor-core math (the "tf32" precision policy).
  bool allow_tf32 = false;
};

namespace cpu {
void gemm(const GemmArgs& args);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void gemm(const GemmArgs& args, cudaStream_t stream);
/// Plain cuBLAS (cublasGemmEx / cublasSgemm), used only as the benchmark ceiling.
void cublas_reference_gemm(const GemmArgs& args, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
