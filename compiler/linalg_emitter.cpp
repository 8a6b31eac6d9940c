#include "compiler/linalg_emitter.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "compiler/mlir_text.h"

namespace bt::compiler {
namespace {

using fusion::Node;
using fusion::Op;

/// The type a node's arithmetic runs in: f32 for bf16 (rounded once at the end).
DType compute_type(DType t) { return t == DType::BF16 ? DType::F32 : t; }

std::string dims_of(const Shape& s) {
  std::string out;
  for (int64_t d : s) out += std::to_string(d) + "x";
  return out;
}

std::string tensor_type(const Shape& s, DType t) { return "tensor<" + dims_of(s) + mlir_type(t) + ">"; }

std::string memref_type(const Shape& s, DType t) {
  std::string strides;
  for (size_t i = 0; i < s.size(); ++i) strides += i ? ", ?" : "?";
  return "memref<" + dims_of(s) + mlir_type(t) + ", strided<[" + strides + "], offset: ?>>";
}

/// affine_map over `rank` loop dims selecting `exprs`.
std::string affine(int64_t rank, const std::vector<std::string>& exprs) {
  std::string s = "affine_map<(";
  for (int64_t i = 0; i < rank; ++i) s += (i ? ", d" : "d") + std::to_string(i);
  s += ") -> (";
  for (size_t i = 0; i < exprs.size(); ++i) s += (i ? ", " : "") + exprs[i];
  return s + ")>";
}

/// The indexing map reading an argument of shape `a` inside loops over `out`
/// (NumPy broadcasting: right-aligned, a size-1 dim reads index 0).
std::string broadcast_map(const Shape& a, const Shape& out) {
  const int64_t R = static_cast<int64_t>(out.size()), r = static_cast<int64_t>(a.size());
  std::vector<std::string> e;
  for (int64_t i = 0; i < r; ++i) {
    const int64_t j = R - r + i;
    e.push_back(a[i] == 1 && out[j] != 1 ? "0" : "d" + std::to_string(j));
  }
  return affine(R, e);
}

std::string iterators(int64_t rank, const std::vector<int64_t>& reduced = {}) {
  std::string s = "[";
  for (int64_t i = 0; i < rank; ++i) {
    const bool red = std::find(reduced.begin(), reduced.end(), i) != reduced.end();
    s += std::string(i ? ", " : "") + (red ? "\"reduction\"" : "\"parallel\"");
  }
  return s + "]";
}

/// Emits the function body, one node at a time.
class Emitter {
 public:
  explicit Emitter(const fusion::Group& g) : g_(g) {}

  std::string run(const std::string& func) {
    const std::vector<int> in = g_.inputs();
    std::ostringstream sig;
    for (size_t k = 0; k < in.size(); ++k) {
      const Node& n = g_.nodes[in[k]];
      sig << (k ? ", " : "") << "%in" << k << ": " << memref_type(n.shape, n.dtype);
    }
    for (size_t k = 0; k < g_.outputs.size(); ++k) {
      const Node& n = g_.nodes[g_.outputs[k]];
      sig << (in.empty() && k == 0 ? "" : ", ") << "%out" << k << ": " << memref_type(n.shape, n.dtype);
    }
    os_ << "func.func @" << func << "(" << sig.str() << ") attributes {llvm.emit_c_interface} {\n";
    for (int i = 0; i < static_cast<int>(g_.nodes.size()); ++i) node(i);
    for (size_t k = 0; k < g_.outputs.size(); ++k) {
      const Node& n = g_.nodes[g_.outputs[k]];
      os_ << "  bufferization.materialize_in_destination %v" << g_.outputs[k] << " in restrict writable %out"
          << k << " : (" << tensor_type(n.shape, n.dtype) << ", " << memref_type(n.shape, n.dtype)
          << ") -> ()\n";
    }
    os_ << "  return\n}\n";
    return os_.str();
  }

 private:
  std::string fresh() { return "%t" + std::to_string(tmp_++); }

