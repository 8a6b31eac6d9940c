// ComputeCopies: the bf16 copies of the f32 masters that a bf16 forward uses,
// kept from step to step and written by AdamW as it updates the masters,
// instead of cast anew by every forward (the local and ddp strategies under
// Precision::BF16; nn::WeightSource is how the model takes them).
//
// Note [Compute copies]
// A bf16 step used to cast every weight matrix in its forward: one pass over
// the f32 masters (4 bytes read, 2 written per parameter) right after AdamW
// had read and written them. AdamW now writes the bf16 copy in the same pass
// (kernels/adamw.h, param_copy), and the forward takes that copy. The copy
// holds the same bits the cast would give (both round to nearest even), so
// nothing a run computes changes.
//
// A copy is current when it was written from the master at the master's
// present version (Tensor::version(), bumped by every in-place write: AdamW,
// a checkpoint's load, a user's copy_). weight(p) serves a current copy as
// it is and refreshes a stale one first, so a write that bypasses AdamW
// costs one cast, never a stale weight. updated() records, after each AdamW
// update, the versions of the masters it wrote (those with a gradient).
//
// Under a captured CUDA graph the host code above runs once, at capture: by
// then the warm-up steps have left every copy current, so the graph holds
// no cast, and AdamW, inside the graph, keeps the copies current at every
// replay.
//
// The gradient of a copy reaches its f32 master through a recorded cast, as
// Tensor::to records it (an f32 gradient passes uncopied: Note [Gradients in
// a wider dtype]). Parameters the model uses in f32 (ParamSpec::keep_f32)
// have no copy: weight() gives the master itself.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/dist/strategy.h"

namespace bt::dist {

class ComputeCopies : public nn::WeightSource {
 public:
  /// A `dtype` copy of every parameter of `ps` but the keep_f32 ones
  /// (allocated here, cast at its first use).
  ComputeCopies(const std::vector<ParamSpec>& ps, DType dtype);

  void enter(int) override {}
  Tensor weight(const Tensor& param) override;
  std::vector<Tensor> leave(int, const std::vector<Tensor>& outs) override { return outs; }

  /// The copies AdamW writes, with their masters: (master, copy), the copy
  /// contiguous, of its master's shape.
  std::vector<std::pair<Tensor, Tensor>> copies() const;
  /// After AdamW wrote the copies of copies(): those whose master it updated
  /// (those with a gradient) are current again.
  void updated();
  /// Bytes of the copies (allocated at construction, kept for good).
  uint64_t bytes() const;

 private:
  static constexpr uint64_t kNever = UINT64_MAX;
  struct Copy {
    Tensor master, copy;        // copy undefined for a keep_f32 master
    uint64_t version = kNever;  // the master's version the copy was written at
  };
  Copy& find(const Tensor& param);

  DType dtype_;
  std::vector<Copy> copies_;
  std::unordered_map<const void*, size_t> index_;  // master's impl -> copies_
};

}  // namespace bt::dist
