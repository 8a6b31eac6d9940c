// The CUDA templates on the GPU (Note [CUDA templates]): every pattern the
// training step has -- elementwise chains with broadcasting, LayerNorm from
// primitives (rows), softmax (max and sum rows), bias gradients and squared
// norms (columns, whole-tensor sums), LayerNorm's backward (all three
// patterns in one group), GELU's backward with its bias gradient (a column
// sum reading a pointwise kernel's output back), casts -- compiled to PTX, loaded and launched by
// the runtime, against the same group through the eager CUDA ops on random
// inputs: f32 within 1e-5 relative, bf16 within 1e-2 (the order of a sum and
// FMA contraction differ from the eager kernels; one bf16 rounding step then
// flips). Odd sizes (no 16-byte vectors), strided and misaligned inputs, the
// kernel cache on CUDA, and training with train.compile on the GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/mlir_backend.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/compile/lazy.h"
#include "runtime/core/device.h"
#include "runtime/tensor/factory.h"
#include "runtime/train/trainer.h"
#include "tests/support/fusion_groups.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"

namespace bt {
namespace {

using fusion::Group;
using fusion::Op;

const Device kGpu = Device::cuda(0);

double tol(DType dt) { return dt == DType::F32 ? 1e-5 : 1e-2; }

std::vector<Tensor> random_inputs(const Group& g, std::mt19937& gen, float lo = -2.0f, float hi = 2.0f) {
  std::vector<Tensor> in;
  for (int n : g.inputs())
    in.push_back(test::uniform_cpu(g.nodes[n].shape, g.nodes[n].dtype, gen, lo, hi).to(kGpu));
  return in;
}

/// Compiles `g` for the GPU, runs it on `inputs` into NaN-filled outputs and
/// compares each output with the eager ops' on the same inputs.
void expect_matches_eager(const Group& g, const std::vector<Tensor>& inputs,
                          const std::shared_ptr<fusion::Backend>& backend = compiler::make_mlir_backend()) {
  SCOPED_TRACE("fusion group '" + g.name + "'");
  const std::shared_ptr<fusion::Kernel> k = backend->compile(g, kGpu);
  std::vector<Tensor> out;
  for (int o : g.outputs) {
    out.push_back(empty(g.nodes[o].shape, TensorOptions{g.nodes[o].dtype, kGpu}));
    out.back().fill_(std::nan(""));  // every element must be written
  }
  k->run(inputs, out);
  const std::vector<Tensor> want = fusion::run_eager(g, inputs);
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = fusion::relative_difference(out[i].to(Device::cpu()), want[i].to(Device::cpu()));
    EXPECT_LT(err, tol(out[i].dtype()))
        << "output " << i << " (" << dtype_name(out[i].dtype()) << " " << shape_str(out[i].shape()) << ")";
  }
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    const std::string why = compiler::make_mlir_backend()->unavailable(kGpu);
    ASSERT_EQ(why, "");
  }
  std::mt19937 gen_{7};
};

TEST_F(CudaKernels, ElementwiseChainsWithBroadcasting) {
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [r, c] : {std::pair<int64_t, int64_t>{64, 768}, {37, 129}, {4096, 3072}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << r << "x" << c);
      const Group g = test::bias_gelu_group(dt, r, c);
      expect_matches_eager(g, random_inputs(g, gen_));
    }
  Group g;  // [R, 1] against [C], every unary op, pow, a scalar on the left, a 0-d input
  g.name = "outer";
  const int a = g.input(DType::F32, {6, 1}), b = g.input(DType::F32, {16}), z = g.input(DType::F32, {});
  const int s = g.binary(Op::Sub, g.scalar(3.0, DType::F32), g.binary(Op::Mul, a, b));
  const int u = g.unary(Op::Log, g.unary(Op::Sqrt, g.unary(Op::Exp, g.unary(Op::Neg, s))));
  g.output(g.binary(Op::Mul, g.binary(Op::Pow, g.binary(Op::Div, s, g.scalar(7.0, DType::F32)), u), z));
  expect_matches_eager(g, random_inputs(g, gen_, 0.1f, 1.0f));
}

TEST_F(CudaKernels, PowersByConstantsMatchTheEagerPow) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Group g;  // 2, -1 and 0.5 are arithmetic (Note [CUDA templates]); 3 and -2 stay powf
    g.name = "powers";
    const int x = g.input(dt, {64, 256});
    for (double c : {2.0, -1.0, 0.5, 3.0, -2.0}) g.output(g.binary(Op::Pow, x, g.scalar(c, dt)));
    expect_matches_eager(g, random_inputs(g, gen_, 0.05f, 4.0f));
  }
}

