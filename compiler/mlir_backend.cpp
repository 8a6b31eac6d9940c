#include "compiler/mlir_backend.h"

#ifdef BT_MLIR
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "compiler/cpu_jit.h"
#include "compiler/cuda_codegen.h"
#include "compiler/cuda_template.h"
#include "compiler/kernel_cache.h"
#include "compiler/linalg_emitter.h"
#include "runtime/core/cuda_module.h"
#include "runtime/tensor/factory.h"
#endif

namespace bt::compiler {

#ifdef BT_MLIR
namespace {

/// A symbol for `name`: letters, digits and '_' only, never starting with a digit.
std::string symbol(const std::string& name) {
  std::string s = "fused_";
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  BT_CHECK(f.good(), "compile.dump: cannot write ", p.string());
}

/// A group compiled for the CPU.
class CpuKernel final : public fusion::Kernel {
 public:
  CpuKernel(fusion::Group g, std::unique_ptr<CpuModule> m, bool loaded)
      : g_(std::move(g)), module_(std::move(m)), loaded_(loaded) {}

  bool loaded_from_cache() const override { return loaded_; }

  void run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    fusion::check_tensors(g_, inputs, outputs, "fused kernel");
    BT_CHECK(inputs.empty() || !inputs[0].is_cuda(), "fused kernel '", g_.name,
             "' was compiled for the CPU; its tensors are on ", inputs[0].device());
    std::vector<std::vector<int64_t>> desc;
    const auto add = [&](const Tensor& t) {
      std::vector<int64_t> d;
      const auto p = static_cast<int64_t>(reinterpret_cast<intptr_t>(t.data_ptr()));
      d.push_back(p);  // allocated
      d.push_back(p);  // aligned
      d.push_back(0);  // offset: data_ptr() is the view's first element
      for (int64_t s : t.shape()) d.push_back(s);
      for (int64_t s : t.strides()) d.push_back(s);
      desc.push_back(std::move(d));
    };
    for (const Tensor& t : inputs) add(t);
    for (const Tensor& t : outputs) add(t);
    module_->call(desc);
  }

 private:
  fusion::Group g_;
  std::unique_ptr<CpuModule> module_;
  bool loaded_;
};

/// A group compiled for CUDA: its kernels (Note [CUDA kernel plans]) in one
/// loaded module, launched in order on the current stream.
class CudaKernel final : public fusion::Kernel {
 public:
  CudaKernel(fusion::Group g, CudaProgram prog, std::shared_ptr<CudaModule> m, bool loaded)
      : g_(std::move(g)), prog_(std::move(prog)), module_(std::move(m)), loaded_(loaded) {
    for (int n : g_.inputs()) fixed_layout_.push_back(!g_.nodes[static_cast<size_t>(n)].strides.empty());
  }

  bool loaded_from_cache() const override { return loaded_; }
  std::string describe() const override { return prog_.summary; }

