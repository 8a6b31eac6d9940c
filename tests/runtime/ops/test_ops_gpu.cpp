// The runtime on CUDA against the runtime on CPU: every op's forward and
// backward through the public API (dispatch, views, autograd; the fused MLP
// also under selective recompute), in f32 and bf16, plus seeded-RNG identity
// and host<->device copies on streams.
#include <cmath>
#include <functional>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "tests/support/seed.h"

namespace bt {
namespace {

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

/// ||a - b|| / ||scale|| (the absolute norm when scale is all zero); NaN never passes.
double rel(const Tensor& a, const Tensor& b, const Tensor& scale) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>(), z = scale.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  EXPECT_EQ(z.size(), y.size());
  double n = 0, d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    n += (x[i] - y[i]) * (x[i] - y[i]);
    d += z[i] * z[i];
  }
  return d == 0 ? std::sqrt(n) : std::sqrt(n / d);
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// What compare() divides the error by (Note [Error relative to the terms]).
enum class Scale {
  Result,    // the CPU's result: ||gpu - cpu|| / ||cpu||
  AbsTerms,  // the sum of |terms| of every result: f on |inputs|
};

// Note [Error relative to the terms]
// A sum whose terms cancel is small next to its terms, but the rounding error of
// bf16 arithmetic is proportional to the terms (each product is rounded), so
// ||gpu - cpu|| / ||cpu|| explodes on cancellation although nothing is wrong.
// For f multilinear in its inputs (sums of products: mul, matmul), every output
// and every gradient of sum(f * w), w > 0, is a sum of products of inputs;
// f on |inputs| gives the same sums of |products|, the scale the rounding
// error is bounded by. Scale::AbsTerms divides by those, so mixed signs test
// the cancelling sums without exploding the ratio.

/// |values| of a CPU f32 tensor, as a new leaf.
Tensor abs_of(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  for (float& x : v) x = std::fabs(x);
  return from_vector(v, t.shape());
}

/// Runs f on CPU (f32 reference, computed from the same rounded inputs) and on
/// CUDA in dtype dt; compares outputs and the gradients of sum(out * w).
void compare(const char* name, const Fn& f, const std::vector<Shape>& shapes, DType dt, double tol,
             std::vector<Tensor> extra = {}, Scale scale = Scale::Result) {
  SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)));
  BT_SEED(seed);
  Generator g(seed);
  std::vector<Tensor> cpu_in, gpu_in, abs_in;
  for (const Shape& s : shapes) {
    Tensor base = randn(s, {}, &g).to(dt).to(DType::F32);  // identical values on both sides
    cpu_in.push_back(base.clone().requires_grad_());
    gpu_in.push_back(base.to(Device::cuda(0)).to(dt).detach().requires_grad_());
    abs_in.push_back(abs_of(base).requires_grad_());
  }
  for (const Tensor& e : extra) {
    cpu_in.push_back(e);
    gpu_in.push_back(e.to(Device::cuda(0)));
    abs_in.push_back(e);
  }
  Tensor yc = f(cpu_in), yg = f(gpu_in);
  ASSERT_EQ(yg.device(), Device::cuda(0));
  Tensor w = uniform(yc.shape(), 0.5, 1.5, {}, &g);
  sum(mul(yc, w)).backward();
  sum(mul(yg, w.to(Device::cuda(0)).to(yg.dtype()))).backward();
  const bool terms = scale == Scale::AbsTerms;
  Tensor ya = terms ? f(abs_in) : yc;
  if (terms) sum(mul(ya, w)).backward();
  EXPECT_LT(rel(yg, yc, ya), tol) << "forward";
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_LT(rel(gpu_in[i].grad(), cpu_in[i].grad(), terms ? abs_in[i].grad() : cpu_in[i].grad()), tol)
        << "grad of input " << i;
}

class OpsGpu : public ::testing::TestWithParam<DType> {};

