#include "compiler/cpu_jit.h"

#include <functional>
#include <mutex>

#include <llvm/IR/Module.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <mlir/Conversion/ArithToLLVM/ArithToLLVM.h>
#include <mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h>
#include <mlir/Conversion/MathToLLVM/MathToLLVM.h>
#include <mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h>
#include <mlir/Conversion/Passes.h>
#include <mlir/Dialect/Affine/IR/AffineOps.h>
#include <mlir/Dialect/Arith/IR/Arith.h>
#include <mlir/Dialect/Arith/Transforms/BufferDeallocationOpInterfaceImpl.h>
#include <mlir/Dialect/Arith/Transforms/BufferizableOpInterfaceImpl.h>
#include <mlir/Dialect/Bufferization/IR/Bufferization.h>
#include <mlir/Dialect/Bufferization/Pipelines/Passes.h>
#include <mlir/Dialect/Bufferization/Transforms/Passes.h>
#include <mlir/Dialect/ControlFlow/IR/ControlFlow.h>
#include <mlir/Dialect/Func/IR/FuncOps.h>
#include <mlir/Dialect/LLVMIR/LLVMDialect.h>
#include <mlir/Dialect/Linalg/IR/Linalg.h>
#include <mlir/Dialect/Linalg/Passes.h>
#include <mlir/Dialect/Linalg/Transforms/AllInterfaces.h>
#include <mlir/Dialect/Linalg/Transforms/BufferizableOpInterfaceImpl.h>
#include <mlir/Dialect/Math/IR/Math.h>
#include <mlir/Dialect/MemRef/IR/MemRef.h>
#include <mlir/Dialect/MemRef/Transforms/AllocationOpInterfaceImpl.h>
#include <mlir/Dialect/MemRef/Transforms/Passes.h>
#include <mlir/Dialect/SCF/IR/SCF.h>
#include <mlir/Dialect/SCF/Transforms/BufferDeallocationOpInterfaceImpl.h>
#include <mlir/Dialect/SCF/Transforms/BufferizableOpInterfaceImpl.h>
#include <mlir/Dialect/Tensor/IR/Tensor.h>
#include <mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h>
#include <mlir/Dialect/Tensor/Transforms/SubsetInsertionOpInterfaceImpl.h>
#include <mlir/ExecutionEngine/ExecutionEngine.h>
#include <mlir/ExecutionEngine/OptUtils.h>
#include <mlir/IR/BuiltinOps.h>
#include <mlir/IR/Diagnostics.h>
#include <mlir/IR/MLIRContext.h>
#include <mlir/Parser/Parser.h>
#include <mlir/Pass/PassManager.h>
#include <mlir/Pass/PassRegistry.h>
#include <mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h>
#include <mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h>
#include <mlir/Target/LLVMIR/Export.h>
#include <mlir/Transforms/Passes.h>

#include "kernels/common/error.h"

namespace bt::compiler {

const char* const kCpuPipeline =
    "func.func(linalg-fuse-elementwise-ops), eliminate-empty-tensors, one-shot-bufferize, "
    "buffer-deallocation-pipeline, convert-bufferization-to-memref, func.func(convert-linalg-to-loops), "
    "convert-scf-to-cf, expand-strided-metadata, lower-affine, finalize-memref-to-llvm, "
    "convert-math-to-llvm, "
    "convert-math-to-libm, convert-arith-to-llvm, convert-cf-to-llvm, convert-func-to-llvm, "
    "reconcile-unrealized-casts";

namespace {

/// The passes kCpuPipeline names, registered once per process.
void register_passes() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    mlir::registerTransformsPasses();
    mlir::registerLinalgPasses();
    mlir::bufferization::registerBufferizationPasses();
    mlir::bufferization::registerBufferizationPipelines();
    mlir::memref::registerMemRefPasses();
    mlir::registerConversionPasses();
  });
}

