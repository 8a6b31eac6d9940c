// linear with bf16 operands: the gradients of the weight and the bias come in
// f32 (Note [Gradients in a wider dtype]), equal within bf16's rounding to the
// bf16 gradients the layer used to return, and one rounding closer to the
// exact ones.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"

namespace bt {
namespace {

/// ||a - ref|| / ||ref||.
double rel(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
  return std::sqrt(num / den);
}

/// The values of a tensor of any floating dtype.
std::vector<double> values(const Tensor& t) {
  const std::vector<float> f = t.to(DType::F32).to_vector<float>();
  return std::vector<double>(f.begin(), f.end());
}

TEST(Linear, Bf16WeightAndBiasGradientsComeInF32) {
  Generator gen(17);
  const int64_t rows = 96, in = 40, out = 24;
  Tensor x = randn({rows, in}, {}, &gen).to(DType::BF16).requires_grad_();
  Tensor gy = randn({rows, out}, {}, &gen).to(DType::BF16);
  Tensor w = randn({out, in}, {}, &gen).requires_grad_();  // f32 masters, cast as Gpt::compute does
  Tensor b = randn({out}, {}, &gen).requires_grad_();
  linear(x, w.to(DType::BF16), b.to(DType::BF16)).backward(gy);
  ASSERT_EQ(w.grad().dtype(), DType::F32);
  ASSERT_EQ(b.grad().dtype(), DType::F32);
  EXPECT_EQ(x.grad().dtype(), DType::BF16);  // the activation's gradient stays in the compute dtype

  // The gradients as bf16 used to be: bf16 leaves, whose f32 gradients
  // AccumulateGrad rounds to bf16 once, as the GEMM and the sum did on store.
  Tensor wb = w.detach().to(DType::BF16).requires_grad_(), bb = b.detach().to(DType::BF16).requires_grad_();
  linear(x.detach(), wb, bb).backward(gy);
  ASSERT_EQ(wb.grad().dtype(), DType::BF16);

  // Exact: double sums of the bf16 values.
  const std::vector<double> xv = values(x), gv = values(gy);
  std::vector<double> ref_w(out * in, 0.0), ref_b(out, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      ref_b[o] += gv[r * out + o];
      for (int64_t i = 0; i < in; ++i) ref_w[o * in + i] += gv[r * out + o] * xv[r * in + i];
    }
  const std::vector<double> gw = values(w.grad()), gb = values(b.grad());
  EXPECT_LT(rel(gw, ref_w), 1e-6);  // f32 sums of exact products
  EXPECT_LT(rel(gb, ref_b), 1e-6);
  EXPECT_GT(rel(values(wb.grad()), ref_w), 1e-4);  // bf16's rounding, ~2^-9 / sqrt(3)
  EXPECT_GT(rel(values(bb.grad()), ref_b), 1e-4);
  EXPECT_LT(rel(values(wb.grad()), gw), 1e-2);  // the old gradients, within bf16's rounding
  EXPECT_LT(rel(values(bb.grad()), gb), 1e-2);
}

// f32 and f64 layers keep their dtype's gradients.
TEST(Linear, F32AndF64KeepTheirGradientDtype) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = randn({3, 4}).to(dt), w = randn({2, 4}).to(dt).requires_grad_(),
           b = randn({2}).to(dt).requires_grad_();
    sum(linear(x, w, b)).backward();
    EXPECT_EQ(w.grad().dtype(), dt);
    EXPECT_EQ(b.grad().dtype(), dt);
  }
}

// sum(x, dims, keepdim, dtype), which makes the bias gradient: bf16 summed
// into f32, any other pair refused.
TEST(Linear, Bf16BiasSumIntoF32) {
  Tensor x = randn({50, 3}).to(DType::BF16);
  Tensor s = sum(x, {0}, false, DType::F32);
  ASSERT_EQ(s.dtype(), DType::F32);
  const std::vector<double> xv = values(x);
  std::vector<double> ref(3, 0.0);
  for (int64_t r = 0; r < 50; ++r)
    for (int64_t j = 0; j < 3; ++j) ref[j] += xv[r * 3 + j];
  EXPECT_LT(rel(values(s), ref), 1e-6);
  EXPECT_EQ(sum(x, {0, 1}, false, DType::F32).dtype(), DType::F32);
  EXPECT_EQ(sum(x, {}, false, DType::F32).dtype(), DType::F32);
  try {
    sum(randn({4}), {0}, false, DType::BF16);
    ADD_FAILURE() << "f32 into bf16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum: f32 into bf16 is not supported"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace bt
