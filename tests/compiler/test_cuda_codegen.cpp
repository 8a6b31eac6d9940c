// The CUDA elementwise template (Note [CUDA elementwise template]) on the
// CPU-only machine: which groups it takes and why it refuses the others, the
// module it writes, and MLIR 19's lowering of that module to PTX in process
// (16-byte vector loads and stores, one entry, the target), with no GPU. The
// kernels' results are the GPU machine's to check, once the runtime loads them.
#include <string>

#include <gtest/gtest.h>

#include "compiler/cuda_codegen.h"
#include "compiler/cuda_template.h"
#include "tests/support/error_message.h"

namespace bt::compiler {
namespace {

using fusion::Group;
using fusion::Op;

/// y = tanh((a + b) * 0.5), z = a * b: two outputs over one f32 shape.
Group bias_tanh(const Shape& shape, DType dt = DType::F32) {
  Group g;
  g.name = "bias_tanh";
  const int a = g.input(dt, shape), b = g.input(dt, shape);
  const int s = g.binary(Op::Mul, g.binary(Op::Add, a, b), g.scalar(0.5, dt));
  g.output(g.unary(Op::Tanh, s));
  g.output(g.binary(Op::Mul, a, b));
  return g;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(CudaTemplate, TakesElementwiseF32GroupsAndSaysWhyNotTheOthers) {
  EXPECT_EQ(cuda_elementwise_unsupported(bias_tanh({64, 768})), "");
  EXPECT_NE(cuda_elementwise_unsupported(bias_tanh({64, 768}, DType::BF16))
                .find("is bf16; the CUDA template takes f32 only"),
            std::string::npos);
  EXPECT_NE(cuda_elementwise_unsupported(bias_tanh({3, 5})).find("15 elements are not a multiple of 4"),
            std::string::npos);
  Group bcast;
  bcast.name = "bias";
  bcast.output(bcast.binary(Op::Add, bcast.input(DType::F32, {8, 16}), bcast.input(DType::F32, {16})));
  EXPECT_NE(cuda_elementwise_unsupported(bcast).find("the CUDA template does not broadcast"),
            std::string::npos);
  Group rows;
  rows.name = "rows";
  rows.output(rows.reduce(Op::Sum, rows.input(DType::F32, {8, 16}), {1}));
  EXPECT_NE(cuda_elementwise_unsupported(rows).find("fusion group 'rows': node 1 (sum) is not elementwise"),
            std::string::npos);
  const std::string msg = test::error_message([&] { (void)cuda_elementwise_module(rows, "k"); });
  EXPECT_NE(msg.find("cuda_elementwise_module: fusion group 'rows'"), std::string::npos) << msg;
}

TEST(CudaTemplate, TheModuleLoadsStoresAndComputesVectors) {
  const std::string m = cuda_elementwise_module(bias_tanh({64, 768}), "fused_bias_tanh");
  EXPECT_NE(m.find("gpu.func @fused_bias_tanh(%in0: memref<?xvector<4xf32>>, %in1: memref<?xvector<4xf32>>, "
                   "%out0: memref<?xvector<4xf32>>, %out1: memref<?xvector<4xf32>>, %n: index) kernel"),
            std::string::npos)
      << m;
  EXPECT_EQ(count(m, "memref.load"), 2u) << m;
  EXPECT_EQ(count(m, "memref.store"), 2u) << m;
  EXPECT_NE(m.find("arith.constant dense<0x3F000000> : vector<4xf32>"), std::string::npos)
      << m;  // 0.5, exact
  EXPECT_NE(m.find("math.tanh"), std::string::npos) << m;
}

TEST(CudaCodegen, TheTemplateLowersToPtxWith16ByteAccesses) {
  if (libdevice_path().empty())
    GTEST_SKIP() << "no CUDA toolkit here (libdevice.10.bc): nothing to link tanh from";
  const std::string ptx =
      cuda_ptx(cuda_elementwise_module(bias_tanh({64, 768}), "fused_bias_tanh"), "fusion group 'bias_tanh'");
  EXPECT_NE(ptx.find(".target sm_90"), std::string::npos) << ptx;
  EXPECT_EQ(count(ptx, ".entry fused_bias_tanh"), 1u) << ptx;
  EXPECT_EQ(count(ptx, "ld.global.v4.f32"), 2u) << ptx;  // one 16-byte load per input
  EXPECT_EQ(count(ptx, "st.global.v4.f32"), 2u) << ptx;  // one 16-byte store per output
  EXPECT_EQ(count(ptx, "ld.global.f32"), 0u) << ptx;     // and no scalar access
  EXPECT_EQ(count(ptx, "call"), 0u) << ptx;              // libdevice's tanhf is inlined
  EXPECT_NE(cuda_ptx(cuda_elementwise_module(bias_tanh({64, 768}), "k"), "k", "sm_80").find(".target sm_80"),
            std::string::npos);
}

TEST(CudaCodegen, BrokenModulesAreNamedErrors) {
  const std::string bad =
      test::error_message([] { (void)cuda_ptx("module { gpu.module @x {", "group 'g'"); });
  EXPECT_NE(bad.find("compiler: group 'g': MLIR could not parse the emitted module"), std::string::npos)
      << bad;
  const std::string none = test::error_message([] { (void)cuda_ptx("module {}", "group 'h'"); });
  EXPECT_NE(none.find("compiler: group 'h': expected one gpu.module lowered to PTX, got 0 binaries"),
            std::string::npos)
      << none;
}

}  // namespace
}  // namespace bt::compiler