  /// In a region: `x` (of type `from`) converted to `to`, as the eager casts convert.
  std::string convert(const std::string& x, DType from, DType to) {
    if (from == to) return x;
    const auto width = [](DType t) { return t == DType::F64 ? 64 : t == DType::F32 ? 32 : 16; };
    if (from == DType::F64 && to == DType::BF16) return convert(convert(x, from, DType::F32), DType::F32, to);
    if (from == DType::F32 && to == DType::BF16) return round_to_bf16(x);
    const std::string r = fresh();
    os_ << "      " << r << " = " << (width(to) > width(from) ? "arith.extf " : "arith.truncf ") << x << " : "
        << mlir_type(from) << " to " << mlir_type(to) << "\n";
    return r;
  }

  // Note [bf16 rounding in integer ops]
  // f32 -> bf16 is written out as the eager cast's integer arithmetic
  // (float_to_bf16_bits, kernels/common/dtype.h: round to nearest even, a NaN
  // kept with its sign, quieted), not as arith.truncf. LLVM lowers truncf to
  // bf16 to one instruction where the CPU has AVX512-BF16, and elsewhere to a
  // call of __truncsfbf2, which Debian 12's libgcc (GCC 12) does not have:
  // on an AVX2-only machine every group with a bf16 cast failed to link and
  // ran eagerly. Written out, the kernels link on any x86-64 and give the
  // eager bits on all of them, NaNs included.
  std::string round_to_bf16(const std::string& x) {
    const auto line = [&](const std::string& rhs) {  // one SSA value per line, in order
      const std::string r = fresh();
      os_ << "      " << r << " = " << rhs << "\n";
      return r;
    };
    const auto c = [&](int64_t v) { return line("arith.constant " + std::to_string(v) + " : i32"); };
    const auto op = [&](const char* name, const std::string& a, const std::string& b) {
      return line(std::string(name) + " " + a + ", " + b + " : i32");
    };
    const std::string u = line("arith.bitcast " + x + " : f32 to i32");
    const std::string c16 = c(16), mag_mask = c(0x7fffffff), inf = c(0x7f800000);
    const std::string quiet_bit = c(0x40), one = c(1), half = c(0x7fff);
    const std::string hi = op("arith.shrui", u, c16);
    const std::string nan = line("arith.cmpi ugt, " + op("arith.andi", u, mag_mask) + ", " + inf + " : i32");
    const std::string quiet = op("arith.ori", hi, quiet_bit);
    const std::string bias = op("arith.addi", op("arith.andi", hi, one), half);
    const std::string rounded = op("arith.shrui", op("arith.addi", u, bias), c16);
    const std::string sel = line("arith.select " + nan + ", " + quiet + ", " + rounded + " : i32");
    return line("arith.bitcast " + line("arith.trunci " + sel + " : i32 to i16") + " : i16 to bf16");
  }

  void node(int i) {
    const Node& n = g_.nodes[i];
    switch (n.op) {
      case Op::Input:
        os_ << "  %v" << i << " = bufferization.to_tensor %in" << n.input
            << " restrict : " << memref_type(n.shape, n.dtype) << "\n";
        return;
      case Op::Scalar:
        os_ << "  %v" << i << " = arith.constant " << constant_bits(n.value, n.dtype) << " : "
            << mlir_type(n.dtype) << "\n";
        return;
      case Op::Sum:
      case Op::Max:
        reduction(i);
        return;
      default:
        elementwise(i);
    }
  }

