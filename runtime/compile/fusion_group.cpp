#include "runtime/compile/fusion_group.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "runtime/autograd/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt::fusion {
namespace {

bool float_dtype(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16; }

std::string where(const Group& g, int i) { return cat("fusion group '", g.name, "', node %", i); }

/// The shape `s` reduced over `dims`.
Shape reduced(const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end())
      out.push_back(s[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

/// "%3 = add %1, %2 : f32[64, 128]" and the like.
std::string line(const Node& n, int i) {
  std::ostringstream os;
  os << "%" << i << " = " << op_name(n.op);
  if (n.op == Op::Input) os << " " << n.input;
  if (!n.strides.empty()) {
    os << " strides [";
    for (size_t k = 0; k < n.strides.size(); ++k) os << (k ? ", " : "") << n.strides[k];
    os << "]";
  }
  if (n.op == Op::Scalar) {
    char buf[40];
    std::snprintf(buf, sizeof buf, " %a", n.value);  // exact
    os << buf;
  }
  for (size_t k = 0; k < n.args.size(); ++k) os << (k ? ", %" : " %") << n.args[k];
  if (is_reduction(n.op)) {
    os << " dims [";
    for (size_t k = 0; k < n.dims.size(); ++k) os << (k ? ", " : "") << n.dims[k];
    os << "]" << (n.keepdim ? " keepdim" : "");
  }
  os << " : " << dtype_name(n.dtype) << shape_str(n.shape);
  return os.str();
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::Input:
      return "input";
    case Op::Scalar:
      return "scalar";
    case Op::Neg:
      return "neg";
    case Op::Exp:
      return "exp";
    case Op::Log:
      return "log";
    case Op::Tanh:
      return "tanh";
    case Op::Sqrt:
      return "sqrt";
    case Op::Add:
      return "add";
    case Op::Sub:
      return "sub";
    case Op::Mul:
      return "mul";
    case Op::Div:
      return "div";
    case Op::Pow:
      return "pow";
    case Op::Cast:
      return "cast";
    case Op::Sum:
      return "sum";
    case Op::Max:
      return "max";
  }
  return "?";
}

bool is_unary(Op op) {
  return op == Op::Neg || op == Op::Exp || op == Op::Log || op == Op::Tanh || op == Op::Sqrt;
}
bool is_binary(Op op) {
  return op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Div || op == Op::Pow;
}
bool is_reduction(Op op) { return op == Op::Sum || op == Op::Max; }

// ---------------------------------------------------------------- building
int Group::push(const Node& n) {
  nodes.push_back(n);
  try {
    validate_node(static_cast<int>(nodes.size()) - 1);
  } catch (...) {
    nodes.pop_back();  // the group stays as it was
    throw;
  }
  return static_cast<int>(nodes.size()) - 1;
}

int Group::input(DType dtype, const Shape& shape, std::vector<int64_t> strides) {
  BT_CHECK(strides.empty() || strides.size() == shape.size(), "fusion group '", name, "': an input of shape ",
           shape_str(shape), " has ", strides.size(), " strides");
  Node n;
  n.op = Op::Input;
  n.dtype = dtype;
  n.shape = shape;
  n.strides = std::move(strides);
  n.input = static_cast<int>(inputs().size());
  return push(n);
}

std::vector<int64_t> input_layout(const Tensor& t) {
  if (t.is_contiguous()) return {};
  const int64_t inner = t.dim() > 0 && t.shape().back() > 1 ? t.strides().back() : 1;
  if (inner != 1 && inner != 0) return {};  // a transpose: copied
  std::vector<int64_t> st = t.strides();
  for (size_t k = 0; k < st.size(); ++k)
    if (t.shape()[k] == 1) st[k] = 0;
  return st;
}

int Group::scalar(double value, DType dtype) {
  Node n;
  n.op = Op::Scalar;
  n.dtype = dtype;
  n.value = value;
  return push(n);
}

int Group::unary(Op op, int a) {
  BT_CHECK(is_unary(op), "fusion group '", name, "': ", op_name(op), " is not a unary op");
  BT_CHECK(a >= 0 && a < static_cast<int>(nodes.size()), "fusion group '", name, "': no node %", a);
  Node n;
  n.op = op;
  n.dtype = nodes[a].dtype;
  n.shape = nodes[a].shape;
  n.args = {a};
  return push(n);
}

int Group::binary(Op op, int a, int b) {
  const int count = static_cast<int>(nodes.size());
  BT_CHECK(a >= 0 && a < count && b >= 0 && b < count, "fusion group '", name, "': no node %",
           a >= 0 && a < count ? b : a);
  return binary(op, a, b, broadcast_shapes(nodes[a].shape, nodes[b].shape, op_name(op)));
}

int Group::binary(Op op, int a, int b, const Shape& shape) {
  BT_CHECK(is_binary(op), "fusion group '", name, "': ", op_name(op), " is not a binary op");
  const int count = static_cast<int>(nodes.size());
  BT_CHECK(a >= 0 && a < count && b >= 0 && b < count, "fusion group '", name, "': no node %",
           a >= 0 && a < count ? b : a);
  Node n;
  n.op = op;
  n.dtype = nodes[a].dtype;
  n.shape = shape;
  n.args = {a, b};
  return push(n);
}

int Group::cast(int a, DType dtype) {
  BT_CHECK(a >= 0 && a < static_cast<int>(nodes.size()), "fusion group '", name, "': no node %", a);
  Node n;
  n.op = Op::Cast;
  n.dtype = dtype;
  n.shape = nodes[a].shape;
  n.args = {a};
  return push(n);
}

int Group::reduce(Op op, int a, std::vector<int64_t> dims, bool keepdim) {
  BT_CHECK(is_reduction(op), "fusion group '", name, "': ", op_name(op), " is not a reduction");
  BT_CHECK(a >= 0 && a < static_cast<int>(nodes.size()), "fusion group '", name, "': no node %", a);
  const int64_t rank = static_cast<int64_t>(nodes[a].shape.size());
  for (int64_t& d : dims) d = d < 0 ? d + rank : d;
  std::sort(dims.begin(), dims.end());
  Node n;
  n.op = op;
  n.dtype = nodes[a].dtype;
  n.args = {a};
  n.dims = dims;
  n.keepdim = keepdim;
  n.shape = reduced(nodes[a].shape, dims, keepdim);
  return push(n);
}

std::vector<int> Group::inputs() const {
  std::vector<int> in;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i)
    if (nodes[i].op == Op::Input) in.push_back(i);
  return in;
}

// ---------------------------------------------------------------- checks
void Group::validate_node(int i) const {
  const Node& n = nodes[i];
  BT_CHECK(float_dtype(n.dtype), where(*this, i), " (", op_name(n.op), ") has dtype ", dtype_name(n.dtype),
           "; fusion groups compute in f32, f64 or bf16");
  for (int64_t d : n.shape) BT_CHECK(d >= 0, where(*this, i), " has a negative dim: ", shape_str(n.shape));
  for (int a : n.args)
    BT_CHECK(a >= 0 && a < i, where(*this, i), " reads %", a, ", which is not an earlier node");
  const auto arg = [&](size_t k) -> const Node& { return nodes[n.args[k]]; };
  switch (n.op) {
    case Op::Input:
      BT_CHECK(n.args.empty() && n.input >= 0, where(*this, i), " is an input: no arguments, an index >= 0");
      break;
    case Op::Scalar:
      BT_CHECK(n.args.empty() && n.shape.empty(), where(*this, i), " is a scalar: no arguments, shape []");
      break;
    case Op::Cast:
      BT_CHECK(n.args.size() == 1 && arg(0).shape == n.shape, where(*this, i),
               " (cast) takes one argument of its shape");
      break;
    case Op::Sum:
    case Op::Max: {
      BT_CHECK(n.args.size() == 1 && arg(0).dtype == n.dtype && arg(0).op != Op::Scalar, where(*this, i),
               " (", op_name(n.op), ") takes one argument of its dtype, not a scalar");
      const int64_t rank = static_cast<int64_t>(arg(0).shape.size());
      for (size_t k = 0; k < n.dims.size(); ++k)
        BT_CHECK(n.dims[k] >= 0 && n.dims[k] < rank && (k == 0 || n.dims[k] > n.dims[k - 1]), where(*this, i),
                 " reduces dims that are not distinct dims of its ", rank, "-d argument");
      BT_CHECK(n.shape == reduced(arg(0).shape, n.dims, n.keepdim), where(*this, i), " has shape ",
               shape_str(n.shape), ", not its argument's ", shape_str(arg(0).shape), " reduced");
      if (n.op == Op::Max)
        BT_CHECK(!n.dims.empty() && shape_numel(arg(0).shape) > 0, where(*this, i),
                 " (max) needs dims to reduce and a non-empty argument");
      break;
    }
    default:
      if (is_unary(n.op)) {
        BT_CHECK(n.args.size() == 1 && arg(0).dtype == n.dtype && arg(0).shape == n.shape, where(*this, i),
                 " (", op_name(n.op), ") takes one argument of its dtype and shape");
      } else {
        // A scalar may also be in the node's compute type: f32 for bf16, as the kernels' scalar ops hold it.
        const auto fits = [&](const Node& x) {
          return x.dtype == n.dtype ||
                 (x.op == Op::Scalar && n.dtype == DType::BF16 && x.dtype == DType::F32);
        };
        BT_CHECK(n.args.size() == 2 && fits(arg(0)) && fits(arg(1)), where(*this, i), " (", op_name(n.op),
                 ") takes two arguments of its dtype (a scalar of a bf16 op may be f32)");
        const Shape both = broadcast_shapes(arg(0).shape, arg(1).shape, op_name(n.op));
        bool fits_shape = both.size() <= n.shape.size();
        for (size_t k = 0; fits_shape && k < both.size(); ++k) {
          const int64_t x = both[both.size() - 1 - k], y = n.shape[n.shape.size() - 1 - k];
          fits_shape = x == y || x == 1;
        }
        BT_CHECK(fits_shape, where(*this, i), " has shape ", shape_str(n.shape),
                 ", which its arguments' broadcast shape ", shape_str(both), " does not broadcast to");
      }
  }
}

void Group::validate() const {
  int next_input = 0;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    validate_node(i);
    if (nodes[i].op == Op::Input) {
      BT_CHECK(nodes[i].input == next_input, where(*this, i), " is input ", nodes[i].input,
               "; inputs are numbered 0, 1, ... in node order (expected ", next_input, ")");
      ++next_input;
    }
  }
  std::set<int> seen;
  for (int o : outputs) {
    BT_CHECK(o >= 0 && o < static_cast<int>(nodes.size()), "fusion group '", name, "': output %", o,
             " is not a node");
    BT_CHECK(nodes[o].op != Op::Input && nodes[o].op != Op::Scalar, "fusion group '", name, "': output %", o,
             " is an ", op_name(nodes[o].op), "; outputs are computed nodes");
    BT_CHECK(seen.insert(o).second, "fusion group '", name, "': %", o, " is an output twice");
  }
}

