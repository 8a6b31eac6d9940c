// GPU GELU (tanh) forward/backward against the CPU kernels; the MLP's fused
// GELU backward against the three kernels it stands for, bit for bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gelu.h"
#include "kernels/reduce.h"
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

// Note [The MLP's GELU backward in one pass]: dPre has gelu_backward's bits,
// h gelu_forward's and the column sums reduce_dim's over dPre (into F32, with
// scratch), with and without h and the sums; on GPT-2's shape (the split's
// chunks), on one chunk, on columns the 16-byte kernel does not take and on
// buffers one element off 16 bytes (both run the three kernels). The sums are
// also checked against float64 sums of dPre.
TEST(CudaGelu, FusedBackwardIsTheThreeKernelsBitForBit) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  struct Case {
    int64_t rows, cols, off;
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c :
         {Case{16384, 3072, 0}, Case{600, 768, 0}, Case{37, 64, 0}, Case{1000, 20, 0}, Case{999, 256, 1}})
      for (bool with_h : {true, false})
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " " << c.rows << " x " << c.cols << " offset " << c.off
                       << (with_h ? " h" : "") << (with_bias ? " bias" : ""));
          const int64_t n = c.rows * c.cols;
          const size_t es = dtype_size(dt), bytes = static_cast<size_t>(n + c.off) * es;
          const HostBuf pre = randn_buf(dt, n + c.off, gen, 2.0), g = randn_buf(dt, n + c.off, gen);
          auto at = [&](const DevBuf& b) { return b.as<unsigned char>() + c.off * es; };
          DevBuf dpre(pre), dg(g), dh(bytes), sums(static_cast<size_t>(c.cols) * sizeof(float));
          DevBuf ref_g(bytes), ref_h(bytes), ref_sums(static_cast<size_t>(c.cols) * sizeof(float));
          const size_t nscratch =
              std::max<size_t>(cuda::gelu_backward_fused_scratch_floats(c.rows, c.cols),
                               cuda::reduce_dim_scratch_floats(kernels::ReduceOp::Sum, 1, c.rows, c.cols));
          DevBuf scratch(std::max<size_t>(nscratch, 1) * sizeof(float));
          dh.poison();
          sums.poison();
          cuda::gelu_backward_fused(dt, at(dpre), at(dg), with_h ? at(dh) : nullptr,
                                    with_bias ? sums.as<float>() : nullptr, c.rows, c.cols,
                                    scratch.as<float>(), nullptr);
          ref_g.upload(g.data(), g.size_bytes());
          cuda::gelu_backward(dt, at(dpre), at(ref_g), at(ref_g), n, nullptr);
          cuda::gelu_forward(dt, at(dpre), at(ref_h), n, nullptr);
          cuda::reduce_dim(kernels::ReduceOp::Sum, dt, DType::F32, at(ref_g), ref_sums.get(), 1, c.rows,
                           c.cols, scratch.as<float>(), nullptr);
          // The bytes of a buffer past its first `skip` bytes.
          const auto bytes_of = [&](const DevBuf& b, size_t count, size_t skip) {
            std::vector<unsigned char> v(count);
            b.download(v.data(), count);
            return std::vector<unsigned char>(v.begin() + static_cast<std::ptrdiff_t>(skip), v.end());
          };
          const size_t skip = static_cast<size_t>(c.off) * es;
          EXPECT_EQ(first_byte_mismatch(bytes_of(dg, bytes, skip), bytes_of(ref_g, bytes, skip), es), -1)
              << "dPre";
          if (with_h)
            EXPECT_EQ(first_byte_mismatch(bytes_of(dh, bytes, skip), bytes_of(ref_h, bytes, skip), es), -1)
                << "h";
          if (!with_bias) continue;
          const size_t sb = static_cast<size_t>(c.cols) * sizeof(float);
          EXPECT_EQ(first_byte_mismatch(bytes_of(sums, sb, 0), bytes_of(ref_sums, sb, 0), sizeof(float)), -1)
              << "column sums";
          const std::vector<double> d = dg.to_host(dt, n + c.off).vals();
          std::vector<double> want(static_cast<size_t>(c.cols), 0.0);
          for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t j = 0; j < c.cols; ++j) want[static_cast<size_t>(j)] += d[c.off + r * c.cols + j];
          BT_EXPECT_REL(sums.to_host(DType::F32, c.cols).vals(), want, 1e-5, "column sums against float64");
        }
}

}  // namespace
}  // namespace bt::test::gpu
