// MLIR 19 on the CPU: a module's text through the lowering pipeline to LLVM,
// then MLIR's ExecutionEngine (the JIT). The only file of libbt_compiler that
// includes MLIR headers besides the backend's registration
// (compiler/mlir_backend.cpp), so that the rest compiles fast.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace bt::compiler {

/// The stages a compile passes through, for compile.dump: (name, text).
using Stages = std::vector<std::pair<std::string, std::string>>;

/// The lowering pipeline (Note [Fusion groups in linalg] in compiler/linalg_emitter.h):
/// fuse, bufferize into the destinations, free what is left, loops, LLVM.
extern const char* const kCpuPipeline;

/// One compiled module. Thread-safe to call once built.
class CpuModule {
 public:
  /// Parses `text`, runs kCpuPipeline and JIT-compiles it (LLVM -O3). Throws
  /// bt::Error with MLIR's diagnostics, naming `what`, when any step fails.
  /// `stages`, if given, receives the lowered MLIR and the LLVM IR.
  CpuModule(const std::string& text, const std::string& what, Stages* stages = nullptr);
  ~CpuModule();
  CpuModule(const CpuModule&) = delete;
  CpuModule& operator=(const CpuModule&) = delete;

  /// Calls `func` (emitted with llvm.emit_c_interface, returning nothing) with
  /// one memref descriptor per argument: each a pointer to {allocated,
  /// aligned, offset, sizes[rank], strides[rank]} as 64-bit words.
  void call(const std::string& func, std::vector<std::vector<int64_t>>& descriptors) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bt::compiler
