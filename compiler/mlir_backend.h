// The compiler's fusion backend (runtime/compile/fusion_backend.h): fusion
// groups to MLIR (compiler/linalg_emitter.h), then, on the CPU, LLVM through
// MLIR's JIT (compiler/cpu_jit.h). CUDA is not generated yet: unavailable()
// says so and the caller runs such groups eagerly.
#pragma once

#include <memory>
#include <string>

#include "runtime/compile/fusion_backend.h"

namespace bt::compiler {

struct BackendOptions {
  /// When set, each compiled group writes its stages under DIR/<group>/:
  /// group.txt (the canonical graph), linalg.mlir, llvm-dialect.mlir, module.ll.
  std::string dump_dir;
};

/// The MLIR backend, or null in a build without MLIR 19.
std::shared_ptr<fusion::Backend> make_mlir_backend(const BackendOptions& opts = {});

/// Installs make_mlir_backend() as fusion::backend() (the launcher does at
/// start); in a build without MLIR 19 the no-op backend stays. Returns whether
/// a compiler is installed.
bool install_fusion_backend(const BackendOptions& opts = {});

}  // namespace bt::compiler
