#include "compiler/cuda_codegen.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <vector>

#include <llvm/Config/llvm-config.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <mlir/Conversion/Passes.h>
#include <mlir/Dialect/Arith/IR/Arith.h>
#include <mlir/Dialect/ControlFlow/IR/ControlFlow.h>
#include <mlir/Dialect/Func/IR/FuncOps.h>
#include <mlir/Dialect/GPU/IR/GPUDialect.h>
#include <mlir/Dialect/GPU/Transforms/Passes.h>
#include <mlir/Dialect/LLVMIR/LLVMDialect.h>
#include <mlir/Dialect/LLVMIR/NVVMDialect.h>
#include <mlir/Dialect/Math/IR/Math.h>
#include <mlir/Dialect/MemRef/IR/MemRef.h>
#include <mlir/Dialect/SCF/IR/SCF.h>
#include <mlir/Dialect/Vector/IR/VectorOps.h>
#include <mlir/IR/BuiltinOps.h>
#include <mlir/IR/MLIRContext.h>
#include <mlir/Target/LLVM/NVVM/Target.h>
#include <mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h>
#include <mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h>
#include <mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h>
#include <mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h>
#include <mlir/Transforms/Passes.h>

#include "compiler/mlir_run.h"
#include "kernels/common/error.h"

namespace bt::compiler {

const char* const kCudaPipeline =
    "nvvm-attach-target{chip={chip} O=3 l={libdevice}}, gpu.module(convert-scf-to-cf, "
    "convert-vector-to-llvm, "
    "convert-gpu-to-nvvm{index-bitwidth=64 use-bare-ptr-memref-call-conv=1}, reconcile-unrealized-casts), "
    "gpu-module-to-binary{format=isa}";

namespace {

/// LLVM's targets (NVPTX among them) and the passes kCudaPipeline names, once per process.
void init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
    mlir::registerConversionPasses();
    mlir::registerGPUPasses();
    mlir::registerTransformsPasses();
  });
}

}  // namespace

std::string libdevice_path() {
  std::vector<std::string> roots;
  for (const char* v : {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"})
    if (const char* p = std::getenv(v); p && *p) roots.emplace_back(p);
  roots.emplace_back("/usr/local/cuda");
  roots.emplace_back("/usr/lib/cuda");
  std::vector<std::string> files;
  for (const std::string& r : roots) files.push_back(r + "/nvvm/libdevice/libdevice.10.bc");
  files.emplace_back("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc");  // Debian's toolkit
  for (const std::string& f : files)
    if (std::error_code ec; std::filesystem::is_regular_file(f, ec)) return f;
  return "";
}

namespace {

std::string replaced(std::string s, const std::string& key, const std::string& value) {
  s.replace(s.find(key), key.size(), value);
  return s;
}

}  // namespace

std::string cuda_codegen_key(const std::string& chip) {
  const std::string libdevice = libdevice_path();
  std::error_code ec;
  const auto size = libdevice.empty() ? 0 : std::filesystem::file_size(libdevice, ec);
  return "llvm " LLVM_VERSION_STRING "\nchip " + chip + "\npipeline " + kCudaPipeline + "\nlibdevice " +
         libdevice + " (" + std::to_string(ec ? 0 : size) + " bytes)\n";
}

std::string cuda_ptx(const std::string& text, const std::string& what, const std::string& chip) {
  init_once();
  mlir::DialectRegistry registry;
  registry.insert<mlir::arith::ArithDialect, mlir::cf::ControlFlowDialect, mlir::func::FuncDialect,
                  mlir::gpu::GPUDialect, mlir::LLVM::LLVMDialect, mlir::NVVM::NVVMDialect,
                  mlir::math::MathDialect, mlir::memref::MemRefDialect, mlir::scf::SCFDialect,
                  mlir::vector::VectorDialect>();
  mlir::NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  mlir::registerBuiltinDialectTranslation(registry);
  mlir::registerLLVMDialectTranslation(registry);
  mlir::registerGPUDialectTranslation(registry);
  mlir::registerNVVMDialectTranslation(registry);
  mlir::MLIRContext ctx(registry, mlir::MLIRContext::Threading::DISABLED);
  ctx.loadAllAvailableDialects();
  MlirRun mlir_run(ctx, what, "CUDA");
  mlir::OwningOpRef<mlir::ModuleOp> mod = mlir_run.parse(text);
  const std::string libdevice = libdevice_path();
  BT_CHECK(!libdevice.empty(), "compiler: ", what,
           ": libdevice.10.bc (the CUDA toolkit's math library) was not found under $CUDA_HOME, $CUDA_PATH, "
           "$CUDA_ROOT, /usr/local/cuda or /usr/lib/cuda; set CUDA_HOME to the toolkit's folder");
  mlir_run.run(*mod, replaced(replaced(kCudaPipeline, "{chip}", chip), "{libdevice}", libdevice));
  std::string ptx;
  int binaries = 0;
  mod->walk([&](mlir::gpu::BinaryOp b) {
    ++binaries;
    for (mlir::Attribute a : b.getObjects())
      if (auto o = mlir::dyn_cast<mlir::gpu::ObjectAttr>(a)) ptx = o.getObject().str();
  });
  if (binaries != 1 || ptx.empty()) {
    std::string after;
    llvm::raw_string_ostream os(after);
    mod->print(os);
    BT_FAIL("compiler: ", what, ": expected one gpu.module lowered to PTX, got ", binaries, " binaries:\n",
            after);
  }
  return ptx;
}

}  // namespace bt::compiler
