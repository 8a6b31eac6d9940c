// A tensor saved by a forward op for its backward, with the version it had.
#pragma once

#include <string>

#include "runtime/tensor/tensor.h"

namespace bt {

/// Holds a detached alias (same storage and version counter, no graph link, so
/// saving an op's own output creates no reference cycle). unpack() refuses if
/// the tensor was modified in place since it was saved (Note [Version counter])
/// or if the graph was already freed by a backward pass.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, const char* op);
  Tensor unpack() const;
  void release() {
    data_ = Tensor();
    released_ = true;
  }
  bool defined() const { return data_.defined() || released_; }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  const char* op_ = "";
  bool released_ = false;
};

}  // namespace bt