TEST_P(OpsGpu, Elementwise) {
  REQUIRE_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  compare(
      "add", [](auto& v) { return add(v[0], v[1]); }, {{33, 7}, {7}}, dt, tol);
  // Mixed signs: the broadcast gradients are sums of 45 and of 3 products that
  // cancel. Against the CPU's sums, bf16's rounding of each product exceeded
  // 2e-2 in 15 of 300 runs on an H200; against the sums of |products| it is
  // bounded (Note [Error relative to the terms]). With the CPU's bf16 kernels
  // standing in for the GPU's: 144 of 5000 runs above 2e-2 the first way, at
  // most 3.8e-3 the second.
  compare(
      "mul", [](auto& v) { return mul(v[0], v[1]); }, {{5, 1, 9}, {3, 1}}, dt, tol, {}, Scale::AbsTerms);
  compare(
      "sub", [](auto& v) { return sub(v[0], v[1]); }, {{129}, {129}}, dt, tol);
  compare(
      "div", [](auto& v) { return div(v[0], add(mul(v[1], v[1]), 1.0)); }, {{17, 3}, {17, 3}}, dt, tol);
  compare(
      "exp/tanh/neg", [](auto& v) { return neg(tanh(exp(v[0]))); }, {{1000}}, dt, tol);
  compare(
      "log/pow", [](auto& v) { return pow(log(add(mul(v[0], v[0]), 1.0)), 2.0); }, {{257}}, dt, tol);
}

TEST_P(OpsGpu, Reductions) {
  REQUIRE_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  compare(
      "sum", [](auto& v) { return sum(v[0], {1}); }, {{7, 1023, 3}}, dt, tol);
  compare(
      "mean",
      [](auto& v) {
        return mean(v[0], {0, 2}, true);
      },
      {{9, 5, 33}}, dt, tol);
  compare(
      "max", [](auto& v) { return max(v[0], -1); }, {{31, 257}}, dt, tol);
  compare(
      "softmax", [](auto& v) { return softmax(v[0]); }, {{13, 1000}}, dt, tol);
  compare(
      "log_softmax", [](auto& v) { return log_softmax(v[0], 0); }, {{65, 7}}, dt, tol);
}

TEST_P(OpsGpu, MatmulAndLinear) {
  REQUIRE_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  compare(
      "matmul", [](auto& v) { return matmul(v[0], v[1]); }, {{67, 33}, {33, 129}}, dt, tol);
  compare(
      "bmm", [](auto& v) { return matmul(v[0], v[1].transpose(1, 2)); }, {{3, 17, 64}, {3, 31, 64}}, dt, tol);
  compare(
      "linear", [](auto& v) { return linear(v[0], v[1], v[2]); }, {{2, 9, 48}, {80, 48}, {80}}, dt, tol);
  compare(
      "linear+gelu", [](auto& v) { return linear(v[0], v[1], v[2], Activation::Gelu); },
      {{37, 64}, {96, 64}, {96}}, dt, tol);
}

// The fused MLP (Note [Fused MLP backward]) with and without selective
// recompute: its plain GEMM and one GELU pass in both dtypes, at a hidden
// width that is a multiple of 8 (256) and one that is not (100).
TEST_P(OpsGpu, Mlp) {
  REQUIRE_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  for (int64_t hidden : {256, 100})
    for (Recompute mode : {Recompute::None, Recompute::Selective}) {
      SCOPED_TRACE(bt::cat("hidden ", hidden, " recompute ", recompute_name(mode)));
      compare(
          "mlp",
          [mode](auto& v) {
            autograd::RecomputeGuard guard(mode);
            return mlp(v[0], v[1], v[2], v[3], v[4]);
          },
          {{2, 37, 64}, {hidden, 64}, {hidden}, {64, hidden}, {64}}, dt, tol);
    }
}

