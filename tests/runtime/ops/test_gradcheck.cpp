// Every differentiable op against float64 central finite differences (CPU).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "runtime/autograd/function.h"
#include "tests/support/gradcheck.h"

namespace bt::test {
namespace {

using V = std::vector<Tensor>;

TEST(Gradcheck, BinaryOpsBroadcast) {
  EXPECT_TRUE(gradcheck([](const V& v) { return add(v[0], v[1]); }, {leaf({3, 4}, 1), leaf({4}, 2)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sub(v[0], v[1]); }, {leaf({2, 1, 3}, 3), leaf({4, 1}, 4)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mul(v[0], v[1]); }, {leaf({3, 4}, 5), leaf({3, 1}, 6)}));
  EXPECT_TRUE(
      gradcheck([](const V& v) { return div(v[0], v[1]); }, {leaf({3, 4}, 7), leaf({4}, 8, 0.5, 2.0)}));
  EXPECT_TRUE(
      gradcheck([](const V& v) { return pow(v[0], v[1]); }, {leaf({3, 4}, 9, 0.5, 2.0), leaf({4}, 10)}));
}

TEST(Gradcheck, ScalarAndUnaryOps) {
  EXPECT_TRUE(gradcheck([](const V& v) { return add(v[0], 2.5); }, {leaf({5}, 11)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mul(v[0], -3.0); }, {leaf({5}, 12)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return pow(v[0], 3.0); }, {leaf({2, 3}, 13)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return pow(v[0], 0.5); }, {leaf({2, 3}, 14, 0.5, 2.0)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return neg(v[0]); }, {leaf({4}, 15)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return exp(v[0]); }, {leaf({2, 3}, 16)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log(v[0]); }, {leaf({2, 3}, 17, 0.5, 2.0)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return tanh(v[0]); }, {leaf({2, 3}, 18)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sqrt(v[0]); }, {leaf({2, 3}, 19, 0.5, 2.0)}));
}

TEST(Gradcheck, Reductions) {
  EXPECT_TRUE(gradcheck([](const V& v) { return sum(v[0]); }, {leaf({3, 4}, 20)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sum(v[0], {0, 2}); }, {leaf({2, 3, 4}, 21)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sum(v[0], {-1}, true); }, {leaf({2, 3, 4}, 22)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mean(v[0], {1}); }, {leaf({2, 3, 4}, 23)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mean(v[0]); }, {leaf({5, 2}, 24)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return max(v[0], 1); }, {leaf({3, 5, 2}, 25)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return max(v[0], 0, true); }, {leaf({4, 3}, 26)}));
}

TEST(Gradcheck, Softmax) {
  EXPECT_TRUE(gradcheck([](const V& v) { return softmax(v[0]); }, {leaf({3, 7}, 27)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return softmax(v[0], 0); }, {leaf({4, 3}, 28)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log_softmax(v[0]); }, {leaf({2, 3, 5}, 29)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log_softmax(v[0], 1); }, {leaf({2, 3, 5}, 30)}));
}

TEST(Gradcheck, Matmul) {
  EXPECT_TRUE(gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({3, 4}, 31), leaf({4, 5}, 32)}));
  EXPECT_TRUE(
      gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({2, 3, 4}, 33), leaf({2, 4, 2}, 34)}));
  EXPECT_TRUE(
      gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({2, 3, 4}, 35), leaf({4, 2}, 36)}));
  // Transposed views go to the GEMM as transposes.
  EXPECT_TRUE(
      gradcheck([](const V& v) { return matmul(v[0].t(), v[1].t()); }, {leaf({4, 3}, 37), leaf({5, 4}, 38)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return matmul(v[0].transpose(1, 2), v[1]); },
                        {leaf({2, 4, 3}, 39), leaf({2, 4, 3}, 40)}));
}

TEST(Gradcheck, Linear) {
  EXPECT_TRUE(gradcheck([](const V& v) { return linear(v[0], v[1], v[2]); },
                        {leaf({2, 3, 4}, 41), leaf({5, 4}, 42), leaf({5}, 43)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return linear(v[0], v[1]); }, {leaf({3, 4}, 44), leaf({2, 4}, 45)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return linear(v[0], v[1], v[2], Activation::Gelu); },
                        {leaf({3, 4}, 46), leaf({6, 4}, 47), leaf({6}, 48)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return linear(v[0], v[1], Tensor(), Activation::Gelu); },
                        {leaf({3, 4}, 49), leaf({6, 4}, 50)}));
}

