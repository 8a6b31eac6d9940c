// The parts of the CUDA GEMM (kernels/gemm.h) that its files share:
//   gemm.cu           cuBLASLt handles, workspaces, plans and the product
//   gemm_epilogue.cu  what runs after the product when cuBLASLt does not fuse it
//   gemm_x3.cu        3xTF32 (Note [3xTF32] in kernels/gemm.h)
//   gemm_dmma.cu      strict fp32 on the FP64 tensor cores (Note [Strict fp32
//                     on the FP64 tensor cores] in kernels/gemm.h)
// Not a public header: include it only from those files.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/common/cuda_check.h"
#include "kernels/gemm.h"

namespace bt::kernels::cuda::gemm_detail {

inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// gemm.cu
/// This stream's cuBLASLt workspace on the current device, kWorkspaceBytes,
/// used in stream order.
void* workspace(cudaStream_t stream);
/// One cuBLASLt product (Strict or Tf32 for F32), then the epilogue kernel
/// when cuBLASLt could not fuse the epilogue. The caller checked the arguments
/// (gemm) or built them (gemm_x3); k > 0. Returns whether cuBLASLt also wrote
/// a.bias_grad (else the caller sums it: Note [Fused bias gradient]).
bool product(const GemmArgs& a, cudaStream_t stream);

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  BT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

// gemm_epilogue.cu
/// The cuBLASLt epilogues (cublasLtEpilogue_t) that can run a's epilogue and
/// bias_grad, the most fused first, CUBLASLT_EPILOGUE_DEFAULT (the plain
/// product) last; returns how many (at most 3). A product under the
/// DEFAULT epilogue leaves the rest to apply_epilogue and bias_grad_sum.
int lt_epilogues(const GemmArgs& a, uint32_t out[3]);
/// Sets `epi` (one of lt_epilogues(a)) and the attributes it needs on `op`;
/// c_dtype: C's dtype.
void set_lt_epilogue(cublasLtMatmulDesc_t op, uint32_t epi, const GemmArgs& a, DType c_dtype);
/// Points `epi`'s bias and aux attributes at a's buffers (set before each call).
void point_lt_epilogue(cublasLtMatmulDesc_t op, uint32_t epi, const GemmArgs& a);
/// Whether cuBLASLt's `epi` also writes a.bias_grad.
bool lt_writes_bias_grad(uint32_t epi);
/// The aux matrix cuBLASLt reads or writes for a's epilogue (pre_gelu, or
/// gelu_in for the DGelu epilogues), and its leading dimension.
const void* lt_aux(const GemmArgs& a);
int64_t lt_aux_ld(const GemmArgs& a);
/// The epilogue of `a` on C (of dtype `c_dtype`) after a plain product; with
/// `scale_mode` (k == 0) C = beta C first.
void apply_epilogue(const GemmArgs& a, DType c_dtype, bool scale_mode, cudaStream_t stream);
/// Note [Fused bias gradient] without cuBLASLt: op(A) summed over k, or for
/// DGeluBgrad C over m (Note [GELU-gradient epilogue]).
void bias_grad_sum(const GemmArgs& a, DType c_dtype, cudaStream_t stream);

// gemm_dmma.cu
/// The strict-fp32 product on the FP64 tensor cores, C = alpha op(A) op(B) +
/// beta C, plus the bias with Epilogue::Bias (the caller applies any other
/// epilogue and bias_grad after it); only where gemm_uses_dmma(a). With
/// `scratch` (scratch_floats of it, or dmma_scratch_floats(a) when 0) it may
/// split K (Note [Split K in fp64] in gemm_dmma.cu).
void gemm_dmma(const GemmArgs& a, cudaStream_t stream, float* scratch, size_t scratch_floats);
/// The scratch gemm_dmma(a) splits K with, in floats; 0 when it does not split.
size_t dmma_scratch_floats(const GemmArgs& a);

// gemm_x3.cu
/// The 3xTF32 GEMM in pieces `p` (gemm_x3_pieces), its split operands in
/// `scratch`; without bias_grad (the caller sums it).
void gemm_x3(const GemmArgs& a, const GemmPieces& p, float* scratch, cudaStream_t stream);

}  // namespace bt::kernels::cuda::gemm_detail