TEST_P(OpsGpu, TransformerOps) {
  REQUIRE_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
  compare(
      "gelu", [](auto& v) { return gelu(v[0]); }, {{4097}}, dt, tol);
  compare(
      "layer_norm", [](auto& v) { return layer_norm(v[0], v[1], v[2]); }, {{67, 768}, {768}, {768}}, dt, tol);
  compare(
      "add_layer_norm",
      [](auto& v) {
        auto r = add_layer_norm(v[0], v[1], v[2], v[3]);
        return add(r.sum, r.out);
      },
      {{2, 67, 768}, {67, 768}, {768}, {768}}, dt, tol);
  compare(
      "attention", [](auto& v) { return causal_attention(v[0], v[1], v[2]); },
      {{2, 3, 65, 64}, {2, 3, 65, 64}, {2, 3, 65, 64}}, dt, dt == DType::F32 ? 1e-4 : 2e-2);
  compare(
      "self_attention", [](auto& v) { return causal_self_attention(v[0], 3); }, {{2, 130, 3 * 3 * 64}}, dt,
      dt == DType::F32 ? 1e-4 : 2e-2);
  compare(
      "grouped_query_attention", [](auto& v) { return grouped_query_attention(v[0], v[1], v[2]); },
      {{2, 130, 4, 64}, {2, 130, 2, 64}, {2, 130, 2, 64}}, dt, dt == DType::F32 ? 1e-4 : 2e-2);
  Tensor idx = from_vector<int32_t>({3, 0, 3, 9, 3, 1, 0}, {7});
  compare("embedding", [](auto& v) { return embedding(v[0], v[1]); }, {{10, 48}}, dt, tol, {idx});
  Tensor tg = from_vector<int32_t>({5, 0, -1, 99, 42}, {5});
  compare("cross_entropy", [](auto& v) { return cross_entropy(v[0], v[1], 100); }, {{5, 128}}, dt, tol, {tg});
  // Note [The LM head in row chunks]: 7 rows in chunks of 3; sum(y * w)'s
  // incoming gradient is not the hint, so the backward rescales.
  Tensor tg7 = from_vector<int32_t>({5, 0, -1, 99, 42, 7, 63}, {7});
  compare("linear_cross_entropy",
          [](auto& v) { return linear_cross_entropy(v[0], v[1], v[2], 100, 1.0f, 3); }, {{7, 64}, {128, 64}},
          dt, tol, {tg7});
}

INSTANTIATE_TEST_SUITE_P(DTypes, OpsGpu, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// bf16 activations with the f32 masters as LayerNorm parameters (Note [f32
// LayerNorm parameters]): the CPU's values, and f32 parameter gradients.
TEST(RuntimeGpu, Bf16LayerNormTakesF32Parameters) {
  REQUIRE_GPU();
  Generator g(21);
  const Device d = Device::cuda(0);
  const Tensor x = randn({2, 67, 768}, {}, &g).to(DType::BF16), y = randn({67, 768}, {}, &g).to(DType::BF16);
  const Tensor w = randn({768}, {}, &g), b = randn({768}, {}, &g), r = randn({2, 67, 768}, {}, &g);
  std::vector<std::vector<float>> got[2];
  for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
    const Device at = on_gpu ? d : Device::cpu();
    Tensor xs = x.to(at).detach().requires_grad_(), ys = y.to(at).detach().requires_grad_(),
           ws = w.to(at).detach().requires_grad_(), bs = b.to(at).detach().requires_grad_();
    auto res = add_layer_norm(xs, ys, ws, bs);
    sum(mul(add(res.sum, res.out).to(DType::F32), r.to(at))).backward();
    ASSERT_EQ(ws.grad().dtype(), DType::F32);
    ASSERT_EQ(bs.grad().dtype(), DType::F32);
    for (const Tensor& t : {res.out, xs.grad(), ws.grad(), bs.grad()})
      got[on_gpu].push_back(t.to(Device::cpu()).to(DType::F32).to_vector<float>());
  }
  const char* what[] = {"out", "x grad", "w grad", "b grad"};
  for (size_t i = 0; i < got[0].size(); ++i) {
    double num = 0, den = 0;
    for (size_t j = 0; j < got[0][i].size(); ++j) {
      const double e = got[1][i][j] - got[0][i][j];
      num += e * e;
      den += static_cast<double>(got[0][i][j]) * got[0][i][j];
    }
    // bf16 values (out, x grad) to bf16 rounding; the f32 sums to f32 rounding of bf16 terms.
    EXPECT_LT(std::sqrt(num / den), i < 2 ? 1e-2 : 1e-5) << what[i];
  }
}

