#include "compiler/mlir_backend.h"

#ifdef BT_MLIR
#include <filesystem>
#include <fstream>

#include "compiler/cpu_jit.h"
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
  CpuKernel(fusion::Group g, std::string func, std::unique_ptr<CpuModule> m)
      : g_(std::move(g)), func_(std::move(func)), module_(std::move(m)) {}

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
    module_->call(func_, desc);
  }

 private:
  fusion::Group g_;
  std::string func_;
  std::unique_ptr<CpuModule> module_;
};

class MlirBackend final : public fusion::Backend {
 public:
  explicit MlirBackend(BackendOptions opts) : opts_(std::move(opts)) {}

  std::string name() const override { return "mlir"; }

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
    Stages stages;
    auto m = std::make_unique<CpuModule>(text, "fusion group '" + g.name + "'",
                                         opts_.dump_dir.empty() ? nullptr : &stages);
    if (!opts_.dump_dir.empty()) {
      const std::filesystem::path dir = std::filesystem::path(opts_.dump_dir) / symbol(g.name);
      std::filesystem::create_directories(dir);
      write_file(dir / "group.txt", g.canonical());
      write_file(dir / "linalg.mlir", text);
      for (const auto& [file, body] : stages) write_file(dir / file, body);
    }
    return std::make_shared<CpuKernel>(g, func, std::move(m));
  }

 private:
  BackendOptions opts_;
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
