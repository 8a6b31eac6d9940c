// FuncEmitter and its helpers (compiler/cuda_func_emitter.h).
#include "compiler/cuda_func_emitter.h"

#include "compiler/mlir_text.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"

namespace bt::compiler {

using fusion::Group;
using fusion::Node;
using fusion::Op;

std::string vec(int v, const std::string& t) {
  return v == 1 ? t : "vector<" + std::to_string(v) + "x" + t + ">";
}

std::string f32_bits(double value, DType t) {
  auto f = static_cast<float>(value);
  if (t == DType::BF16) f = bf16_bits_to_float(float_to_bf16_bits(f));
  return constant_bits(f, DType::F32);
}

std::vector<int64_t> leaf_strides(const Node& nd, const Shape& space) {
  if (nd.op != Op::Input || nd.strides.empty()) return broadcast_strides(nd.shape, space);
  std::vector<int64_t> st(space.size(), 0);
  const size_t lead = space.size() - nd.shape.size();
  for (size_t k = 0; k < nd.shape.size(); ++k)
    if (nd.shape[k] != 1) st[lead + k] = nd.strides[k];
  return st;
}

FuncEmitter::FuncEmitter(std::ostringstream& os, const Group& g, const KernelPlan& kp, int v)
    : os_(os), g_(g), kp_(kp), v_(v), ft_(vec(v, "f32")) {
  stride_.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (kp.used[i] && leaf(static_cast<int>(i))) stride_[i] = leaf_strides(g.nodes[i], kp.space);
}

void FuncEmitter::open(const std::string& s) {
  line(s);
  indent_ += 2;
}

void FuncEmitter::close(const std::string& s) {
  indent_ -= 2;
  line(s);
}

std::string FuncEmitter::index(int64_t c) {
  const std::string r = fresh();
  line(r + " = arith.constant " + std::to_string(c) + " : index");
  return r;
}

std::string FuncEmitter::int32(int64_t c) {
  const std::string r = fresh();
  line(r + " = arith.constant " + std::to_string(c) + " : i32");
  return r;
}

std::string FuncEmitter::op(const std::string& name, const std::string& a, const std::string& b,
                            const std::string& type) {
  const std::string r = fresh();
  line(r + " = " + name + " " + a + ", " + b + " : " + type);
  return r;
}

std::string FuncEmitter::f32(const std::string& bits) {
  const std::string r = fresh();
  line(r + " = arith.constant " + bits + " : f32");
  return r;
}

bool FuncEmitter::leaf(int n) const {
  return g_.nodes[static_cast<size_t>(n)].op == Op::Input || kp_.staged[static_cast<size_t>(n)];
}

bool FuncEmitter::vector_input(int n) const {
  const auto& st = stride_[static_cast<size_t>(n)];
  if (v_ <= 1 || kp_.level[static_cast<size_t>(n)] != Level::Full || st.empty() || st.back() != 1)
    return false;
  for (size_t k = 0; k + 1 < st.size(); ++k)
    if (st[k] % v_ != 0) return false;
  return true;
}

std::string FuncEmitter::input_type(int n) const {
  const Node& nd = g_.nodes[static_cast<size_t>(n)];
  int64_t span = 1;  // the elements from the first one read to the last (its layout's extent)
  if (nd.strides.empty()) {
    span = shape_numel(nd.shape);
  } else {
    for (size_t k = 0; k < nd.shape.size(); ++k) span += (nd.shape[k] - 1) * nd.strides[k];
  }
  const int w = vector_input(n) ? v_ : 1;
  return "memref<" + std::to_string((span + w - 1) / w) + "x" + vec(w, mlir_type(nd.dtype)) + ">";
}

std::string FuncEmitter::output_type(int n, bool full) const {
  const Node& nd = g_.nodes[static_cast<size_t>(n)];
  const int w = full ? v_ : 1;
  return "memref<" + std::to_string(shape_numel(nd.shape) / w) + "x" + vec(w, mlir_type(nd.dtype)) + ">";
}

std::string FuncEmitter::input_name(int n) const {
  const Node& nd = g_.nodes[static_cast<size_t>(n)];
  if (nd.op == Op::Input) return "%in" + std::to_string(nd.input);
  const auto pos = std::find(g_.outputs.begin(), g_.outputs.end(), n) - g_.outputs.begin();
  return "%staged" + std::to_string(pos);
}

std::string FuncEmitter::offset(int n, const std::string& e) {
  const auto& st = stride_[static_cast<size_t>(n)];
  const Shape& sp = kp_.space;
  std::vector<int64_t> suffix(sp.size(), 1);
  for (size_t k = sp.size(); k-- > 1;) suffix[k - 1] = suffix[k] * sp[k];
  bool contiguous = true;
  for (size_t k = 0; k < sp.size(); ++k) contiguous = contiguous && (sp[k] == 1 || st[k] == suffix[k]);
  if (contiguous) return e;
  std::string sum;
  for (size_t k = 0; k < sp.size(); ++k) {
    if (st[k] == 0 || sp[k] == 1) continue;
    std::string idx = suffix[k] == 1 ? e : op("arith.divui", e, index(suffix[k]));
    if (k > 0) idx = op("arith.remui", idx, index(sp[k]));
    if (st[k] != 1) idx = op("arith.muli", idx, index(st[k]));
    sum = sum.empty() ? idx : op("arith.addi", sum, idx);
  }
  return sum.empty() ? index(0) : sum;
}

std::string FuncEmitter::extend(const std::string& x, DType t, int w) {
  if (t == DType::F32) return x;
  const std::string r = fresh();
  line(r + " = arith.extf " + x + " : " + vec(w, "bf16") + " to " + vec(w, "f32"));
  return r;
}

std::string FuncEmitter::round(const std::string& x, DType t, int w) {
  if (t == DType::F32) return x;
  const std::string b = fresh(), r = fresh();
  line(b + " = arith.truncf " + x + " : " + vec(w, "f32") + " to " + vec(w, "bf16"));
  line(r + " = arith.extf " + b + " : " + vec(w, "bf16") + " to " + vec(w, "f32"));
  return r;
}

std::string FuncEmitter::narrow(const std::string& x, DType t, int w) {
  if (t == DType::F32) return x;
  const std::string r = fresh();
  line(r + " = arith.truncf " + x + " : " + vec(w, "f32") + " to " + vec(w, "bf16"));
  return r;
}

std::string FuncEmitter::splat(const std::string& x) {
  if (v_ == 1) return x;
  const std::string r = fresh();
  line(r + " = vector.broadcast " + x + " : f32 to " + ft_);
  return r;
}

std::string FuncEmitter::uniform(int n, const std::string& e) {
  if (auto it = uni_.find(n); it != uni_.end()) return it->second;
  const Node& nd = g_.nodes[static_cast<size_t>(n)];
  std::string r;
  if (nd.op == Op::Scalar) {
    r = f32(f32_bits(nd.value, nd.dtype));
  } else if (leaf(n)) {
    r = fresh();
    line(r + " = memref.load " + input_name(n) + "[" + offset(n, e) + "] : " + input_type(n));
    r = extend(r, nd.dtype, 1);
  } else {
    BT_ASSERT(!fusion::is_reduction(nd.op), "uniform(): reduction ", n, " read before it was computed");
    std::vector<std::string> a;
    for (int x : nd.args) a.push_back(uniform(x, e));
    r = compute(nd, a, "f32", 1);
  }
  uni_[n] = r;
  return r;
}

void FuncEmitter::hoist_uniforms(int n, const std::string& e) {
  std::vector<int> stack{n}, found;
  std::vector<bool> seen(g_.nodes.size(), false);
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(x)]) continue;
    seen[static_cast<size_t>(x)] = true;
    const Level l = kp_.level[static_cast<size_t>(x)];
    if (l == Level::Uniform || (l == Level::Const && g_.nodes[static_cast<size_t>(x)].op != Op::Scalar)) {
      found.push_back(x);  // a value computed from constants alone is hoisted too
      continue;
    }
    if (kp_.level[static_cast<size_t>(x)] == Level::Full && !leaf(x))
      for (int a : g_.nodes[static_cast<size_t>(x)].args) stack.push_back(a);
  }
  std::sort(found.begin(), found.end());
  for (int x : found) uniform(x, e);
}