  /// One linalg.generic over the node's shape; scalar arguments are used as values.
  void elementwise(int i) {
    const Node& n = g_.nodes[i];
    const int64_t R = static_cast<int64_t>(n.shape.size());
    std::vector<int> tensors;
    for (int a : n.args)
      if (g_.nodes[a].op != Op::Scalar && std::find(tensors.begin(), tensors.end(), a) == tensors.end())
        tensors.push_back(a);
    os_ << "  %e" << i << " = tensor.empty() : " << tensor_type(n.shape, n.dtype) << "\n";
    os_ << "  %v" << i << " = linalg.generic {indexing_maps = [";
    for (int a : tensors) os_ << broadcast_map(g_.nodes[a].shape, n.shape) << ", ";
    os_ << affine(R, identity(R)) << "], iterator_types = " << iterators(R) << "}";
    if (!tensors.empty()) {
      os_ << " ins(";
      for (size_t k = 0; k < tensors.size(); ++k) os_ << (k ? ", %v" : "%v") << tensors[k];
      os_ << " : ";
      for (size_t k = 0; k < tensors.size(); ++k)
        os_ << (k ? ", " : "") << tensor_type(g_.nodes[tensors[k]].shape, g_.nodes[tensors[k]].dtype);
      os_ << ")";
    }
    os_ << " outs(%e" << i << " : " << tensor_type(n.shape, n.dtype) << ") {\n    ^bb0(";
    for (int a : tensors) os_ << "%a" << a << ": " << mlir_type(g_.nodes[a].dtype) << ", ";
    os_ << "%o: " << mlir_type(n.dtype) << "):\n";
    // Each argument in the node's compute type (a scalar: its constant, converted).
    const DType ct = compute_type(n.dtype);
    std::vector<std::string> x;
    for (int a : n.args) {
      const Node& an = g_.nodes[a];
      const std::string v = an.op == Op::Scalar ? "%v" + std::to_string(a) : "%a" + std::to_string(a);
      x.push_back(convert(v, an.dtype, n.op == Op::Cast ? an.dtype : ct));
    }
    std::string r;
    if (n.op == Op::Cast) {
      r = convert(x[0], g_.nodes[n.args[0]].dtype, n.dtype);
    } else {
      r = fresh();
      os_ << "      " << elementwise_op(n.op, r, x, mlir_type(ct)) << "\n";
      r = convert(r, ct, n.dtype);
    }
    os_ << "      linalg.yield " << r << " : " << mlir_type(n.dtype) << "\n  } -> "
        << tensor_type(n.shape, n.dtype) << "\n";
  }

  /// A fill of the accumulator, then one linalg.generic over the argument's
  /// shape; bf16 accumulates in f32 and is rounded by a second generic.
  void reduction(int i) {
    const Node& n = g_.nodes[i];
    const Node& a = g_.nodes[n.args[0]];
    const int64_t R = static_cast<int64_t>(a.shape.size());
    const DType acc = compute_type(n.dtype);
    const std::string acc_t = tensor_type(n.shape, acc);
    if (n.dims.empty()) {  // nothing to reduce: a copy of the argument, as the eager op makes
      os_ << "  %e" << i << " = tensor.empty() : " << tensor_type(n.shape, n.dtype) << "\n";
      os_ << "  %v" << i << " = linalg.generic {indexing_maps = [" << affine(R, identity(R)) << ", "
          << affine(R, identity(R)) << "], iterator_types = " << iterators(R) << "} ins(%v" << n.args[0]
          << " : " << tensor_type(a.shape, a.dtype) << ") outs(%e" << i << " : "
          << tensor_type(n.shape, n.dtype) << ") {\n    ^bb0(%x: " << mlir_type(a.dtype)
          << ", %o: " << mlir_type(n.dtype) << "):\n      linalg.yield %x : " << mlir_type(n.dtype)
          << "\n  } -> " << tensor_type(n.shape, n.dtype) << "\n";
      return;
    }
    if (n.op == Op::Sum && n.dims.size() == 1 && row_like(a.shape, n.dims[0])) {
      row_sum(i);
      return;
    }
    std::vector<std::string> out_e;
    for (int64_t d = 0; d < R; ++d) {
      const bool red = std::find(n.dims.begin(), n.dims.end(), d) != n.dims.end();
      if (!red)
        out_e.push_back("d" + std::to_string(d));
      else if (n.keepdim)
        out_e.push_back("0");
    }
    const double init = n.op == Op::Sum ? 0.0 : -std::numeric_limits<double>::infinity();
    os_ << "  %c" << i << " = arith.constant " << constant_bits(init, acc) << " : " << mlir_type(acc) << "\n";
    os_ << "  %e" << i << " = tensor.empty() : " << acc_t << "\n";
    os_ << "  %f" << i << " = linalg.fill ins(%c" << i << " : " << mlir_type(acc) << ") outs(%e" << i << " : "
        << acc_t << ") -> " << acc_t << "\n";
    const std::string res = n.dtype == acc ? "%v" + std::to_string(i) : "%r" + std::to_string(i);
    os_ << "  " << res << " = linalg.generic {indexing_maps = [" << affine(R, identity(R)) << ", "
        << affine(R, out_e) << "], iterator_types = " << iterators(R, n.dims) << "} ins(%v" << n.args[0]
        << " : " << tensor_type(a.shape, a.dtype) << ") outs(%f" << i << " : " << acc_t
        << ") {\n    ^bb0(%x: " << mlir_type(a.dtype) << ", %acc: " << mlir_type(acc) << "):\n";
    const std::string x = convert("%x", a.dtype, acc), r = fresh();
    os_ << "      " << r << " = arith." << (n.op == Op::Sum ? "addf %acc, " : "maximumf %acc, ") << x << " : "
        << mlir_type(acc) << "\n      linalg.yield " << r << " : " << mlir_type(acc) << "\n  } -> " << acc_t
        << "\n";
    if (n.dtype != acc) {  // round the f32 result to bf16
      const int64_t ro = static_cast<int64_t>(n.shape.size());
      os_ << "  %e" << i << "b = tensor.empty() : " << tensor_type(n.shape, n.dtype) << "\n";
      os_ << "  %v" << i << " = linalg.generic {indexing_maps = [" << affine(ro, identity(ro)) << ", "
          << affine(ro, identity(ro)) << "], iterator_types = " << iterators(ro) << "} ins(" << res << " : "
          << acc_t << ") outs(%e" << i << "b : " << tensor_type(n.shape, n.dtype)
          << ") {\n    ^bb0(%y: " << mlir_type(acc) << ", %o: " << mlir_type(n.dtype) << "):\n";
      const std::string y = convert("%y", acc, n.dtype);
      os_ << "      linalg.yield " << y << " : " << mlir_type(n.dtype) << "\n  } -> "
          << tensor_type(n.shape, n.dtype) << "\n";
    }
  }