// Note [Fused MLP backward]: the GELU gradient and the first bias gradient
// from one GEMM's epilogue; also without biases and under selective
// recompute (GELU as its own kernel, its output rebuilt in backward).
TEST(Gradcheck, Mlp) {
  EXPECT_TRUE(
      gradcheck([](const V& v) { return mlp(v[0], v[1], v[2], v[3], v[4]); },
                {leaf({2, 3, 4}, 51), leaf({6, 4}, 52), leaf({6}, 53), leaf({5, 6}, 54), leaf({5}, 55)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mlp(v[0], v[1], Tensor(), v[2], Tensor()); },
                        {leaf({3, 4}, 56), leaf({7, 4}, 57), leaf({2, 7}, 58)}));
  autograd::RecomputeGuard selective(Recompute::Selective);
  EXPECT_TRUE(
      gradcheck([](const V& v) { return mlp(v[0], v[1], v[2], v[3], v[4]); },
                {leaf({3, 4}, 59), leaf({8, 4}, 60), leaf({8}, 61), leaf({4, 8}, 62), leaf({4}, 63)}));
}

TEST(Gradcheck, GeluAndLayerNorm) {
  EXPECT_TRUE(gradcheck([](const V& v) { return gelu(v[0]); }, {leaf({3, 5}, 51, -3.0, 3.0)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return layer_norm(v[0], v[1], v[2]); },
                        {leaf({4, 6}, 52), leaf({6}, 53), leaf({6}, 54)}, 1e-6, 1e-6, 1e-5));
  EXPECT_TRUE(gradcheck([](const V& v) { return layer_norm(v[0], Tensor(), Tensor()); },
                        {leaf({2, 3, 5}, 55)}, 1e-6, 1e-6, 1e-5));
}

// Both outputs, each alone, and y repeated over x's leading dimension.
TEST(Gradcheck, AddLayerNorm) {
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto r = add_layer_norm(v[0], v[1], v[2], v[3]);
        return add(mul(r.sum, 0.7), r.out);
      },
      {leaf({4, 6}, 59), leaf({4, 6}, 60), leaf({6}, 61), leaf({6}, 62)}, 1e-6, 1e-6, 1e-5));
  EXPECT_TRUE(gradcheck([](const V& v) { return add_layer_norm(v[0], v[1], v[2], v[3]).out; },
                        {leaf({2, 3, 5}, 63), leaf({3, 5}, 64), leaf({5}, 65), leaf({5}, 66)}, 1e-6, 1e-6,
                        1e-5));
  EXPECT_TRUE(gradcheck([](const V& v) { return add_layer_norm(v[0], v[1], Tensor(), Tensor()).sum; },
                        {leaf({2, 3, 5}, 67), leaf({3, 5}, 68)}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto r = add_layer_norm(v[0], v[1], Tensor(), Tensor());
        return add(r.sum, mul(r.out, 1.3));
      },
      {leaf({2, 3, 5}, 69), leaf({5}, 70)}, 1e-6, 1e-6, 1e-5));
  // A bias into the residual add (Note [A bias into the residual add]): its
  // gradient from the LayerNorm's pass, and from the sum's alone.
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto r = add_layer_norm(v[0], v[1], v[2], v[3], 1e-5, v[4]);
        return add(mul(r.sum, 0.7), r.out);
      },
      {leaf({4, 6}, 71), leaf({4, 6}, 72), leaf({6}, 73), leaf({6}, 74), leaf({6}, 75)}, 1e-6, 1e-6, 1e-5));
  EXPECT_TRUE(
      gradcheck([](const V& v) { return add_layer_norm(v[0], v[1], Tensor(), Tensor(), 1e-5, v[2]).out; },
                {leaf({2, 3, 5}, 76), leaf({3, 5}, 77), leaf({5}, 78)}, 1e-6, 1e-6, 1e-5));
  EXPECT_TRUE(
      gradcheck([](const V& v) { return add_layer_norm(v[0], v[1], Tensor(), Tensor(), 1e-5, v[2]).sum; },
                {leaf({2, 3, 5}, 79), leaf({2, 3, 5}, 80), leaf({5}, 81)}));
}

