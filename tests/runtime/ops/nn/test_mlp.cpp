// The fused MLP (runtime/ops/nn/mlp.h) against the two linears and the GELU it
// replaces, in every recompute mode: the same bits forward and backward. In
// f32 and bf16 the fused op runs dH's GEMM and the GELU backward over its
// values, as the unfused ops do, and sums b1's gradient in the order of the
// CPU's bias-gradient GEMM; in f64 it takes the GELU's derivative and b1's
// gradient in dH's GEMM, whose CPU epilogue is the GELU backward kernel's
// arithmetic (Note [Fused MLP backward], Note [GELU-gradient epilogue]).
// Argument errors name the argument.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

using autograd::RecomputeGuard;

/// f32 masters and the compute copies the MLP reads (bf16 casts under bf16,
/// as Gpt::compute makes them: their gradients reach the masters in f32).
struct Params {
  std::vector<Tensor> masters;  // x, fc_w, fc_b, out_w, out_b
  explicit Params(uint64_t seed, int64_t hidden = 32) {
    Generator g(seed);
    auto p = [&](const Shape& s, double std) {
      return normal(s, 0.0, std, TensorOptions{DType::F32}, &g).requires_grad_();
    };
    masters = {p({3, 5, 8}, 1.0), p({hidden, 8}, 0.4), p({hidden}, 0.4), p({8, hidden}, 0.3), p({8}, 0.3)};
  }
};

enum class Run { Fused, Unfused };

/// The output and the masters' gradients of sum(mlp(x) * r) in `mode`
/// (checkpointed under full, as Gpt's blocks are), as raw floats.
std::vector<std::vector<float>> run(Run how, DType dt, Recompute mode, bool graph = true) {
  Params ps(7);
  std::vector<Tensor> c;
  for (const Tensor& m : ps.masters) c.push_back(m.to(dt));
  auto f = [&](const Tensor& x) {
    if (how == Run::Fused) return mlp(x, c[1], c[2], c[3], c[4]);
    return linear(linear(x, c[1], c[2], Activation::Gelu), c[3], c[4]);
  };
  RecomputeGuard guard(mode);
  GradModeGuard grad(graph);
  Tensor y = mode == Recompute::Full ? autograd::checkpoint(f, c[0]) : f(c[0]);
  std::vector<std::vector<float>> out{y.to(DType::F32).to_vector<float>()};
  if (!graph) return out;
  Generator g(13);
  Tensor r = normal(y.shape(), 0.0, 1.0, TensorOptions{DType::F32}, &g).to(dt);
  sum(mul(y, r).to(DType::F32)).backward();
  for (const Tensor& m : ps.masters) {
    EXPECT_EQ(m.grad().dtype(), DType::F32);
    out.push_back(m.grad().to_vector<float>());
  }
  return out;
}

constexpr Recompute kModes[] = {Recompute::None, Recompute::Selective, Recompute::Full};

TEST(Mlp, IsTheUnfusedOpsBitForBit) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64})
    for (Recompute mode : kModes)
      for (bool graph : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::string(recompute_name(mode)) +
                     (graph ? "" : " (evaluation)"));
        EXPECT_EQ(run(Run::Fused, dt, mode, graph), run(Run::Unfused, dt, mode, graph));
      }
}

TEST(Mlp, ErrorsNameTheArgument) {
  Tensor x = randn({2, 8}), w1 = randn({16, 8}), b1 = randn({16}), w2 = randn({8, 16}), b2 = randn({8});
  using test::error_message;
  EXPECT_NE(error_message([&] {
              mlp(x, randn({16, 7}), b1, w2, b2);
            }).find("mlp: input features 8 (x shape [2, 8]) do not match fc_w shape [16, 7] [hidden, in]"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              mlp(x, w1, b1, randn({8, 15}), b2);
            }).find("mlp: out_w shape [8, 15] [out, hidden] does not take the 16 hidden features of fc_w"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              mlp(x, w1, randn({15}), w2, b2);
            }).find("mlp: fc_b shape [15] does not match the 16 output features of fc_w [16, 8]"),
            std::string::npos);
  EXPECT_NE(error_message([&] { mlp(x, w1, b1, w2, randn({16})); }).find("mlp: out_b shape [16]"),
            std::string::npos);
  EXPECT_NE(error_message([&] { mlp(x, w1.to(DType::BF16), b1, w2, b2); }).find("mlp"), std::string::npos);
}

}  // namespace
}  // namespace bt