  // ---- the eager row sum's order (Note [Row sums in the eager order])

  /// Whether summing `shape` over `d` is a row sum in the eager kernels: no
  /// dim after d is larger than 1 (kernels/cpu/reduce.cpp's inner == 1).
  static bool row_like(const Shape& shape, int64_t d) {
    for (size_t j = static_cast<size_t>(d) + 1; j < shape.size(); ++j)
      if (shape[j] != 1) return false;
    return true;
  }

  /// One linalg.generic: `loops` loop dims, `ins` (value, type, map) read as
  /// block arguments %b0.., the output (type, map) initialized from `init`;
  /// `body` writes the region's ops from the block argument names and returns
  /// the yielded value. Returns the result's SSA name.
  struct In {
    std::string value, type, map, elem;
  };
  std::string generic(
      int64_t loops, const std::vector<std::string>& iters, const std::vector<In>& ins,
      const std::string& init, const std::string& out_type, const std::string& out_map,
      const std::string& out_elem,
      const std::function<std::string(const std::vector<std::string>&, const std::string&)>& body) {
    const std::string r = "%g" + std::to_string(gen_++);
    os_ << "  " << r << " = linalg.generic {indexing_maps = [";
    for (const In& x : ins) os_ << x.map << ", ";
    os_ << out_map << "], iterator_types = [";
    for (int64_t k = 0; k < loops; ++k) os_ << (k ? ", \"" : "\"") << iters[k] << "\"";
    os_ << "]}";
    if (!ins.empty()) {
      os_ << " ins(";
      for (size_t k = 0; k < ins.size(); ++k) os_ << (k ? ", " : "") << ins[k].value;
      os_ << " : ";
      for (size_t k = 0; k < ins.size(); ++k) os_ << (k ? ", " : "") << ins[k].type;
      os_ << ")";
    }
    os_ << " outs(" << init << " : " << out_type << ") {\n    ^bb0(";
    std::vector<std::string> names;
    for (size_t k = 0; k < ins.size(); ++k) {
      names.push_back("%b" + std::to_string(k));
      os_ << names.back() << ": " << ins[k].elem << ", ";
    }
    os_ << "%bo: " << out_elem << "):\n";
    const std::string y = body(names, "%bo");
    os_ << "      linalg.yield " << y << " : " << out_elem << "\n  } -> " << out_type << "\n";
    return r;
  }

