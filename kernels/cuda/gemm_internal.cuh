// The parts of the CUDA GEMM (kernels/gemm.h) that its files share:
//   gemm.cu           cuBLASLt handles, workspaces, plans and the product
//   gemm_epilogue.cu  what runs after the product when cuBLASLt does not fuse it
//   gemm_x3.cu        3xTF32 (Note [3xTF32] in kernels/gemm.h)
// Not a public header: include it only from those files.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

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

// gemm_epilogue.cu
/// The epilogue of `a` on C (of dtype `c_dtype`) after a plain product; with
/// `scale_mode` (k == 0) C = beta C first.
void apply_epilogue(const GemmArgs& a, DType c_dtype, bool scale_mode, cudaStream_t stream);
/// Note [Fused bias gradient] without cuBLASLt.
void bias_grad_sum(const GemmArgs& a, DType c_dtype, cudaStream_t stream);

// gemm_x3.cu
/// The 3xTF32 GEMM in pieces `p` (gemm_x3_pieces), its split operands in
/// `scratch`; without bias_grad.
void gemm_x3(const GemmArgs& a, const GemmPieces& p, float* scratch, cudaStream_t stream);

}  // namespace bt::kernels::cuda::gemm_detail
