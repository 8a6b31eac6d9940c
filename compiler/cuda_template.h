// The CUDA elementwise template (Note [CUDA elementwise template]): a fusion
// group of elementwise f32 ops over one shape as a gpu.module in which each
// thread computes one 16-byte vector of every output. Plain text, no MLIR
// headers; compiler/cuda_codegen.h lowers it to PTX.
#pragma once

#include <string>

#include "runtime/compile/fusion_group.h"

namespace bt::compiler {

/// Empty when `g` fits the elementwise template; else a sentence naming what
/// does not (a reduction, a cast, a broadcast, a dtype other than f32, an
/// element count that is not a multiple of 4).
std::string cuda_elementwise_unsupported(const fusion::Group& g);

/// The module text of `g` (which must fit: cuda_elementwise_unsupported is
/// empty) as `gpu.module @bt_fused` holding the kernel `func`: its arguments
/// are the group's inputs, then its outputs, each a memref<?xvector<4xf32>>
/// over the whole contiguous tensor, then the vector count n (index); thread
/// i < n of the 1-D grid computes vector i.
std::string cuda_elementwise_module(const fusion::Group& g, const std::string& func);

}  // namespace bt::compiler