TEST(RuntimeGpu, SeededRandomIdenticalOnCpuAndGpu) {
  REQUIRE_GPU();
  for (int64_t n : {1, 3, 1000, 65537}) {
    Generator gc(99), gg(99);
    gc.advance(7);
    gg.advance(7);
    Tensor a = randn({n}, {}, &gc), b = randn({n}, TensorOptions{DType::F32, Device::cuda(0)}, &gg);
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << n;
    Tensor u = rand({n}, {}, &gc), v = rand({n}, TensorOptions{DType::F32, Device::cuda(0)}, &gg);
    EXPECT_EQ(u.to_vector<float>(), v.to_vector<float>()) << n;
  }
}

TEST(RuntimeGpu, SumSquaresMatchesFloat64AndIsRepeatable) {
  REQUIRE_GPU();
  Generator g(12);
  const Device d = Device::cuda(0);
  std::vector<Tensor> xs = {randn({4, 9}, {}, &g).to(d).t(), randn({300}, {}, &g).to(DType::BF16).to(d),
                            randn({0}, {}, &g).to(d)};
  for (int i = 0; i < 70; ++i) xs.push_back(randn({1 + i * 611}, {}, &g).to(d));  // two launches
  double want = 0;
  for (const Tensor& x : xs)
    for (double v : x.to_vector<double>()) want += v * v;
  const Tensor s = sum_squares(xs);
  EXPECT_EQ(s.device(), d);
  EXPECT_NEAR(s.item<float>(), want, 2e-6 * want);
  EXPECT_EQ(sum_squares(xs).item<float>(), s.item<float>());
}

TEST(RuntimeGpu, CopiesOnStreams) {
  REQUIRE_GPU();
  Generator g(5);
  Tensor host = randn({1 << 20}, {}, &g);
  Stream s = Stream::create(Device::cuda(0));
  Tensor back;
  {
    StreamGuard guard(s);
    Tensor pinned = host.pin_memory();
    Tensor dev = pinned.to(Device::cuda(0), /*non_blocking=*/true);
    EXPECT_EQ(dev.stream(), s);
    Tensor twice = mul(dev, 2.0);
    back = twice.to(Device::cpu(), /*non_blocking=*/true);
    EXPECT_TRUE(back.is_pinned());
    s.synchronize();
  }
  const auto h = host.to_vector<float>(), b = back.to_vector<float>();
  for (size_t i = 0; i < h.size(); i += 4097) EXPECT_EQ(b[i], 2 * h[i]);
  // Strided view to device and back.
  Tensor t = arange(12).reshape({3, 4}).t();
  EXPECT_EQ(t.to(Device::cuda(0)).cpu().to_vector<float>(), t.contiguous().to_vector<float>());
}

TEST(RuntimeGpu, OutOfRangeEmbeddingIndexOnDevice) {
  REQUIRE_GPU();
  Tensor table = zeros({4, 8}, TensorOptions{DType::F32, Device::cuda(0)});
  Tensor idx = from_vector<int32_t>({1, 2, 7}, {3}).to(Device::cuda(0));
  try {
    embedding(table, idx);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index 7 at position 2"), std::string::npos) << e.what();
  }
}