std::string FuncEmitter::full(int n, const std::string& e, std::map<int, std::string>& memo) {
  if (auto it = memo.find(n); it != memo.end()) return it->second;
  const Node& nd = g_.nodes[static_cast<size_t>(n)];
  const Level l = kp_.level[static_cast<size_t>(n)];
  std::string r;
  if (nd.op == Op::Scalar) {
    r = fresh();
    line(r + " = arith.constant " +
         (v_ == 1 ? f32_bits(nd.value, nd.dtype) : "dense<" + f32_bits(nd.value, nd.dtype) + ">") + " : " +
         ft_);
  } else if (l != Level::Full) {
    auto it = uni_.find(n);
    BT_ASSERT(it != uni_.end(), "full(): uniform node ", n, " was not hoisted");
    r = splat(it->second);
  } else if (leaf(n)) {
    const std::string off = offset(n, e);
    r = fresh();
    if (vector_input(n)) {
      line(r + " = memref.load " + input_name(n) + "[" + op("arith.divui", off, index(v_)) +
           "] : " + input_type(n));
      r = extend(r, nd.dtype, v_);
    } else {
      line(r + " = memref.load " + input_name(n) + "[" + off + "] : " + input_type(n));
      r = splat(extend(r, nd.dtype, 1));
    }
  } else {
    std::vector<std::string> a;
    for (int x : nd.args) a.push_back(full(x, e, memo));
    r = compute(nd, a, ft_, v_);
  }
  memo[n] = r;
  return r;
}