std::string Group::canonical() const {
  std::ostringstream os;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) os << line(nodes[i], i) << "\n";
  os << "outputs";
  for (size_t k = 0; k < outputs.size(); ++k) os << (k ? ", %" : " %") << outputs[k];
  os << "\n";
  return os.str();
}

void check_tensors(const Group& g, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const char* what) {
  const std::vector<int> in = g.inputs();
  BT_CHECK(inputs.size() == in.size() && outputs.size() == g.outputs.size(), what, ": fusion group '", g.name,
           "' takes ", in.size(), " inputs and ", g.outputs.size(), " outputs; got ", inputs.size(), " and ",
           outputs.size());
  const Tensor* first = inputs.empty() ? (outputs.empty() ? nullptr : &outputs[0]) : &inputs[0];
  const auto check = [&](const Tensor& t, const Node& n, const char* kind, size_t k) {
    BT_CHECK(
        t.defined() && t.dtype() == n.dtype && t.shape() == n.shape, what, ": fusion group '", g.name, "' ",
        kind, " ", k, " must be ", dtype_name(n.dtype), shape_str(n.shape), "; got ",
        t.defined() ? cat(dtype_name(t.dtype()), shape_str(t.shape())) : std::string("an undefined tensor"));
    BT_CHECK(first->defined() && t.device() == first->device(), what, ": fusion group '", g.name, "' ", kind,
             " ", k, " is on ", t.device(), "; all must be on one device");
  };
  for (size_t k = 0; k < in.size(); ++k) {
    const Node& n = g.nodes[in[k]];
    check(inputs[k], n, "input", k);
    BT_CHECK(n.strides.empty() || input_layout(inputs[k]) == n.strides, what, ": fusion group '", g.name,
             "' input ", k, " must have strides ", shape_str(n.strides), "; got ",
             shape_str(inputs[k].strides()));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    check(outputs[k], g.nodes[g.outputs[k]], "output", k);
    BT_CHECK(outputs[k].is_contiguous(), what, ": fusion group '", g.name, "' output ", k,
             " must be contiguous");
    for (const Tensor& x : inputs)
      BT_CHECK(!outputs[k].shares_storage(x), what, ": fusion group '", g.name, "' output ", k,
               " shares memory with an input; outputs must be fresh buffers");
  }
}

