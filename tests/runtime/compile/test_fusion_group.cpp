// Fusion groups (runtime/compile/fusion_group.h) and the fusion-backend
// interface without a compiler: building and checking a group, its canonical
// text, run_eager against the eager ops called directly, check_tensors, and
// the no-op backend a build without MLIR (or a program that installs none) has.
#include <cmath>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "runtime/compile/fusion_backend.h"
#include "runtime/compile/fusion_group.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"
#include "tests/support/fusion_groups.h"

namespace bt {
namespace {

using fusion::Group;
using fusion::Op;

Group bias_gelu(DType dt, int64_t rows, int64_t cols) { return test::bias_gelu_group(dt, rows, cols); }

TEST(FusionGroup, BuildsShapesAndDtypesAndChecksThem) {
  Group g = bias_gelu(DType::F32, 4, 8);
  EXPECT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.nodes[g.outputs[0]].shape, (Shape{4, 8}));
  const int r = g.reduce(Op::Sum, g.outputs[0], {-1}, true);
  EXPECT_EQ(g.nodes[r].shape, (Shape{4, 1}));
  EXPECT_EQ(g.nodes[r].dims, (std::vector<int64_t>{1}));
  EXPECT_EQ(g.nodes[g.reduce(Op::Max, 0, {1, 0})].shape, Shape{});

