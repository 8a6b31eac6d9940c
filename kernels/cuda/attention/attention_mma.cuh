// Internal entry points of the tensor-core (mma.sync) causal attention in
// kernels/cuda/attention/attention_mma.cu; kernels/cuda/attention/attention.cu dispatches to them
// and keeps the SIMT kernels as the general fallback. Not a public header.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.h"

namespace bt::kernels::cuda::detail {

/// Run when attention_forward_path / attention_backward_path (kernels/attention.h)
/// say AttnPath::TensorCore: BF16 with D in {32, 64, 128} (backward {32, 64}),
/// or F32 with math Tf32 or Tf32x3 and D in {32, 64}; a finite scale > 0,
/// every row of every view on a 16-byte boundary.
void attention_forward_mma(const AttnForward& a, cudaStream_t stream);
/// The dQ pass (which also writes Di = rowsum(dO * O) into `di`, [B, H, T]
/// floats: the backward's scratch), then the dK/dV pass.
void attention_backward_mma(const AttnBackward& a, float* di, cudaStream_t stream);
/// The Hopper wgmma forward (kernels/cuda/sm90a/attention_wgmma.cu, built when
/// BT_SM90A): BF16, D = 64; attention_forward_mma calls it when
/// attention_forward_uses_wgmma (kernels/attention.h).
void attention_forward_wgmma(const AttnForward& a, cudaStream_t stream);
/// The Hopper wgmma backward (kernels/cuda/sm90a/attention_wgmma_bwd.cu):
/// BF16, D = 64, both passes; attention_backward_mma calls it when
/// attention_backward_uses_wgmma.
void attention_backward_wgmma(const AttnBackward& a, float* di, cudaStream_t stream);

}  // namespace bt::kernels::cuda::detail