double relative_difference(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const std::vector<double> x = a.to(DType::F64).to_vector<double>(),
                            y = b.to(DType::F64).to_vector<double>();
  BT_CHECK(x.size() == y.size(), "relative_difference: ", x.size(), " elements against ", y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ---------------------------------------------------------------- eager
std::vector<Tensor> run_eager(const Group& g, const std::vector<Tensor>& inputs) {
  g.validate();
  const std::vector<int> in = g.inputs();
  BT_CHECK(inputs.size() == in.size(), "run_eager: fusion group '", g.name, "' takes ", in.size(),
           " inputs; got ", inputs.size());
  NoGradGuard no_grad;
  std::vector<Tensor> v(g.nodes.size());
  const Device dev = inputs.empty() ? Device::cpu() : inputs[0].device();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    // A bf16 op with an f32 scalar computes in f32 and rounds once, as the kernels do.
    const bool widen = is_binary(n.op) && n.dtype == DType::BF16 &&
                       (g.nodes[n.args[0]].dtype == DType::F32 || g.nodes[n.args[1]].dtype == DType::F32);
    if (widen) {
      const Tensor x = v[n.args[0]].to(DType::F32), y = v[n.args[1]].to(DType::F32);
      Tensor r;
      switch (n.op) {
        case Op::Add:
          r = add(x, y);
          break;
        case Op::Sub:
          r = sub(x, y);
          break;
        case Op::Mul:
          r = mul(x, y);
          break;
        case Op::Div:
          r = div(x, y);
          break;
        default:
          r = pow(x, y);
      }
      v[i] = r.to(DType::BF16);
      if (v[i].shape() != n.shape) v[i] = v[i].expand(n.shape).contiguous();
      continue;
    }
    const auto a = [&](size_t k) -> const Tensor& { return v[n.args[k]]; };
    switch (n.op) {
      case Op::Input:
        v[i] = inputs[n.input];
        break;
      case Op::Scalar:
        v[i] = full({}, n.value, TensorOptions{n.dtype, dev});
        break;
      case Op::Neg:
        v[i] = neg(a(0));
        break;
      case Op::Exp:
        v[i] = exp(a(0));
        break;
      case Op::Log:
        v[i] = log(a(0));
        break;
      case Op::Tanh:
        v[i] = tanh(a(0));
        break;
      case Op::Sqrt:
        v[i] = sqrt(a(0));
        break;
      case Op::Add:
        v[i] = add(a(0), a(1));
        break;
      case Op::Sub:
        v[i] = sub(a(0), a(1));
        break;
      case Op::Mul:
        v[i] = mul(a(0), a(1));
        break;
      case Op::Div:
        v[i] = div(a(0), a(1));
        break;
      case Op::Pow:
        v[i] = pow(a(0), a(1));
        break;
      case Op::Cast:
        v[i] = a(0).to(n.dtype);
        break;
      case Op::Sum:
        v[i] = n.dims.empty() ? a(0).clone() : sum(a(0), n.dims, n.keepdim);
        break;
      case Op::Max: {
        Tensor x = a(0);
        // One dim at a time, the highest first, so the lower dims keep their numbers.
        for (auto d = n.dims.rbegin(); d != n.dims.rend(); ++d) x = max(x, *d, n.keepdim);
        v[i] = x;
        break;
      }
    }
    if (is_binary(n.op) && v[i].shape() != n.shape)
      v[i] = v[i].expand(n.shape).contiguous();  // broadcast to it
  }
  std::vector<Tensor> out;
  for (int o : g.outputs) out.push_back(v[o].contiguous());
  return out;
}

}  // namespace bt::fusion