std::string FuncEmitter::compute(const Node& nd, const std::vector<std::string>& a, const std::string& type,
                                 int w) {
  if (nd.op == Op::Cast) return round(a.at(0), nd.dtype, w);
  if (nd.op == Op::Tanh && nd.dtype == DType::BF16) return round(tanh_approx(a.at(0), w), nd.dtype, w);
  if (nd.op == Op::Pow)
    if (std::string r = pow_by_constant(nd, a.at(0), type, w); !r.empty()) return round(r, nd.dtype, w);
  const std::string r = fresh();
  line(elementwise_op(nd.op, r, a, type));
  return round(r, nd.dtype, w);
}

std::string FuncEmitter::pow_by_constant(const Node& nd, const std::string& x, const std::string& type,
                                         int w) {
  const Node& c = g_.nodes[static_cast<size_t>(nd.args.at(1))];
  if (c.op != Op::Scalar) return "";
  const std::string r = fresh();
  if (c.value == 2.0) {
    line(r + " = arith.mulf " + x + ", " + x + " : " + type);
  } else if (c.value == 0.5) {
    line(r + " = math.sqrt " + x + " : " + type);
  } else if (c.value == -1.0) {
    const std::string one = fresh(), bits = f32_bits(1.0, DType::F32);
    line(one + " = arith.constant " + (w == 1 ? bits : "dense<" + bits + ">") + " : " + type);
    line(r + " = arith.divf " + one + ", " + x + " : " + type);
  } else {
    return "";
  }
  return r;
}

std::string FuncEmitter::tanh_approx(const std::string& x, int w) {
  const auto one = [&](const std::string& v) {
    const std::string r = fresh();
    line(r + " = llvm.inline_asm \"tanh.approx.f32 $0, $1;\", \"=f,f\" " + v + " : (f32) -> f32");
    return r;
  };
  if (w == 1) return one(x);
  std::string acc = x;
  for (int i = 0; i < w; ++i) {
    const std::string e = fresh(), next = fresh();
    line(e + " = vector.extract " + x + "[" + std::to_string(i) + "] : f32 from " + vec(w, "f32"));
    line(next + " = vector.insert " + one(e) + ", " + acc + " [" + std::to_string(i) + "] : f32 into " +
         vec(w, "f32"));
    acc = next;
  }
  return acc;
}

std::string FuncEmitter::combine(Op red, const std::string& a, const std::string& b,
                                 const std::string& type) {
  return op(red == Op::Sum ? "arith.addf" : "arith.maximumf", a, b, type);
}

std::string FuncEmitter::identity_lanes(Op red) {
  if (v_ == 1) return identity(red);
  const std::string r = fresh();
  line(r + " = arith.constant dense<" + (red == Op::Sum ? "0x00000000" : "0xFF800000") + "> : " + ft_);
  return r;
}

std::string FuncEmitter::warp_reduce(Op red, std::string x) {
  const std::string width = int32(32);
  for (int off = 16; off >= 1; off /= 2) {
    const std::string s = fresh();
    line(s + ", " + fresh() + " = gpu.shuffle xor " + x + ", " + int32(off) + ", " + width + " : f32");
    x = combine(red, x, s);
  }
  return x;
}

std::string FuncEmitter::lanes(Op red, const std::string& x) {
  if (v_ == 1) return x;
  const std::string r = fresh();
  line(r + " = vector.reduction <" + (red == Op::Sum ? "add" : "maximumf") + ">, " + x + " : " + ft_ +
       " into f32");
  return r;
}

std::string FuncEmitter::block_reduce(Op red, std::string x, const std::string& tid, unsigned threads) {
  x = warp_reduce(red, x);
  const std::string c32 = index(32);
  const std::string lane = op("arith.remui", tid, c32), warp = op("arith.divui", tid, c32);
  const std::string first = fresh();
  line(first + " = arith.cmpi eq, " + lane + ", " + index(0) + " : index");
  open("scf.if " + first + " {");
  line("memref.store " + x + ", %sh[" + warp + "] : " + shared_type_);
  close();
  line("gpu.barrier");
  const std::string init = identity(red), k = fresh(), acc = fresh(), r = fresh();
  open(r + " = scf.for " + k + " = " + index(0) + " to " + index(threads / 32) + " step " + index(1) +
       " iter_args(" + acc + " = " + init + ") -> (f32) {");
  const std::string y = fresh();
  line(y + " = memref.load %sh[" + k + "] : " + shared_type_);
  line("scf.yield " + combine(red, acc, y) + " : f32");
  close();
  line("gpu.barrier");
  return r;
}

}  // namespace bt::compiler
