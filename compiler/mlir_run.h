// Parsing a module's text and running a pass pipeline on it, with MLIR's
// diagnostics as the error: what the CPU JIT (compiler/cpu_jit.cpp) and the
// CUDA lowering (compiler/cuda_codegen.cpp) share. Internal to libbt_compiler's
// MLIR translation units: it includes MLIR headers.
#pragma once

#include <string>

#include <llvm/Support/raw_ostream.h>
#include <mlir/IR/BuiltinOps.h>
#include <mlir/IR/Diagnostics.h>
#include <mlir/IR/MLIRContext.h>
#include <mlir/Parser/Parser.h>
#include <mlir/Pass/PassManager.h>
#include <mlir/Pass/PassRegistry.h>

#include "kernels/common/error.h"

namespace bt::compiler {

/// Collects the context's diagnostics while it lives; parse() and run() throw
/// bt::Error with them, naming `what` (the group) and `kind` (CPU, CUDA).
class MlirRun {
 public:
  MlirRun(mlir::MLIRContext& ctx, std::string what, std::string kind)
      : ctx_(ctx),
        what_(std::move(what)),
        kind_(std::move(kind)),
        handler_(&ctx, [this](mlir::Diagnostic& d) {
          llvm::raw_string_ostream os(diags_);
          os << d.getLocation() << ": " << d << "\n";
          return mlir::success();
        }) {}

  mlir::OwningOpRef<mlir::ModuleOp> parse(const std::string& text) {
    mlir::OwningOpRef<mlir::ModuleOp> mod = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx_);
    BT_CHECK(mod, "compiler: ", what_, ": MLIR could not parse the emitted module (a compiler bug):\n",
             diags_);
    return mod;
  }

  void run(mlir::ModuleOp mod, const std::string& pipeline) {
    mlir::PassManager pm(&ctx_);
    std::string err;
    llvm::raw_string_ostream es(err);
    BT_CHECK(mlir::succeeded(mlir::parsePassPipeline(pipeline, pm, es)), "compiler: the ", kind_,
             " pipeline '", pipeline, "' does not parse: ", err);
    BT_CHECK(mlir::succeeded(pm.run(mod)), "compiler: ", what_, ": the ", kind_, " pipeline failed:\n",
             diags_);
  }

  const std::string& diagnostics() const { return diags_; }

 private:
  mlir::MLIRContext& ctx_;
  std::string what_, kind_, diags_;
  mlir::ScopedDiagnosticHandler handler_;
};

}  // namespace bt::compiler
