// The MLIR text of one gpu.func of the CUDA templates (Note [CUDA templates]
// in compiler/cuda_template.cpp): SSA names and constants, the kernel's
// operands and their types, the values of a group's nodes, and the warp and
// block reductions. Plain text, no MLIR headers. Not a public header: only
// the templates use it.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/cuda_plan.h"

namespace bt::compiler {

/// `t`, or vector<v x t> when v > 1.
std::string vec(int v, const std::string& t);
/// f32 bits of `value` rounded to `t` (the value a node computes with).
std::string f32_bits(double value, DType t);
/// Per dim of `space`, the element stride of leaf `nd` (an input or a staged
/// output): its recorded layout when it has one (Node::strides, right-aligned
/// in the space; 0 where it broadcasts), else that of a contiguous tensor.
std::vector<int64_t> leaf_strides(const fusion::Node& nd, const Shape& space);

/// The MLIR of one gpu.func: SSA names, constants, the values of nodes.
class FuncEmitter {
 public:
  FuncEmitter(std::ostringstream& os, const fusion::Group& g, const KernelPlan& kp, int v);

  // ---- text
  std::string fresh() { return "%t" + std::to_string(next_++); }
  void line(const std::string& s) { os_ << std::string(static_cast<size_t>(indent_), ' ') << s << "\n"; }
  void open(const std::string& s);
  void close(const std::string& s = "}");
  std::string index(int64_t c);
  std::string int32(int64_t c);
  std::string op(const std::string& name, const std::string& a, const std::string& b,
                 const std::string& type = "index");
  std::string f32(const std::string& bits);

  // ---- operands
  /// An input, or a staged output (Note [CUDA kernel plans]): read from memory.
  bool leaf(int n) const;
  /// Whether leaf `n` is read V lanes at a time (else one element, splat
  /// when used per vector): unit stride along the innermost dim, and every
  /// other stride a multiple of V, so that a vector never straddles two rows.
  bool vector_input(int n) const;
  std::string input_type(int n) const;
  std::string output_type(int n, bool full) const;
  std::string input_name(int n) const;

  /// The element offset, in input node `n`, of element `e` of the kernel's space.
  std::string offset(int n, const std::string& e);

  std::string extend(const std::string& x, DType t, int w);
  std::string round(const std::string& x, DType t, int w);
  /// `x` (already rounded to t) as t, for a store.
  std::string narrow(const std::string& x, DType t, int w);
  std::string splat(const std::string& x);

  // ---- node values
  /// Node `n` (Level::Uniform or Const) as f32, computed at element `e`
  /// (any element of the extent over which it does not vary); memoized.
  std::string uniform(int n, const std::string& e);
  void set_uniform(int n, const std::string& v) { uni_[n] = v; }

  /// Emits (here, outside any loop) every uniform value the Full cone of `n` reads.
  void hoist_uniforms(int n, const std::string& e);

  /// Node `n` as ft_ (V lanes of f32) at element `e` (a multiple of V) of the
  /// kernel's space; `memo` is the enclosing loop body's.
  std::string full(int n, const std::string& e, std::map<int, std::string>& memo);

  /// An elementwise node or cast from its arguments' f32 values, rounded to its dtype.
  std::string compute(const fusion::Node& nd, const std::vector<std::string>& a, const std::string& type,
                      int w);

  /// x^c for a constant c of 2, -1 or 0.5 as one multiply, divide or square
  /// root (Note [CUDA templates]), else "".
  std::string pow_by_constant(const fusion::Node& nd, const std::string& x, const std::string& type, int w);

  /// tanh.approx.f32 on each of `w` lanes (Note [CUDA templates]: a bf16 tanh).
  std::string tanh_approx(const std::string& x, int w);

  // ---- reductions
  std::string combine(fusion::Op red, const std::string& a, const std::string& b,
                      const std::string& type = "f32");
  std::string identity(fusion::Op red) { return f32(red == fusion::Op::Sum ? "0x00000000" : "0xFF800000"); }
  /// The identity of `red` in every lane of ft_.
  std::string identity_lanes(fusion::Op red);
  const std::string& lanes_type() const { return ft_; }
  /// A butterfly of gpu.shuffle xor over the warp: every lane gets the same bits.
  std::string warp_reduce(fusion::Op red, std::string x);
  /// The lanes of a vector folded in order.
  std::string lanes(fusion::Op red, const std::string& x);
  /// `x` of every thread of a 1-D block of `threads` (a multiple of 32)
  /// combined; every thread gets the same bits. Uses %sh[0, threads / 32).
  std::string block_reduce(fusion::Op red, std::string x, const std::string& tid, unsigned threads);
  void set_shared(const std::string& t) { shared_type_ = t; }

 private:
  std::ostringstream& os_;
  const fusion::Group& g_;
  const KernelPlan& kp_;
  int v_;
  std::string ft_;
  std::string shared_type_;
  int next_ = 0;
  int indent_ = 6;
  std::vector<std::vector<int64_t>> stride_;
  std::map<int, std::string> uni_;
};

}  // namespace bt::compiler
