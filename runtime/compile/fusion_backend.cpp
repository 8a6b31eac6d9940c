#include "runtime/compile/fusion_backend.h"

#include <mutex>

#include "runtime/compile/lazy.h"

namespace bt::fusion {
namespace {

/// What a build without MLIR 19 (or a program that installed no compiler) has.
class NoopBackend final : public Backend {
 public:
  std::string name() const override { return "none"; }
  std::string unavailable(const Device&) const override {
    return "no compiler is available: BluTrain was built without MLIR 19 (install libmlir-19-dev, "
           "mlir-19-tools and llvm-19-dev -- scripts/install-deps does -- and rebuild)";
  }
  std::shared_ptr<Kernel> compile(const Group& g, const Device& device) override {
    BT_FAIL("cannot compile fusion group '", g.name, "': ", unavailable(device));
  }
};

std::mutex g_mu;
std::shared_ptr<Backend> g_backend = std::make_shared<NoopBackend>();

}  // namespace

std::shared_ptr<Backend> backend() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_backend;
}

void set_backend(std::shared_ptr<Backend> b) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_backend = b ? std::move(b) : std::make_shared<NoopBackend>();
  }
  clear_kernel_cache();  // lazy fusion's kernels came from the backend that was installed
}

}  // namespace bt::fusion
