#include "compiler/cpu_jit.h"

#include <algorithm>
#include <functional>
#include <mutex>

#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
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

#include "compiler/mlir_run.h"
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

/// LLVM's native target, initialized once per process (compiling and loading need it).
void init_native_target() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

/// The passes kCpuPipeline names, registered once per process.
void register_passes() {
  static std::once_flag once;
  std::call_once(once, [] {
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

std::string error_text(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return s;
}

/// LLVM's optimization level of the kernels (the pipeline's -O3).
constexpr unsigned kOptLevel = 3;

/// The host as LLVM's JIT sees it: the triple, CPU and features the object code is made for.
llvm::orc::JITTargetMachineBuilder host() {
  init_native_target();
  auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) BT_FAIL("compiler: LLVM cannot describe this host: ", error_text(jtmb.takeError()));
  return std::move(*jtmb);
}

/// The entry point load() looks up: `func`'s C interface, packed.
std::string packed_name(const std::string& func) { return "_mlir__mlir_ciface_" + func; }

/// Adds packed_name(func): void(void** args), which calls `func`'s C interface
/// (_mlir_ciface_<func>) with *args[i] as argument i -- one call signature for
/// every kernel, as MLIR's ExecutionEngine packs its functions.
void add_packed_entry(llvm::Module& m, const std::string& func, const std::string& what) {
  llvm::Function* f = m.getFunction("_mlir_ciface_" + func);
  BT_CHECK(f && !f->isDeclaration(), "compiler: ", what, ": the LLVM module has no _mlir_ciface_", func,
           " (a compiler bug)");
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  auto* type = llvm::FunctionType::get(b.getVoidTy(), {b.getPtrTy()}, /*isVarArg=*/false);
  auto* packed = llvm::Function::Create(type, llvm::Function::ExternalLinkage, packed_name(func), m);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", packed));
  std::vector<llvm::Value*> args;
  for (llvm::Argument& a : f->args()) {
    llvm::Value* slot = b.CreateConstGEP1_64(b.getPtrTy(), packed->getArg(0), a.getArgNo());
    args.push_back(b.CreateLoad(a.getType(), b.CreateLoad(b.getPtrTy(), slot)));
  }
  b.CreateCall(f, args);
  b.CreateRetVoid();
}

}  // namespace

std::string cpu_codegen_key() {
  static const std::string key = [] {
    const llvm::orc::JITTargetMachineBuilder h = host();
    std::vector<std::string> features = h.getFeatures().getFeatures();
    std::sort(features.begin(), features.end());  // the host's order is not promised
    std::string f;
    for (const std::string& x : features) f += (f.empty() ? "" : ",") + x;
    return cat("llvm ", LLVM_VERSION_STRING, "\ntarget ", h.getTargetTriple().str(), "\ncpu ", h.getCPU(),
               "\nfeatures ", f, "\nllvm-opt O", kOptLevel, "\npipeline ", kCpuPipeline, "\n");
  }();
  return key;
}

struct CpuModule::Impl {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  void (*entry)(void**) = nullptr;
};

CpuModule::CpuModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CpuModule::~CpuModule() = default;

std::unique_ptr<CpuModule> CpuModule::compile(const std::string& text, const std::string& func,
                                              const std::string& what, Stages* stages, std::string* object) {
  init_native_target();
  register_passes();
  mlir::DialectRegistry registry;
  add_dialects(registry);
  mlir::MLIRContext ctx(registry, mlir::MLIRContext::Threading::DISABLED);
  ctx.loadAllAvailableDialects();
  MlirRun mlir_run(ctx, what, "CPU");  // MLIR's diagnostics become the error message
  mlir::OwningOpRef<mlir::ModuleOp> mod = mlir_run.parse(text);
  mlir_run.run(*mod, kCpuPipeline);
  if (stages) stages->emplace_back("llvm-dialect.mlir", print(*mod));
  // LLVM IR for the host, the packed entry, -O3, object code: what MLIR's
  // ExecutionEngine does, but keeping the object (the engine dumps it only to a
  // file), and loading it the one way a cached object is loaded.
  llvm::LLVMContext llvm_ctx;
  std::unique_ptr<llvm::Module> lm = mlir::translateModuleToLLVMIR(*mod, llvm_ctx);
  BT_CHECK(lm, "compiler: ", what, ": the module did not translate to LLVM IR:\n", mlir_run.diagnostics());
  if (stages) {
    std::string ll;  // as translated, before LLVM's optimizations
    llvm::raw_string_ostream os(ll);
    lm->print(os, nullptr);
    stages->emplace_back("module.ll", ll);
  }
  auto tm = host().createTargetMachine();
  if (!tm)
    BT_FAIL("compiler: ", what, ": no LLVM target machine for this host: ", error_text(tm.takeError()));
  lm->setDataLayout((*tm)->createDataLayout());
  lm->setTargetTriple((*tm)->getTargetTriple().str());
  add_packed_entry(*lm, func, what);
  if (llvm::Error e = mlir::makeOptimizingTransformer(kOptLevel, /*sizeLevel=*/0, nullptr)(lm.get()))
    BT_FAIL("compiler: ", what, ": LLVM's optimizations failed: ", error_text(std::move(e)));
  auto obj = llvm::orc::SimpleCompiler(**tm)(*lm);
  if (!obj) BT_FAIL("compiler: ", what, ": LLVM could not compile the module: ", error_text(obj.takeError()));
  const std::string code = (*obj)->getBuffer().str();
  std::unique_ptr<CpuModule> m = load(code, func, what);
  if (object) *object = code;
  return m;
}

std::unique_ptr<CpuModule> CpuModule::load(const std::string& object, const std::string& func,
                                           const std::string& what) {
  auto jit = llvm::orc::LLJITBuilder()
                 .setJITTargetMachineBuilder(host())
                 .setPlatformSetUp(llvm::orc::setUpInactivePlatform)  // no static constructors to run
                 .setLinkProcessSymbolsByDefault(false)
                 .create();
  if (!jit) BT_FAIL("compiler: ", what, ": LLVM's JIT did not start: ", error_text(jit.takeError()));
  auto impl = std::make_unique<Impl>();
  impl->jit = std::move(*jit);
  llvm::orc::LLJIT& j = *impl->jit;
  // The process's symbols: malloc and free (buffers left after bufferization), libm, memrefCopy.
  auto process =
      llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(j.getDataLayout().getGlobalPrefix());
  if (!process)
    BT_FAIL("compiler: ", what, ": cannot resolve the process's symbols: ", error_text(process.takeError()));
  j.getMainJITDylib().addGenerator(std::move(*process));
  if (llvm::Error e = j.addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(object, what)))
    BT_FAIL("compiler: ", what, ": the object code did not load: ", error_text(std::move(e)));
  auto entry = j.lookup(packed_name(func));  // links the object
  if (!entry)
    BT_FAIL("compiler: ", what, ": the object code did not link or lacks ", packed_name(func), ": ",
            error_text(entry.takeError()));
  impl->entry = entry->toPtr<void (*)(void**)>();
  return std::unique_ptr<CpuModule>(new CpuModule(std::move(impl)));
}

void CpuModule::call(std::vector<std::vector<int64_t>>& descriptors) const {
  std::vector<void*> ptrs(descriptors.size());
  std::vector<void*> args(descriptors.size());
  for (size_t i = 0; i < descriptors.size(); ++i) {
    ptrs[i] = descriptors[i].data();
    args[i] = &ptrs[i];
  }
  impl_->entry(args.data());
}

}  // namespace bt::compiler
