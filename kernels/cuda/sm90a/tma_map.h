// Host side of the bulk tensor copies (kernels/cuda/sm90a/tma.cuh): the
// tensor maps that describe a global tensor and its copy box to the copy
// engine. Not a public header.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "kernels/attention.h"

namespace bt::kernels::cuda::detail {

/// The map of a BF16 attention view with D = 64 elements a row, [B, heads, T,
/// 64] at `base` with element strides `st` (positive multiples of 8 where
/// their dimension has more than one entry, `base` 16-byte aligned, T < 2^31:
/// see attention_forward_uses_wgmma), copied in
/// boxes of `rows` consecutive t-rows (rows <= 256) of one (b, h), 128-byte
/// swizzled: chunk c of a box's row r lands at chunk c ^ (r % 8), as
/// Bf16Ops::swz<64> and the wgmma descriptors (sm90a/wgmma.cuh) lay tiles out.
/// Rows past T arrive as zeros. Coordinates, innermost first: (0, t, h, b).
CUtensorMap tma_map_bf16_rows64(const void* base, int64_t B, int64_t heads, int64_t T, const AttnStrides& st,
                                int rows);

}  // namespace bt::kernels::cuda::detail
