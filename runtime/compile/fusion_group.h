// A fusion group: the small graph IR of one region of elementwise and
// reduction ops that a fusion backend (runtime/compile/fusion_backend.h)
// compiles into one kernel. Plain data -- no MLIR, no tensors -- so the
// runtime can build it and a compiler can read it.
//
// Nodes are in topological order; node i reads nodes < i. Every node has a
// dtype (f32, f64 or bf16) and a static shape:
//   Input k     the group's k-th argument (a tensor of that shape and dtype;
//               any strides). `strides` empty: any strides, the compiled
//               kernel may copy it contiguous first; else exactly these
//               element strides (0 for dims of size 1: input_layout()), which
//               a kernel may read in place (a narrowed half, an expanded
//               view), and they are part of the canonical text
//   Scalar v    the constant v rounded to the node's dtype, shape [] (it
//               broadcasts anywhere); an argument of elementwise ops only.
//               A bf16 op's scalar may be f32, as the kernels' scalar ops
//               hold it (the op then computes in f32 and rounds once)
//   Neg Exp Log Tanh Sqrt             elementwise on one argument of the same shape
//   Add Sub Mul Div Pow               elementwise on two arguments whose shapes
//                                     broadcast (NumPy rules) to the node's shape;
//                                     the node's shape may be larger still (the
//                                     result broadcast to it: a reduction's
//                                     backward, gradient expanded over the
//                                     reduced dims, is `mul %g, 1.0` so)
//   Cast        the argument converted to the node's dtype (round to nearest even)
//   Sum Max     the argument reduced over `dims` (sorted, distinct); the node's
//               shape drops them, or keeps them as 1 with `keepdim`
// All math is the eager ops' (runtime/ops/elementwise.h, reduce.h): bf16
// values are computed in f32 and rounded once per node, and a bf16 Sum
// accumulates in f32. `outputs` are the computed nodes the group writes
// (distinct; no Input or Scalar), in the order of the kernel's output tensors.
//
// run_eager() runs a group through the eager ops: the reference every
// compiled kernel is tested against, and the fallback when one fails to compile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt::fusion {

enum class Op : uint8_t { Input, Scalar, Neg, Exp, Log, Tanh, Sqrt, Add, Sub, Mul, Div, Pow, Cast, Sum, Max };

/// "input", "scalar", "neg", ... (the canonical text's spelling).
const char* op_name(Op op);
bool is_unary(Op op);
bool is_binary(Op op);
bool is_reduction(Op op);

struct Node {
  Op op = Op::Input;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<int> args;         // node indices
  int input = -1;                // Input: the argument's index
  std::vector<int64_t> strides;  // Input: the argument's layout (input_layout), empty = contiguous
  double value = 0.0;            // Scalar
  std::vector<int64_t> dims;     // Sum, Max: the reduced dims of args[0]
  bool keepdim = false;          // Sum, Max
};

struct Group {
  std::string name;  // in messages and dumps
  std::vector<Node> nodes;
  std::vector<int> outputs;

  // ---- building (each returns the new node's index; shapes and dtypes are
  // derived and checked; a node that fails the checks is not added)
  /// `strides`: input_layout() of the argument (empty: contiguous).
  int input(DType dtype, const Shape& shape, std::vector<int64_t> strides = {});
  int scalar(double value, DType dtype);
  int unary(Op op, int a);
  int binary(Op op, int a, int b);
  /// A binary node whose result is broadcast to `shape` (which the arguments' broadcast shape must broadcast
  /// to).
  int binary(Op op, int a, int b, const Shape& shape);
  int cast(int a, DType dtype);
  int reduce(Op op, int a, std::vector<int64_t> dims, bool keepdim = false);
  void output(int node) { outputs.push_back(node); }

  /// The Input nodes in argument order (index k holds the node of argument k).
  std::vector<int> inputs() const;
  /// Throws bt::Error, naming the group and the node, unless the group is well formed.
  void validate() const;
  /// The checks of node i alone (what each builder runs on the node it adds).
  void validate_node(int i) const;
  /// One line per node and one for the outputs: what the cache key hashes and dumps show.
  std::string canonical() const;

 private:
  int push(const Node& n);
};

/// The layout an Input node records for `t`: empty when t is contiguous or
/// its last dim has a stride other than 1 or 0 (a transpose: kernels copy
/// it), else its
/// strides with 0 for every dim of size 1 (where a stride means nothing), so
/// that equal layouts give equal canonical text.
std::vector<int64_t> input_layout(const Tensor& t);

/// Checks that `inputs` and `outputs` match the group's arguments and outputs
/// (count, shape, dtype, the layout of an input that records one, one
/// device; outputs contiguous and not overlapping any input); `what` names
/// the caller in the error.
void check_tensors(const Group& g, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const char* what);

/// ||a - b|| / ||b|| over all elements, in double (||a - b|| when b is all
/// zeros): how compiled groups are compared with run_eager (compile.check, tests).
double relative_difference(const Tensor& a, const Tensor& b);

/// The group's outputs computed by the eager ops from `inputs` (not recorded by autograd).
std::vector<Tensor> run_eager(const Group& g, const std::vector<Tensor>& inputs);

}  // namespace bt::fusion