TEST(Gradcheck, CausalAttention) {
  EXPECT_TRUE(gradcheck([](const V& v) { return causal_attention(v[0], v[1], v[2]); },
                        {leaf({2, 2, 5, 4}, 56), leaf({2, 2, 5, 4}, 57), leaf({2, 2, 5, 4}, 58)}));
  // q/k/v as strided slices of one fused [B, T, 3, H, D] projection.
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor qkv = v[0];  // [B, T, 3, H, D]
        auto part = [&](int i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
        return causal_attention(part(0), part(1), part(2));
      },
      {leaf({1, 6, 3, 2, 4}, 59)}));
  // The fused form: heads read from and gradients written into [B, T, 3C] in place.
  EXPECT_TRUE(
      gradcheck([](const V& v) { return causal_self_attention(v[0], 2); }, {leaf({2, 5, 3 * 2 * 4}, 61)}));
}

TEST(Gradcheck, GroupedQueryAttention) {
  // H = 4 query heads over Hkv = 2 and 1 key/value heads, [B, T, heads, D].
  for (int64_t Hkv : {2, 1}) {
    SCOPED_TRACE(Hkv);
    EXPECT_TRUE(gradcheck([](const V& v) { return grouped_query_attention(v[0], v[1], v[2]); },
                          {leaf({2, 5, 4, 3}, 70), leaf({2, 5, Hkv, 3}, 71), leaf({2, 5, Hkv, 3}, 72)}));
    // The [B, heads, T, D] form.
    EXPECT_TRUE(gradcheck([](const V& v) { return causal_attention(v[0], v[1], v[2]); },
                          {leaf({1, 4, 5, 3}, 73), leaf({1, Hkv, 5, 3}, 74), leaf({1, Hkv, 5, 3}, 75)}));
  }
  // q, k, v as strided slices of one fused [B, T, (H + 2 Hkv) D] projection.
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor qkv = v[0].view({1, 6, 4 + 2 * 2, 3});
        return grouped_query_attention(qkv.narrow(2, 0, 4), qkv.narrow(2, 4, 2), qkv.narrow(2, 6, 2));
      },
      {leaf({1, 6, (4 + 2 * 2) * 3}, 76)}));
}

/// K/V [B, T, Hkv, D] with each head repeated G times: [B, T, H, D], head h
/// holding head h / G (a copy whose backward sums the G gradients).
Tensor repeat_heads(const Tensor& x, int64_t G) {
  const int64_t B = x.size(0), T = x.size(1), Hkv = x.size(2), D = x.size(3);
  return x.unsqueeze(3).expand({B, T, Hkv, G, D}).reshape({B, T, Hkv * G, D});
}

TEST(Attention, GroupedQueryEqualsMultiHeadOnRepeatedKeyValueHeads) {
  for (DType dt : {DType::F32, DType::F64})
    for (int64_t Hkv : {2, 1}) {
      SCOPED_TRACE(bt::cat(dtype_name(dt), " Hkv ", Hkv));
      const int64_t G = 4 / Hkv;
      auto make = [&](const Shape& shape, uint64_t seed) {
        return leaf(shape, seed).to(dt).detach().requires_grad_();
      };
      Tensor q = make({2, 9, 4, 8}, 80), k = make({2, 9, Hkv, 8}, 81), v = make({2, 9, Hkv, 8}, 82);
      Tensor w = leaf({2, 9, 4, 8}, 83).to(dt).detach();
      Tensor gqa = grouped_query_attention(q, k, v);
      sum(mul(gqa, w)).backward();
      const Tensor dq = q.grad().clone(), dk = k.grad().clone(), dv = v.grad().clone();
      q.zero_grad(), k.zero_grad(), v.zero_grad();
      Tensor mha = grouped_query_attention(q, repeat_heads(k, G), repeat_heads(v, G));
      sum(mul(mha, w)).backward();
      // The same arithmetic for every query head: forward and dq bitwise; dk
      // and dv sum the same terms in another order.
      EXPECT_EQ(gqa.to(DType::F64).to_vector<double>(), mha.to(DType::F64).to_vector<double>());
      EXPECT_EQ(dq.to(DType::F64).to_vector<double>(), q.grad().to(DType::F64).to_vector<double>());
      const double tol = dt == DType::F64 ? 1e-13 : 1e-5;
      auto max_diff = [](const Tensor& a, const Tensor& b) {
        const std::vector<double> x = a.to(DType::F64).to_vector<double>(),
                                  y = b.to(DType::F64).to_vector<double>();
        double m = 0;
        for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
        return m;
      };
      EXPECT_LT(max_diff(dk, k.grad()), tol) << "dk";
      EXPECT_LT(max_diff(dv, v.grad()), tol) << "dv";
    }
}