TEST_F(CudaKernels, CastsRoundOnceAsTheEagerOpsDo) {
  Group g;
  g.name = "casts";
  const int x = g.input(DType::F32, {128, 256}), w = g.input(DType::BF16, {256});
  const int xb = g.cast(x, DType::BF16);
  g.output(xb);
  g.output(g.cast(g.binary(Op::Mul, xb, w), DType::F32));
  expect_matches_eager(g, random_inputs(g, gen_));
}

TEST_F(CudaKernels, RowReductionsLayerNormAndSoftmax) {
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [r, c] : {std::pair<int64_t, int64_t>{128, 768}, {37, 129}, {4, 50304}, {16384, 768}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << r << "x" << c);
      const Group g = test::layer_norm_group(dt, r, c);
      expect_matches_eager(g, random_inputs(g, gen_));
    }
  Group g;
  g.name = "softmax";
  const int x = g.input(DType::F32, {4, 8, 1000});
  const int e = g.unary(Op::Exp, g.binary(Op::Sub, x, g.reduce(Op::Max, x, {2}, true)));
  g.output(g.binary(Op::Div, e, g.reduce(Op::Sum, e, {2}, true)));
  expect_matches_eager(g, random_inputs(g, gen_, -20.0f, 20.0f));
}

TEST_F(CudaKernels, ColumnReductionsAndWholeTensorSums) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : {Shape{4, 32, 768}, Shape{16384, 768}, Shape{5, 7, 33}, Shape{3000, 1}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << shape_str(s));
      const Group g = test::bias_grad_group(dt, s);
      expect_matches_eager(g, random_inputs(g, gen_));
    }
  for (auto [r, c] : {std::pair<int64_t, int64_t>{512, 128}, {50304, 768}, {1, 768}}) {
    const Group g = test::square_norm_group(r, c);
    expect_matches_eager(g, random_inputs(g, gen_));
  }
}

TEST_F(CudaKernels, LayerNormBackwardRunsAllThreePatterns) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Group g = test::layer_norm_backward_group(dt, {16, 1024, 768});
    expect_matches_eager(g, random_inputs(g, gen_, 0.5f, 2.0f));
  }
}

TEST_F(CudaKernels, AColumnSumOfARowKernelsOutputReadsItBack) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const Group g = test::row_then_column_group(dt, {16, 1024, 768});
    expect_matches_eager(g, random_inputs(g, gen_));
  }
}

TEST_F(CudaKernels, AColumnSumReadsBackAPointwiseKernelsOutput) {
  // The bias gradient of GELU's backward reads dh back (Note [CUDA kernel plans]).
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [r, c] : {std::pair<int64_t, int64_t>{16384, 3072}, {333, 72}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << r << "x" << c);
      const Group g = test::gelu_backward_group(dt, r, c);
      expect_matches_eager(g, random_inputs(g, gen_));
    }
}

TEST_F(CudaKernels, StridedAndMisalignedInputsAreCopiedFirst) {
  const Group g = test::bias_gelu_group(DType::F32, 64, 256);
  const Tensor wide = test::uniform_cpu({256, 64}, DType::F32, gen_).to(kGpu);
  const Tensor flat = test::uniform_cpu({257}, DType::F32, gen_).to(kGpu);
  const Tensor x = wide.transpose(0, 1);    // strided
  const Tensor b = flat.narrow(0, 1, 256);  // 4 bytes past a 16-byte boundary
  ASSERT_FALSE(x.is_contiguous());
  expect_matches_eager(g, {x, b});
}

// Inputs that record their layout are read in place: the two halves of a
// head dim as RoPE reads them (Note [RoPE without a concatenation]), an
// expanded view, and a half at an offset the vector reads cannot take (the
// group then runs eagerly once).
TEST_F(CudaKernels, InputsWithALayoutAreReadInPlace) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = test::uniform_cpu({4, 16, 3, 64}, dt, gen_).to(kGpu).view({4, 16, 3, 2, 32});
    const Tensor c = test::uniform_cpu({16, 1, 1, 32}, dt, gen_).to(kGpu);
    const Tensor s = test::uniform_cpu({16, 1, 2, 32}, dt, gen_).to(kGpu);
    const Tensor lo = x.narrow(3, 0, 1), hi = x.narrow(3, 1, 1);
    Group g;
    g.name = "rope";
    const int ix = g.input(dt, x.shape()), ic = g.input(dt, c.shape()), is = g.input(dt, s.shape());
    const int il = g.input(dt, lo.shape(), fusion::input_layout(lo));
    const int ih = g.input(dt, hi.shape(), fusion::input_layout(hi));
    g.output(g.binary(Op::Add, g.binary(Op::Add, g.binary(Op::Mul, ix, ic), g.binary(Op::Mul, il, is)),
                      g.binary(Op::Mul, ih, is)));
    expect_matches_eager(g, {x, c, s, lo, hi});
  }
  const Tensor col = test::uniform_cpu({64, 1}, DType::F32, gen_).to(kGpu);
  const Tensor wide = col.expand({64, 256}), y = test::uniform_cpu({64, 256}, DType::F32, gen_).to(kGpu);
  Group e;
  e.name = "expanded";
  const int iw = e.input(DType::F32, wide.shape(), fusion::input_layout(wide));
  e.output(e.binary(Op::Mul, iw, e.input(DType::F32, y.shape())));
  expect_matches_eager(e, {wide, y});
  // Strides [72, 36, 1] allow vectors, but the view starts 4 bytes past a 16-byte boundary.
  const Tensor odd = test::uniform_cpu({8, 2, 36}, DType::F32, gen_).to(kGpu).narrow(2, 1, 32);
  Group m;
  m.name = "misaligned";
  m.output(m.unary(Op::Neg, m.input(DType::F32, odd.shape(), fusion::input_layout(odd))));
  expect_matches_eager(m, {odd});
}

