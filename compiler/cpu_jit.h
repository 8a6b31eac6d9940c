// MLIR 19 on the CPU: a module's text through the lowering pipeline to LLVM
// IR, LLVM -O3 and object code for the host, loaded into an LLVM ORC JIT
// (LLJIT). The object code is what the kernel cache keeps
// (compiler/kernel_cache.h): a kernel loaded from it runs no MLIR pass and no
// LLVM code generation. With compiler/cuda_codegen.cpp (and the header they
// share, compiler/mlir_run.h), the only files of libbt_compiler that include
// MLIR or LLVM headers, so that the rest compiles fast.
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

/// The lines of a kernel-cache key that name this process's code generation:
/// LLVM's version, the host's target triple, CPU and features (the object code
/// uses them), the optimization level and kCpuPipeline.
std::string cpu_codegen_key();

/// One compiled module, loaded. Thread-safe to call once built.
class CpuModule {
 public:
  /// Parses `text`, runs kCpuPipeline, translates to LLVM IR, optimizes it
  /// (LLVM -O3) and compiles it to object code for the host, then loads that
  /// as load() does. Throws bt::Error with MLIR's diagnostics, naming `what`,
  /// when any step fails. `stages`, if given, receives the lowered MLIR and the
  /// LLVM IR; `object`, if given, the object code.
  static std::unique_ptr<CpuModule> compile(const std::string& text, const std::string& func,
                                            const std::string& what, Stages* stages = nullptr,
                                            std::string* object = nullptr);
  /// Loads object code compile() made (in this process or another with the
  /// same cpu_codegen_key()) and finds `func`'s entry point. Throws bt::Error
  /// naming `what` when the object does not load or lacks the entry point.
  static std::unique_ptr<CpuModule> load(const std::string& object, const std::string& func,
                                         const std::string& what);
  ~CpuModule();
  CpuModule(const CpuModule&) = delete;
  CpuModule& operator=(const CpuModule&) = delete;

  /// Calls the function (emitted with llvm.emit_c_interface, returning
  /// nothing) with one memref descriptor per argument: each a pointer to
  /// {allocated, aligned, offset, sizes[rank], strides[rank]} as 64-bit words.
  void call(std::vector<std::vector<int64_t>>& descriptors) const;

 private:
  struct Impl;
  explicit CpuModule(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bt::compiler