  // Errors name the group and the node.
  Group bad;
  bad.name = "bad";
  const int a = bad.input(DType::F32, {3, 4}), b = bad.input(DType::F32, {5});
  std::string msg = test::error_message([&] { bad.binary(Op::Add, a, b); });
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  const int c = bad.input(DType::BF16, {3, 4});
  msg = test::error_message([&] { bad.binary(Op::Mul, a, c); });
  EXPECT_NE(msg.find("fusion group 'bad', node %3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("two arguments of its dtype"), std::string::npos) << msg;
  msg = test::error_message([&] { bad.input(DType::I32, {2}); });
  EXPECT_NE(msg.find("f32, f64 or bf16"), std::string::npos) << msg;
  msg = test::error_message([&] { bad.reduce(Op::Sum, a, {2}); });
  EXPECT_NE(msg.find("not distinct dims"), std::string::npos) << msg;
  msg = test::error_message([&] { bad.reduce(Op::Sum, bad.scalar(1.0, DType::F32), {}); });
  EXPECT_NE(msg.find("not a scalar"), std::string::npos) << msg;
  EXPECT_EQ(bad.nodes.size(), 4u) << "nodes that fail their checks are not added";
  bad.output(a);
  msg = test::error_message([&] { bad.validate(); });
  EXPECT_NE(msg.find("outputs are computed nodes"), std::string::npos) << msg;
}

TEST(FusionGroup, CanonicalTextIsExactAndStable) {
  const Group g = bias_gelu(DType::F32, 4, 8);
  const std::string c = g.canonical();
  EXPECT_EQ(c, bias_gelu(DType::F32, 4, 8).canonical());
  EXPECT_NE(c, bias_gelu(DType::F32, 4, 9).canonical()) << "shapes are part of the text";
  EXPECT_NE(c, bias_gelu(DType::BF16, 4, 8).canonical()) << "dtypes are part of the text";
  EXPECT_NE(c.find("%0 = input 0 : f32[4, 8]"), std::string::npos) << c;
  EXPECT_NE(c.find("%2 = add %0, %1 : f32[4, 8]"), std::string::npos) << c;
  EXPECT_NE(c.find("= scalar 0x1.6e4e26d4801f7p-5 : f32[]"), std::string::npos) << c;  // 0.044715, exactly
  EXPECT_NE(c.find("outputs %"), std::string::npos) << c;
}

TEST(FusionGroup, RunEagerIsTheEagerOps) {
  std::mt19937 gen(7);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Group g = bias_gelu(dt, 5, 7);
    const Tensor x = test::uniform_cpu({5, 7}, dt, gen), b = test::uniform_cpu({7}, dt, gen);
    const Tensor got = fusion::run_eager(g, {x, b})[0];
    // The same ops written out.
    const auto s_ = [&](double v) { return full({}, v, TensorOptions{dt}); };
    const Tensor s = add(x, b);
    const Tensor want =
        mul(mul(s_(0.5), s),
            add(s_(1.0), tanh(mul(add(s, mul(s_(0.044715), mul(mul(s, s), s))), s_(0.7978845608028654)))));
    ASSERT_EQ(got.shape(), want.shape());
    const std::vector<float> gv = got.to(DType::F32).to_vector<float>(),
                             wv = want.to(DType::F32).to_vector<float>();
    for (size_t i = 0; i < gv.size(); ++i) EXPECT_EQ(gv[i], wv[i]) << i;
  }
  // Reductions: Max over two dims, Sum with keepdim, a cast.
  Group r;
  r.name = "reduce";
  const int x = r.input(DType::F32, {3, 4, 5});
  r.output(r.reduce(Op::Max, x, {0, 2}));
  r.output(r.cast(r.reduce(Op::Sum, x, {1}, true), DType::F64));
  const Tensor xv = test::uniform_cpu({3, 4, 5}, DType::F32, gen);
  const std::vector<Tensor> out = fusion::run_eager(r, {xv});
  EXPECT_EQ(out[0].shape(), (Shape{4}));
  EXPECT_EQ(out[0].to_vector<float>(), max(max(xv, 2), 0).to_vector<float>());
  EXPECT_EQ(out[1].dtype(), DType::F64);
  EXPECT_EQ(out[1].to_vector<double>(), sum(xv, {1}, true).to(DType::F64).to_vector<double>());
}

TEST(FusionGroup, ABinaryNodeMayBroadcastItsResultFurther) {
  // A reduction's backward: the row gradient times a scale, expanded over the row.
  Group g;
  g.name = "expand";
  const int r = g.input(DType::F32, {3, 1});
  g.output(g.binary(Op::Mul, r, g.scalar(0.25, DType::F32), {2, 3, 4}));
  g.validate();
  EXPECT_EQ(g.nodes[2].shape, (Shape{2, 3, 4}));
  const Tensor x = from_vector<float>({1, 2, 3}, {3, 1});
  const Tensor y = fusion::run_eager(g, {x})[0];
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.data<float>()[0], 0.25f);
  EXPECT_EQ(y.data<float>()[23], 0.75f);
  Group bad;
  bad.name = "bad";
  const int b = bad.input(DType::F32, {3, 2});
  const std::string msg = test::error_message([&] {
    (void)bad.binary(Op::Mul, b, bad.scalar(1.0, DType::F32), {3, 4});
  });
  EXPECT_NE(msg.find("which its arguments' broadcast shape [3, 2] does not broadcast to"), std::string::npos)
      << msg;
}

TEST(FusionGroup, CheckTensorsNamesWhatIsWrong) {
  const Group g = bias_gelu(DType::F32, 2, 3);
  const Tensor x = zeros({2, 3}), b = zeros({3}), out = empty({2, 3});
  fusion::check_tensors(g, {x, b}, {out}, "test");
  std::string msg = test::error_message([&] { fusion::check_tensors(g, {x}, {out}, "test"); });
  EXPECT_NE(msg.find("takes 2 inputs and 1 outputs; got 1 and 1"), std::string::npos) << msg;
  msg = test::error_message([&] { fusion::check_tensors(g, {x, zeros({4})}, {out}, "test"); });
  EXPECT_NE(msg.find("input 1 must be f32[3]; got f32[4]"), std::string::npos) << msg;
  msg = test::error_message([&] { fusion::check_tensors(g, {x, b}, {empty({3, 2}).t()}, "test"); });
  EXPECT_NE(msg.find("must be contiguous"), std::string::npos) << msg;
  msg = test::error_message([&] { fusion::check_tensors(g, {x, b}, {x}, "test"); });
  EXPECT_NE(msg.find("shares memory with an input"), std::string::npos) << msg;
}

// An input may record its layout (a narrowed half, an expanded view): then it
// is part of the text, and a tensor of another layout is refused.
TEST(FusionGroup, AnInputsLayoutIsPartOfItsText) {
  const Tensor x = zeros({2, 3, 8});
  const Tensor half = x.view({2, 3, 2, 4}).narrow(2, 1, 1), wide = zeros({3, 1}).expand({3, 5});
  EXPECT_TRUE(fusion::input_layout(x).empty());
  EXPECT_TRUE(fusion::input_layout(x.narrow(0, 1, 1)).empty()) << "contiguous, at an offset";
  EXPECT_EQ(fusion::input_layout(half), (std::vector<int64_t>{24, 8, 0, 1}));
  EXPECT_EQ(fusion::input_layout(wide), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(fusion::input_layout(zeros({3, 4}).t()).empty()) << "a transpose is copied, not read in place";
  Group g;
  g.name = "halves";
  const int a = g.input(DType::F32, half.shape(), fusion::input_layout(half));
  g.output(g.unary(Op::Neg, a));
  EXPECT_NE(g.canonical().find("%0 = input 0 strides [24, 8, 0, 1] : f32[2, 3, 1, 4]"), std::string::npos)
      << g.canonical();
  const Tensor out = empty(half.shape());
  fusion::check_tensors(g, {half}, {out}, "test");
  const std::string msg =
      test::error_message([&] { fusion::check_tensors(g, {zeros(half.shape())}, {out}, "test"); });
  EXPECT_NE(msg.find("input 0 must have strides [24, 8, 0, 1]"), std::string::npos) << msg;
  EXPECT_EQ(fusion::relative_difference(fusion::run_eager(g, {half})[0], neg(half).contiguous()), 0.0);
}

TEST(FusionBackend, WithoutACompilerTheNoOpBackendSaysWhy) {
  // This test program installs no compiler: the runtime's no-op backend.
  const std::shared_ptr<fusion::Backend> b = fusion::backend();
  EXPECT_EQ(b->name(), "none");
  EXPECT_NE(b->unavailable(Device::cpu()).find("built without MLIR 19"), std::string::npos);
  const Group g = bias_gelu(DType::F32, 2, 3);
  const std::string msg = test::error_message([&] { b->compile(g, Device::cpu()); });
  EXPECT_NE(msg.find("cannot compile fusion group 'bias_gelu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scripts/install-deps"), std::string::npos) << msg;
}

}  // namespace
}  // namespace bt
