// How a fusion group becomes CUDA kernels (Note [CUDA kernel plans]): its
// outputs are sorted into kernels of three patterns -- pointwise, rows
// (reductions over trailing dims, one block per row) and columns
// (reductions over leading dims, in two passes) -- each kernel computing its
// outputs from the group's inputs. Plain data and logic; no MLIR.
#pragma once

#include <string>
#include <vector>

#include "runtime/compile/fusion_group.h"

namespace bt::compiler {

enum class Pattern { Pointwise, Rows, Columns };
const char* pattern_name(Pattern p);

/// What a node is within one kernel: a constant, a value that is the same
/// across the kernel's inner extent (a row's statistic, a column's sum, a
/// broadcast parameter), or one that varies element by element.
enum class Level { Const, Uniform, Full };

struct KernelPlan {
  Pattern pattern = Pattern::Pointwise;
  /// The shape the kernel's threads cover: the outputs' shape (pointwise) or
  /// the shape the reductions read (rows, columns).
  Shape space;
  /// Rows: rows are dims [0, split) of `space`, each reduced over [split, rank).
  /// Columns: columns are dims [split, rank), reduced over [0, split).
  int split = 0;
  std::vector<int> outputs;     // positions in Group::outputs
  std::vector<int> reductions;  // the reductions it computes (chain ends), in node order
  std::vector<Level> level;     // per node of the group (meaningful for the nodes it uses)
  std::vector<bool> used;       // per node: in some output's cone (a staged node's cone excluded)
  /// Per node: a group output an earlier kernel computes, which this one
  /// reads from memory like an input (Note [CUDA kernel plans]).
  std::vector<bool> staged;
};

struct CudaPlan {
  std::vector<KernelPlan> kernels;  // in launch order
  /// Per node: for a reduction, the node it reduces once chains are merged
  /// (Note [CUDA kernel plans]); for others, -1.
  std::vector<int> reduce_base;
  /// Per node: true for a reduction merged into the next one of its chain (never computed).
  std::vector<bool> absorbed;
};

/// The plan of `g` for CUDA, or a sentence naming what no pattern covers
/// (then `plan` is unspecified).
std::string plan_cuda(const fusion::Group& g, CudaPlan* plan);

/// Per dim of `space`, the stride of a contiguous tensor of `shape` that
/// broadcasts to `space` (NumPy's right alignment): 0 where it broadcasts.
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& space);

}  // namespace bt::compiler
