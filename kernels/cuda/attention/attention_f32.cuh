// Internal entry points of the register-tiled fp32 causal attention in
// kernels/cuda/attention/attention_f32.cu (strict fp32: FFMA only, no tensor cores);
// kernels/cuda/attention/attention.cu dispatches to them and keeps the one-row-per-lane
// SIMT kernels as the general fallback. Not a public header.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention.h"

namespace bt::kernels::cuda::detail {

/// Run when attention_forward_path / attention_backward_path (kernels/attention.h)
/// say AttnPath::F32Tiled: F32, D in {32, 64}, a finite scale, every row of
/// every view on a 16-byte boundary.
void attention_forward_f32(const AttnForward& a, cudaStream_t stream);
/// The dQ pass (which also writes Di = rowsum(dO * O) into `di`, [B, H, T]
/// floats: the backward's scratch), then the dK/dV pass.
void attention_backward_f32(const AttnBackward& a, float* di, cudaStream_t stream);

}  // namespace bt::kernels::cuda::detail
