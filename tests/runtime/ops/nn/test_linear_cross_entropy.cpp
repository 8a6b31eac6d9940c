// Note [The LM head in row chunks]: linear_cross_entropy gives the loss and
// the gradients of cross_entropy(linear(x, w)) without the whole logits, for
// every chunk size, with ignored targets and a padded vocabulary; it rescales
// for another incoming gradient, backpropagates twice through a retained
// graph, makes only the loss without a gradient, and names bad input.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/ops/nn/cross_entropy.h"
#include "runtime/ops/nn/linear_cross_entropy.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

constexpr int64_t kRows = 13, kIn = 8, kVp = 24, kVocab = 20;  // 4 padded columns

struct HeadRun {
  double loss = 0;
  std::vector<double> gx, gw;
};

/// The loss of x [13, 8] and w [24, 8] (fixed values in `dt`) against targets
/// with two ignored rows, backpropagated with `incoming` `passes` times.
/// `chunk` 0: the plain ops, cross_entropy(linear(x, w)); else
/// linear_cross_entropy in chunks of that many rows, told `hint`.
HeadRun run_head(DType dt, int64_t chunk, float hint, float incoming, int passes = 1) {
  Generator g(11);
  Tensor x = uniform({kRows, kIn}, -2, 2, TensorOptions{}, &g).to(dt).requires_grad_();
  Tensor w = uniform({kVp, kIn}, -1, 1, TensorOptions{}, &g).to(dt).requires_grad_();
  const Tensor targets = from_vector<int32_t>({0, 19, 3, -1, 5, 2, 7, 7, 11, -1, 18, 1, 4}, {kRows});
  Tensor loss = chunk == 0 ? cross_entropy(linear(x, w), targets, kVocab)
                           : linear_cross_entropy(x, w, targets, kVocab, hint, chunk);
  HeadRun r;
  r.loss = loss.to(DType::F64).item<double>();
  for (int i = 0; i < passes; ++i)
    loss.backward(full({}, incoming, TensorOptions{DType::F32}), i + 1 < passes);
  r.gx = x.grad().to(DType::F64).to_vector<double>();
  r.gw = w.grad().to(DType::F64).to_vector<double>();
  return r;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    n += (a[i] - b[i]) * (a[i] - b[i]);
    d += b[i] * b[i];
  }
  return std::sqrt(n / std::max(d, 1e-300));
}

double tol_of(DType dt) { return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-6 : 2e-2; }

void expect_same(const HeadRun& got, const HeadRun& want, DType dt, const std::string& what, double tol = 0) {
  SCOPED_TRACE(what + " " + std::string(dtype_name(dt)));
  if (tol == 0) tol = tol_of(dt);
  EXPECT_NEAR(got.loss, want.loss, tol * std::fabs(want.loss));
  EXPECT_LT(rel_diff(got.gx, want.gx), tol);
  EXPECT_LT(rel_diff(got.gw, want.gw), tol);
}

TEST(LinearCrossEntropy, EveryChunkSizeGivesThePlainOpsLossAndGradients) {
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    const HeadRun plain = run_head(dt, 0, 0, 0.5f);
    for (int64_t chunk : {1, 3, 7, 12, 13, 64})
      expect_same(run_head(dt, chunk, 0.5f, 0.5f), plain, dt, "chunk " + std::to_string(chunk));
  }
}

TEST(LinearCrossEntropy, AnotherIncomingGradientIsRescaled) {
  for (DType dt : {DType::F64, DType::F32}) {
    const HeadRun plain = run_head(dt, 0, 0, 0.3f);
    // The gradient's scale is an f32 number on both paths (cross_entropy's
    // d loss / d row), rounded in another order here: f64 within 1e-7, as
    // cross_entropy's own test.
    expect_same(run_head(dt, 5, 1.0f, 0.3f), plain, dt, "hint 1, incoming 0.3", std::max(tol_of(dt), 1e-7));
  }
}

