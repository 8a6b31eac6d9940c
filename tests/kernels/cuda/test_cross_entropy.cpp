// GPU fused softmax cross-entropy against the CPU kernels: padded rows (ld >
// vocab), ignored targets (-1), odd vocab sizes; NaN loss for a bad target.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cross_entropy.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::CrossEntropyArgs;

/// Random logits (N(0, stddev)) and targets (row r ignored, -1, when r %
/// ignore_every == ignored) on the host, with the CPU's loss and lse.
struct HostCase {
  HostBuf logits;
  std::vector<int32_t> targets;
  CrossEntropyArgs a;  // points into logits and targets
  std::vector<float> loss_ref, lse_ref;

  HostCase(DType dt, int64_t rows, int64_t vocab, int64_t ld, std::mt19937& gen, double stddev,
           int ignore_every, int ignored)
      : logits(randn_buf(dt, rows * ld, gen, stddev)),
        targets(static_cast<size_t>(rows)),
        loss_ref(static_cast<size_t>(rows)),
        lse_ref(static_cast<size_t>(rows)) {
    std::uniform_int_distribution<int32_t> tdist(0, static_cast<int32_t>(vocab - 1));
    for (int64_t r = 0; r < rows; ++r)
      targets[static_cast<size_t>(r)] = r % ignore_every == ignored ? -1 : tdist(gen);
    a.dt = dt;
    a.rows = rows, a.vocab = vocab, a.ld = ld;
    a.logits = logits.data();
    a.targets = targets.data();
    cpu::cross_entropy_forward(a, loss_ref.data(), lse_ref.data());
  }
  HostCase(const HostCase&) = delete;
};

void run_case(DType dt, int64_t rows, int64_t vocab, int64_t ld, std::mt19937& gen) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rows " << rows << " vocab " << vocab << " ld "
                                    << ld);
  const HostCase c(dt, rows, vocab, ld, gen, 2.0, 5, 3);
  const HostBuf& logits = c.logits;
  const std::vector<int32_t>& targets = c.targets;
  const CrossEntropyArgs& a = c.a;
  const std::vector<float>&loss_ref = c.loss_ref, &lse_ref = c.lse_ref;
  std::vector<float> dloss(static_cast<size_t>(rows));
  for (auto& d : dloss) d = static_cast<float>(uniform_vals(1, gen, 0.1, 2.0)[0]);
  HostBuf dlogits_ref(dt, rows * ld);
  cpu::cross_entropy_backward(a, lse_ref.data(), dloss.data(), dlogits_ref.data());

  DevBuf dl(logits), dt_(upload_vector(targets)), ddloss(upload_vector(dloss)),
      dlse_ref(upload_vector(lse_ref));
  DevBuf dloss_out(static_cast<size_t>(rows) * 4), dlse_out(static_cast<size_t>(rows) * 4);
  DevBuf dgrad(static_cast<size_t>(rows * ld) * dtype_size(dt));
  dloss_out.poison();
  dlse_out.poison();
  dgrad.poison();
  CrossEntropyArgs ag = a;
  ag.logits = dl.get();
  ag.targets = dt_.as<int32_t>();
  cuda::cross_entropy_forward(ag, dloss_out.as<float>(), dlse_out.as<float>(), nullptr);
  BT_EXPECT_REL(to_doubles(dloss_out.to_vector<float>(rows)), to_doubles(loss_ref), 1e-5, "loss");
  BT_EXPECT_REL(to_doubles(dlse_out.to_vector<float>(rows)), to_doubles(lse_ref), 1e-5, "lse");
  cuda::cross_entropy_backward(ag, dlse_ref.as<float>(), ddloss.as<float>(), dgrad.get(), nullptr);
  BT_EXPECT_REL(dgrad.to_host(dt, rows * ld).vals(), dlogits_ref.vals(), tol(dt), "dlogits");
}

TEST(CudaCrossEntropy, MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 7, 129})
      for (int64_t vocab : {1, 31, 1000}) {
        run_case(dt, rows, vocab, vocab, gen);
        run_case(dt, rows, vocab, (vocab + 63) / 64 * 64 + (vocab == 31 ? 1 : 0), gen);
      }
    run_case(dt, 4, 50257, 50304, gen);  // GPT-2 vocabulary, padded
    run_case(dt, 3, 50257, 50257, gen);
  }
}