TEST_F(CudaKernels, ASecondBackendLoadsThePtxFromTheKernelCache) {
  test::TempDir dir("bt_cuda_cache");
  compiler::BackendOptions o;
  o.cache_dir = dir.path().string();
  const Group g = test::layer_norm_backward_group(DType::BF16, {4, 32, 768});
  const std::vector<Tensor> in = random_inputs(g, gen_);
  const auto first = compiler::make_mlir_backend(o), second = compiler::make_mlir_backend(o);
  EXPECT_FALSE(first->compile(g, kGpu)->loaded_from_cache());
  EXPECT_TRUE(second->compile(g, kGpu)->loaded_from_cache());
  expect_matches_eager(g, in, second);
}

TEST(CudaTrainCompile, GivesTheEagerLossesOnTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(compiler::install_fusion_backend());  // no disk cache
  fusion::clear_kernel_cache();
  fusion::reset_lazy_stats();
  test::TempDir dir("bt_cuda_train_compile");
  const std::string glob = test::write_token_shards(dir.path().string(), "train", 2, 3000, 64, 1);
  // bf16: the compiled groups round as the eager ops do, but sum in another
  // order and take tanh from tanh.approx.f32 (Note [CUDA templates]), so a
  // bf16 value flips by a unit now and then; the losses drift apart slowly
  // (1.6e-4 and 1.5e-3 at most for the primitive model on an H200).
  for (auto [precision, loss_tol, norm_tol] :
       {std::tuple<const char*, double, double>{"fp32", 1e-5, 1e-4}, {"bf16", 2e-3, 2e-2}})
    for (bool fused : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << precision << (fused ? ", hand-fused model" : ", primitive-op model"));
      const auto config = [&](bool compile) {
        train::TrainConfig c;
        c.model.n_layer = 2;
        c.model.n_head = 2;
        c.model.n_embd = 64;
        c.model.seq_len = 32;
        c.model.vocab_size = 64;
        c.model.fused_ops = fused;
        c.data.train = glob;
        c.train.device = "cuda";
        c.train.steps = 12;
        c.train.batch_size = 8;
        c.train.micro_batch = 4;
        c.train.lr = 3e-3;
        c.train.warmup_steps = 3;
        c.train.compile = compile ? "true" : "false";
        c.train.precision = precision;
        return c;
      };
      train::Trainer eager(config(false)), compiled(config(true));
      double worst_loss = 0.0, worst_norm = 0.0;
      for (int i = 0; i < 12; ++i) {
        const train::StepStats a = eager.step(), b = compiled.step();
        SCOPED_TRACE(::testing::Message() << "step " << b.step);
        worst_loss = std::max(worst_loss, std::abs(b.loss - a.loss) / std::abs(a.loss));
        worst_norm = std::max(worst_norm, std::abs(b.grad_norm - a.grad_norm) / std::abs(a.grad_norm));
        EXPECT_LE(std::abs(b.loss - a.loss), loss_tol * std::abs(a.loss));
        EXPECT_LE(std::abs(b.grad_norm - a.grad_norm), norm_tol * std::abs(a.grad_norm));
        EXPECT_TRUE(b.compiled);
        EXPECT_EQ(b.recompiles, 0);
      }
      std::printf("%s %s: largest relative difference, loss %.2e, gradient norm %.2e\n", precision,
                  fused ? "hand-fused" : "primitive", worst_loss, worst_norm);
    }
  EXPECT_EQ(fusion::lazy_stats().eager_fallbacks, 0) << "every group of the step has a CUDA template";
  fusion::set_backend(nullptr);
}

}  // namespace
}  // namespace bt