  /// A tensor of `shape` and `t` filled with `value`.
  std::string filled(const Shape& shape, DType t, double value) {
    const std::string e = "%g" + std::to_string(gen_++), c = "%g" + std::to_string(gen_++),
                      f = "%g" + std::to_string(gen_++);
    os_ << "  " << e << " = tensor.empty() : " << tensor_type(shape, t) << "\n";
    os_ << "  " << c << " = arith.constant " << constant_bits(value, t) << " : " << mlir_type(t) << "\n";
    os_ << "  " << f << " = linalg.fill ins(" << c << " : " << mlir_type(t) << ") outs(" << e << " : "
        << tensor_type(shape, t) << ") -> " << tensor_type(shape, t) << "\n";
    return f;
  }

  std::string empty_tensor(const Shape& shape, DType t) {
    const std::string e = "%g" + std::to_string(gen_++);
    os_ << "  " << e << " = tensor.empty() : " << tensor_type(shape, t) << "\n";
    return e;
  }

  /// An input that only gives loop `loop` (of `loops`) its trip count `size`:
  /// linalg infers loop ranges from the operands' shapes through their maps,
  /// and a loop read only inside an affine expression (8 k + l) has none.
  In trip_count(int64_t size, int64_t loop, int64_t loops) {
    return {empty_tensor({size}, DType::F32), tensor_type({size}, DType::F32),
            affine(loops, {"d" + std::to_string(loop)}), "f32"};
  }

  /// Loop dim names d<first>.. d<first + count - 1>.
  static std::vector<std::string> dims_from(int64_t first, int64_t count) {
    std::vector<std::string> e;
    for (int64_t k = 0; k < count; ++k) e.push_back("d" + std::to_string(first + k));
    return e;
  }

  /// The argument's index exprs: its dims but `d` from the loops d0.. (the
  /// outer dims, in order), and `expr` at d.
  static std::vector<std::string> arg_index(int64_t rank, int64_t d, const std::string& expr) {
    std::vector<std::string> e;
    for (int64_t j = 0, o = 0; j < rank; ++j) e.push_back(j == d ? expr : "d" + std::to_string(o++));
    return e;
  }

