// Internal entry points of the tensor-core (mma.sync) causal attention in
// kernels/cuda/attention_mma.cu; kernels/cuda/attention.cu dispatches to them
// and keeps the SIMT kernels as the general fallback. Not a public header.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.h"

namespace bt::kernels::cuda::detail {

/// True when the tensor-core forward handles `a`: BF16, D in {32, 64, 128}, a
/// finite scale > 0, and every row of q, k, v, o starts on a 16-byte boundary
/// (aligned pointers, b/h/t strides multiples of 8 elements).
bool attention_forward_mma_ok(const AttnForward& a);
/// Same for the backward (D in {32, 64}; q, k, v, o, dout, dq, dk, dv).
bool attention_backward_mma_ok(const AttnBackward& a);

void attention_forward_mma(const AttnForward& a, cudaStream_t stream);
/// The dQ pass (which also writes Di = rowsum(dO * O) into `di`, [B, H, T]
/// floats: the backward's scratch), then the dK/dV pass.
void attention_backward_mma(const AttnBackward& a, float* di, cudaStream_t stream);

}  // namespace bt::kernels::cuda::detail
