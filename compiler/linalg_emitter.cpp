#include "compiler/linalg_emitter.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

namespace bt::compiler {
namespace {

using fusion::Node;
using fusion::Op;

/// MLIR's name of a fusion group's dtype (f32, f64, bf16: dtype_name's spelling).
const char* mlir_type(DType t) {
  BT_CHECK(t == DType::F32 || t == DType::F64 || t == DType::BF16,
           "fusion groups compute in f32, f64 or bf16, not ", dtype_name(t));
  return dtype_name(t).data();
}

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

/// `value` rounded to `t`, as an MLIR literal of its bits (exact).
std::string constant_bits(double value, DType t) {
  char buf[32];
  if (t == DType::F64) {
    uint64_t u;
    std::memcpy(&u, &value, 8);
    std::snprintf(buf, sizeof buf, "0x%016" PRIX64, u);
  } else {
    const float f = static_cast<float>(value);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (t == DType::BF16)
      std::snprintf(buf, sizeof buf, "0x%04X", static_cast<unsigned>(float_to_bf16_bits(f)));
    else
      std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(u));
  }
  return buf;
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
    const std::string r = fresh();
    os_ << "      " << r << " = " << (width(to) > width(from) ? "arith.extf " : "arith.truncf ") << x << " : "
        << mlir_type(from) << " to " << mlir_type(to) << "\n";
    return r;
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
      const char* t = mlir_type(ct);
      switch (n.op) {
        case Op::Neg:
          os_ << "      " << r << " = arith.negf " << x[0] << " : " << t << "\n";
          break;
        case Op::Exp:
        case Op::Log:
        case Op::Tanh:
        case Op::Sqrt:
          os_ << "      " << r << " = math." << fusion::op_name(n.op) << " " << x[0] << " : " << t << "\n";
          break;
        case Op::Pow:
          os_ << "      " << r << " = math.powf " << x[0] << ", " << x[1] << " : " << t << "\n";
          break;
        default: {
          const char* f = n.op == Op::Add   ? "addf"
                          : n.op == Op::Sub ? "subf"
                          : n.op == Op::Mul ? "mulf"
                                            : "divf";
          os_ << "      " << r << " = arith." << f << " " << x[0] << ", " << x[1] << " : " << t << "\n";
        }
      }
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

  static std::vector<std::string> identity(int64_t rank) {
    std::vector<std::string> e;
    for (int64_t d = 0; d < rank; ++d) e.push_back("d" + std::to_string(d));
    return e;
  }

  const fusion::Group& g_;
  std::ostringstream os_;
  int tmp_ = 0;
};

}  // namespace

std::string to_linalg(const fusion::Group& g, const std::string& func) {
  g.validate();
  return Emitter(g).run(func);
}

}  // namespace bt::compiler