  void run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override {
    fusion::check_tensors(g_, inputs, outputs, "fused kernel");
    const Device& dev = module_->device();
    const auto on_device = [&](const Tensor& t) {
      BT_CHECK(t.device() == dev, "fused kernel '", g_.name, "' was compiled for ", dev, "; a tensor is on ",
               t.device());
    };
    // The templates index an input through the layout its node records
    // (contiguous when it records none: a strided input is copied first) and
    // read vectors at 16-byte boundaries: a misaligned input is copied, or,
    // when its layout is fixed, the group runs eagerly this once.
    std::vector<Tensor> in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      on_device(inputs[i]);
      in[i] = fixed_layout_[i] ? inputs[i] : inputs[i].contiguous();
    }
    for (const CudaLaunch& l : prog_.launches)
      for (size_t a = 0; a < l.args.size(); ++a)
        if (l.args[a].kind == CudaArg::Input && l.align[a] > 0) {
          const auto k = static_cast<size_t>(l.args[a].index);
          Tensor& t = in[k];
          if (reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(l.align[a]) == 0) continue;
          if (!fixed_layout_[k]) {
            t = t.clone();
            continue;
          }
          const std::vector<Tensor> r = fusion::run_eager(g_, inputs);
          for (size_t o = 0; o < outputs.size(); ++o) Tensor(outputs[o]).copy_(r[o]);
          return;
        }
    std::vector<Tensor> scratch;
    for (int64_t n : prog_.scratch_f32)
      scratch.push_back(empty({n}, TensorOptions{}.with_dtype(DType::F32).with_device(dev)));
    const Stream stream = Stream::current(dev);
    for (size_t k = 0; k < prog_.launches.size(); ++k) {
      const CudaLaunch& l = prog_.launches[k];
      std::vector<void*> ptr(l.args.size());
      std::vector<void*> arg(l.args.size());
      for (size_t a = 0; a < l.args.size(); ++a) {
        const CudaArg& c = l.args[a];
        const Tensor& t = c.kind == CudaArg::Input    ? in[static_cast<size_t>(c.index)]
                          : c.kind == CudaArg::Output ? outputs[static_cast<size_t>(c.index)]
                                                      : scratch[static_cast<size_t>(c.index)];
        if (c.kind == CudaArg::Output) on_device(t);
        ptr[a] = t.data_ptr();
        BT_CHECK(
            l.align[a] == 0 || reinterpret_cast<uintptr_t>(ptr[a]) % static_cast<uintptr_t>(l.align[a]) == 0,
            "fused kernel '", g_.name, "': output ", c.index, " is not ", l.align[a], "-byte aligned");
        arg[a] = &ptr[a];
      }
      CudaModule::Dims d;
      d.grid = l.grid;
      d.block = l.block;
      module_->launch(k, d, arg.data(), stream);
    }
  }

 private:
  fusion::Group g_;
  CudaProgram prog_;
  std::vector<bool> fixed_layout_;  // per input: its node records a layout (read in place)
  std::shared_ptr<CudaModule> module_;
  bool loaded_;
};

/// The kernel cache's key of `g` compiled as `func` from `text` (Note [Kernel
/// cache]): everything that changes the object code. Input strides are not in
/// it: the emitted memref types have fully dynamic strides and offsets (Note
/// [Fusion groups in linalg]), so one kernel serves every layout.
std::string cache_key(const fusion::Group& g, const std::string& func, const std::string& text) {
  char linalg[32];
  std::snprintf(linalg, sizeof linalg, "%016" PRIx64, fnv1a64(text));
  return cat("blutrain fused kernel, cpu\ncode version ", kKernelCodeVersion, "\n", cpu_codegen_key(),
             "entry ", func, "\nlinalg fnv1a64 ", linalg, "\ngroup\n", g.canonical());
}

/// The key of `g`'s CUDA program (`module` emitted as `func`) for `chip`.
std::string cuda_cache_key(const fusion::Group& g, const std::string& func, const std::string& module,
                           const std::string& chip) {
  char text[32];
  std::snprintf(text, sizeof text, "%016" PRIx64, fnv1a64(module));
  return cat("blutrain fused kernel, cuda\ncode version ", kKernelCodeVersion, "\n", cuda_codegen_key(chip),
             "entry ", func, "\nmodule fnv1a64 ", text, "\ngroup\n", g.canonical());
}

class MlirBackend final : public fusion::Backend {
 public:
  explicit MlirBackend(BackendOptions opts)
      : opts_(std::move(opts)),
        cache_(opts_.dump_dir.empty() ? opts_.cache_dir : "", opts_.cache_lock_timeout_s) {}

  std::string name() const override { return "mlir"; }

  std::string describe() const override {
    std::string s = "mlir backend, kernel cache ";
    if (cache_.enabled()) return s + "in " + cache_.dir();
    if (!opts_.dump_dir.empty() && !opts_.cache_dir.empty()) return s + "unused while compile.dump is set";
    return s + "off";
  }

