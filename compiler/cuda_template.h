// The CUDA codegen templates (Note [CUDA templates]): a fusion group, planned
// into kernels (compiler/cuda_plan.h), as one gpu.module of MLIR text plus
// how to launch each kernel. Plain text, no MLIR headers;
// compiler/cuda_codegen.h lowers the module to PTX.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/cuda_plan.h"

namespace bt::compiler {

struct CudaArg {
  enum Kind { Input, Output, Scratch };
  Kind kind = Input;
  int index = 0;  // the group's input or output, or the scratch buffer
};

struct CudaLaunch {
  std::string kernel;
  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{1, 1, 1};
  std::vector<CudaArg> args;  // one pointer each, in the kernel's parameter order
  /// Per argument: its pointer must be aligned to this many bytes (16-byte vector access).
  std::vector<int> align;
};

struct CudaProgram {
  std::string module;                // MLIR text: `gpu.module @bt_fused`
  std::vector<CudaLaunch> launches;  // in order, on one stream
  std::vector<int64_t> scratch_f32;  // sizes of the scratch buffers (f32 elements)
  std::string summary;               // e.g. "rows[16384 x 768] + columns[768]", for logs
};

/// The program of `g`, its kernels named `<func>_<i>`; throws bt::Error with
/// plan_cuda's reason when no pattern covers the group.
CudaProgram cuda_program(const fusion::Group& g, const std::string& func);

}  // namespace bt::compiler