/// The dialects and interfaces the emitted modules and the pipeline use.
void add_dialects(mlir::DialectRegistry& r) {
  r.insert<mlir::affine::AffineDialect, mlir::arith::ArithDialect, mlir::bufferization::BufferizationDialect,
           mlir::cf::ControlFlowDialect, mlir::func::FuncDialect, mlir::linalg::LinalgDialect,
           mlir::LLVM::LLVMDialect, mlir::math::MathDialect, mlir::memref::MemRefDialect,
           mlir::scf::SCFDialect, mlir::tensor::TensorDialect>();
  mlir::arith::registerBufferizableOpInterfaceExternalModels(r);
  mlir::arith::registerBufferDeallocationOpInterfaceExternalModels(r);
  mlir::linalg::registerAllDialectInterfaceImplementations(r);
  mlir::memref::registerAllocationOpInterfaceExternalModels(r);
  mlir::scf::registerBufferizableOpInterfaceExternalModels(r);
  mlir::scf::registerBufferDeallocationOpInterfaceExternalModels(r);
  mlir::tensor::registerBufferizableOpInterfaceExternalModels(r);
  mlir::tensor::registerSubsetOpInterfaceExternalModels(r);
  mlir::registerConvertFuncToLLVMInterface(r);
  mlir::registerConvertMemRefToLLVMInterface(r);
  mlir::arith::registerConvertArithToLLVMInterface(r);
  mlir::registerConvertMathToLLVMInterface(r);
  mlir::registerBuiltinDialectTranslation(r);
  mlir::registerLLVMDialectTranslation(r);
}

std::string print(mlir::Operation* op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  op->print(os);
  return s;
}

}  // namespace

struct CpuModule::Impl {
  mlir::MLIRContext ctx;
  std::unique_ptr<mlir::ExecutionEngine> engine;
  explicit Impl(mlir::DialectRegistry& r) : ctx(r, mlir::MLIRContext::Threading::DISABLED) {}
};

CpuModule::CpuModule(const std::string& text, const std::string& what, Stages* stages) {
  register_passes();
  mlir::DialectRegistry registry;
  add_dialects(registry);
  impl_ = std::make_unique<Impl>(registry);
  mlir::MLIRContext& ctx = impl_->ctx;
  ctx.loadAllAvailableDialects();
  // MLIR's diagnostics become the error message.
  std::string diags;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic& d) {
    llvm::raw_string_ostream os(diags);
    os << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> mod = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
  BT_CHECK(mod, "compiler: ", what, ": MLIR could not parse the emitted module (a compiler bug):\n", diags);
  mlir::PassManager pm(&ctx);
  std::string err;
  llvm::raw_string_ostream es(err);
  BT_CHECK(mlir::succeeded(mlir::parsePassPipeline(kCpuPipeline, pm, es)), "compiler: the CPU pipeline '",
           kCpuPipeline, "' does not parse: ", err);
  BT_CHECK(mlir::succeeded(pm.run(*mod)), "compiler: ", what, ": the CPU pipeline failed:\n", diags);
  if (stages) stages->emplace_back("llvm-dialect.mlir", print(*mod));
  // ExecutionEngineOptions holds function_refs: what they call must outlive create() below.
  const std::function<llvm::Error(llvm::Module*)> optimize =
      mlir::makeOptimizingTransformer(/*optLevel=*/3, /*sizeLevel=*/0, nullptr);
  mlir::ExecutionEngineOptions opts;
  opts.transformer = optimize;
  // With dumps, the LLVM IR as translated (before LLVM's optimizations).
  std::string ll;
  const auto build = [&ll](mlir::Operation* m, llvm::LLVMContext& c) -> std::unique_ptr<llvm::Module> {
    std::unique_ptr<llvm::Module> lm = mlir::translateModuleToLLVMIR(m, c);
    if (lm) {
      llvm::raw_string_ostream os(ll);
      lm->print(os, nullptr);
    }
    return lm;
  };
  if (stages) opts.llvmModuleBuilder = build;
  auto engine = mlir::ExecutionEngine::create(*mod, opts);
  if (!engine) {
    std::string e;
    llvm::raw_string_ostream os(e);
    os << engine.takeError();
    BT_FAIL("compiler: ", what, ": the JIT could not compile the module: ", e, "\n", diags);
  }
  if (stages) stages->emplace_back("module.ll", ll);
  impl_->engine = std::move(*engine);
}

CpuModule::~CpuModule() = default;

void CpuModule::call(const std::string& func, std::vector<std::vector<int64_t>>& descriptors) const {
  std::vector<void*> ptrs(descriptors.size());
  llvm::SmallVector<void*> args;
  for (size_t i = 0; i < descriptors.size(); ++i) {
    ptrs[i] = descriptors[i].data();
    args.push_back(&ptrs[i]);
  }
  if (llvm::Error e = impl_->engine->invokePacked("_mlir_ciface_" + func, args)) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << e;
    BT_FAIL("compiler: calling ", func, " failed: ", s);
  }
}

}  // namespace bt::compiler
