// The compiler's fusion backend (runtime/compile/fusion_backend.h): fusion
// groups to MLIR (compiler/linalg_emitter.h), then, on the CPU, LLVM object
// code loaded into LLVM's JIT (compiler/cpu_jit.h); on CUDA, the templates'
// kernels (compiler/cuda_template.h) lowered to PTX (compiler/cuda_codegen.h)
// and loaded by the runtime (runtime/core/cuda_module.h). Both kinds are kept
// in the on-disk kernel cache (compiler/kernel_cache.h, Note [Kernel cache]).
#pragma once

#include <memory>
#include <string>

#include "runtime/compile/fusion_backend.h"

namespace bt::compiler {

struct BackendOptions {
  /// When set, each compiled group writes its stages under DIR/<group>/:
  /// group.txt (the canonical graph), then on the CPU linalg.mlir,
  /// llvm-dialect.mlir, module.ll; on CUDA cuda.mlir (the templates' module) and kernel.ptx.
  std::string dump_dir;
  /// The on-disk kernel cache's folder (kernel_cache_dir() resolves
  /// compile.cache_dir to it); empty: none, kernels are compiled in memory.
  /// With dump_dir set, every group is compiled (the stages exist only then)
  /// and the cache is neither read nor written.
  std::string cache_dir{};  // {}: `{dump}` alone stays free of -Wmissing-field-initializers
  /// Seconds to wait for another process compiling the same kernel before
  /// compiling it without the cache.
  double cache_lock_timeout_s = 120.0;
};

/// The MLIR backend, or null in a build without MLIR 19.
std::shared_ptr<fusion::Backend> make_mlir_backend(const BackendOptions& opts = {});

/// Installs make_mlir_backend() as fusion::backend() (the launcher does at
/// start); in a build without MLIR 19 the no-op backend stays. Returns whether
/// a compiler is installed.
bool install_fusion_backend(const BackendOptions& opts = {});

}  // namespace bt::compiler