  /// The eager sum_chunk of the `len` elements from `base` along dim d of
  /// argument `a` (8 interleaved partial sums in A, combined pairwise, then
  /// the tail in order), for every outer index: a tensor of the outer shape in A.
  std::string sum_chunk(int a, int64_t d, int64_t base, int64_t len, DType A) {
    const Node& an = g_.nodes[a];
    const int64_t R = static_cast<int64_t>(an.shape.size()), m = R - 1, q = len / 8, r = len % 8;
    Shape outer = an.shape;
    outer.erase(outer.begin() + d);
    const std::string at = tensor_type(an.shape, an.dtype), va = "%v" + std::to_string(a);
    const char* am = mlir_type(A);
    std::vector<In> ins;
    if (q > 0) {  // part[l] += x[base + 8 k + l]
      Shape ps = outer;
      ps.push_back(8);
      std::vector<std::string> iters(static_cast<size_t>(m), "parallel");
      iters.push_back("reduction");
      iters.push_back("parallel");
      const std::string expr =
          "d" + std::to_string(m) + " * 8 + d" + std::to_string(m + 1) + " + " + std::to_string(base);
      std::vector<std::string> pm = dims_from(0, m);
      pm.push_back("d" + std::to_string(m + 1));
      const std::string parts = generic(
          m + 2, iters,
          {{va, at, affine(m + 2, arg_index(R, d, expr)), mlir_type(an.dtype)}, trip_count(q, m, m + 2)},
          filled(ps, A, 0.0), tensor_type(ps, A), affine(m + 2, pm), am,
          [&](const std::vector<std::string>& b, const std::string& o) {
            const std::string x = convert(b[0], an.dtype, A), y = fresh();
            os_ << "      " << y << " = arith.addf " << o << ", " << x << " : " << am << "\n";
            return y;
          });
      for (int l = 0; l < 8; ++l) {
        std::vector<std::string> e = dims_from(0, m);
        e.push_back(std::to_string(l));
        ins.push_back({parts, tensor_type(ps, A), affine(m, e), am});
      }
    }
    for (int64_t j = 0; j < r; ++j)
      ins.push_back(
          {va, at, affine(m, arg_index(R, d, std::to_string(base + 8 * q + j))), mlir_type(an.dtype)});
    return generic(m, std::vector<std::string>(static_cast<size_t>(m), "parallel"), ins,
                   empty_tensor(outer, A), tensor_type(outer, A), affine(m, dims_from(0, m)), am,
                   [&](const std::vector<std::string>& b, const std::string&) {
                     std::string s;
                     size_t k = 0;
                     if (q > 0) {
                       const auto add = [&](const std::string& x, const std::string& y) {
                         const std::string z = fresh();
                         os_ << "      " << z << " = arith.addf " << x << ", " << y << " : " << am << "\n";
                         return z;
                       };
                       s = add(add(add(b[0], b[1]), add(b[2], b[3])), add(add(b[4], b[5]), add(b[6], b[7])));
                       k = 8;
                     } else {
                       s = fresh();
                       os_ << "      " << s << " = arith.constant " << constant_bits(0.0, A) << " : " << am
                           << "\n";
                     }
                     for (; k < b.size(); ++k) {
                       const std::string x = convert(b[k], an.dtype, A), z = fresh();
                       os_ << "      " << z << " = arith.addf " << s << ", " << x << " : " << am << "\n";
                       s = z;
                     }
                     return s;
                   });
  }

