// Internal entry points of the register-tiled fp32 causal attention in
// kernels/cuda/attention_f32.cu (strict fp32: FFMA only, no tensor cores);
// kernels/cuda/attention.cu dispatches to them and keeps the one-row-per-lane
// SIMT kernels as the general fallback. Not a public header.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.h"

namespace bt::kernels::cuda::detail {

/// True when the tiled fp32 forward handles `a`: F32, D in {32, 64}, a finite
/// scale, and every row of q, k, v, o starts on a 16-byte boundary (aligned
/// pointers, b/h/t strides multiples of 4 elements).
bool attention_forward_f32_ok(const AttnForward& a);
/// Same for the backward (q, k, v, o, dout, dq, dk, dv).
bool attention_backward_f32_ok(const AttnBackward& a);

void attention_forward_f32(const AttnForward& a, cudaStream_t stream);
/// The dQ pass (which also writes Di = rowsum(dO * O) into `di`, [B, H, T]
/// floats: the backward's scratch), then the dK/dV pass.
void attention_backward_f32(const AttnBackward& a, float* di, cudaStream_t stream);

}  // namespace bt::kernels::cuda::detail
