// linear with bf16 operands: the gradients of the weight and the bias come in
// f32 (Note [Gradients in a wider dtype]), equal within bf16's rounding to the
// bf16 gradients the layer used to return, and one rounding closer to the
// exact ones.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "tests/support/gradcheck.h"

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

// linear_split (Note [One GEMM for several weights]): float64 gradients,
// including a weight whose output nobody uses (its gradient is zeros).
TEST(LinearSplit, Float64GradientsOfEveryWeight) {
  const std::vector<Tensor> in{test::leaf({2, 5, 6}, 1), test::leaf({4, 6}, 2), test::leaf({3, 6}, 3),
                               test::leaf({2, 6}, 4)};
  const test::Fn all = [](const std::vector<Tensor>& t) {
    const std::vector<Tensor> p = linear_split(t[0], {t[1], t[2], t[3]});
    return add(add(sum(mul(p[0], p[0])), sum(mul(p[1], 3.0))), sum(mul(p[2], p[2])));
  };
  EXPECT_TRUE(test::gradcheck(all, in));
  const test::Fn middle_unused = [](const std::vector<Tensor>& t) {
    const std::vector<Tensor> p = linear_split(t[0], {t[1], t[2], t[3]});
    return add(sum(mul(p[0], p[0])), sum(mul(p[2], p[0].narrow(2, 0, 2))));
  };
  EXPECT_TRUE(test::gradcheck(middle_unused, in));
}

// The outputs are views side by side of one result, equal to separate
// linears; bf16 weight gradients come in f32, as linear's do.
TEST(LinearSplit, GivesSeparateLinearsWithF32WeightGradients) {
  Generator gen(5);
  Tensor x = randn({3, 7, 32}, {}, &gen).to(DType::BF16).requires_grad_();
  std::vector<Tensor> w;
  for (int64_t n : {24, 8, 8}) w.push_back(randn({n, 32}, {}, &gen).requires_grad_());
  std::vector<Tensor> wb;
  for (const Tensor& m : w) wb.push_back(m.to(DType::BF16));
  const std::vector<Tensor> p = linear_split(x, wb);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1].shape(), (Shape{3, 7, 8}));
  EXPECT_EQ(p[1].data_ptr(), static_cast<const void*>(static_cast<const char*>(p[0].data_ptr()) + 24 * 2));
  Tensor total;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(test::rel_error(p[i], linear(x.detach(), wb[i].detach())), 1e-2) << i;
    const Tensor s = sum(mul(p[i].to(DType::F32), static_cast<double>(i + 1)));
    total = total.defined() ? add(total, s) : s;
  }
  total.backward();
  Tensor x2 = x.detach().requires_grad_(), total2;
  std::vector<Tensor> w2;
  for (size_t i = 0; i < 3; ++i) {
    w2.push_back(w[i].detach().clone().requires_grad_());
    const Tensor s = sum(mul(linear(x2, w2[i].to(DType::BF16)).to(DType::F32), static_cast<double>(i + 1)));
    total2 = total2.defined() ? add(total2, s) : s;
  }
  total2.backward();
  EXPECT_LT(test::rel_error(x.grad(), x2.grad()), 1e-2);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(w[i].grad().dtype(), DType::F32) << i;
    EXPECT_LT(test::rel_error(w[i].grad(), w2[i].grad()), 1e-5) << i;
  }
  EXPECT_THROW(linear_split(x, {}), Error);
  EXPECT_THROW(linear_split(x, {wb[0], randn({8, 31}).to(DType::BF16)}), Error);
}

}  // namespace
}  // namespace bt
