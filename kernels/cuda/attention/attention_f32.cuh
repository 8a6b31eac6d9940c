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
/// Floats of scratch with which attention_backward_f32 runs through dS in
/// memory (Note [dS through memory in fp32] in attention_f32.cu): Di, then the
/// dS tiles of as many key/value heads as fit in 256 MiB; 0 when one head's
/// tiles do not, and the least scratch (attention_backward_scratch_floats of
/// the shape, Di alone) runs the recomputing passes.
size_t attention_backward_f32_scratch_floats(const AttnShape& s);
/// The backward into `scratch` of `scratch_floats` floats (at least [B, H, T]
/// for Di): through dS in memory when it holds one key/value head's tiles
/// after Di, else the recomputing dQ pass (which also writes Di) and the
/// dK/dV pass.
void attention_backward_f32(const AttnBackward& a, float* scratch, size_t scratch_floats,
                            cudaStream_t stream);

}  // namespace bt::kernels::cuda::detail
