// CUDA codegen on the CPU-only machine: how groups are planned into kernels
// (Note [CUDA kernel plans]) and why the others are refused, the modules the
// templates write (Note [CUDA templates]), and MLIR 19's lowering of them to
// PTX in process (16-byte vector accesses, shuffles, barriers), with no GPU.
// What the kernels compute is checked on the GPU machine
// (tests/compiler/test_cuda_kernels_gpu.cpp).
#include <string>

#include <gtest/gtest.h>

#include "compiler/cuda_codegen.h"
#include "compiler/cuda_template.h"
#include "tests/support/error_message.h"
#include "tests/support/fusion_groups.h"

namespace bt::compiler {
namespace {

using fusion::Group;
using fusion::Op;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::string plan_of(const Group& g) {
  CudaPlan p;
  const std::string why = plan_cuda(g, &p);
  if (!why.empty()) return why;
  std::string s;
  for (const KernelPlan& k : p.kernels) {
    s += std::string(s.empty() ? "" : " + ") + pattern_name(k.pattern) + shape_str(k.space) + "/" +
         std::to_string(k.split) + " out";
    for (int o : k.outputs) s += " " + std::to_string(o);
  }
  return s;
}

TEST(CudaPlan, SortsOutputsIntoPointwiseRowAndColumnKernels) {
  EXPECT_EQ(plan_of(test::bias_gelu_group(DType::F32, 64, 768)), "pointwise[64, 768]/0 out 0");
  EXPECT_EQ(plan_of(test::layer_norm_group(DType::BF16, 128, 768)), "rows[128, 768]/1 out 0 1 2");
  EXPECT_EQ(plan_of(test::bias_grad_group(DType::F32, {4, 32, 768})), "columns[4, 32, 768]/2 out 0");
  EXPECT_EQ(plan_of(test::square_norm_group(512, 128)), "columns[512, 128]/2 out 0 + pointwise[]/0 out 1");
  // LayerNorm's backward: the weight and bias gradients (columns), then dx's rows, which also
  // write the pointwise output over the same space (its inputs read once).
  // A column sum of a value made from a row sum: the rows kernel first, the columns kernel reads its output.
  EXPECT_EQ(plan_of(test::row_then_column_group(DType::BF16, {4, 32, 64})),
            "rows[4, 32, 64]/2 out 0 + columns[4, 32, 64]/2 out 1");
  EXPECT_EQ(plan_of(test::layer_norm_backward_group(DType::F32, {4, 32, 768})),
            "columns[4, 32, 768]/2 out 0 1 + rows[4, 32, 768]/2 out 2 3");
}

TEST(CudaPlan, AColumnSumReadsBackAValueItWouldRecomputeFromMoreBytes) {
  // GELU's backward reads h and dg (4 bytes an element in bf16) and writes dh
  // (2): the bias gradient's columns kernel reads dh back after the pointwise
  // kernel, and neither h, dg nor the tanh is in its cone.
  const Group g = test::gelu_backward_group(DType::BF16, 64, 768);
  EXPECT_EQ(plan_of(g), "pointwise[64, 768]/0 out 0 + columns[64, 768]/1 out 1");
  CudaPlan p;
  ASSERT_EQ(plan_cuda(g, &p), "");
  const KernelPlan& cols = p.kernels[1];
  EXPECT_TRUE(cols.staged[static_cast<size_t>(g.outputs[0])]);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const bool recomputed = g.nodes[i].op == Op::Input || g.nodes[i].op == Op::Tanh;
    EXPECT_FALSE(recomputed && cols.used[i]) << "node " << i;
  }
  // A widening cast reads 2 bytes to recompute what staging would read 4 of: recomputed.
  Group wide;
  wide.name = "wide";
  const int y = wide.cast(wide.unary(Op::Neg, wide.input(DType::BF16, {64, 768})), DType::F32);
  wide.output(y);
  wide.output(wide.reduce(Op::Sum, y, {0}, true));
  ASSERT_EQ(plan_cuda(wide, &p), "");
  ASSERT_EQ(p.kernels.size(), 2u);
  for (const KernelPlan& k : p.kernels) EXPECT_FALSE(k.staged[static_cast<size_t>(y)]);
}

TEST(CudaPlan, SaysWhyAGroupHasNoPlan) {
  Group mid;
  mid.name = "mid";
  mid.output(mid.reduce(Op::Sum, mid.input(DType::F32, {4, 8, 16}), {1}, true));
  EXPECT_NE(
      plan_of(mid).find("fusion group 'mid': node 1 reduces dims that are neither leading nor trailing"),
      std::string::npos);
  Group centered;  // x - column mean: a full value after a column reduction
  centered.name = "centered";
  const int x = centered.input(DType::F32, {64, 16});
  centered.output(centered.binary(Op::Sub, x, centered.reduce(Op::Sum, x, {0}, true)));
  EXPECT_NE(plan_of(centered).find("output 0 is a full-size value computed from a column reduction"),
            std::string::npos)
      << plan_of(centered);
  Group f64;
  f64.name = "f64";
  f64.output(f64.unary(Op::Exp, f64.input(DType::F64, {8})));
  EXPECT_NE(plan_of(f64).find("node 0 is f64; CUDA kernels are generated for f32 and bf16"),
            std::string::npos);
  const std::string msg = test::error_message([&] { (void)cuda_program(mid, "k"); });
  EXPECT_NE(msg.find("fusion group 'mid'"), std::string::npos) << msg;
}

TEST(CudaTemplate, PointwiseKernelsMoveSixteenBytesPerAccess) {
  const CudaProgram p = cuda_program(test::bias_gelu_group(DType::F32, 64, 768), "k");
  ASSERT_EQ(p.launches.size(), 1u);
  EXPECT_NE(p.module.find("gpu.func @k_0(%in0: memref<12288xvector<4xf32>>, %in1: memref<192xvector<4xf32>>, "
                          "%out0: memref<12288xvector<4xf32>>) kernel"),
            std::string::npos)
      << p.module;
  EXPECT_EQ(p.launches[0].grid[0], 48u);  // 12288 vectors / 256 threads
  EXPECT_EQ(p.launches[0].block[0], 256u);
  Group folded;  // a value of constants alone is computed once, before the element's work
  folded.name = "folded";
  const int x = folded.input(DType::F32, {64, 16});
  folded.output(folded.binary(
      Op::Add, x, folded.binary(Op::Mul, folded.scalar(2.0, DType::F32), folded.scalar(3.0, DType::F32))));
  (void)cuda_ptx(cuda_program(folded, "f").module, "f");
  const CudaProgram b = cuda_program(test::bias_gelu_group(DType::BF16, 64, 768), "k");
  EXPECT_NE(b.module.find("%in1: memref<96xvector<8xbf16>>"), std::string::npos) << b.module;
  EXPECT_NE(b.module.find("arith.truncf"), std::string::npos);  // each bf16 node rounds
}

TEST(CudaTemplate, PowersByTwoMinusOneAndAHalfAreOneArithmeticOp) {
  Group g;  // x^2, x^-1, x^0.5 and x^3: only the last is libdevice's powf
  g.name = "powers";
  const int x = g.input(DType::BF16, {64, 256});
  for (double c : {2.0, -1.0, 0.5, 3.0}) g.output(g.binary(Op::Pow, x, g.scalar(c, DType::BF16)));
  const std::string m = cuda_program(g, "p").module;
  EXPECT_EQ(count(m, "math.powf"), 1u) << m;
  EXPECT_EQ(count(m, "math.sqrt"), 1u) << m;
  EXPECT_EQ(count(m, "arith.divf"), 1u) << m;
  EXPECT_GE(count(m, "arith.mulf"), 1u) << m;
}

TEST(CudaCodegen, PointwiseLowersToPtxWithVectorAccessesOnly) {
  if (libdevice_path().empty()) GTEST_SKIP() << "no CUDA toolkit here (libdevice.10.bc)";
  const std::string ptx =
      cuda_ptx(cuda_program(test::bias_gelu_group(DType::F32, 64, 768), "k").module, "f32");
  EXPECT_NE(ptx.find(".target sm_90"), std::string::npos) << ptx;
  EXPECT_EQ(count(ptx, ".entry k_0"), 1u) << ptx;
  EXPECT_EQ(count(ptx, "ld.global.v4.f32"), 2u) << ptx;  // x and the bias: one 16-byte load each
  EXPECT_EQ(count(ptx, "st.global.v4.f32"), 1u) << ptx;
  EXPECT_EQ(count(ptx, "ld.global.f32"), 0u) << ptx;
  EXPECT_EQ(count(ptx, "call"), 0u) << ptx;  // libdevice's tanhf is inlined
  const std::string bf =
      cuda_ptx(cuda_program(test::bias_gelu_group(DType::BF16, 64, 768), "k").module, "bf16");
  EXPECT_EQ(count(bf, "ld.global.v4.b32"), 2u) << bf;  // 8 bf16 = 16 bytes
  EXPECT_EQ(count(bf, "st.global.v4.b32"), 1u) << bf;
  EXPECT_EQ(count(bf, "ld.global.u16") + count(bf, "ld.global.b16"), 0u) << bf;
  EXPECT_GT(count(bf, "cvt.rn.bf16.f32"), 0u) << bf;
  EXPECT_EQ(count(bf, "tanh.approx.f32"), 8u) << bf;    // a bf16 tanh: one instruction a lane
  EXPECT_EQ(count(ptx, "tanh.approx.f32"), 0u) << ptx;  // an f32 tanh: libdevice's tanhf
  EXPECT_NE(cuda_ptx(cuda_program(test::bias_gelu_group(DType::F32, 64, 768), "k").module, "k", "sm_80")
                .find(".target sm_80"),
            std::string::npos);
}

TEST(CudaCodegen, RowsAndColumnsLowerToShufflesBarriersAndTwoPasses) {
  if (libdevice_path().empty()) GTEST_SKIP() << "no CUDA toolkit here (libdevice.10.bc)";
  const CudaProgram ln = cuda_program(test::layer_norm_group(DType::BF16, 128, 768), "ln");
  ASSERT_EQ(ln.launches.size(), 1u);
  EXPECT_EQ(ln.launches[0].grid[0], 128u);  // a block per row
  EXPECT_EQ(ln.launches[0].block[0], 96u);  // 768 / 8 lanes
  const std::string ptx = cuda_ptx(ln.module, "ln");
  EXPECT_EQ(count(ptx, "shfl.sync.bfly"), 10u) << ptx;  // two reductions, five steps each
  EXPECT_GE(count(ptx, "bar.sync"), 4u) << ptx;
  EXPECT_GT(count(ptx, "ld.global.v4.b32"), 0u) << ptx;
  const CudaProgram bg = cuda_program(test::bias_grad_group(DType::F32, {4, 32, 768}), "bg");
  ASSERT_EQ(bg.launches.size(), 2u);
  EXPECT_EQ(bg.launches[0].kernel, "bg_0_p1");
  EXPECT_EQ(bg.launches[1].kernel, "bg_0_p2");
  ASSERT_EQ(bg.scratch_f32.size(), 1u);
  EXPECT_EQ(bg.scratch_f32[0], static_cast<int64_t>(bg.launches[0].grid[1]) * 768);
  const std::string cptx = cuda_ptx(bg.module, "bg");
  EXPECT_EQ(count(cptx, ".entry bg_0_p1"), 1u);
  EXPECT_EQ(count(cptx, ".entry bg_0_p2"), 1u);
  // Column sums read 16 bytes per thread and row too: 8 bf16 columns.
  const std::string bptx =
      cuda_ptx(cuda_program(test::bias_grad_group(DType::BF16, {4, 32, 768}), "bb").module, "bb");
  EXPECT_EQ(count(bptx, "ld.global.v4.b32"), 1u) << bptx;
  EXPECT_EQ(count(bptx, "ld.global.u16") + count(bptx, "ld.global.b16"), 0u) << bptx;
  (void)cuda_ptx(cuda_program(test::layer_norm_backward_group(DType::F32, {4, 32, 768}), "lnb").module,
                 "lnb");
  (void)cuda_ptx(cuda_program(test::square_norm_group(512, 128), "sq").module, "sq");
  const CudaProgram st = cuda_program(test::row_then_column_group(DType::BF16, {4, 32, 64}), "st");
  ASSERT_EQ(st.launches.size(), 3u);  // rows, then the two column passes
  EXPECT_NE(st.module.find("%staged0: memref<8192xbf16>"), std::string::npos) << st.module;
  (void)cuda_ptx(st.module, "st");
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
