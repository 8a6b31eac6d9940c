// WeightSource: where a model's forward takes its weights from when they are
// not simply its parameters. A model that supports one divides its
// parameters into units (Gpt: unit 0 = embeddings and final LayerNorm,
// unit 1 + l = block l) and calls, around the computation of each unit u,
//
//   enter(u)                       the unit's weights must be usable now
//   w = weight(p)  for each param   the tensor the ops use for parameter p;
//                                   its gradient must reach p (a leaf)
//   outs = leave(u, outs)           the unit's forward is over; the source may
//                                   wrap the tensors it hands on (all of them,
//                                   in one node: GPT's blocks hand on two) so
//                                   that backward re-enters u before any of
//                                   u's own backward runs
//
// Units may nest (the root encloses the blocks). ZeRO-3
// (runtime/dist/zero3.h) is the implementation: it gathers a unit's shards
// on enter and frees them on leave.
#pragma once

#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt::nn {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual void enter(int unit) = 0;
  virtual Tensor weight(const Tensor& param) = 0;
  /// outs may hold undefined tensors and ones that need no gradient: they
  /// come back as they are.
  virtual std::vector<Tensor> leave(int unit, const std::vector<Tensor>& outs) = 0;
};

}  // namespace bt::nn
