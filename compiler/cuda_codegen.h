// MLIR 19 for CUDA: a module holding one gpu.module (compiler/cuda_template.h)
// lowered to PTX through the GPU and NVVM dialects, in this process, with no
// GPU and no ptxas (gpu-module-to-binary's ISA format; libdevice linked for
// the math functions). The runtime loads and launches the PTX
// (runtime/core/cuda_module.h).
#pragma once

#include <string>

namespace bt::compiler {

/// The passes (on the builtin module) from a gpu.module to PTX, `{chip}` standing for the target
/// (sm_90) and `{libdevice}` for the CUDA toolkit's libdevice.10.bc (Note
/// [CUDA templates] in compiler/cuda_template.cpp). Memrefs are passed as bare
/// pointers: the templates' memrefs have static shapes.
extern const char* const kCudaPipeline;

/// libdevice.10.bc (the CUDA toolkit's math library as LLVM bitcode, which
/// the math ops lower to calls into) under $CUDA_HOME, $CUDA_PATH, $CUDA_ROOT,
/// /usr/local/cuda or /usr/lib/cuda (or Debian's toolkit folder); empty when
/// there is none. MLIR 19 as Debian builds it links libdevice only when
/// CUDA_HOME is set, so cuda_ptx names it explicitly.
std::string libdevice_path();

/// Everything besides the module text that the PTX depends on, for the
/// kernel cache's key: LLVM's version, the chip, the pipeline, libdevice's path and size.
std::string cuda_codegen_key(const std::string& chip);

/// The PTX of the single gpu.module in `text` for `chip` (e.g. "sm_90").
/// Throws bt::Error with MLIR's diagnostics, naming `what`, when parsing or a
/// pass fails, and when libdevice is not found (CUDA_HOME says where).
std::string cuda_ptx(const std::string& text, const std::string& what, const std::string& chip = "sm_90");

}  // namespace bt::compiler
