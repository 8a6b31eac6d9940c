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

void run_case(DType dt, int64_t rows, int64_t vocab, int64_t ld, std::mt19937& gen) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rows " << rows << " vocab " << vocab << " ld "
                                    << ld);
  const HostBuf logits = randn_buf(dt, rows * ld, gen, 2.0);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> tdist(0, static_cast<int32_t>(vocab - 1));
  for (int64_t r = 0; r < rows; ++r) targets[static_cast<size_t>(r)] = (r % 5 == 3) ? -1 : tdist(gen);
  std::vector<float> dloss(static_cast<size_t>(rows));
  for (auto& d : dloss) d = static_cast<float>(uniform_vals(1, gen, 0.1, 2.0)[0]);

  CrossEntropyArgs a;
  a.dt = dt;
  a.rows = rows, a.vocab = vocab, a.ld = ld;
  a.logits = logits.data();
  a.targets = targets.data();
  std::vector<float> loss_ref(static_cast<size_t>(rows)), lse_ref(static_cast<size_t>(rows));
  cpu::cross_entropy_forward(a, loss_ref.data(), lse_ref.data());
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
