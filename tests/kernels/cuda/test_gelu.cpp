// GPU GELU (tanh) forward/backward against the CPU kernels.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gelu.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

TEST(CudaGelu, ForwardAndBackwardMatchCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : {1, 7, 1000, 1023, 4097, 1 << 20}) {
      for (int64_t off : {0, 1}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n " << n << " offset " << off);
        const size_t es = dtype_size(dt);
        const HostBuf x = randn_buf(dt, n + off, gen, 2.0), g = randn_buf(dt, n + off, gen);
        const unsigned char* xp = static_cast<const unsigned char*>(x.data()) + off * es;
        const unsigned char* gp = static_cast<const unsigned char*>(g.data()) + off * es;
        HostBuf y_ref(dt, n), dx_ref(dt, n);
        cpu::gelu_forward(dt, xp, y_ref.data(), n);
        cpu::gelu_backward(dt, xp, gp, dx_ref.data(), n);
        DevBuf dx(x), dg(g), dy(static_cast<size_t>(n + off) * es), ddx(static_cast<size_t>(n + off) * es);
        dy.poison();
        ddx.poison();
        cuda::gelu_forward(dt, dx.as<unsigned char>() + off * es, dy.as<unsigned char>() + off * es, n,
                           nullptr);
        cuda::gelu_backward(dt, dx.as<unsigned char>() + off * es, dg.as<unsigned char>() + off * es,
                            ddx.as<unsigned char>() + off * es, n, nullptr);
        const std::vector<double> y_all = dy.to_host(dt, n + off).vals(),
                                  dx_all = ddx.to_host(dt, n + off).vals();
        BT_EXPECT_REL(std::vector<double>(y_all.begin() + off, y_all.end()), y_ref.vals(), tol(dt), "y");
        // dx = g * gelu'(x) can vanish by cancellation (gelu' has a root near x = -0.75), so a lone
        // element's relative error is measured against the size of g, which bounds |dx| up to ~1.13.
        const std::vector<double> dx_out(dx_all.begin() + off, dx_all.end()), dx_want = dx_ref.vals(),
                                                                              gv = g.vals();
        double num = 0, den = 0, gs = 0;
        for (size_t i = 0; i < dx_want.size(); ++i) {
          num += (dx_out[i] - dx_want[i]) * (dx_out[i] - dx_want[i]);
          den += dx_want[i] * dx_want[i];
          gs += gv[i + off] * gv[i + off];
        }
        EXPECT_LT(std::sqrt(num / std::max(den, 0.01 * gs)), tol(dt)) << "dx: relative error";
        EXPECT_TRUE(std::isfinite(num)) << "dx has NaN or Inf";
      }
    }
  }
}

}  // namespace
}  // namespace bt::test::gpu
