#include "compiler/mlir_backend.h"

#ifdef BT_MLIR
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "compiler/cpu_jit.h"
#include "compiler/kernel_cache.h"
#include "compiler/linalg_emitter.h"
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
    if (device.is_cuda())
      return "the compiler does not generate CUDA kernels yet (the CPU JIT exists); groups on " +
             device.str() + " run eagerly";
    return "";
  }

  std::shared_ptr<fusion::Kernel> compile(const fusion::Group& g, const Device& device) override {
    const std::string why = unavailable(device);
    BT_CHECK(why.empty(), "cannot compile fusion group '", g.name, "': ", why);
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
