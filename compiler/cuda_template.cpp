#include "compiler/cuda_template.h"

#include <sstream>

#include "compiler/mlir_text.h"
#include "kernels/common/error.h"

namespace bt::compiler {

// Note [CUDA elementwise template]
// convert-parallel-loops-to-gpu on the CPU path's loops reaches 71% of copy
// bandwidth for an f32 bias+GELU on an H100 and far less in bf16 (scalar
// loads; issue 19). The template writes the kernel itself: every operand is a
// memref of vector<4xf32>, so LLVM's NVPTX backend emits one 16-byte
// ld.global.v4.f32 / st.global.v4.f32 per operand and thread, and each op of
// the group becomes one vector op of the arith/math dialects (math.tanh and
// friends come from libdevice, linked by gpu-module-to-binary). The first
// version takes what a 16-byte vector of every operand can carry: elementwise
// f32 ops over one shape with a multiple of 4 elements, no broadcast, no
// reduction, no cast; the caller checks at launch that the tensors are
// contiguous and 16-byte aligned. Other groups are not yet templated (the
// backend runs them eagerly): bf16 (8 x 2 bytes), broadcasts, and the row
// and column reductions are the next templates.

namespace {

using fusion::Node;
using fusion::Op;

constexpr const char* kVec = "vector<4xf32>";
constexpr const char* kMem = "memref<?xvector<4xf32>>";

}  // namespace

std::string cuda_elementwise_unsupported(const fusion::Group& g) {
  const std::string in = "fusion group '" + g.name + "': ";
  if (g.outputs.empty()) return in + "it has no outputs";
  const auto at = [&](size_t i) {
    return in + "node " + std::to_string(i) + " (" + fusion::op_name(g.nodes[i].op) + ")";
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {  // what each node is, first
    const Node& n = g.nodes[i];
    if (fusion::is_reduction(n.op) || n.op == Op::Cast)
      return at(i) + " is not elementwise; the CUDA template takes elementwise ops only";
    if (n.dtype != DType::F32)
      return at(i) + " is " + std::string(dtype_name(n.dtype)) + "; the CUDA template takes f32 only";
  }
  const Shape& shape = g.nodes[g.outputs[0]].shape;
  for (size_t i = 0; i < g.nodes.size(); ++i)  // then their shapes
    if (g.nodes[i].op != Op::Scalar && g.nodes[i].shape != shape)
      return at(i) + " has shape " + shape_str(g.nodes[i].shape) + ", not the outputs' " + shape_str(shape) +
             "; the CUDA template does not broadcast";
  const int64_t numel = shape_numel(shape);
  if (numel % 4 != 0)
    return in + std::to_string(numel) + " elements are not a multiple of 4 (the template's 16-byte vectors)";
  return "";
}

std::string cuda_elementwise_module(const fusion::Group& g, const std::string& func) {
  const std::string why = cuda_elementwise_unsupported(g);
  BT_CHECK(why.empty(), "cuda_elementwise_module: ", why);
  const std::vector<int> inputs = g.inputs();
  std::ostringstream os;
  os << "module attributes {gpu.container_module} {\n  gpu.module @bt_fused {\n    gpu.func @" << func << "(";
  for (size_t k = 0; k < inputs.size(); ++k) os << "%in" << k << ": " << kMem << ", ";
  for (size_t k = 0; k < g.outputs.size(); ++k) os << "%out" << k << ": " << kMem << ", ";
  os << "%n: index) kernel {\n"
     << "      %bid = gpu.block_id x\n      %bdim = gpu.block_dim x\n      %tid = gpu.thread_id x\n"
     << "      %base = arith.muli %bid, %bdim : index\n      %i = arith.addi %base, %tid : index\n"
     << "      %live = arith.cmpi ult, %i, %n : index\n      scf.if %live {\n";
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const std::string v = "%v" + std::to_string(i);
    os << "        ";
    if (n.op == Op::Input) {
      os << v << " = memref.load %in" << n.input << "[%i] : " << kMem;
    } else if (n.op == Op::Scalar) {
      os << v << " = arith.constant dense<" << constant_bits(n.value, DType::F32) << "> : " << kVec;
    } else {
      std::vector<std::string> args;
      for (int a : n.args) args.push_back("%v" + std::to_string(a));
      os << elementwise_op(n.op, v, args, kVec);
    }
    os << "\n";
  }
  for (size_t k = 0; k < g.outputs.size(); ++k)
    os << "        memref.store %v" << g.outputs[k] << ", %out" << k << "[%i] : " << kMem << "\n";
  os << "      }\n      gpu.return\n    }\n  }\n}\n";
  return os.str();
}

}  // namespace bt::compiler
