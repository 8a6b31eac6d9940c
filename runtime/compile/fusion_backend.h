// The fusion-backend interface: how the runtime asks a compiler for a kernel
// that computes a fusion group (runtime/compile/fusion_group.h), and runs it.
// The runtime defines it and knows nothing of MLIR; compiler/ implements it
// (compiler/mlir_backend.h) and the launcher installs that implementation.
// Until one is installed -- always in a build without MLIR 19 -- backend() is
// the no-op backend, which compiles nothing and says why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/compile/fusion_group.h"
#include "runtime/tensor/tensor.h"

namespace bt::fusion {

/// A compiled fusion group.
class Kernel {
 public:
  virtual ~Kernel() = default;
  /// Writes the group's outputs into `outputs` from `inputs` (check_tensors'
  /// rules: the group's shapes and dtypes, one device, outputs contiguous and
  /// apart from the inputs; inputs may be strided views). Throws bt::Error on
  /// a mismatch. Version counters are the caller's business: run() bumps none.
  virtual void run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) = 0;
  /// True when the backend loaded this kernel from a cache it keeps between
  /// runs instead of generating its code (compile() still made the kernel).
  virtual bool loaded_from_cache() const { return false; }
  /// What the kernel is, for profiles ("rows[16, 1024, 768] + columns[...]"); empty: nothing to say.
  virtual std::string describe() const { return ""; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  /// "mlir", "none", ...
  virtual std::string name() const = 0;
  /// The backend and its settings, for the log ("mlir backend, kernel cache in DIR").
  virtual std::string describe() const { return name() + " backend"; }
  /// Empty when this backend compiles for `device`; else a sentence saying why not.
  virtual std::string unavailable(const Device& device) const = 0;
  /// A kernel for `g` on `device`. Throws bt::Error naming the group when it
  /// cannot compile it (the caller then runs the group eagerly).
  virtual std::shared_ptr<Kernel> compile(const Group& g, const Device& device) = 0;
};

/// The installed backend (the no-op one until set_backend is called).
std::shared_ptr<Backend> backend();
/// Installs `b` process-wide; nullptr puts the no-op backend back. Lazy
/// fusion's compiled kernels (runtime/compile/lazy.h) are dropped.
void set_backend(std::shared_ptr<Backend> b);

}  // namespace bt::fusion