  std::string unavailable(const Device& device) const override {
    if (!device.is_cuda()) return "";
    if (std::string why = cuda_modules_unavailable(); !why.empty()) return why;
    if (libdevice_path().empty())
      return "libdevice.10.bc (the CUDA toolkit's math library) was not found under $CUDA_HOME, $CUDA_PATH, "
             "$CUDA_ROOT, /usr/local/cuda or /usr/lib/cuda; set CUDA_HOME to the toolkit's folder";
    return "";
  }

  std::shared_ptr<fusion::Kernel> compile(const fusion::Group& g, const Device& device) override {
    const std::string why = unavailable(device);
    BT_CHECK(why.empty(), "cannot compile fusion group '", g.name, "': ", why);
    if (device.is_cuda()) return compile_cuda(g, device);
    const std::string func = symbol(g.name);
    const std::string text = to_linalg(g, func);
    const std::string what = "fusion group '" + g.name + "'";
    std::unique_ptr<CpuModule> m;
    if (!opts_.dump_dir.empty()) {
      Stages stages;
      m = CpuModule::compile(text, func, what, &stages);
      const std::filesystem::path dir = std::filesystem::path(opts_.dump_dir) / func;
      std::filesystem::create_directories(dir);
      write_file(dir / "group.txt", g.canonical());
      write_file(dir / "linalg.mlir", text);
      for (const auto& [file, body] : stages) write_file(dir / file, body);
      return std::make_shared<CpuKernel>(g, std::move(m), false);
    }
    const KernelCache::Outcome got = cache_.fetch(
        cache_key(g, func, text), [&](const std::string& object) { m = CpuModule::load(object, func, what); },
        [&] {
          std::string object;
          m = CpuModule::compile(text, func, what, nullptr, &object);
          return object;
        });
    return std::make_shared<CpuKernel>(g, std::move(m), got == KernelCache::Outcome::Loaded);
  }

 private:
  std::shared_ptr<fusion::Kernel> compile_cuda(const fusion::Group& g, const Device& device) {
    const std::string func = symbol(g.name);
    const std::string what = "fusion group '" + g.name + "'";
    CudaProgram prog = cuda_program(g, func);  // throws, naming the group, when no template fits
    const std::string chip = "sm_" + std::to_string(cuda_arch(device));
    std::vector<std::string> kernels;
    for (const CudaLaunch& l : prog.launches) kernels.push_back(l.kernel);
    std::string ptx;
    bool loaded = false;
    if (!opts_.dump_dir.empty()) {
      ptx = cuda_ptx(prog.module, what, chip);
      const std::filesystem::path dir = std::filesystem::path(opts_.dump_dir) / func;
      std::filesystem::create_directories(dir);
      write_file(dir / "group.txt", g.canonical());
      write_file(dir / "cuda.mlir", prog.module);
      write_file(dir / "kernel.ptx", ptx);
    } else {
      loaded =
          cache_.fetch(
              cuda_cache_key(g, func, prog.module, chip), [&](const std::string& payload) { ptx = payload; },
              [&] {
                ptx = cuda_ptx(prog.module, what, chip);
                return ptx;
              }) == KernelCache::Outcome::Loaded;
    }
    std::shared_ptr<CudaModule> m = CudaModule::load(device, ptx, kernels, what + " (" + prog.summary + ")");
    return std::make_shared<CudaKernel>(g, std::move(prog), std::move(m), loaded);
  }

  BackendOptions opts_;
  KernelCache cache_;
};

}  // namespace

std::shared_ptr<fusion::Backend> make_mlir_backend(const BackendOptions& opts) {
  return std::make_shared<MlirBackend>(opts);
}
#else
std::shared_ptr<fusion::Backend> make_mlir_backend(const BackendOptions&) { return nullptr; }
#endif

bool install_fusion_backend(const BackendOptions& opts) {
  std::shared_ptr<fusion::Backend> b = make_mlir_backend(opts);
  if (b) fusion::set_backend(b);
  return b != nullptr;
}

}  // namespace bt::compiler
