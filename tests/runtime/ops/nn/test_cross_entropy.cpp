// Note [Gradient in the forward pass]: cross_entropy given its logits (moved
// in) and the incoming gradient to expect writes the gradient over them in the
// forward, the bits the backward would write; the backward rescales when the
// incoming gradient is another one, and a retained graph backpropagates twice.
#include <cstring>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/ops/nn/cross_entropy.h"

namespace bt {
namespace {

struct CeRun {
  std::vector<float> grad;    // of the leaf under the logits
  std::vector<float> buffer;  // the logits' buffer right after the forward
  float loss = 0;
};

/// loss = cross_entropy(x * 1, targets) on a [6, 11] leaf (vocab 9: two padded
/// columns), backpropagated with `incoming`, `passes` times (retaining the
/// graph between them). `fused`: the logits are moved in with `hint`.
CeRun run_ce(DType dt, bool fused, float hint, float incoming, int passes = 1) {
  Generator g(7);
  Tensor x = uniform({6, 11}, -3, 3, TensorOptions{}, &g).to(dt).requires_grad_();
  const Tensor targets = from_vector<int32_t>({0, 8, 3, -1, 5, 2}, {6});
  Tensor logits = mul(x, 1.0);  // a non-leaf whose storage only `logits` holds
  const void* buf = logits.data_ptr();
  const size_t nbytes = logits.nbytes();
  CeRun r;
  Tensor loss =
      fused ? cross_entropy(std::move(logits), targets, 9, hint) : cross_entropy(logits, targets, 9);
  std::vector<unsigned char> raw(nbytes);
  std::memcpy(raw.data(), buf, nbytes);  // the autograd graph keeps the buffer alive
  r.buffer = from_blob(raw.data(), {6, 11}, dt).to(DType::F32).to_vector<float>();
  r.loss = loss.to(DType::F32).item<float>();
  for (int i = 0; i < passes; ++i)
    loss.backward(full({}, incoming, TensorOptions{DType::F32}), i + 1 < passes);
  r.grad = x.grad().to(DType::F32).to_vector<float>();
  return r;
}

TEST(CrossEntropy, GradientInTheForwardPassHasTheBackwardsBits) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    for (float hint : {1.0f, 0.25f}) {
      const CeRun plain = run_ce(dt, false, 0, hint), fused = run_ce(dt, true, hint, hint);
      EXPECT_EQ(fused.loss, plain.loss) << dt;
      EXPECT_EQ(fused.grad, plain.grad) << dt << " hint " << hint;
      // The forward wrote the gradient (d loss / d logits = d loss / d x here)
      // over the logits: the fusion happened.
      EXPECT_EQ(fused.buffer, plain.grad) << dt << " hint " << hint;
      EXPECT_NE(plain.buffer, plain.grad) << dt;  // the unfused forward leaves the logits
    }
  }
}

TEST(CrossEntropy, AnotherIncomingGradientIsRescaled) {
  for (DType dt : {DType::F32, DType::F64}) {
    const CeRun plain = run_ce(dt, false, 0, 0.75f), fused = run_ce(dt, true, 1.0f, 0.75f);
    ASSERT_EQ(fused.grad.size(), plain.grad.size());
    for (size_t i = 0; i < plain.grad.size(); ++i) EXPECT_NEAR(fused.grad[i], plain.grad[i], 1e-7) << dt << i;
  }
}

TEST(CrossEntropy, ARetainedGraphBackpropagatesTwice) {
  for (float incoming : {1.0f, 0.5f}) {
    const CeRun plain = run_ce(DType::F32, false, 0, incoming, 2),
                fused = run_ce(DType::F32, true, 1.0f, incoming, 2);
    EXPECT_EQ(fused.grad, plain.grad) << incoming;  // both hold twice one pass's gradient
  }
}

}  // namespace
}  // namespace bt