TEST(Attention, SelfAttentionEqualsAttentionOnSlicedHeads) {
  Tensor qkv = leaf({2, 7, 3 * 3 * 4}, 62);
  Tensor fused = causal_self_attention(qkv, 3);
  Tensor parts = qkv.view({2, 7, 3, 3, 4});
  auto part = [&](int i) { return parts.select(2, i).permute({0, 2, 1, 3}); };
  Tensor ref = causal_attention(part(0), part(1), part(2)).permute({0, 2, 1, 3}).reshape({2, 7, 12});
  EXPECT_EQ(fused.to_vector<double>(), ref.contiguous().to_vector<double>());
  Tensor w = leaf({2, 7, 12}, 63);
  sum(mul(fused, w)).backward();
  const std::vector<double> g_fused = qkv.grad().to_vector<double>();
  qkv.zero_grad();
  sum(mul(ref, w)).backward();
  EXPECT_EQ(g_fused, qkv.grad().to_vector<double>());
  EXPECT_THROW(causal_self_attention(qkv, 5), Error);  // 36 is not 3 x 5 x D
}

TEST(Gradcheck, CrossEntropy) {
  // The fused kernel returns an fp32 loss and log-sum-exp by design (even for
  // f64 logits), so the finite differences use a larger step and tolerance.
  Tensor targets = from_vector<int32_t>({0, 4, 2, -1, 3}, {5});
  EXPECT_TRUE(gradcheck([&](const V& v) { return cross_entropy(v[0], targets); }, {leaf({5, 6}, 60, -2, 2)},
                        1e-2, 1e-4, 1e-2));
  // Padded vocabulary: only the first 5 of 8 columns take part.
  EXPECT_TRUE(gradcheck([&](const V& v) { return cross_entropy(v[0], targets, 5); },
                        {leaf({5, 8}, 61, -2, 2)}, 1e-2, 1e-4, 1e-2));
}

TEST(Gradcheck, Embedding) {
  Tensor idx = from_vector<int32_t>({1, 3, 1, 0, 3, 3}, {2, 3});
  EXPECT_TRUE(gradcheck([&](const V& v) { return embedding(v[0], idx); }, {leaf({4, 5}, 62)}));
}

TEST(Gradcheck, ViewsAndCopies) {
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].reshape({3, 4}).permute({1, 0}); }, {leaf({2, 6}, 63)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].slice(1, 1, 5, 2); }, {leaf({3, 6}, 64)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].narrow(0, 1, 2).select(1, 2); }, {leaf({4, 3}, 65)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].unsqueeze(0).expand({3, 2, 4}); }, {leaf({2, 4}, 66)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].t().contiguous().clone(); }, {leaf({3, 5}, 67)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].to(DType::F32).to(DType::F64); }, {leaf({4}, 68)}, 1e-3,
                        1e-4, 1e-3));
}

TEST(Gradcheck, DetectsAWrongGradient) {
  // A deliberately wrong custom backward must be caught: the checker can fail.
  auto wrong = [](const V& v) {
    Tensor y = mul(v[0].detach(), 2.0);
    if (autograd::any_requires_grad({&v[0]}))
      autograd::record("WrongBackward", {&v[0]}, y,
                       [](autograd::Grads& g) -> autograd::Grads { return {mul(g[0], 3.0)}; });
    return y;
  };
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter rep(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &failures);
    EXPECT_FALSE(gradcheck(wrong, {leaf({3}, 69)}));
  }
  EXPECT_GT(failures.size(), 0);
}

}  // namespace
}  // namespace bt::test
