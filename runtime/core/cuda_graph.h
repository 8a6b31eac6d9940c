// CudaGraph: a CUDA graph captured from the work one function queues on a
// stream, replayed later with one launch. The Trainer captures a whole
// training step with it (Note [Whole-step CUDA graphs] in
// runtime/train/trainer.cpp).
#pragma once

#include <cstddef>
#include <functional>

#include "runtime/core/stream.h"

namespace bt {

/// Whether a CudaGraph capture is under way in this process. Code that would
/// read the device back, synchronize, or query events (which a capture
/// forbids) checks it: the caching allocators defer their event bookkeeping,
/// the embedding leaves its index check to the caller.
bool capture_underway();

/// Marks a capture as under way for its lifetime (CudaGraph::capture holds
/// one; tests of code that must behave under capture hold one without CUDA).
class CaptureScope {
 public:
  CaptureScope();
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
};

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// Records what `fn` queues on `s` (a CUDA stream other than the legacy
  /// default stream; `fn` runs with `s` current) into this graph, replacing
  /// any earlier one, and instantiates it. Nothing runs on the device yet.
  /// If `fn` throws, or the capture fails, the capture is ended and
  /// discarded, this graph stays empty, and the error propagates.
  void capture(const Stream& s, const std::function<void()>& fn);
  /// Queues one run of the captured work on `s`.
  void replay(const Stream& s) const;
  bool captured() const { return exec_ != nullptr; }
  /// Nodes (kernels, copies, ...) in the captured graph.
  size_t nodes() const { return nodes_; }
  /// Memset nodes the capture turned into kernel nodes (Note [Small memsets
  /// as kernel nodes] in cuda_graph.cpp).
  size_t memsets_replaced() const { return memsets_replaced_; }

 private:
  void reset();
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  size_t nodes_ = 0;
  size_t memsets_replaced_ = 0;
};

}  // namespace bt
