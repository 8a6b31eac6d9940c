// GPU row-wise softmax / log-softmax, forward and backward, against the CPU kernels.
#include <vector>

#include <gtest/gtest.h>

#include "kernels/softmax.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

TEST(CudaSoftmax, ForwardAndBackwardMatchCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool log : {false, true}) {
      for (int64_t rows : {1, 7, 129}) {
        for (int64_t cols : {1, 31, 768, 1023, 1025, 2500}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << (log ? " log" : "") << " rows " << rows << " cols " << cols);
          const int64_t n = rows * cols;
          // Unit-scale logits: with peaked rows, dx = y (dy - sum(dy y)) cancels for
          // the peak and the CPU reference itself is only ~1e-5 accurate there.
          const HostBuf x = randn_buf(dt, n, gen, 1.0);
          HostBuf y_ref(dt, n);
          cpu::softmax_forward(dt, x.data(), y_ref.data(), rows, cols, log);
          DevBuf dx_in(x), dy_out(y_ref.size_bytes());
          dy_out.poison();
          cuda::softmax_forward(dt, dx_in.get(), dy_out.get(), rows, cols, log, nullptr);
          BT_EXPECT_REL(dy_out.to_host(dt, n).vals(), y_ref.vals(), tol(dt), "softmax forward");

          // Backward from the CPU's y on both sides.
          const HostBuf g = randn_buf(dt, n, gen);
          HostBuf dx_ref(dt, n);
          cpu::softmax_backward(dt, y_ref.data(), g.data(), dx_ref.data(), rows, cols, log);
          DevBuf dy(y_ref), dg(g), ddx(dx_ref.size_bytes());
          ddx.poison();
          cuda::softmax_backward(dt, dy.get(), dg.get(), ddx.get(), rows, cols, log, nullptr);
          BT_EXPECT_REL(ddx.to_host(dt, n).vals(), dx_ref.vals(), tol(dt), "softmax backward");
        }
      }
    }
  }
}

}  // namespace
}  // namespace bt::test::gpu
