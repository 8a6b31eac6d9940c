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
/// The dQ pass (which also writes Di = rowsum(dO * O) into the first [B, H,
/// T] floats of `scratch`), then the dK/dV pass; or, where the wgmma backward
/// runs and `scratch_floats` reach onepass_scratch(a.shape).total, its one
/// pass.
void attention_backward_mma(const AttnBackward& a, float* scratch, size_t scratch_floats,
                            cudaStream_t stream);
/// The Hopper wgmma forward (kernels/cuda/sm90a/attention_wgmma.cu, built when
/// BT_SM90A): BF16, D = 64; attention_forward_mma calls it when
/// attention_forward_uses_wgmma (kernels/attention.h).
void attention_forward_wgmma(const AttnForward& a, cudaStream_t stream);
/// The Hopper wgmma backward (kernels/cuda/sm90a/attention_wgmma_bwd.cu):
/// BF16, D = 64; attention_backward_mma calls it when
/// attention_backward_uses_wgmma. One pass given the scratch of
/// onepass_scratch, else two.
void attention_backward_wgmma(const AttnBackward& a, float* scratch, size_t scratch_floats,
                              cudaStream_t stream);

/// Where the wgmma backward's one pass keeps its state in the scratch (Note
/// [dQ in the dK/dV pass, summed in key order]): Di, then dQ's f32 sums
/// ([B H][tiles][64][64], on a 256-byte boundary), then the turn counters
/// ([B H][tiles] ints). total is 0 for grouped queries, which take two passes.
struct OnePassScratch {
  size_t sum_offset = 0, turn_offset = 0, turns = 0, total = 0;
};
inline OnePassScratch onepass_scratch(const AttnShape& s) {
  OnePassScratch l;
  if (s.B <= 0 || s.H <= 0 || s.T <= 0 || s.group() != 1) return l;
  const size_t bh = static_cast<size_t>(s.B * s.H), tiles = static_cast<size_t>((s.T + 63) / 64);
  l.sum_offset = (bh * static_cast<size_t>(s.T) + 63) / 64 * 64;
  l.turn_offset = l.sum_offset + bh * tiles * 64 * 64;
  l.turns = bh * tiles;
  l.total = l.turn_offset + l.turns;
  return l;
}

}  // namespace bt::kernels::cuda::detail