  /// A Sum over one dim that the eager kernels treat as a row (row_like):
  /// the eager sum_row's order, so compiled and eager sums agree bit for bit.
  void row_sum(int i) {
    const Node& n = g_.nodes[i];
    const int a = n.args[0];
    const Node& an = g_.nodes[a];
    const int64_t d = n.dims[0], len = an.shape[d], R = static_cast<int64_t>(an.shape.size()), m = R - 1;
    const DType A = compute_type(n.dtype);
    constexpr int64_t kChunk = 4096;
    Shape outer = an.shape;
    outer.erase(outer.begin() + d);
    const std::string ot = tensor_type(outer, A);
    std::string total;  // in A for one chunk, in f64 over several
    DType total_t = A;
    if (len <= kChunk) {
      total = sum_chunk(a, d, 0, len, A);
    } else {
      // Full chunks: part[c][l] over k < 512, each chunk combined, the chunk sums added in f64 in order.
      const int64_t C = len / kChunk;
      Shape ps = outer;
      ps.push_back(C);
      ps.push_back(8);
      std::vector<std::string> iters(static_cast<size_t>(m), "parallel");
      iters.insert(iters.end(), {"parallel", "reduction", "parallel"});
      const std::string expr = "d" + std::to_string(m) + " * 4096 + d" + std::to_string(m + 1) + " * 8 + d" +
                               std::to_string(m + 2);
      std::vector<std::string> pm = dims_from(0, m + 1);
      pm.push_back("d" + std::to_string(m + 2));
      const char* am = mlir_type(A);
      const std::string parts = generic(m + 3, iters,
                                        {{"%v" + std::to_string(a), tensor_type(an.shape, an.dtype),
                                          affine(m + 3, arg_index(R, d, expr)), mlir_type(an.dtype)},
                                         trip_count(kChunk / 8, m + 1, m + 3)},
                                        filled(ps, A, 0.0), tensor_type(ps, A), affine(m + 3, pm), am,
                                        [&](const std::vector<std::string>& b, const std::string& o) {
                                          const std::string x = convert(b[0], an.dtype, A), y = fresh();
                                          os_ << "      " << y << " = arith.addf " << o << ", " << x << " : "
                                              << am << "\n";
                                          return y;
                                        });
      Shape cs = outer;
      cs.push_back(C);
      std::vector<In> ins;
      for (int l = 0; l < 8; ++l) {
        std::vector<std::string> e = dims_from(0, m + 1);
        e.push_back(std::to_string(l));
        ins.push_back({parts, tensor_type(ps, A), affine(m + 1, e), am});
      }
      const std::string chunks =
          generic(m + 1, std::vector<std::string>(static_cast<size_t>(m + 1), "parallel"), ins,
                  empty_tensor(cs, A), tensor_type(cs, A), affine(m + 1, dims_from(0, m + 1)), am,
                  [&](const std::vector<std::string>& b, const std::string&) {
                    const auto add = [&](const std::string& x, const std::string& y) {
                      const std::string z = fresh();
                      os_ << "      " << z << " = arith.addf " << x << ", " << y << " : " << am << "\n";
                      return z;
                    };
                    return add(add(add(b[0], b[1]), add(b[2], b[3])), add(add(b[4], b[5]), add(b[6], b[7])));
                  });
      std::vector<std::string> citer(static_cast<size_t>(m), "parallel");
      citer.push_back("reduction");
      total = generic(m + 1, citer, {{chunks, tensor_type(cs, A), affine(m + 1, dims_from(0, m + 1)), am}},
                      filled(outer, DType::F64, 0.0), tensor_type(outer, DType::F64),
                      affine(m + 1, dims_from(0, m)), "f64",
                      [&](const std::vector<std::string>& b, const std::string& o) {
                        const std::string x = convert(b[0], A, DType::F64), y = fresh();
                        os_ << "      " << y << " = arith.addf " << o << ", " << x << " : f64\n";
                        return y;
                      });
      total_t = DType::F64;
      if (const int64_t tail = len % kChunk; tail > 0) {
        const std::string last = sum_chunk(a, d, C * kChunk, tail, A);
        total = generic(m, std::vector<std::string>(static_cast<size_t>(m), "parallel"),
                        {{total, tensor_type(outer, DType::F64), affine(m, dims_from(0, m)), "f64"},
                         {last, ot, affine(m, dims_from(0, m)), am}},
                        empty_tensor(outer, DType::F64), tensor_type(outer, DType::F64),
                        affine(m, dims_from(0, m)), "f64",
                        [&](const std::vector<std::string>& b, const std::string&) {
                          const std::string x = convert(b[1], A, DType::F64), y = fresh();
                          os_ << "      " << y << " = arith.addf " << b[0] << ", " << x << " : f64\n";
                          return y;
                        });
      }
    }
    // The node's value: the total rounded to its dtype, at index 0 of d with keepdim.
    std::vector<std::string> out_e;
    for (int64_t j = 0, o = 0; j < R; ++j) {
      if (j != d)
        out_e.push_back("d" + std::to_string(o++));
      else if (n.keepdim)
        out_e.push_back("0");
    }
    const std::string v =
        generic(m, std::vector<std::string>(static_cast<size_t>(m), "parallel"),
                {{total, tensor_type(outer, total_t), affine(m, dims_from(0, m)), mlir_type(total_t)}},
                empty_tensor(n.shape, n.dtype), tensor_type(n.shape, n.dtype), affine(m, out_e),
                mlir_type(n.dtype), [&](const std::vector<std::string>& b, const std::string&) {
                  return convert(convert(b[0], total_t, A), A, n.dtype);
                });
    os_ << "  %v" << i << " = tensor.cast " << v << " : " << tensor_type(n.shape, n.dtype) << " to "
        << tensor_type(n.shape, n.dtype) << "\n";
  }

  static std::vector<std::string> identity(int64_t rank) {
    std::vector<std::string> e;
    for (int64_t d = 0; d < rank; ++d) e.push_back("d" + std::to_string(d));
    return e;
  }

  const fusion::Group& g_;
  std::ostringstream os_;
  int tmp_ = 0;
  int gen_ = 0;
};

}  // namespace

std::string to_linalg(const fusion::Group& g, const std::string& func) {
  g.validate();
  return Emitter(g).run(func);
}

}  // namespace bt::compiler
