// Lazy fusion: inside a LazyScope, the fusible ops (elementwise, casts
// between float types, sums along a dim) do not compute; they return pending tensors, and the first
// read of any pending value -- by an op that is not fusible (a GEMM,
// attention, cross-entropy, a collective), a copy, item() -- computes all of
// them as fusion groups through the installed fusion backend
// (runtime/compile/fusion_backend.h).
//
// Note [Lazy fusion]
// A fusible op records a node: its op, its arguments (earlier pending nodes,
// or materialized tensors it read) and a Storage with no data whose
// `pending` points back at the node (runtime/tensor/storage.h). Autograd
// records and saves such tensors like any other, so a backward's own fusible
// ops are recorded the same way. Tensor::data_ptr() is the one door to a
// storage's data: on a pending storage, or one a pending node reads (its
// lazy_readers count; the reader must see the values from before a write),
// it runs flush() first. flush() takes every pending node and keeps what is
// live: a node whose storage someone still holds (a variable of the caller,
// a tensor saved for backward, a view) is an output; the nodes only outputs
// depend on are intermediates and never get memory; the rest are dropped.
// The live nodes of each device become one fusion group (fusion_group.h),
// whose canonical text (with the device) keys a cache of compiled kernels,
// so a step's regions compile on the first step and are looked up after.
// Each output storage gets its memory and the kernel writes it; a group the
// backend cannot compile runs through the eager ops (run_eager), with one
// warning naming the group. Results are the eager ops' to rounding (a
// compiled loop nest sums in another order than the eager kernels).
// What is not fused: ops on devices the backend does not compile for, ops
// with a zero-size tensor, and a view of a pending tensor other than the
// tensor itself (it is computed first). Flushes run with recording off.
// Under selective recompute, saved values are rebuilt inside backward groups
// instead of written by the forward's (Note [Saved values recomputed], lazy.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/compile/fusion_group.h"
#include "runtime/tensor/tensor.h"

namespace bt::fusion {

struct LazyOptions {
  /// compile.check: the first run of each compiled group also runs eagerly,
  /// and the largest relative difference is kept (LazyStats::check_max_rel_diff).
  bool check = false;
};

/// Records fusible ops lazily until it ends (it flushes then). Scopes nest;
/// the innermost's options apply.
class LazyScope {
 public:
  explicit LazyScope(const LazyOptions& opts = {});
  ~LazyScope();
  LazyScope(const LazyScope&) = delete;
  LazyScope& operator=(const LazyScope&) = delete;

 private:
  LazyOptions prev_;
};

/// True when fusible ops on `device` are recorded now: inside a LazyScope,
/// not inside a flush, and the installed backend compiles for `device`.
bool lazy_recording(const Device& device);

// The fusible ops' hooks (runtime/ops/elementwise.cpp and reduce.cpp call
// them when lazy_recording): each returns a pending, contiguous tensor with
// the eager op's shape and dtype.
Tensor lazy_unary(Op op, const Tensor& a);
Tensor lazy_binary(Op op, const Tensor& a, const Tensor& b);
/// `a op s` (Add, Mul, Pow), s in a's compute type: the kernels' scalar ops.
Tensor lazy_scalar(Op op, const Tensor& a, double s);
/// `a op s` broadcast to `shape` (a's shape must broadcast to it): a
/// reduction's backward expands its gradient so, with no eager expand copy.
Tensor lazy_scalar_to(Op op, const Tensor& a, double s, const Shape& shape);
/// `a` converted to `dtype` (f32, f64 or bf16; round to nearest even).
Tensor lazy_cast(const Tensor& a, DType dtype);
/// The sum along `dim`, kept as size 1, in `out` (a's dtype, or f32 for bf16).
Tensor lazy_sum(const Tensor& a, int dim, DType out);

/// Computes every pending value that is still held (see the note).
void flush();

struct LazyStats {
  int64_t groups_run = 0;        // fusion groups computed (compiled or eager)
  int64_t kernels_compiled = 0;  // distinct groups the backend made a kernel for (misses of the kernels here)
  int64_t kernels_loaded = 0;    // of those, the ones it loaded from its kernel cache (no code generated)
  int64_t eager_fallbacks = 0;   // group runs that went through the eager ops
  int64_t nodes_fused = 0;       // recorded ops computed inside groups
  int64_t outputs_written = 0;   // pending values that got memory (the rest never did)
  double compile_s = 0.0;        // time in the backend's compile (loads from its kernel cache included)
  double check_max_rel_diff = 0.0;
};
/// Totals since the process started (or reset_lazy_stats).
LazyStats lazy_stats();
void reset_lazy_stats();
/// Drops the compiled kernels (the next flush of each group compiles again).
void clear_kernel_cache();

}  // namespace bt::fusion