// Note [Targets on the host]: host targets with device logits give the loss
// and gradient of device targets, and a bad one is still named.
TEST(RuntimeGpu, CrossEntropyTakesTargetsFromTheHost) {
  REQUIRE_GPU();
  Generator g(4);
  Tensor logits = randn({6, 40}, TensorOptions{DType::F32, Device::cuda(0)}, &g);
  Tensor host = from_vector<int32_t>({0, 39, 7, -1, 12, 3}, {6}).pin_memory();
  std::vector<std::vector<float>> got;
  for (const Tensor& tg : {host, host.to(Device::cuda(0))}) {
    Tensor l = logits.detach().requires_grad_();
    Tensor loss = cross_entropy(l, tg);
    loss.backward();
    got.push_back(loss.to_vector<float>());
    got.push_back(l.grad().to_vector<float>());
  }
  EXPECT_EQ(got[0], got[2]);
  EXPECT_EQ(got[1], got[3]);
  try {
    cross_entropy(logits, from_vector<int32_t>({0, 1, 2, 3, 40, 5}, {6}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 40 at position 4"), std::string::npos) << e.what();
  }
}

// Note [Gradient in the forward pass] on the GPU: the fused kernel writes the
// unfused backward's bits over the logits (bf16 and f32, vectorized and
// scalar rows), and another incoming gradient is rescaled on the device.
TEST(RuntimeGpu, CrossEntropyGradientInTheForwardPass) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t cols : {136, 131}) {  // 16-byte rows, and rows that take the scalar path
      for (float incoming : {0.5f, 0.3f}) {
        Generator g(5);
        Tensor x0 = uniform({64, cols}, -4, 4, TensorOptions{DType::F32, Device::cuda(0)}, &g).to(dt);
        Tensor tg = from_vector<int32_t>(std::vector<int32_t>(64, 7), {64}).pin_memory();
        std::vector<std::vector<float>> got;
        for (bool fused : {false, true}) {
          Tensor x = x0.detach().requires_grad_();
          Tensor logits = mul(x, 1.0);
          Tensor loss =
              fused ? cross_entropy(std::move(logits), tg, 128, 0.5f) : cross_entropy(logits, tg, 128);
          loss.backward(full({}, incoming, TensorOptions{DType::F32, Device::cuda(0)}));
          got.push_back(loss.to(DType::F32).to_vector<float>());
          got.push_back(x.grad().to(DType::F32).to_vector<float>());
        }
        EXPECT_EQ(got[0], got[2]) << dt << " " << cols;
        if (incoming == 0.5f) {
          EXPECT_EQ(got[1], got[3]) << dt << " " << cols;
        } else {
          const double tol = dt == DType::BF16 ? 1e-2 : 1e-6;
          for (size_t i = 0; i < got[1].size(); ++i)
            EXPECT_NEAR(got[3][i], got[1][i], tol * std::abs(got[1][i]) + 1e-9)
                << dt << " " << cols << " " << i;
        }
      }
    }
  }
}

/// 50 AdamW steps of a softmax regression (all targets 3: learnable through
/// the bias) on `d`; returns the loss of every step.
std::vector<float> train_losses(const Device& d) {
  Generator g(1);
  Tensor w = normal({64, 32}, 0, 0.02, TensorOptions{DType::F32, d}, &g).requires_grad_();
  Tensor b = zeros({64}, TensorOptions{DType::F32, d}).requires_grad_();
  Tensor x = randn({128, 32}, TensorOptions{DType::F32, d}, &g);
  Tensor tg = from_vector<int32_t>(std::vector<int32_t>(128, 3), {128}).to(d);
  AdamWOptions o;
  o.lr = 0.1;
  AdamW opt({w, b}, o);
  std::vector<float> losses;
  for (int i = 0; i < 50; ++i) {
    opt.zero_grad();
    Tensor loss = cross_entropy(linear(x, w, b), tg);
    losses.push_back(loss.item<float>());
    loss.backward();
    opt.step();
  }
  return losses;
}

TEST(RuntimeGpu, TrainingOnGpuFollowsTheCpuTrajectory) {
  REQUIRE_GPU();
  const std::vector<float> cpu = train_losses(Device::cpu()), gpu = train_losses(Device::cuda(0));
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-3 * std::max(1.0f, std::abs(cpu[i]))) << "step " << i;
  EXPECT_LT(gpu.back(), gpu.front() * 0.05f) << "first " << gpu.front() << ", last " << gpu.back();
}

}  // namespace
}  // namespace bt