// Note [Gradient in the forward pass]: the fused forward writes the bits that
// the forward, then the backward with its lse, write; in place over the logits
// too. bf16 rows of every width class: a partial last pack, the shared-memory
// kernel (Note [A bf16 row in shared memory]), and the general kernel (ld % 8).
TEST(CudaCrossEntropy, FusedForwardGivesTheBitsOfForwardThenBackward) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [vocab, ld] :
         {std::pair<int64_t, int64_t>{31, 32}, {1000, 1000}, {50257, 50304}, {50257, 50257}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " vocab " << vocab << " ld " << ld);
      const int64_t rows = 37;
      const HostCase c(dt, rows, vocab, ld, gen, 3.0, 7, 2);
      const CrossEntropyArgs& a = c.a;
      const float dl = 0.25f;

      DevBuf dlg(c.logits), dtg(upload_vector(c.targets)), ddl(upload_vector(std::vector<float>(rows, dl)));
      DevBuf loss1(rows * 4), lse1(rows * 4), grad1(static_cast<size_t>(rows * ld) * dtype_size(dt));
      DevBuf loss2(rows * 4), lse2(rows * 4), grad2(static_cast<size_t>(rows * ld) * dtype_size(dt));
      grad1.poison();
      grad2.poison();
      CrossEntropyArgs ag = a;
      ag.logits = dlg.get();
      ag.targets = dtg.as<int32_t>();
      cuda::cross_entropy_forward(ag, loss1.as<float>(), lse1.as<float>(), nullptr);
      cuda::cross_entropy_backward(ag, lse1.as<float>(), ddl.as<float>(), grad1.get(), nullptr);
      cuda::cross_entropy_forward_backward(ag, loss2.as<float>(), lse2.as<float>(), dl, grad2.get(), nullptr);
      const auto l1 = loss1.to_vector<float>(rows), l2 = loss2.to_vector<float>(rows);
      BT_EXPECT_REL(to_doubles(l2), to_doubles(c.loss_ref), 1e-5, "fused loss");
      BT_EXPECT_REL(to_doubles(lse2.to_vector<float>(rows)), to_doubles(c.lse_ref), 1e-5, "fused lse");
      EXPECT_EQ(l1, l2);
      EXPECT_EQ(lse1.to_vector<float>(rows), lse2.to_vector<float>(rows));
      const HostBuf g1 = grad1.to_host(dt, rows * ld), g2 = grad2.to_host(dt, rows * ld);
      EXPECT_EQ(g1.bytes, g2.bytes);
      // In place: the gradient written over the logits themselves (the loss
      // must still read the target's logit, not its gradient).
      loss2.poison();
      cuda::cross_entropy_forward_backward(ag, loss2.as<float>(), lse2.as<float>(), dl, dlg.get(), nullptr);
      EXPECT_EQ(dlg.to_host(dt, rows * ld).bytes, g1.bytes);
      EXPECT_EQ(loss2.to_vector<float>(rows), l1);
    }
}

TEST(CudaCrossEntropy, OutOfRangeTargetGivesNanLoss) {
  BT_SKIP_WITHOUT_GPU();
  const int64_t rows = 4, vocab = 10;
  std::vector<float> logits(rows * vocab, 0.5f);
  std::vector<int32_t> targets = {0, 10, -1, -5};
  DevBuf dl(upload_vector(logits)), dt(upload_vector(targets)), loss(rows * 4);
  CrossEntropyArgs a;
  a.dt = DType::F32;
  a.rows = rows, a.vocab = vocab, a.ld = vocab;
  a.logits = dl.get();
  a.targets = dt.as<int32_t>();
  cuda::cross_entropy_forward(a, loss.as<float>(), nullptr, nullptr);
  const auto l = loss.to_vector<float>(rows);
  EXPECT_NEAR(l[0], std::log(10.0), 1e-5);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(l[2], 0.0f);
  EXPECT_TRUE(std::isnan(l[3]));
}

}  // namespace
}  // namespace bt::test::gpu