TEST(LinearCrossEntropy, ARetainedGraphBackpropagatesTwice) {
  for (float incoming : {1.0f, 0.5f}) {
    const HeadRun plain = run_head(DType::F64, 0, 0, incoming, 2);
    expect_same(run_head(DType::F64, 4, 1.0f, incoming, 2), plain, DType::F64, "two passes");
  }
}

TEST(LinearCrossEntropy, WithoutAHintTheGradientTakesThePlainOps) {
  const HeadRun plain = run_head(DType::F64, 0, 0, 0.7f);
  expect_same(run_head(DType::F64, 4, 0.0f, 0.7f), plain, DType::F64, "no hint");
}

TEST(LinearCrossEntropy, WithoutGradientOnlyTheLossInChunks) {
  Generator g(3);
  const Tensor x = uniform({kRows, kIn}, -2, 2, TensorOptions{DType::F64}, &g);
  const Tensor w = uniform({kVp, kIn}, -1, 1, TensorOptions{DType::F64}, &g);
  const Tensor targets = from_vector<int32_t>({0, 19, 3, -1, 5, 2, 7, 7, 11, -1, 18, 1, 4}, {kRows});
  const double want = cross_entropy(linear(x, w), targets, kVocab).item<double>();
  for (int64_t chunk : {1, 6, 13}) {
    const Tensor loss = linear_cross_entropy(x, w, targets, kVocab, 1.0f, chunk);
    EXPECT_FALSE(loss.requires_grad());
    EXPECT_NEAR(loss.to(DType::F64).item<double>(), want, 1e-7 * std::fabs(want)) << chunk;  // an f32 loss
  }
}

TEST(LinearCrossEntropy, BadInputIsNamed) {
  const Tensor x = zeros({4, 8}), w = zeros({16, 8}), t = from_vector<int32_t>({0, 1, 2, 3}, {4});
  const auto msg = [](const std::function<void()>& f) { return test::error_message(f); };
  EXPECT_NE(msg([&] {
              (void)linear_cross_entropy(x, zeros({16, 7}), t);
            }).find("input features"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              (void)linear_cross_entropy(x, w, from_vector<int32_t>({0, 1}, {2}));
            }).find("2 targets (shape [2]) for 4 rows of x"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              (void)linear_cross_entropy(x, w, from_vector<int32_t>({0, 1, 12, 3}, {4}), 12);
            }).find("linear_cross_entropy: target 12 at position 2 is outside [0, 12)"),
            std::string::npos);
  EXPECT_NE(msg([&] { (void)linear_cross_entropy(x, w, t, 17); }).find("vocab 17 must be in [1, 16]"),
            std::string::npos);
  EXPECT_NE(msg([&] { (void)linear_cross_entropy(x, w, t.to(DType::F32)); }).find("targets"),
            std::string::npos);
}

TEST(LinearCrossEntropy, ChunkRowsFollowTheBudget) {
  if (std::getenv("BT_HEAD_CHUNK_MIB")) GTEST_SKIP() << "BT_HEAD_CHUNK_MIB sets another budget";
  using kernels::GemmMath;
  // 2 GiB of logits: GPT-2's 50304 f32 columns take 10672 rows, rounded down to 64s.
  EXPECT_EQ(lm_head_chunk_rows(50304, DType::F32, GemmMath::Tf32), 10624);
  EXPECT_EQ(lm_head_chunk_rows(50304, DType::F32, GemmMath::Strict), 10624);
  EXPECT_EQ(lm_head_chunk_rows(50304, DType::BF16, GemmMath::Strict), 21312);
  // 512 MiB under 3xTF32 (Note [Chunk budgets]).
  EXPECT_EQ(lm_head_chunk_rows(50304, DType::F32, GemmMath::Tf32x3), 2624);
  EXPECT_EQ(lm_head_chunk_rows(int64_t{1} << 40, DType::F32, GemmMath::Strict), 64);  // never fewer than 64
}

}  // namespace
}  // namespace bt
