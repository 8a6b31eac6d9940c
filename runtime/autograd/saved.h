// A tensor saved by a forward op for its backward, with the version it had.
#pragma once

#include <memory>
#include <string>

#include "runtime/tensor/tensor.h"

namespace bt {
namespace autograd {
struct Recipe;
}

/// Holds a detached alias (same storage and version counter, no graph link, so
/// saving an op's own output creates no reference cycle). unpack() refuses if
/// the tensor was modified in place since it was saved (Note [Version counter])
/// or if the graph was already freed by a backward pass. A tensor whose
/// storage carries a recompute recipe is kept as that recipe and its view's
/// geometry, not its memory, and rebuilt by unpack() (Note [Selective recompute]).
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op);
  Tensor unpack() const;
  void release() {
    data_ = Tensor();
    recipe_.reset();
    released_ = true;
  }
  bool defined() const { return data_.defined() || released_; }
  /// Whether this holds a recipe instead of the tensor's memory.
  bool recomputed() const { return recipe_ != nullptr; }

 private:
  Tensor data_;  // with a recipe: the view's geometry over a placeholder storage
  std::shared_ptr<autograd::Recipe> recipe_;
  uint64_t version_ = 0;
  const char* op_ = "";
  bool released_ = false;
};

}  // namespace bt
